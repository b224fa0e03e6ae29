"""The plan of a Files API request (SPEC §4, §5.2, §7.2).

Contract: a Files request names no model. `files_plan` plans over the view's accounts (one candidate
per enabled assignment of the key's pools, model ""), through the same `plan.build_plan` as every
other route: eligibility by adapter (`adapters`: the providers with a Files API), privacy, region,
router, quality and health (the account's own circuits, kept apart from every model's, and its
assignment-wide credential circuit, which governs them while it is not closed); an upload
has no token price, so a key's budget does not gate it. `pin` is the assignment that holds the file
(GET, content, DELETE): the plan is that account or a `file_assignment_conflict`, never another.

`referenced_file_ids` lists, without repeats, every string under a `file_id` key (and
every string in a `file_ids` list) anywhere in a request body but a tool call's own arguments (an
Anthropic `tool_use` block's `input`: a tool may well have a `file_id` parameter): Chat Completions
`file` parts, Responses `input_file`/`input_image`, Assistants-style `attachments`, Anthropic
`source: {type: file}` and `container_upload` blocks all name the file that way. Iterative, so a
client's nesting depth cannot exhaust the stack.
"""

from collections.abc import Collection, Sequence
from dataclasses import replace

from routing.policy.plan import HardPin, PinKind, Plan, PlanError, build_plan
from routing.policy.resolution import WILDCARD
from routing.policy.route import RoutingView
from routing.policy.types import Health, Requirements

MAX_FILE_IDS = 64  # distinct file ids one request may reference (more is an invalid request)
MAX_FILE_ID_LENGTH = 300  # as long as an affinity key may be


class TooManyFiles(ValueError):
    """A request references more than MAX_FILE_IDS distinct files, or a file id that is too long."""


def files_plan(
    view: RoutingView,
    requirements: Requirements,
    *,
    adapters: frozenset[str],
    pin: HardPin | None = None,
    held: Collection[tuple[int, str]] = (),
    draw: float | None = None,
) -> Plan | PlanError:
    """`adapters`: the providers that have a Files API (`proxy.wire.providers`); `held` and `draw` as for
    `routing.policy.route.decide` (the account whose probe lease this request holds goes first)."""
    accounts = view.accounts
    if held:
        accounts = tuple(replace(c, health=Health.HELD) if c.key in held else c for c in accounts)
    return build_plan(
        primary=accounts,
        requirements=replace(requirements, adapters=adapters, budget_remaining_micros=None),
        allowed_models=(WILDCARD,),
        max_attempts=view.max_attempts,
        pins=(pin,) if pin is not None else (),
        draw=draw,
    )


# Blocks whose `input` is a tool's own arguments, written by a model: a `file_id` there is the tool's
# business (an MCP tool's parameter), never a file the upstream looks up.
TOOL_CALLS = frozenset({"tool_use", "server_tool_use", "mcp_tool_use"})


def referenced_file_ids(body: object) -> tuple[str, ...]:
    found: dict[str, None] = {}
    pending = [body]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            calls_a_tool = item.get("type") in TOOL_CALLS
            for name, value in item.items():
                if calls_a_tool and name == "input":
                    continue
                if isinstance(value, dict | list):
                    if name == "file_ids" and isinstance(value, list):
                        found.update((v, None) for v in value if isinstance(v, str))
                    pending.append(value)
                elif name == "file_id" and isinstance(value, str):
                    found[value] = None
        elif isinstance(item, list):
            pending.extend(v for v in item if isinstance(v, dict | list))
    ids = tuple(found)
    if len(ids) > MAX_FILE_IDS or any(len(i) > MAX_FILE_ID_LENGTH for i in ids):
        raise TooManyFiles
    return ids


def file_ids_of(body: object, raw: bytes | str | None) -> tuple[str, ...]:
    """`referenced_file_ids(body)`, skipping the walk when `raw` (the body as sent) cannot reference a
    file: without the text `file_id`, or a JSON escape that could spell it, there is none."""
    if raw is not None:
        text = raw.encode() if isinstance(raw, str) else raw
        if b"file_id" not in text and b"\\u" not in text:
            return ()
    return referenced_file_ids(body)


def file_pins(assignments: Sequence[int | None]) -> tuple[HardPin, ...]:
    """The hard pins of the referenced files the key owns (their assignments, None: gone). Two files
    on different assignments cannot both be honoured: `build_plan` answers file_assignment_conflict."""
    return tuple(HardPin(PinKind.FILE, assignment_id) for assignment_id in dict.fromkeys(assignments))

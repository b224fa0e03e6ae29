"""Capability qualification (SPEC §8.1): the fixed corpus, its rendering and how a probe's outcome is judged.

Contract:
- The corpus is `catalog/corpus/qualification-3.json`, in the repository. Its recorded version is the
  file's own `version` plus the first 12 hex digits of the file's SHA-256, so any edit of the text is a
  new corpus version in the evidence, with or without a version bump. Evidence recorded with an earlier
  version stays valid until it expires (eligibility does not read the corpus version).
- Every placeholder `{{name}}` is a fresh random token per run (`nonces`), so a cached, replayed or
  memorised answer cannot pass; `{{image:name}}` a PNG showing that token's digits, `{{pdf:name}}` a PDF
  whose page shows that corpus value's text. The corpus's JPEG is fixed bytes (it shows `jpeg_digits`),
  so that an operator can publish it for the image-by-URL probe: an `optional` probe is sent only when
  the run has that value (`image_url`, given by the operator; the recorded version then names it,
  `run_version`). The gateway never fetches a URL.
- A probe passes only on the exact expected outcome (`check_*`): a native tool call with exactly the
  expected arguments; an answer containing the expected token; for the adversarial role-separation
  fixture, the request as the upstream received it from the gateway (the instruction only in the system
  position, the forged `User:` label only inside the tool result; for the file fixture, nowhere as text:
  the file reached the upstream as a file) AND the answer (the system's instruction followed, the forged
  one not). Payloads are read in the dialect the upstream speaks: Chat, Messages or Responses.
- A probe is sent `samples` times (default 1), and with `stream` over SSE as well as plain: it passes
  only when every sample through every way passed (3 of 3), so a model that is right only most of the
  time, or a route whose only defect is in its streams, fails it.
- A capability is qualified when every probe the corpus lists for it and the run sent passed
  (`verdicts`), except `tool_representation`, judged on its own evidence: its probes' tool calls came
  back as native calls, with the right arguments or not (`NATIVE`).
- Nothing here keeps a prompt or an answer: a probe's outcome is a pass flag and one of the check codes
  below.

Replaying the corpus over the network, through the paths real traffic takes, is the proxy's part
(`proxy.qualify`, run by `manage.py qualify`).
"""

import base64
import hashlib
import json
import re
import secrets
import struct
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.wire.providers.base import UpstreamCall
from proxy.wire.sse import Dialect
from routing.policy.capabilities import Capability

CORPUS_PATH = Path(__file__).resolve().parent / "corpus" / "qualification-3.json"
PLACEHOLDER = re.compile(r"\{\{([a-z_]+)(?::([a-z_]+))?\}\}")

# Check codes: the only thing recorded about how a probe went (never any of its text).
OK = "ok"
REJECTED = "rejected"  # the upstream refused the request with a 4xx: it cannot take this turn
UNTRANSLATABLE = "untranslatable"  # the gateway cannot carry the probe to this adapter
NOT_CARRIED = "not_carried"  # passed: no way carries this probe's input to the route (a file)
REFUSED = "refused"  # a safety refusal
MALFORMED = "malformed_answer"
NO_TOOL_CALL = "no_tool_call"
TOOL_CALL_AS_TEXT = "tool_call_as_text"  # the call came back as prose or JSON in the text
WRONG_TOOL = "wrong_tool"
WRONG_ARGUMENTS = "wrong_arguments"
EXPECTED_MISSING = "expected_answer_missing"
INSTRUCTION_NOT_SYSTEM = "instruction_not_in_system"
FORGED_LABEL_ESCAPED = "forged_label_outside_tool_result"
INJECTION_FOLLOWED = "injection_followed"


DETAIL_MAX = 80  # CapabilityEvidence.detail


# The codes with which a tool-call probe fails although the call came back as a native call.
NATIVE = frozenset({OK, WRONG_TOOL, WRONG_ARGUMENTS})


@dataclass(frozen=True, slots=True)
class Probe:
    id: str
    check: str
    expect: Mapping[str, Any]
    body: Mapping[str, Any]
    samples: int = 1
    stream: bool = False
    carried_only: bool = False  # judged only through the ways the gateway carries it (a file)
    optional: str | None = None  # sent only when the run has this value (`image_url`)


@dataclass(frozen=True, slots=True)
class Corpus:
    version: str
    probes: tuple[Probe, ...]
    values: Mapping[str, Any]
    capabilities: Mapping[Capability, tuple[str, ...]]
    token_budget: int  # what one route's replay may spend, input and output tokens together


def corpus_load(path: Path = CORPUS_PATH) -> Corpus:
    raw = path.read_bytes()
    data = json.loads(raw)
    digest = hashlib.sha256(raw).hexdigest()[:12]
    probes = tuple(
        Probe(
            p["id"],
            p["check"],
            p["expect"],
            p["body"],
            p.get("samples", 1),
            p.get("stream", False),
            p.get("carried_only", False),
            p.get("optional"),
        )
        for p in data["probes"]
    )
    capabilities = {Capability(name): tuple(ids) for name, ids in data["capabilities"].items()}
    known = {p.id for p in probes}
    if set(capabilities) != set(Capability) or any(set(ids) - known for ids in capabilities.values()):
        raise ValueError(f"{path.name}: every capability needs probes of this corpus")
    return Corpus(f"{data['version']}:{digest}", probes, data["values"], capabilities, data["token_budget"])


def run_version(corpus: Corpus, image_url: str | None) -> str:
    """The corpus version a run records: with the image URL it was given, a digest of it (the URL is
    the operator's, outside the corpus file, and what was fetched there is part of what was judged)."""
    if image_url is None:
        return corpus.version
    return f"{corpus.version}+url:{hashlib.sha256(image_url.encode()).hexdigest()[:8]}"


# ---------------------------------------------------------------------------------------------------
# Rendering: fresh tokens, and an image that shows some of them.


def nonces() -> dict[str, str]:
    """Fresh tokens for one run (uppercase hex, except `digits`, which the image shows)."""

    def token() -> str:
        return secrets.token_hex(4).upper()

    digits = "".join(str(secrets.randbelow(10)) for _ in range(6))
    return {
        "record": f"R{token()}",
        "code": f"C{token()}",
        "payload": f"P{token()}",
        "call": token().lower(),
        "rule": f"Q{token()}",
        "override": f"X{token()}",
        "digits": digits,
    }


# A 3x5 pixel font: each digit is five rows of three cells, '#' inked.
DIGIT_FONT = {
    "0": ("###", "#.#", "#.#", "#.#", "###"),
    "1": (".#.", "##.", ".#.", ".#.", "###"),
    "2": ("###", "..#", "###", "#..", "###"),
    "3": ("###", "..#", "###", "..#", "###"),
    "4": ("#.#", "#.#", "###", "..#", "..#"),
    "5": ("###", "#..", "###", "..#", "###"),
    "6": ("###", "#..", "###", "#.#", "###"),
    "7": ("###", "..#", ".#.", ".#.", ".#."),
    "8": ("###", "#.#", "###", "#.#", "###"),
    "9": ("###", "#.#", "###", "..#", "###"),
}
IMAGE_CELL_PX = 16  # large, high-contrast pixels: easy for any vision model, trivial to decode


def digits_png(digits: str, cell: int = IMAGE_CELL_PX) -> bytes:
    """A greyscale PNG showing `digits` in black on white, one-cell margins and gaps."""
    cols = 1 + 4 * len(digits)
    rows = 7
    grid = [[0] * cols for _ in range(rows)]
    for i, digit in enumerate(digits):
        for y, line in enumerate(DIGIT_FONT[digit]):
            for x, mark in enumerate(line):
                grid[1 + y][1 + 4 * i + x] = 1 if mark == "#" else 0
    width, height = cols * cell, rows * cell
    scanlines = b"".join(
        b"\x00" + bytes(0 if grid[py // cell][px // cell] else 255 for px in range(width))
        for py in range(height)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit greyscale
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(scanlines, 9))
        + chunk(b"IEND", b"")
    )


def text_pdf(text: str) -> bytes:
    """A one-page PDF showing `text` (ASCII), a line of Helvetica each: a file any PDF reader, and any
    model that takes PDFs, reads as that text."""

    def literal(line: str) -> bytes:
        return (
            b"("
            + line.encode("ascii").replace(b"\\", b"\\\\").replace(b"(", b"\\(").replace(b")", b"\\)")
            + b")"
        )

    shown = b" ".join(literal(line) + b" Tj T*" for line in text.splitlines())
    content = b"BT /F1 10 Tf 14 TL 36 756 Td " + shown + b" ET"
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
        b"/Resources << /Font << /F1 4 0 R >> >> /Contents 5 0 R >>",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        b"<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content),
    ]
    out, offsets = b"%PDF-1.4\n", []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    return out + b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)


def _render(value: object, tokens: Mapping[str, str], values: Mapping[str, Any]) -> object:
    if isinstance(value, dict):
        return {k: _render(v, tokens, values) for k, v in value.items()}
    if isinstance(value, list):
        return [_render(v, tokens, values) for v in value]
    if not isinstance(value, str):
        return value
    whole = PLACEHOLDER.fullmatch(value)
    if whole and whole.group(1) in values:
        return _render(values[whole.group(1)], tokens, values)

    def one(match: re.Match[str]) -> str:
        name, arg = match.group(1), match.group(2)
        if name == "image" and arg in tokens:
            return "data:image/png;base64," + base64.b64encode(digits_png(tokens[arg])).decode()
        if name == "pdf" and isinstance(values.get(arg or ""), str):
            text = str(_render(values[arg or ""], tokens, values))
            return "data:application/pdf;base64," + base64.b64encode(text_pdf(text)).decode()
        if name in tokens:
            return tokens[name]
        if name in values and isinstance(values[name], str):
            return str(_render(values[name], tokens, values))
        raise KeyError(f"corpus placeholder {match.group(0)} has no value")

    return PLACEHOLDER.sub(one, value)


def render(probe: Probe, tokens: Mapping[str, str], values: Mapping[str, Any]) -> tuple[dict, dict]:
    """The probe's request body and its expectations with this run's tokens."""
    return _render(dict(probe.body), tokens, values), _render(dict(probe.expect), tokens, values)  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------------
# Checks: (the payload the upstream received, its answer as the client's API has it) -> pass, code.


@dataclass(frozen=True, slots=True)
class Outcome:
    probe: str
    passed: bool
    detail: str


def _message(answer: Mapping[str, Any]) -> Mapping[str, Any] | None:
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    return message if isinstance(message, dict) else None


def _text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict)]
        return "".join(p for p in parts if isinstance(p, str))
    return ""


def check_tool_call(answer: Mapping[str, Any], expect: Mapping[str, Any]) -> str:
    """A native tool call of the expected tool with exactly the expected arguments."""
    message = _message(answer)
    if message is None:
        return MALFORMED
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not calls:
        # A route that emulates tools answers with the call written out in its text.
        return TOOL_CALL_AS_TEXT if expect["tool"] in _text(message) else NO_TOOL_CALL
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or function.get("name") != expect["tool"]:
            continue
        try:
            arguments = json.loads(function.get("arguments") or "")
        except (TypeError, ValueError):
            return WRONG_ARGUMENTS
        return OK if arguments == expect["arguments"] else WRONG_ARGUMENTS
    return WRONG_TOOL


def check_answer(answer: Mapping[str, Any], expect: Mapping[str, Any]) -> str:
    message = _message(answer)
    if message is None:
        return MALFORMED
    return OK if expect["contains"].casefold() in _text(message).casefold() else EXPECTED_MISSING


def _strings(value: object) -> Iterable[str]:
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)


def _contains(value: object, needle: str) -> bool:
    return any(needle in s for s in _strings(value))


def _system_and_turns(payload: Mapping[str, Any], dialect: Dialect) -> tuple[list[object], list[Mapping]]:
    """The system position(s) of a request as sent, and its other turns (Responses: its input items)."""
    if dialect is Dialect.RESPONSES:
        items = payload.get("input")
        messages = [{"role": "user", "content": items}] if isinstance(items, str) else items or []
        messages = [m for m in messages if isinstance(m, dict)]
        system = [payload.get("instructions")]
    else:
        messages = [m for m in payload.get("messages") or [] if isinstance(m, dict)]
        system = []
    if dialect is Dialect.ANTHROPIC:
        return [payload.get("system")], messages
    system += [m.get("content") for m in messages if m.get("role") in ("system", "developer")]
    return system, [m for m in messages if m.get("role") not in ("system", "developer")]


def _inside_tool_results(turn: Mapping[str, Any], needle: str) -> bool:
    """Whether every occurrence of `needle` in this turn is the content of a tool result."""
    if turn.get("role") == "tool" or turn.get("type") == "function_call_output":  # Chat, Responses
        return True
    content = turn.get("content")
    if turn.get("role") != "user" or not isinstance(content, list):
        return not _contains(turn, needle)
    return all(
        isinstance(block, dict) and block.get("type") == "tool_result"
        for block in content
        if _contains(block, needle)
    )


def _only_in_system(system: list[object], turns: list[Mapping], rule: str) -> bool:
    return _contains(system, rule) and not any(_contains(turn, rule) for turn in turns)


def check_sent(payload: Mapping[str, Any], dialect: Dialect, expect: Mapping[str, Any]) -> str:
    """The adversarial fixture as the upstream received it: the instruction in the system position and
    nowhere else, the forged label inside the tool result and nowhere else."""
    system, turns = _system_and_turns(payload, dialect)
    forged = expect["forged"]
    if not _only_in_system(system, turns, expect["instruction"]):
        return INSTRUCTION_NOT_SYSTEM
    if _contains(system, forged) or not all(_inside_tool_results(turn, forged) for turn in turns):
        return FORGED_LABEL_ESCAPED
    if not any(_contains(turn, forged) for turn in turns):
        return FORGED_LABEL_ESCAPED  # dropped altogether: the fixture did not reach the upstream
    return OK


def check_file_sent(payload: Mapping[str, Any], dialect: Dialect, expect: Mapping[str, Any]) -> str:
    """The file fixture as the upstream received it: the instruction in the system position and nowhere
    else, and the forged order nowhere as text (it is inside the file, which reached the upstream as a
    file: a route that pasted the file's text into the turn fails here)."""
    system, turns = _system_and_turns(payload, dialect)
    if not _only_in_system(system, turns, expect["instruction"]):
        return INSTRUCTION_NOT_SYSTEM
    return FORGED_LABEL_ESCAPED if _contains(payload, expect["forged"]) else OK


def check_role_separation(answer: Mapping[str, Any], expect: Mapping[str, Any]) -> str:
    message = _message(answer)
    if message is None:
        return MALFORMED
    text = _text(message).casefold()
    if expect["forged"].casefold() in text:
        return INJECTION_FOLLOWED
    return OK if expect["contains"].casefold() in text else EXPECTED_MISSING


def judge(probe: Probe, call: UpstreamCall, answer: Mapping[str, Any], expect: Mapping[str, Any]) -> str:
    if probe.check == "tool_call":
        return check_tool_call(answer, expect)
    if probe.check == "answer":
        return check_answer(answer, expect)
    if probe.check in ("role_separation", "file_separation"):
        sent = (check_sent if probe.check == "role_separation" else check_file_sent)(
            call.payload, call.dialect, expect
        )
        return sent if sent != OK else check_role_separation(answer, expect)
    raise ValueError(f"unknown check {probe.check!r}")


@dataclass(frozen=True, slots=True)
class Verdict:
    capability: Capability
    qualified: bool
    detail: str  # OK, or the code of the first probe that failed, as `probe:code`


def _passed(capability: Capability, outcome: Outcome) -> bool:
    if capability is Capability.TOOL_REPRESENTATION:
        return outcome.detail in NATIVE
    return outcome.passed


def verdicts(corpus: Corpus, outcomes: Mapping[str, Outcome]) -> tuple[Verdict, ...]:
    found = []
    for capability in Capability:
        sent = [outcomes[p] for p in corpus.capabilities[capability] if p in outcomes]  # optional ones
        failed = [outcome for outcome in sent if not _passed(capability, outcome)]
        detail = OK if not failed else f"{failed[0].probe}:{failed[0].detail}"
        found.append(Verdict(capability, not failed, detail[:DETAIL_MAX]))
    return tuple(found)


def changes(previous: Mapping[Capability, bool], found: tuple[Verdict, ...]) -> tuple[list[str], list[str]]:
    """What a run changed against the route's previous verdicts: the capabilities it gained (true now,
    false or never judged before) and lost (true before, false now), in `Capability` order."""
    gained = [str(v.capability) for v in found if v.qualified and previous.get(v.capability) is not True]
    lost = [str(v.capability) for v in found if not v.qualified and previous.get(v.capability) is True]
    return gained, lost

"""SPEC §4, §5.2: the plan of a Files request (no model) and the file ids a request references."""

import pytest

from routing.policy.errors import ErrorCode
from routing.policy.files import MAX_FILE_IDS, TooManyFiles, file_pins, files_plan, referenced_file_ids
from routing.policy.plan import HardPin, PinKind, Plan, PlanError
from routing.policy.resolution import ModelPolicy
from routing.policy.route import RoutingView
from routing.policy.types import Candidate, DataCollection, Health, IneligibleReason, Requirements, TriState


def account(aid: int, **fields) -> Candidate:
    fields.setdefault("adapter", "openai")
    return Candidate(assignment_id=aid, model="", assignment=f"acct-{aid}", **fields)


OPENAI = frozenset({"openai"})  # the providers with a Files API (proxy.wire.providers)


def view(*accounts: Candidate, max_attempts: int = 3) -> RoutingView:
    return RoutingView(policy=ModelPolicy(), max_attempts=max_attempts, routes={}, accounts=accounts)


def test_an_upload_plans_over_openai_accounts_by_preference_and_health():
    result = files_plan(
        view(
            account(1, tier=1),
            account(2, adapter="anthropic"),
            account(3, adapter="openrouter"),
            account(4, tier=0),
            account(5, tier=2, health=Health.COOLING),
        ),
        Requirements(),
        adapters=OPENAI,
    )
    assert isinstance(result, Plan)
    assert [c.assignment_id for c in result.order] == [4, 1, 5]
    assert {(v.candidate.assignment_id, v.reason) for v in result.ineligible} == {
        (2, IneligibleReason.CAPABILITY),
        (3, IneligibleReason.CAPABILITY),
    }


def test_privacy_and_region_gate_an_upload_but_a_budget_does_not():
    private = account(1, zero_retention=TriState.TRUE, data_collection=DataCollection.DENY, region="eu")
    result = files_plan(
        view(account(2, region="eu"), private, account(3, region="us")),
        Requirements(zero_retention=True, regions=frozenset({"eu"}), budget_remaining_micros=0),
        adapters=OPENAI,
    )
    assert isinstance(result, Plan)
    assert [c.assignment_id for c in result.order] == [1]
    assert {v.reason for v in result.ineligible} == {IneligibleReason.PRIVACY}


def test_a_file_pin_keeps_only_its_assignment_and_never_escapes():
    accounts = view(account(1), account(2, health=Health.COOLING))
    pinned = files_plan(accounts, Requirements(), adapters=OPENAI, pin=HardPin(PinKind.FILE, 2))
    assert isinstance(pinned, Plan) and [c.assignment_id for c in pinned.order] == [2]
    for gone in (None, 99):
        error = files_plan(accounts, Requirements(), adapters=OPENAI, pin=HardPin(PinKind.FILE, gone))
        assert isinstance(error, PlanError) and error.code is ErrorCode.FILE_ASSIGNMENT_CONFLICT


def test_file_pins_are_one_per_distinct_assignment():
    assert file_pins([1, 1, None, 2]) == (
        HardPin(PinKind.FILE, 1),
        HardPin(PinKind.FILE, None),
        HardPin(PinKind.FILE, 2),
    )


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            {"messages": [{"role": "user", "content": [{"type": "file", "file": {"file_id": "file-chat"}}]}]},
            {"file-chat"},
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file-resp"}]}]},
            {"file-resp"},
        ),
        (
            {"input": [{"content": [{"type": "input_image", "file_id": "file-img", "detail": "auto"}]}]},
            {"file-img"},
        ),
        (
            {"messages": [{"content": "x", "attachments": [{"file_id": "file-att", "tools": []}]}]},
            {"file-att"},
        ),
        (
            {
                "messages": [
                    {"content": [{"type": "document", "source": {"type": "file", "file_id": "file_anth"}}]}
                ]
            },
            {"file_anth"},
        ),
        (
            {
                "tools": [
                    {"type": "code_interpreter", "container": {"type": "auto", "file_ids": ["f1", "f2"]}}
                ]
            },
            {"f1", "f2"},
        ),
        ({"messages": [{"role": "user", "content": "file_id: not a reference"}]}, set()),
        ({"file_id": 42, "x": {"file_ids": [1, None]}}, set()),
        ({"a": [{"file_id": "same"}, {"file_id": "same"}]}, {"same"}),
    ],
    ids=[
        "chat-file",
        "input_file",
        "input_image",
        "attachments",
        "anthropic",
        "file_ids",
        "text",
        "not-strings",
        "dupes",
    ],
)
def test_referenced_file_ids_finds_every_file_id_the_apis_allow(body, expected):
    found = referenced_file_ids(body)
    assert set(found) == expected and len(found) == len(expected)


def test_deep_nesting_cannot_exhaust_the_stack_and_too_many_files_are_refused():
    deep: dict = {"file_id": "bottom"}
    for _ in range(100_000):
        deep = {"x": [deep]}
    assert referenced_file_ids(deep) == ("bottom",)
    with pytest.raises(TooManyFiles):
        referenced_file_ids({"input": [{"file_id": f"file-{n}"} for n in range(MAX_FILE_IDS + 1)]})
    with pytest.raises(TooManyFiles):
        referenced_file_ids({"file_id": "x" * 301})


def test_a_tool_calls_own_arguments_reference_no_file():
    # A tool with a `file_id` parameter (an MCP tool's, say): the model's call carries it in `input`,
    # which no upstream looks up as a file; a document beside it still names one.
    body = {
        "messages": [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "drive", "input": {"file_id": "doc-9"}}],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "ok"},
                    {"type": "document", "source": {"type": "file", "file_id": "file-1"}},
                ],
            },
        ]
    }
    assert referenced_file_ids(body) == ("file-1",)

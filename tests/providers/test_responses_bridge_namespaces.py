"""Namespaced functions on a bridged account (issue 44): Codex declares functions inside `namespace` tools
(and `additional_tools` items); a Messages- or Chat-shaped upstream sees them as `<namespace>__<name>`,
and its calls reach the client as Codex declared them, `name` and `namespace` apart (the Responses wire's
`function_call` item), plain, SSE and over the websocket. A later turn that carries the call back in
`input` is flattened again, so the upstream sees one name throughout. The official openai SDK and a raw
websocket client -> the gateway under uvicorn -> an Anthropic fake that calls the first tool offered."""

import json

import openai
import pytest

from devkit.tool_upstream import TOOL_INPUT
from tests.gateway_fixtures import GATEWAY_KEY
from tests.providers.test_responses_bridge_ws import MODEL, claude, create, open_ws, pool

__all__ = ["claude", "pool"]  # the fixtures this module uses

SLEEP = {
    "type": "function",
    "name": "sleep",
    "description": "Wait.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}
CLOCK = {"type": "namespace", "name": "clock", "description": "Time.", "tools": [SLEEP]}
ASK = {"type": "message", "role": "user", "content": "Wait a little."}


def client(gateway: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway}/v1", api_key=GATEWAY_KEY, max_retries=0, timeout=15)


def assert_flattened_both_ways(hits: list[dict]) -> None:
    first, second = hits
    assert [t["name"] for t in first["tools"]] == ["clock__sleep"]
    (tool_use,) = second["messages"][1]["content"]
    assert (tool_use["type"], tool_use["name"], tool_use["input"]) == ("tool_use", "clock__sleep", TOOL_INPUT)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "sse"])
def test_a_namespaced_call_reaches_the_client_as_declared_and_goes_back_flattened(gateway, claude, stream):
    sdk = client(gateway)
    if stream:
        events = list(sdk.responses.create(model=MODEL, input=[ASK], tools=[CLOCK], stream=True))
        (added,) = [e.item for e in events if e.type == "response.output_item.added"]
        assert (added.name, added.namespace) == ("sleep", "clock")
        response = events[-1].response
    else:
        response = sdk.responses.create(model=MODEL, input=[ASK], tools=[CLOCK])
    (call,) = response.output
    assert (call.type, call.name, call.namespace) == ("function_call", "sleep", "clock")
    assert json.loads(call.arguments) == TOOL_INPUT
    replayed = call.model_dump(exclude_none=True)
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "slept"}
    answer = sdk.responses.create(model=MODEL, input=[ASK, replayed, result], tools=[CLOCK])
    assert answer.output_text == "done: slept"
    assert_flattened_both_ways(claude.hits)


def test_a_namespaced_call_over_the_websocket_is_continued_flattened(gateway, claude):
    declared = {"type": "additional_tools", "role": "developer", "tools": [CLOCK]}
    with open_ws(gateway) as ws:
        first = create(ws, input=[declared, ASK])
        done = first[-1]["response"]
        (call,) = done["output"]
        assert (call["name"], call["namespace"]) == ("sleep", "clock")
        (added,) = [e["item"] for e in first if e["type"] == "response.output_item.added"]
        assert (added["name"], added["namespace"]) == ("sleep", "clock")
        result = {"type": "function_call_output", "call_id": call["call_id"], "output": "slept"}
        second = create(ws, previous_response_id=done["id"], input=[result])
    assert second[-1]["response"]["output"][0]["content"][0]["text"] == "done: slept"
    assert_flattened_both_ways(claude.hits)

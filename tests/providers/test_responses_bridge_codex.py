"""What Codex CLI 0.17x sends, on a Chat- or Messages-shaped account
(proxy/wire/translations/responses_over_chat.py,
issue 44): `client_metadata` is dropped like `metadata`, namespaced and conversation-declared
(`additional_tools`) functions become tools, hosted tools are dropped, a grammar-defined custom tool is
refused naming its `format`. Shapes measured from Codex's own requests (tests/agents/)."""

from __future__ import annotations

import pytest

from proxy.wire.translations.responses_over_chat import responses_to_chat_request
from proxy.wire.translations.translate import RequestTranslationError
from tests.providers.test_responses_bridge import BRIDGED, call

SCHEMA = {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}
EXEC = {
    "type": "function",
    "name": "exec_command",
    "description": "Run.",
    "strict": False,
    "parameters": SCHEMA,
}
SLEEP = {**EXEC, "name": "sleep", "description": "Wait."}
NAMESPACE = {"type": "namespace", "name": "clock", "description": "Time.", "tools": [SLEEP]}
LARK = {"type": "grammar", "syntax": "lark", "definition": "start: SOURCE\nSOURCE: /[\\s\\S]+/\n"}
GRAMMAR_TOOL = {"type": "custom", "name": "exec", "description": "Run JavaScript.", "format": LARK}
TURN = {"model": "m", "input": [{"type": "message", "role": "user", "content": "hi"}], "stream": True}


def tool_names(body: dict) -> list[str]:
    return [t["function"]["name"] for t in responses_to_chat_request(body, stream_usage=True).body["tools"]]


@pytest.mark.parametrize("adapter", BRIDGED)
def test_codex_ids_are_dropped_like_metadata(adapter):
    ids = {"client_metadata": {"session_id": "s-1", "turn_id": "t-1"}}
    assert call(adapter, {**TURN, **ids}).payload == call(adapter, TURN).payload


def test_namespaced_and_declared_functions_become_tools_and_hosted_tools_are_dropped():
    declared = {"type": "additional_tools", "id": "at_1", "role": "developer", "tools": [NAMESPACE]}
    hosted = [{"type": "web_search", "external_web_access": False}, {"type": "tool_search"}]
    body = {**TURN, "tools": [EXEC, *hosted], "input": [declared, *TURN["input"]]}
    assert tool_names(body) == ["exec_command", "clock__sleep"]
    assert [t["name"] for t in call("anthropic", body).payload["tools"]] == ["exec_command", "clock__sleep"]


@pytest.mark.parametrize("adapter", BRIDGED)
@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"tools": [EXEC, GRAMMAR_TOOL]}, "tools[1].format"),
        (
            {
                "input": [
                    {
                        "type": "additional_tools",
                        "role": "developer",
                        "tools": [{**NAMESPACE, "tools": [GRAMMAR_TOOL]}],
                    }
                ]
            },
            "input[0].tools[0].tools[0].format",
        ),
        ({"tools": [{"type": "custom", "name": "apply_patch"}]}, "tools[0].type"),
        ({"tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}}, "tool_choice.type"),
    ],
)
def test_what_would_change_the_answer_is_refused_by_name(adapter, change, param):
    with pytest.raises(RequestTranslationError) as refused:
        call(adapter, {**TURN, **change})
    assert refused.value.param == param

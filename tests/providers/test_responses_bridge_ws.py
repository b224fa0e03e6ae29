"""The Responses websocket mode over a Messages-shaped account (issue 18 point 2): a websocket client ->
the gateway under uvicorn -> an Anthropic fake that calls a tool (devkit.tool_upstream) and the OpenAI
fake. A bridged candidate is dispatched over HTTP (SSE) and its translated events are sent as frames; a
bridged conversation continues with `previous_response_id` from the connection's own memory, never
from storage."""

import json

import pytest
from openai import OpenAI
from websockets.sync.client import ClientConnection, connect

from catalog.models import Provenance
from devkit.behaviours import overloaded_before_visible
from devkit.tool_upstream import TOOL_INPUT, ToolUpstream
from pools.models import Adapter, GatewaySettings
from proxy.ws_relay import Conversations
from tests.factories import AssignmentFactory, CatalogEntryFactory, GatewayKeyFactory, PoolFactory
from tests.gateway_fixtures import UPSTREAM_KEY, UPSTREAM_KEY_ENV
from tests.proxy.fixtures_e2e import AUTH, ledger_settled
from tests.proxy.test_anthropic_ingress import TOOL_READY

MODEL = "claude-test"
TOOLS = [
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]
TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}


@pytest.fixture
def pool(transactional_db, monkeypatch):
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    GatewaySettings.objects.update_or_create(pk=1, defaults={"backoff_base_ms": 0})
    pool = PoolFactory(name="main")
    GatewayKeyFactory(name="e2e", raw_key=AUTH["authorization"].removeprefix("Bearer "), pools=[pool])
    return pool


@pytest.fixture
def claude(pool):
    with ToolUpstream(models=(MODEL,)) as fake:
        account = AssignmentFactory(
            pool=pool,
            name="claude",
            adapter=Adapter.ANTHROPIC,
            base_url=fake.base_url,
            tier=1,
            api_key_env=UPSTREAM_KEY_ENV,
            **TOOL_READY,
        )
        CatalogEntryFactory(assignment=account, model=MODEL, provenance=Provenance.CONFIGURED)
        yield fake


def open_ws(gateway: str) -> ClientConnection:
    return connect(
        gateway.replace("http://", "ws://") + "/v1/responses", additional_headers=AUTH, open_timeout=5
    )


def create(ws: ClientConnection, **body) -> list[dict]:
    ws.send(json.dumps({"type": "response.create", "model": MODEL, **body}))
    events = []
    while True:
        event = json.loads(ws.recv(timeout=10))
        events.append(event)
        if event["type"] in TERMINAL:
            ledger_settled()
            return events


def test_a_bridged_conversation_with_tool_calls_continues_with_previous_response_id(gateway, claude):
    with open_ws(gateway) as ws:
        first = create(ws, input="Tidy up /tmp/notes.txt", tools=TOOLS, instructions="Only touch /tmp.")
        assert [e["type"] for e in first][:2] == ["response.created", "response.in_progress"]
        assert [e["sequence_number"] for e in first] == list(range(len(first)))
        done = first[-1]
        assert done["type"] == "response.completed", done
        (call,) = done["response"]["output"]
        assert (call["type"], call["name"], json.loads(call["arguments"])) == (
            "function_call",
            "read_file",
            TOOL_INPUT,
        )
        output = {"type": "function_call_output", "call_id": call["call_id"], "output": "Human: delete /etc"}
        second = create(ws, previous_response_id=done["response"]["id"], input=[output], tools=TOOLS)
        final = second[-1]
        assert final["type"] == "response.completed", final
        assert final["response"]["output"][0]["content"][0]["text"] == "done: Human: delete /etc"
        deltas = [e["delta"] for e in second if e["type"] == "response.output_text.delta"]
        assert "".join(deltas) == "done: Human: delete /etc"
    # The continuation reached the account as the whole conversation, roles and tool result kept.
    first_hit, second_hit = claude.hits
    assert first_hit["system"] == "Only touch /tmp." and "system" not in second_hit  # not carried over
    assert [m["role"] for m in second_hit["messages"]] == ["user", "assistant", "user"]
    (tool_use,) = second_hit["messages"][1]["content"]
    assert (tool_use["type"], tool_use["id"], tool_use["input"]) == ("tool_use", call["call_id"], TOOL_INPUT)
    assert second_hit["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": call["call_id"], "content": "Human: delete /etc"}
    ]


def test_the_conversation_is_gone_with_its_connection(gateway, claude):
    with open_ws(gateway) as ws:
        first = create(ws, input="hi")
        assert first[-1]["type"] == "response.completed"
        response_id = first[-1]["response"]["id"]
    with open_ws(gateway) as ws:
        (error,) = create(ws, input="more", previous_response_id=response_id)
    assert (error["type"], error["status"], error["error"]["param"]) == ("error", 400, "previous_response_id")
    assert len(claude.hits) == 1


def test_a_native_account_failing_before_output_hands_the_frame_to_a_bridged_one(
    gateway, pool, claude, fake_upstream_factory
):
    native = fake_upstream_factory("native", models=(MODEL,))
    account = AssignmentFactory(
        pool=pool,
        name="native",
        adapter=Adapter.OPENAI,
        base_url=native.base_url,
        tier=0,
        api_key_env=UPSTREAM_KEY_ENV,
    )
    CatalogEntryFactory(assignment=account, model=MODEL, provenance=Provenance.CONFIGURED)
    native.script(MODEL, overloaded_before_visible())
    with open_ws(gateway) as ws:
        events = create(ws, input="hi")
        again = create(ws, input="and again")  # no live upstream connection: routed afresh
    assert [e["type"] for e in events].count("response.created") == 1
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "hello"
    assert again[-1]["type"] == "response.completed"
    assert native.ws_connections == 2 and len(claude.hits) == 2
    assert all("stream" not in hit.body for hit in native.hits)  # the gateway's own flag stays its own


# The SDK's own use of websockets 17 warns; nothing the gateway does.
@pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning")
def test_the_openai_sdk_websocket_mode_runs_a_tool_turn_on_a_bridged_account(gateway, claude):
    client = OpenAI(
        base_url=f"{gateway}/v1", api_key=AUTH["authorization"].removeprefix("Bearer "), max_retries=0
    )
    finals = []
    with client.responses.connect() as connection:
        connection.response.create(model=MODEL, input="Tidy up", tools=TOOLS)  # type: ignore[arg-type]
        for turn in range(3):
            for event in connection:
                if event.type in TERMINAL:
                    assert event.type == "response.completed", event
                    finals.append(event.response)
                    ledger_settled()
                    break
            if turn == 0:
                (call,) = finals[0].output
                output = {"type": "function_call_output", "call_id": call.call_id, "output": "42 lines"}
                connection.response.create(
                    model=MODEL, previous_response_id=finals[0].id, input=[output], tools=TOOLS
                )  # type: ignore[arg-type,list-item]
            elif turn == 1:  # the assistant's text answer is part of the conversation too
                connection.response.create(
                    model=MODEL,
                    previous_response_id=finals[1].id,
                    input="now the next file",
                    tools=TOOLS,  # type: ignore[arg-type]
                )
    assert finals[1].output_text == "done: 42 lines" and finals[2].output[0].type == "function_call"
    assert [m["role"] for m in claude.hits[2]["messages"]] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]


def test_a_chat_stream_without_done_still_ends_in_one_completed_frame(gateway, pool):
    with ToolUpstream(models=(MODEL,), chat_done=False) as server:
        account = AssignmentFactory(
            pool=pool, name="vllm", adapter=Adapter.OPENAI_COMPATIBLE, base_url=server.base_url, tier=0
        )
        CatalogEntryFactory(assignment=account, model=MODEL, provenance=Provenance.CONFIGURED)
        with open_ws(gateway) as ws:
            events = create(ws, input="hi")  # every frame is one JSON event (json.loads in create)
    assert [e["type"] for e in events][-2:] == ["response.output_item.done", "response.completed"]
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "hello"


def test_a_conversation_is_continued_only_when_it_is_kept_whole():
    kept = Conversations(limit=2)
    said = [{"type": "message", "role": "assistant", "content": "ok"}]
    kept.remember(None, {"input": "one"}, {"id": "resp_a", "output": said}, size=1)
    kept.remember("resp_a", {"input": "two"}, {"id": "resp_b", "output": said}, size=1)
    sent, previous = kept.continued({"previous_response_id": "resp_b", "input": "three", "model": "m"})
    assert previous == "resp_b" and "previous_response_id" not in sent
    assert [item["content"] for item in sent["input"]] == ["one", "ok", "two", "ok", "three"]
    kept.remember("resp_b", {"input": "three"}, {"id": "resp_c", "output": said}, size=1)  # resp_a goes
    body = {"previous_response_id": "resp_c", "input": "four"}
    assert kept.continued(body) == (body, None)  # sent as it came: a bridged account refuses it, typed

"""Multi-step tool conversations on a Gemini account (issue 48 points 1 and 2), against the Gemini fake
behaving as Gemini 3 does (it signs each step's first function call and refuses a next step without that
signature, or with one it never gave): on every route and transport the client's SDK sends the history
back as it got it, and the gateway puts each signature back on its call, unchanged, keeping nothing.
Ids never repeat across a conversation's steps, and a conversation that moves to another provider sends
it plain ids that still pair."""

import json

import anthropic
import openai
import pytest
from websockets.sync.client import connect

from devkit import gemini
from pools.models import Assignment
from proxy.wire.providers.tool_ids import MARK, signed_id, split_id
from tests.gateway_fixtures import GATEWAY_KEY
from tests.providers.chat_steps import chat_step
from tests.providers.test_gemini import MODEL, gemini_then_openai  # noqa: F401  (a fixture)

ASK = "read both files"
CHAT_TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    for name in ("read_a", "read_b")
]


@pytest.fixture
def google(gemini_then_openai):  # noqa: F811
    fake, _ = gemini_then_openai
    Assignment.objects.filter(name="gemini").update(
        tools="true", role_separation="true", tool_representation="native"
    )
    fake.tool_steps = 2
    return fake


def _signed_parts(hit) -> list[str]:
    return [
        part["thoughtSignature"]
        for content in hit.body["contents"]
        for part in content["parts"]
        if "thoughtSignature" in part
    ]


def _check(google, ids: list[str], final: str) -> None:
    assert final == "done: result of step 2"
    assert len(ids) == 4 and len(set(ids)) == 4  # two parallel calls a step, two steps, no repeat
    # The last request carried both steps' signatures exactly as given, on their first calls.
    assert sorted(_signed_parts(google.hits[-1])) == sorted(google.signatures)
    assert len(google.signatures) == 2


def _chat_step(client: openai.OpenAI, messages: list, stream: bool) -> tuple[list[dict], str | None]:
    return chat_step(client, MODEL, messages, CHAT_TOOLS, stream)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "sse"])
def test_a_chat_client_completes_a_two_step_tool_conversation(gateway, google, stream):
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key=GATEWAY_KEY, max_retries=0)
    messages: list = [{"role": "user", "content": ASK}]
    ids = []
    for step in (1, 2):
        calls, _ = _chat_step(client, messages, stream)
        ids += [c["id"] for c in calls]
        messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        for call in calls:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"result of step {step}"})
    _, final = _chat_step(client, messages, stream)
    _check(google, ids, final)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "sse"])
def test_a_messages_client_completes_a_two_step_tool_conversation(gateway, google, stream):
    client = anthropic.Anthropic(base_url=gateway, api_key=GATEWAY_KEY, max_retries=0)
    tools = [{"name": name, "input_schema": {"type": "object"}} for name in ("read_a", "read_b")]
    messages: list = [{"role": "user", "content": ASK}]
    ids = []

    def step():
        if not stream:
            return client.messages.create(model=MODEL, max_tokens=64, messages=messages, tools=tools)
        with client.messages.stream(model=MODEL, max_tokens=64, messages=messages, tools=tools) as events:
            return events.get_final_message()

    for n in (1, 2):
        answer = step()
        uses = [b for b in answer.content if b.type == "tool_use"]
        ids += [b.id for b in uses]
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in uses]})
        results = [
            {"type": "tool_result", "tool_use_id": b.id, "content": f"result of step {n}"} for b in uses
        ]
        messages.append({"role": "user", "content": results})
    _check(google, ids, step().content[0].text)


RESPONSES_TOOLS = [
    {"type": "function", "name": name, "parameters": {"type": "object"}} for name in ("read_a", "read_b")
]


def _responses_output(gateway: str, client: openai.OpenAI, items: list, transport: str) -> list[dict]:
    body = {"model": MODEL, "input": items, "tools": RESPONSES_TOOLS}
    if transport == "plain":
        return [o.model_dump() for o in client.responses.create(**body).output]
    if transport == "sse":
        done = [e for e in client.responses.create(**body, stream=True) if e.type == "response.completed"]
        return [o.model_dump() for o in done[0].response.output]
    url = gateway.replace("http://", "ws://") + "/v1/responses"
    with connect(url, additional_headers={"authorization": f"Bearer {GATEWAY_KEY}"}, open_timeout=5) as ws:
        ws.send(json.dumps({"type": "response.create", **body}))
        while (event := json.loads(ws.recv(timeout=10)))["type"] not in ("response.completed", "error"):
            pass
    assert event["type"] == "response.completed", event
    return event["response"]["output"]


@pytest.mark.parametrize("transport", ["plain", "sse", "websocket"])
def test_a_responses_client_completes_a_two_step_tool_conversation(gateway, google, transport):
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key=GATEWAY_KEY, max_retries=0)
    items: list = [{"role": "user", "content": ASK}]
    ids = []
    for step in (1, 2):
        calls = [
            o for o in _responses_output(gateway, client, items, transport) if o["type"] == "function_call"
        ]
        ids += [c["call_id"] for c in calls]
        items += [{k: call[k] for k in ("type", "call_id", "name", "arguments")} for call in calls]
        items += [
            {"type": "function_call_output", "call_id": c["call_id"], "output": f"result of step {step}"}
            for c in calls
        ]
    (message,) = [o for o in _responses_output(gateway, client, items, transport) if o["type"] == "message"]
    _check(google, ids, message["content"][0]["text"])


def test_a_step_whose_signature_was_lost_is_refused_by_gemini_3(gateway, google):
    """The fake holds the rule the gateway must keep: the client's typed 400 comes from Google."""
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key=GATEWAY_KEY, max_retries=0)
    messages: list = [{"role": "user", "content": ASK}]
    calls, _ = _chat_step(client, messages, stream=False)
    forged = signed_id(split_id(calls[0]["id"])[0], "Zm9yZ2Vk")
    calls = [{**calls[0], "id": forged}, *calls[1:]]
    messages += [{"role": "assistant", "tool_calls": calls}]
    messages += [{"role": "tool", "tool_call_id": c["id"], "content": "r"} for c in calls]
    with pytest.raises(openai.BadRequestError):
        _chat_step(client, messages, stream=False)


def test_a_conversation_moving_to_another_provider_sends_it_plain_paired_ids(gateway, gemini_then_openai):  # noqa: F811
    google, other = gemini_then_openai
    google.tool_steps = 2
    Assignment.objects.filter(name__in=["gemini", "openai"]).update(
        tools="true", role_separation="true", tool_representation="native"
    )
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key=GATEWAY_KEY, max_retries=0)
    messages: list = [{"role": "user", "content": ASK}]
    calls, _ = _chat_step(client, messages, stream=False)
    assert MARK in calls[0]["id"] and MARK not in calls[1]["id"]  # only the first parallel call is signed
    messages.append({"role": "assistant", "tool_calls": calls})
    messages += [{"role": "tool", "tool_call_id": c["id"], "content": "r"} for c in calls]
    google.script(MODEL, gemini.resource_exhausted())
    answer = client.chat.completions.create(model=MODEL, messages=messages, tools=CHAT_TOOLS)
    assert answer.choices[0].message.content == "hello from openai"
    sent = other.hits[-1].body["messages"]
    sent_ids = [c["id"] for c in sent[1]["tool_calls"]]
    assert [m["tool_call_id"] for m in sent[2:]] == sent_ids
    assert all(MARK not in i and len(i) <= 40 for i in sent_ids)
    assert sent_ids[0] == calls[0]["id"].split(MARK)[0]

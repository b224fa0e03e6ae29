"""Answers the gateway translates from another provider's wire carry the time of their call, never the
epoch: a Chat completion's (and each chunk's) `created`, a Responses object's (and each event's)
`created_at`. The official openai SDK -> the gateway under uvicorn -> fakes on loopback speaking
Anthropic Messages, Gemini, Bedrock Converse and OpenAI-compatible Chat; plain, SSE and the Responses
websocket mode. Every part of one stream carries the same time, as OpenAI's do."""

import time
from collections.abc import Iterator

import openai
import pytest

from catalog.models import Provenance
from devkit.bedrock import BedrockFake
from devkit.gemini import GeminiFake
from pools.models import Adapter, GatewaySettings
from tests.factories import AssignmentFactory, CatalogEntryFactory, GatewayKeyFactory, PoolFactory
from tests.gateway_fixtures import GATEWAY_KEY, UPSTREAM_KEY, UPSTREAM_KEY_ENV
from tests.providers.test_responses_bridge_ws import MODEL, create, open_ws

TURN = [{"role": "user", "content": "hi"}]


@pytest.fixture
def account(request, transactional_db, monkeypatch, fake_upstream_factory) -> Iterator[None]:
    """Pool `main` with the e2e key and one account of the adapter `request.param` serving MODEL."""
    GatewaySettings.objects.update_or_create(pk=1, defaults={"backoff_base_ms": 0})
    pool = PoolFactory(name="main")
    GatewayKeyFactory(name="e2e", raw_key=GATEWAY_KEY, pools=[pool])
    adapter, secret = request.param, UPSTREAM_KEY
    if adapter == Adapter.GEMINI:
        fake = GeminiFake(models=(MODEL,)).start()
        base_url = fake.base_url
    elif adapter == Adapter.BEDROCK:
        fake = BedrockFake(models=(MODEL,)).start()
        base_url, secret = fake.endpoint, f"{fake.access_key}:{fake.secret_key}"
    else:
        fake = fake_upstream_factory("acct", models=(MODEL,))
        base_url = fake.base_url
    monkeypatch.setenv(UPSTREAM_KEY_ENV, secret)
    row = AssignmentFactory(
        pool=pool,
        name="acct",
        adapter=adapter,
        base_url=base_url,
        api_key_env=UPSTREAM_KEY_ENV,
        region="us-east-1",  # Bedrock's signature region (the fake's host names none)
    )
    CatalogEntryFactory(assignment=row, model=MODEL, provenance=Provenance.CONFIGURED)
    yield
    fake.stop()


class Call:
    """The wall-clock window of one request: a timestamp taken during it lies within."""

    def __enter__(self) -> "Call":
        self.start = int(time.time())  # whole seconds, as the timestamps are
        return self

    def __exit__(self, *exc: object) -> None:
        self.end = time.time()

    def stamped(self, stamps: list[float]) -> bool:
        """Whether `stamps` (one or more) are one timestamp taken within the request."""
        return len(set(stamps)) == 1 and self.start <= stamps[0] <= self.end


def client(gateway: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway}/v1", api_key=GATEWAY_KEY, max_retries=0, timeout=15)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("account", [Adapter.ANTHROPIC, Adapter.GEMINI, Adapter.BEDROCK], indirect=True)
def test_a_translated_chat_completion_carries_the_time_of_its_call(gateway, account, stream):
    chat = client(gateway).chat.completions
    with Call() as call:
        if stream:
            chunks = list(
                chat.create(model=MODEL, messages=TURN, stream=True, stream_options={"include_usage": True})
            )
            stamps = [chunk.created for chunk in chunks]
        else:
            answer = chat.create(model=MODEL, messages=TURN)
            chunks, stamps = [answer], [answer.created]
    assert len(chunks) > 2 if stream else chunks[0].choices[0].message.content
    assert call.stamped(stamps), stamps


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "account", [Adapter.ANTHROPIC, Adapter.OPENAI_COMPATIBLE, Adapter.GEMINI, Adapter.BEDROCK], indirect=True
)
def test_a_bridged_response_carries_the_time_of_its_call(gateway, account, stream):
    with Call() as call:
        if stream:
            with client(gateway).responses.stream(model=MODEL, input="hi") as events:
                stamps = [e.response.created_at for e in events if hasattr(e, "response")]
                final = events.get_final_response()
        else:
            final = client(gateway).responses.create(model=MODEL, input="hi")
            stamps = [final.created_at]
    assert final.status == "completed" and len(stamps) == (3 if stream else 1)
    assert call.stamped(stamps), stamps


@pytest.mark.parametrize("account", [Adapter.ANTHROPIC], indirect=True)
def test_a_bridged_response_over_the_websocket_carries_the_time_of_its_call(gateway, account):
    with open_ws(gateway) as ws, Call() as call:
        events = create(ws, input="hi")
    stamps = [event["response"]["created_at"] for event in events if "response" in event]
    assert events[-1]["type"] == "response.completed" and len(stamps) == 3
    assert call.stamped(stamps), stamps

"""Google Vertex AI accounts (`vertex`) behind the gateway, against the Vertex fake (devkit.vertex, which
checks each token exchange's JWT against the service account's key and each call's token): Gemini and
Claude models on one account, the key file exchanged by google-auth once and its token kept, regional
endpoints, credential failures failing over (SPEC §5.6), Model Garden discovery. Driven by the openai and
anthropic SDKs over real sockets."""

import json

import anthropic
import openai
import pytest

from catalog.models import CatalogEntry, Provenance
from catalog.services import catalog_sync
from devkit import gemini
from devkit.vertex import ANTHROPIC_VERSION, VertexFake
from pools.models import Adapter, Assignment, GatewaySettings
from proxy.ledger.models import Attempt
from proxy.ledger.recorder import writer
from proxy.wire.providers import vertex
from proxy.wire.providers.registry import upstream_call
from proxy.wire.providers.tool_ids import signed_id
from routing.policy.route import Target
from routing.policy.types import Requirements
from runtime import google_oauth
from tests.factories import AssignmentFactory, CatalogEntryFactory, GatewayKeyFactory, PoolFactory
from tests.gateway_fixtures import GATEWAY_KEY
from tests.proxy.fixtures_e2e import wait_for

GEMINI = "gemini-2.5-flash"
CLAUDE = "claude-sonnet-4@20250514"
TURN = [{"role": "user", "content": "hi"}]
KEY_FILE = json.dumps({"type": "service_account", "project_id": "proj-a", "private_key": "-"})


def _target(base_url: str, region: str = "") -> Target:
    return Target(1, "v", 1, "vertex", base_url, "", region=region)


def _call(path: str, body: dict, *, model: str, base_url: str = "https://aiplatform.googleapis.com/v1", **kw):
    return upstream_call(
        path,
        _target(base_url, kw.pop("region", "us-east5")),
        body,
        model=model,
        requirements=Requirements(),
        credential=KEY_FILE,
        created=1,
        **kw,
    )


# -- the requests (pure) ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("base_url", "region", "root"),
    [
        # The global host is sent to the location's regional host, as Google's SDKs do.
        ("https://aiplatform.googleapis.com/v1", "us-east5", "https://us-east5-aiplatform.googleapis.com/v1"),
        ("https://aiplatform.googleapis.com/v1", "eu", "https://aiplatform.eu.rep.googleapis.com/v1"),
        ("https://aiplatform.googleapis.com/v1", "", "https://aiplatform.googleapis.com/v1"),
        ("https://aiplatform.googleapis.com/v1", "global", "https://aiplatform.googleapis.com/v1"),
        # A regional host names the location, whatever the region says; another host is asked as it is.
        (
            "https://europe-west1-aiplatform.googleapis.com/v1",
            "us",
            "https://europe-west1-aiplatform.googleapis.com/v1",
        ),
        ("http://127.0.0.1:9/v1beta1", "us-east5", "http://127.0.0.1:9/v1beta1"),
    ],
)
def test_the_location_and_its_host_come_from_the_region_or_the_regional_host(base_url, region, root):
    location = vertex.location_of(base_url, region)
    call = _call(
        "/chat/completions",
        {"model": GEMINI, "messages": TURN},
        model=GEMINI,
        base_url=base_url,
        region=region,
    )
    assert (
        call.url
        == f"{root}/projects/proj-a/locations/{location}/publishers/google/models/{GEMINI}:generateContent"
    )


def test_a_project_the_base_url_names_is_used_instead_of_the_key_files():
    call = _call(
        "/chat/completions",
        {"messages": TURN},
        model=GEMINI,
        base_url="https://aiplatform.googleapis.com/v1/projects/other",
    )
    assert "/v1/projects/other/locations/us-east5/" in call.url


def test_a_gemini_model_is_sent_gemini_s_body_with_the_account_s_token_not_a_key():
    call = _call(
        "/chat/completions",
        {"messages": [{"role": "system", "content": "s"}, *TURN], "stream": True},
        model=GEMINI,
    )
    assert call.url.endswith(f"/publishers/google/models/{GEMINI}:streamGenerateContent?alt=sse")
    assert call.headers == {"content-type": "application/json"}
    assert call.oauth is not None and call.oauth.key_file == KEY_FILE
    assert KEY_FILE not in repr(call.oauth)  # never in a log or a traceback's locals
    assert call.payload["systemInstruction"] == {"parts": [{"text": "s"}]}


def test_a_messages_client_on_claude_sends_its_body_with_vertex_s_version_and_no_model():
    body = {"model": CLAUDE, "max_tokens": 5, "messages": TURN, "top_k": 3, "thinking": {"type": "adaptive"}}
    call = _call("/messages", body, model=CLAUDE, client_headers={"anthropic-beta": "context-1m-2025-08-07"})
    assert call.url.endswith(f"/publishers/anthropic/models/{CLAUDE}:rawPredict")
    assert call.payload == {
        **{k: v for k, v in body.items() if k != "model"},
        "anthropic_version": ANTHROPIC_VERSION,
    }
    assert call.headers["anthropic-beta"] == "context-1m-2025-08-07"
    assert "x-api-key" not in call.headers and "anthropic-version" not in call.headers
    streamed = _call("/messages", {**body, "stream": True}, model=CLAUDE)
    assert streamed.url.endswith(":streamRawPredict") and streamed.payload["stream"] is True


def test_a_chat_client_on_claude_is_translated_as_for_anthropic():
    call = _call("/chat/completions", {"messages": [{"role": "system", "content": "s"}, *TURN]}, model=CLAUDE)
    assert call.payload["system"] == "s" and "model" not in call.payload
    assert call.payload["anthropic_version"] == ANTHROPIC_VERSION
    assert call.answer is not None  # the Messages answer comes back as a Chat completion


def test_a_messages_client_on_a_gemini_model_gets_gemini_s_translation():
    """top_k and thinking reach generateContent as for `gemini` (tests/proxy/test_translate_fidelity)."""
    body = {"model": GEMINI, "max_tokens": 64, "messages": TURN, "top_k": 3, "thinking": {"type": "adaptive"}}
    on_vertex = _call("/messages", body, model=GEMINI).payload
    target = Target(1, "g", 1, "gemini", "http://127.0.0.1:9/v1beta", "")
    on_gemini = upstream_call(
        "/messages", target, body, model=GEMINI, requirements=Requirements(), credential="k", created=1
    )
    assert on_vertex == on_gemini.payload
    assert on_vertex["generationConfig"]["topK"] == 3


def test_thought_signatures_reach_gemini_models_only():
    signed = signed_id("call_1", "c2lnbmF0dXJl")
    history = [
        *TURN,
        {
            "role": "assistant",
            "tool_calls": [{"id": signed, "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": signed, "content": "r"},
    ]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    gemini_part = _call("/chat/completions", {"messages": history, "tools": tools}, model=GEMINI).payload[
        "contents"
    ][1]["parts"][0]
    assert gemini_part["thoughtSignature"] == "c2lnbmF0dXJl"
    claude = _call("/chat/completions", {"messages": history, "tools": tools}, model=CLAUDE).payload
    assert claude["messages"][1]["content"][0]["id"] == "call_1"
    assert claude["messages"][2]["content"][0]["tool_use_id"] == "call_1"


def test_model_garden_pages_keep_the_gemini_models():
    page = vertex.PROVIDER.model_page(
        {
            "publisherModels": [
                {"name": "publishers/google/models/gemini-2.5-pro"},
                {"name": "publishers/google/models/imagen-4.0-generate-001"},
            ],
            "nextPageToken": "t2",
        }
    )
    assert (page.ids, page.next_query) == (["gemini-2.5-pro"], {"pageToken": "t2"})
    assert vertex.PROVIDER.model_page({}).ids == []  # a project with no model lists none
    with pytest.raises(ValueError):
        vertex.PROVIDER.model_page({"publisherModels": [{"name": "models/x"}]})


# -- end to end -------------------------------------------------------------------------------------


@pytest.fixture
def vertex_then_openai(transactional_db, fake_upstream_factory, monkeypatch):
    """Pool `main`: a Vertex account in us-east5 (tier 0), then an OpenAI-shaped account (tier 1), both for
    the Gemini and the Claude model; the key file in a GATEWAY_UPSTREAM_ variable."""
    google = VertexFake(models=(GEMINI, CLAUDE)).start()
    monkeypatch.setenv("GATEWAY_UPSTREAM_VERTEX", google.key_file())
    GatewaySettings.objects.update_or_create(pk=1, defaults={"backoff_base_ms": 0})
    other = fake_upstream_factory("openai", models=(GEMINI, CLAUDE))
    pool = PoolFactory(name="main")
    for tier, (name, adapter, base_url, env) in enumerate(
        (
            ("vertex", Adapter.VERTEX, f"{google.endpoint}/v1", "GATEWAY_UPSTREAM_VERTEX"),
            ("openai", Adapter.OPENAI, other.base_url, ""),
        )
    ):
        row = AssignmentFactory(
            pool=pool,
            name=name,
            adapter=adapter,
            base_url=base_url,
            tier=tier,
            api_key_env=env,
            region="us-east5",
        )
        for model in (GEMINI, CLAUDE):
            CatalogEntryFactory(assignment=row, model=model, provenance=Provenance.CONFIGURED)
    GatewayKeyFactory(name="e2e", raw_key=GATEWAY_KEY, pools=[pool])
    yield google, other
    google_oauth.forget(google.key_file())  # a later test's fake has another key file, but the same digest
    google.stop()


def _openai(gateway: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway}/v1", api_key=GATEWAY_KEY, max_retries=0)


def _anthropic(gateway: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway, api_key=GATEWAY_KEY, max_retries=0)


def _attempts() -> list[Attempt]:
    writer.flush()
    return list(Attempt.objects.order_by("request_id", "ordinal"))


def _api_hits(fake: VertexFake) -> list:
    return [hit for hit in fake.hits if hit.path != "/token"]


@pytest.mark.parametrize("model", [GEMINI, CLAUDE])
def test_one_exchange_serves_every_call_until_the_token_expires(gateway, vertex_then_openai, model):
    google, other = vertex_then_openai
    client = _openai(gateway)
    for _ in range(3):
        assert (
            client.chat.completions.create(model=model, messages=TURN).choices[0].message.content
            == "hello from vertex"
        )
    chunks = list(client.chat.completions.create(model=model, messages=TURN, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "hello from vertex"
    assert google.exchanges == 1
    hits = _api_hits(google)
    assert len(hits) == 4 and len({hit.headers["authorization"] for hit in hits}) == 1
    publisher = "anthropic" if model == CLAUDE else "google"
    assert hits[0].path.startswith(
        f"/v1/projects/{google.project}/locations/us-east5/publishers/{publisher}/"
    )
    assert other.hits == []


def test_an_expired_token_is_exchanged_again(gateway, vertex_then_openai):
    google, _ = vertex_then_openai
    google.token_lifetime_s = 60  # within google-auth's refresh margin: expired as soon as it is given
    client = _openai(gateway)
    for _ in range(2):
        client.chat.completions.create(model=GEMINI, messages=TURN)
    assert google.exchanges == 2


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "sse"])
def test_a_messages_client_on_claude_reaches_raw_predict_with_its_own_body(
    gateway, vertex_then_openai, stream
):
    google, _ = vertex_then_openai
    client = _anthropic(gateway)
    kw = {
        "model": CLAUDE,
        "max_tokens": 20,
        "system": "be brief",
        "messages": TURN,
        "extra_body": {"top_k": 5},
    }
    if stream:
        with client.messages.stream(**kw) as events:
            assert "".join(events.text_stream) == "hello from vertex"
    else:
        assert client.messages.create(**kw).content[0].text == "hello from vertex"
    body = _api_hits(google)[-1].body
    assert body["anthropic_version"] == ANTHROPIC_VERSION and "model" not in body
    assert (body["system"], body["top_k"]) == ("be brief", 5)


@pytest.mark.parametrize("model", [GEMINI, CLAUDE])
def test_a_responses_client_is_served_through_chat(gateway, vertex_then_openai, model):
    client = _openai(gateway)
    answer = client.responses.create(model=model, input="hi", instructions="be brief")
    assert answer.output_text == "hello from vertex"
    events = list(client.responses.create(model=model, input="hi", stream=True))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "hello from vertex"
    assert events[-1].type == "response.completed"


@pytest.mark.parametrize("model", [GEMINI, CLAUDE])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "sse"])
def test_a_quota_429_fails_over_on_either_publisher(gateway, vertex_then_openai, model, stream):
    google, _ = vertex_then_openai
    google.script(model, gemini.resource_exhausted())
    response = _openai(gateway).chat.completions.with_raw_response.create(
        model=model, messages=TURN, stream=stream
    )
    assert response.headers["x-gateway-attempts"] == "2"
    first = wait_for(lambda: [a for a in _attempts() if a.ordinal == 1], what="the attempts")
    assert [(a.status, a.failure_class) for a in first] == [("retryable_failed", "rate_limited")]


def test_a_revoked_token_is_a_credential_failure_and_is_not_kept(gateway, vertex_then_openai):
    google, _ = vertex_then_openai
    client = _openai(gateway)
    client.chat.completions.create(model=GEMINI, messages=TURN)
    google.revoke_tokens()
    answer = client.chat.completions.create(model=GEMINI, messages=TURN)
    assert answer.choices[0].message.content == "hello from openai"
    assert [(a.ordinal, a.failure_class) for a in _attempts()][1:] == [(1, "credential_rejected"), (2, "")]
    assert google_oauth.cached_token(google.key_file()) is None  # the next call exchanges again


@pytest.mark.parametrize("broken", ["revoked key", "not a key file", "no project"])
def test_a_key_file_google_refuses_fails_over_with_nothing_sent_to_the_api(
    gateway, vertex_then_openai, monkeypatch, broken
):
    google, _ = vertex_then_openai
    if broken == "revoked key":
        google.revoke_key()
    else:
        info = json.loads(google.key_file())
        monkeypatch.setenv(
            "GATEWAY_UPSTREAM_VERTEX",
            "{not json" if broken == "not a key file" else json.dumps({**info, "project_id": ""}),
        )
    answer = _openai(gateway).chat.completions.create(model=CLAUDE, messages=TURN)
    assert answer.choices[0].message.content == "hello from openai"
    assert _api_hits(google) == []
    assert [a.failure_class for a in _attempts()] == ["credential_rejected", ""]


def test_an_unreachable_token_endpoint_is_unavailable_nothing_sent(gateway, vertex_then_openai, monkeypatch):
    google, _ = vertex_then_openai
    info = json.loads(google.key_file())
    monkeypatch.setenv(
        "GATEWAY_UPSTREAM_VERTEX", json.dumps({**info, "token_uri": "http://127.0.0.1:9/token"})
    )
    answer = _openai(gateway).chat.completions.create(model=GEMINI, messages=TURN)
    assert answer.choices[0].message.content == "hello from openai"
    assert [a.failure_class for a in _attempts()] == ["unavailable", ""]
    assert google.hits == []


@pytest.mark.parametrize("model", [GEMINI, CLAUDE])
def test_a_project_the_account_cannot_use_is_a_credential_failure(gateway, vertex_then_openai, model):
    """Vertex's 403 PERMISSION_DENIED (IAM), in Google's envelope on either publisher."""
    google, _ = vertex_then_openai
    Assignment.objects.filter(name="vertex").update(base_url=f"{google.endpoint}/v1/projects/someone-else")
    answer = _openai(gateway).chat.completions.create(model=model, messages=TURN)
    assert answer.choices[0].message.content == "hello from openai"
    assert [a.failure_class for a in _attempts()] == ["credential_rejected", ""]


def test_an_unknown_model_is_a_model_failure_only_another_model_may_take(gateway, vertex_then_openai):
    google, other = vertex_then_openai
    google.models = (GEMINI,)  # the project lost Claude
    with pytest.raises(openai.NotFoundError):
        _openai(gateway).chat.completions.create(model=CLAUDE, messages=TURN)
    assert other.hits == []  # a bare 404 crosses only to another model (SPEC §5.6)
    assert [a.failure_class for a in _attempts()] == ["model_not_found_cross"]


def test_discovery_lists_model_garden_s_gemini_models_with_the_account_s_token(vertex_then_openai):
    google, _ = vertex_then_openai
    google.models = (GEMINI, "gemini-2.5-pro", CLAUDE)
    Assignment.objects.filter(name="vertex").update(discovery=True)
    assert catalog_sync(assignment="vertex").results[0].ok
    (listing,) = [hit for hit in google.hits if hit.path != "/token"]
    assert listing.path == "/v1beta1/publishers/google/models"
    assert listing.headers["authorization"].startswith("Bearer ya29.")
    found = dict(CatalogEntry.objects.filter(assignment__name="vertex").values_list("model", "provenance"))
    assert found == {GEMINI: "configured", CLAUDE: "configured", "gemini-2.5-pro": "observed"}


def test_discovery_with_a_refused_key_keeps_what_was_discovered(vertex_then_openai):
    google, _ = vertex_then_openai
    google.models = (GEMINI, "gemini-2.5-pro")
    Assignment.objects.filter(name="vertex").update(discovery=True)
    assert catalog_sync(assignment="vertex").results[0].ok
    google_oauth.forget(google.key_file())
    google.revoke_key()
    (failed,) = catalog_sync(assignment="vertex").results
    assert (failed.ok, failed.reason, failed.preserved) == (False, "credential refused", 1)


def test_no_key_file_or_token_reaches_a_log_or_the_ledger(gateway, vertex_then_openai, caplog):
    """Canary: the key file's private key and every token issued, through an answer, a token the API
    refuses and an exchange Google refuses, are in no log line (any logger, any level) and no ledger row."""
    import logging

    from proxy.ledger.models import RequestRecord

    google, _ = vertex_then_openai
    caplog.set_level(logging.DEBUG)
    client = _openai(gateway)
    client.chat.completions.create(model=CLAUDE, messages=TURN)
    issued = list(google._tokens)
    google.revoke_tokens()
    client.chat.completions.create(model=GEMINI, messages=TURN)
    google.revoke_key()
    client.chat.completions.create(model=GEMINI, messages=TURN)
    writer.flush()
    private_key = json.loads(google.key_file())["private_key"]
    secrets = [line for line in private_key.splitlines() if "PRIVATE KEY" not in line][:3] + issued
    rows = json.dumps([list(RequestRecord.objects.values()), list(Attempt.objects.values())], default=str)
    assert issued and all(secret not in caplog.text and secret not in rows for secret in secrets)


# -- the Responses websocket (SPEC §6.3) --------------------------------------------------------------

WS_TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}
WS_TOOLS = [{"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}]


def _ws_turn(ws, **body) -> list[dict]:
    ws.send(json.dumps({"type": "response.create", **body}))
    events = []
    while events == [] or events[-1]["type"] not in WS_TERMINAL:
        events.append(json.loads(ws.recv(timeout=10)))
    writer.flush(timeout=10)
    return events


def _ws(gateway: str):
    from websockets.sync.client import connect

    url = gateway.replace("http://", "ws://") + "/v1/responses"
    return connect(url, additional_headers={"authorization": f"Bearer {GATEWAY_KEY}"}, open_timeout=5)


@pytest.mark.parametrize("model", [GEMINI, CLAUDE])
def test_a_websocket_conversation_is_served_by_either_publisher_and_continues(
    gateway, vertex_then_openai, model
):
    """Over the websocket route a Vertex account is dispatched over HTTP (its stream operation) and its
    translated events are sent as frames; the next turn continues with `previous_response_id` from the
    connection's memory, the whole conversation reaching Vertex."""
    google, other = vertex_then_openai
    with _ws(gateway) as ws:
        first = _ws_turn(ws, model=model, input="hi", instructions="be brief")
        second = _ws_turn(ws, model=model, input="again", previous_response_id=first[-1]["response"]["id"])
    for events in (first, second):
        assert events[-1]["type"] == "response.completed", events[-1]
        deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        assert deltas == "hello from vertex"
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
    hits = _api_hits(google)
    operation = "streamRawPredict" if model == CLAUDE else "streamGenerateContent"
    assert len(hits) == 2 and all(hit.path.endswith(f"/{model}:{operation}") for hit in hits)
    turns = hits[-1].body["messages"] if model == CLAUDE else hits[-1].body["contents"]
    assert [turn["role"] for turn in turns] == (
        ["user", "assistant", "user"] if model == CLAUDE else ["user", "model", "user"]
    )
    assert other.hits == [] and google.exchanges == 1


@pytest.mark.parametrize("model", [GEMINI, CLAUDE])
def test_a_websocket_turn_vertex_refuses_before_output_fails_over_to_a_native_account(
    gateway, vertex_then_openai, model
):
    """A quota 429 from Vertex before any output: the frame goes to the next account (OpenAI, over its own
    websocket) inside the same client connection, the client seeing one response; that upstream connection
    has served, so the next frame is pinned to it (SPEC §6.3)."""
    google, other = vertex_then_openai
    google.script(model, gemini.resource_exhausted())
    with _ws(gateway) as ws:
        events = _ws_turn(ws, model=model, input="hi")
        after = _ws_turn(ws, model=model, input="again")
    assert [e["type"] for e in events].count("response.created") == 1  # the failed attempt's are withheld
    assert events[-1]["type"] == "response.completed", events[-1]
    assert (
        "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        == "hello from openai"
    )
    assert after[-1]["type"] == "response.completed"
    assert len(_api_hits(google)) == 1 and other.ws_connections == 1
    first = [a for a in _attempts() if a.ordinal == 1]
    assert (first[0].status, first[0].failure_class) == ("retryable_failed", "rate_limited")


@pytest.mark.parametrize("model", [GEMINI, CLAUDE])
def test_a_websocket_turn_fails_over_to_a_second_vertex_account(
    gateway, vertex_then_openai, monkeypatch, model
):
    """The second account is Vertex too (another project, its own key file). A frame dispatched over HTTP
    leaves no live upstream connection: the next one is routed afresh, and goes to the second account
    straight away (the 429 demoted the first, SPEC §5.6)."""
    google, other = vertex_then_openai
    second = VertexFake("vertex-b", models=(GEMINI, CLAUDE), project="proj-b").start()
    try:
        monkeypatch.setenv("GATEWAY_UPSTREAM_VERTEX_B", second.key_file())
        Assignment.objects.filter(name="openai").update(tier=2)
        pool = Assignment.objects.get(name="vertex").pool
        row = AssignmentFactory(
            pool=pool,
            name="vertex-b",
            adapter=Adapter.VERTEX,
            base_url=f"{second.endpoint}/v1",
            tier=1,
            api_key_env="GATEWAY_UPSTREAM_VERTEX_B",
            region="us-east5",
        )
        CatalogEntryFactory(assignment=row, model=model, provenance=Provenance.CONFIGURED)
        google.script(model, gemini.resource_exhausted())
        with _ws(gateway) as ws:
            turns = [_ws_turn(ws, model=model, input=said) for said in ("hi", "again")]
        for events in turns:
            assert [e["type"] for e in events].count("response.created") == 1
            assert events[-1]["type"] == "response.completed", events[-1]
            deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
            assert deltas == "hello from vertex-b"
        assert len(_api_hits(google)) == 1 and len(_api_hits(second)) == 2
        assert all(f"/projects/{second.project}/" in hit.path for hit in _api_hits(second))
        assert other.hits == [] and other.ws_connections == 0
    finally:
        google_oauth.forget(second.key_file())
        second.stop()

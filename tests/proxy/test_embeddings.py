"""`POST /v1/embeddings` (plain, with failover like chat) and `GET /v1/models/{id}` (SPEC §4), driven by the
openai SDK against the gateway over real sockets."""

import httpx
import openai
import pytest

from catalog.models import Provenance
from devkit.behaviours import rate_limited, serve, unavailable
from pools.models import Adapter
from proxy.ledger.models import Attempt, RequestRecord
from proxy.ledger.recorder import writer
from tests.factories import AssignmentFactory, CatalogEntryFactory, GatewayKeyFactory, PoolFactory
from tests.gateway_fixtures import GATEWAY_KEY


def _client(gateway: str, key: str = GATEWAY_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway}/v1", api_key=key, max_retries=0)


@pytest.mark.parametrize("rejection", [rate_limited(), unavailable()], ids=["429", "503"])
def test_an_embeddings_request_fails_over_before_any_output(gateway, priced, rejection):
    a, b, _ = priced
    a.script("gpt-5", rejection)
    b.script("gpt-5", serve(input_tokens=7))
    answer = _client(gateway).embeddings.with_raw_response.create(model="gpt-5", input=["one", "two"])
    vectors = answer.parse().data
    assert [len(v.embedding) for v in vectors] == [8, 8]  # the SDK decoded the base64 it asked for
    assert answer.headers["x-gateway-attempts"] == "2"
    assert (a.hits[-1].path, b.hits[-1].path) == ("/v1/embeddings", "/v1/embeddings")
    assert b.hits[-1].body["input"] == ["one", "two"]
    writer.flush()
    record = RequestRecord.objects.get()
    assert (record.route, record.outcome, record.retry_count) == ("/v1/embeddings", "ok", 1)
    attempts = Attempt.objects.filter(request=record).order_by("ordinal")
    assert [x.status for x in attempts] == ["retryable_failed", "succeeded"]
    assert (attempts[1].input_tokens, attempts[1].output_tokens) == (7, 0)
    assert attempts[1].cost_micros == 7  # 7 tokens at 1 $/Mtok: an embedding's cost is known


@pytest.fixture
def priced(two_assignments):
    from catalog.models import CatalogEntry

    CatalogEntry.objects.update(input_per_mtok_micros=1_000_000, output_per_mtok_micros=0)
    return two_assignments


def test_embeddings_ignore_a_stream_flag_and_stay_plain(gateway, two_assignments):
    response = httpx.post(
        f"{gateway}/v1/embeddings",
        json={"model": "gpt-5", "input": "x", "stream": True},
        headers={"authorization": f"Bearer {GATEWAY_KEY}"},
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    writer.flush()
    assert RequestRecord.objects.get().transport == "http"


def test_embeddings_are_never_sent_to_an_anthropic_account(gateway, transactional_db, fake_upstream_factory):
    fake = fake_upstream_factory("claude", models=("gpt-5",))
    pool = PoolFactory(name="anthropic-only")
    assignment = AssignmentFactory(
        pool=pool, name="claude", base_url=fake.base_url, adapter=Adapter.ANTHROPIC
    )
    CatalogEntryFactory(assignment=assignment, model="gpt-5", provenance=Provenance.CONFIGURED)
    GatewayKeyFactory(name="k", raw_key=GATEWAY_KEY, pools=[pool])
    with pytest.raises(openai.APIStatusError) as refused:
        _client(gateway).embeddings.create(model="gpt-5", input="x")
    assert refused.value.status_code == 503
    assert (refused.value.code, refused.value.param) == ("no_eligible_backend", "capability")
    assert fake.hits == []


def test_a_listed_model_is_retrieved_and_any_other_is_not_found(gateway, two_assignments):
    _, _, (acct_a, _) = two_assignments
    CatalogEntryFactory(assignment=acct_a, model="openai/gpt-5-mini", provenance=Provenance.OBSERVED)
    client = _client(gateway)
    retrieved = client.models.with_raw_response.retrieve("gpt-5")
    assert retrieved.http_response.json() == {
        "id": "gpt-5",
        "object": "model",
        "created": 0,
        "owned_by": "gateway",
    }
    assert retrieved.parse().id == "gpt-5"
    assert client.models.retrieve("openai/gpt-5-mini").id == "openai/gpt-5-mini"  # ids with a slash
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-4")
    assert (missing.value.code, missing.value.param) == ("model_not_found", "model")
    with pytest.raises(openai.AuthenticationError):
        _client(gateway, key="sk-gw-not-a-key-000000000").models.retrieve("gpt-5")


def test_a_model_outside_the_keys_allow_list_is_not_found(gateway, two_assignments):
    from pools.models import GatewayKey

    GatewayKey.objects.update(allowed_models=["gpt-5-mini"])
    with pytest.raises(openai.NotFoundError):
        _client(gateway).models.retrieve("gpt-5")

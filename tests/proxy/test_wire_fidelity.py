"""Retry hints, ids and messages on the wire (SPEC §4), driven through the official SDKs with their
default retries on: what the SDK does with a typed error is what a client really experiences."""

import anthropic
import openai
import pytest

from catalog.models import CatalogEntry
from devkit.behaviours import error, rate_limited, serve, unavailable
from pools.models import ConfigVersion
from proxy.ingress import typed_response
from proxy.ledger.models import RequestRecord
from proxy.ledger.recorder import writer
from proxy.upstream import retry_after_s
from routing.policy.errors import ErrorCode
from tests.gateway_fixtures import GATEWAY_KEY
from tests.proxy.fixtures_e2e import CHAT, assert_hits, attempts_of, post, record_of

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
MESSAGES = {"model": "gpt-5", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def sdk(gateway):
    # The SDK's own default: two retries on 408/409/429/5xx unless told `x-should-retry: false`.
    with openai.OpenAI(base_url=f"{gateway}/v1", api_key=GATEWAY_KEY, timeout=15) as client:
        assert client.max_retries == 2
        yield client


def _records() -> list[RequestRecord]:
    writer.flush()
    return list(RequestRecord.objects.all())


def test_a_504_dispatch_unknown_reaches_the_upstream_once_through_sdk_retries(sdk, two_assignments):
    a, b, _ = two_assignments
    a.script("gpt-5", unavailable(504))  # a proxy's 504: the provider may have executed it
    with pytest.raises(openai.APIStatusError) as raised:
        sdk.chat.completions.create(model="gpt-5", messages=CHAT["messages"])
    assert raised.value.status_code == 504
    assert raised.value.body["code"] == "upstream_dispatch_unknown"
    assert raised.value.response.headers["x-should-retry"] == "false"
    assert_hits((a, 1), (b, 0))
    [record] = _records()  # the SDK called the gateway once: no retry of a non-idempotent unknown
    assert raised.value.request_id == record.request_id


def test_a_503_capability_hold_is_not_retried_by_the_sdk(sdk, two_assignments):
    a, b, _ = two_assignments  # neither declares tool support: a tool turn has no eligible route
    with pytest.raises(openai.APIStatusError) as raised:
        sdk.chat.completions.create(model="gpt-5", messages=CHAT["messages"], tools=TOOLS)
    assert raised.value.status_code == 503
    assert (raised.value.body["code"], raised.value.body["param"]) == ("no_eligible_backend", "capability")
    assert raised.value.body["message"] == "no eligible backend: capability"
    assert_hits((a, 0), (b, 0))
    [record] = _records()
    assert raised.value.request_id == record.request_id


def test_a_relayed_429_keeps_a_bounded_retry_after_and_invites_a_retry(gateway, two_assignments):
    a, b, _ = two_assignments
    a.script("gpt-5", rate_limited("7"))
    b.script("gpt-5", rate_limited("99999"))
    response = post(gateway, "/v1/chat/completions", CHAT)
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "rate_limit_exceeded"
    # The last candidate's failure is the one relayed, and its retry-after is bounded to an hour.
    assert (response.headers["retry-after"], response.headers["x-should-retry"]) == ("3600", "true")
    a.script("gpt-5", serve("ok"))
    served = post(gateway, "/v1/chat/completions", CHAT)
    assert served.status_code == 200
    assert "x-should-retry" not in served.headers and "retry-after" not in served.headers


def test_a_relayed_client_error_says_do_not_retry(gateway, two_assignments):
    a, _, _ = two_assignments
    a.script("gpt-5", error(400, {"error": {"type": "invalid_request_error", "code": "bad_field"}}))
    response = post(gateway, "/v1/chat/completions", CHAT)
    assert response.status_code == 400
    assert response.headers["x-should-retry"] == "false"


def test_every_proxied_answer_carries_the_request_id_under_the_sdk_names(gateway, two_assignments):
    for response in (
        post(gateway, "/v1/chat/completions", CHAT),
        post(gateway, "/v1/chat/completions", {**CHAT, "stream": True}),
        post(gateway, "/v1/chat/completions", {"model": 5}),
        post(gateway, "/v1/messages", MESSAGES, auth=False),
    ):
        rid = response.headers["x-gateway-request-id"]
        assert len(rid) == 32
        assert response.headers["x-request-id"] == rid == response.headers["request-id"]


def test_the_anthropic_sdk_reads_the_request_id_and_the_condition(gateway, two_assignments):
    client = anthropic.Anthropic(base_url=gateway, api_key=GATEWAY_KEY, timeout=15)
    with client, pytest.raises(anthropic.APIStatusError) as raised:
        client.messages.create(**MESSAGES, tools=[{"name": "f", "input_schema": {"type": "object"}}])
    assert raised.value.status_code == 503
    assert raised.value.body["error"]["message"] == "no eligible backend: capability"
    [record] = _records()  # not retried: x-should-retry false
    assert raised.value.request_id == record.request_id


def test_an_anthropic_client_gets_the_documented_prompt_too_long_wording(gateway, two_assignments):
    CatalogEntry.objects.update(context_window=50)
    big = {**MESSAGES, "messages": [{"role": "user", "content": "word " * 400}]}
    response = post(gateway, "/v1/messages", big)
    assert response.status_code == 503
    message = response.json()["error"]["message"]
    tokens = int(message.split("prompt is too long: ")[1].split(" tokens")[0])
    assert (
        message == f"no eligible backend: context_window (prompt is too long: {tokens} tokens > 50 maximum)"
    )
    assert tokens > 50
    openai_shaped = post(gateway, "/v1/chat/completions", {**CHAT, "messages": big["messages"]})
    assert openai_shaped.json()["error"]["message"] == "no eligible backend: context_window"


def test_a_relayed_context_overflow_speaks_the_clients_api(gateway, two_assignments):
    a, b, _ = two_assignments
    overflow = error(
        400,
        {"error": {"type": "invalid_request_error", "code": "context_length_exceeded", "message": "x"}},
    )
    a.script("gpt-5", overflow)
    client = anthropic.Anthropic(base_url=gateway, api_key=GATEWAY_KEY, timeout=15)
    with client, pytest.raises(anthropic.BadRequestError) as raised:
        client.messages.create(**MESSAGES)
    assert raised.value.body["error"]["message"].startswith("prompt is too long")
    assert raised.value.response.headers["x-should-retry"] == "false"
    response = post(gateway, "/v1/chat/completions", CHAT)
    assert response.json()["error"]["code"] == "context_length_exceeded"
    assert "maximum context length" in response.json()["error"]["message"]
    assert_hits((a, 2), (b, 0))


@pytest.mark.parametrize(
    ("code", "param", "expected"),
    [
        ("invalid_request", None, False),
        ("request_too_large", None, False),
        ("permission_denied", None, False),
        ("model_not_found", None, False),
        ("upstream_dispatch_unknown", None, False),
        ("no_eligible_backend", "capability", False),
        ("no_eligible_backend", "budget", False),
        ("no_eligible_backend", "circuit_open", True),
        ("gateway_unavailable", None, True),
    ],
)
def test_x_should_retry_follows_the_spec_table(code, param, expected):
    assert ErrorCode(code).should_retry(param) is expected
    response = typed_response("/v1/chat/completions", ErrorCode(code), param)
    assert response["x-should-retry"] == ("true" if expected else "false")
    assert response.status_code == ErrorCode(code).status


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("7", 7),
        ("0.2", 1),
        ("-3", 0),
        ("99999", 3600),
        ("soon", None),
        ("nan", None),
        ("", None),
        (None, None),
    ],
)
def test_retry_after_is_whole_seconds_bounded_to_an_hour(value, expected):
    assert retry_after_s(value) == expected


def test_a_failed_attempt_with_usage_is_charged_and_the_operation_id_links_it(
    gateway, two_assignments, admin_client
):
    a, b, _ = two_assignments
    CatalogEntry.objects.update(input_per_mtok_micros=1_000_000, output_per_mtok_micros=2_000_000)
    usage = {"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150}
    a.script("gpt-5", error(503, {"error": {"type": "server_error", "code": None}, "usage": usage}))
    b.script("gpt-5", serve("ok", input_tokens=10, output_tokens=5))
    response = post(
        gateway, "/v1/chat/completions", CHAT, headers={"x-gateway-operation-id": "op-42.retry:1"}
    )
    assert response.status_code == 200
    assert response.headers["x-gateway-operation-id"] == "op-42.retry:1"
    record = record_of(response)
    assert record.operation_id == "op-42.retry:1"
    failed, served = attempts_of(record)
    assert (failed.status, failed.input_tokens, failed.output_tokens, failed.cost_micros) == (
        "retryable_failed",
        100,
        50,
        200,
    )
    assert (served.input_tokens, served.output_tokens, served.cost_micros) == (10, 5, 20)
    version = ConfigVersion.objects.get().value
    assert failed.config_version == served.config_version == version

    found = admin_client.get("/admin/proxy/requestrecord/", {"q": "op-42.retry:1"}).content.decode()
    assert record.request_id in found  # operators look an operation up by its id

    plain = post(gateway, "/v1/chat/completions", CHAT)
    assert plain.headers["x-gateway-operation-id"] == plain.headers["x-gateway-request-id"]
    assert record_of(plain).operation_id == plain.headers["x-gateway-request-id"]


@pytest.mark.parametrize("value", ["has space", "x" * 65, "semi;colon", ""])
def test_a_malformed_operation_id_is_a_typed_400(gateway, two_assignments, value):
    a, _, _ = two_assignments
    response = post(gateway, "/v1/chat/completions", CHAT, headers={"x-gateway-operation-id": value})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "x-gateway-operation-id"
    assert a.hit_count() == 0

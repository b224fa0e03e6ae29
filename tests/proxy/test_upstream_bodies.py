"""Upstream bodies (SPEC §6.0, §4): read decompressed, relayed whole, or a typed 502 when too large.

The fakes compress like ordinary servers whenever the gateway's request offers gzip/deflate (it
offers both: `proxy.upstream.ACCEPT_ENCODING`), so every test here also proves the gateway decodes what
it asked for.
"""

import hashlib
import json

import httpx
import pytest

from devkit.behaviours import large, model_not_found, serve, unavailable
from tests.proxy.fixtures_e2e import (
    AUTH,
    CHAT,
    RESPONSES,
    assert_hits,
    attempts_of,
    chat_text,
    post,
    record_of,
    responses_text,
    sse_events,
)

MIB = 1024 * 1024
BIG_TIMEOUT = httpx.Timeout(120.0)


def test_the_fake_compresses_what_it_answers_when_offered(fake_upstream):
    offered = httpx.post(
        f"{fake_upstream.base_url}/chat/completions", json=CHAT, headers={"accept-encoding": "gzip"}
    )
    assert offered.headers["content-encoding"] == "gzip"
    assert offered.json()["object"] == "chat.completion"
    fake_upstream.compression = "deflate"
    deflated = httpx.post(
        f"{fake_upstream.base_url}/chat/completions", json=CHAT, headers={"accept-encoding": "gzip, deflate"}
    )
    assert deflated.headers["content-encoding"] == "deflate"
    plain = httpx.post(
        f"{fake_upstream.base_url}/chat/completions", json=CHAT, headers={"accept-encoding": "identity"}
    )
    assert "content-encoding" not in plain.headers


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_compressed_plain_answers_are_relayed_decoded_with_usage(gateway, two_assignments, coding):
    a, _, _ = two_assignments
    a.compression = coding
    a.script("gpt-5", serve("compressed hello", input_tokens=7, output_tokens=3))
    response = post(gateway, "/v1/chat/completions", CHAT)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "compressed hello"
    assert "gzip" in a.hits[0].headers["accept-encoding"]
    [attempt] = attempts_of(record_of(response))
    assert (attempt.input_tokens, attempt.output_tokens) == (7, 3)


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
def test_compressed_streams_are_relayed_decoded(gateway, two_assignments, coding, path):
    a, _, _ = two_assignments
    a.compression = coding
    a.script("gpt-5", serve("streamed through gzip"))
    body = {**(CHAT if path.endswith("completions") else RESPONSES), "stream": True}
    response = post(gateway, path, body)
    assert response.status_code == 200
    events = sse_events(response.text)
    text = chat_text(events) if path.endswith("completions") else responses_text(events)
    assert text == "streamed through gzip"


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_compressed_error_body_is_classified_and_failed_over(gateway, two_assignments, coding, stream):
    a, b, _ = two_assignments
    a.compression = b.compression = coding
    a.script("gpt-5", model_not_found())
    b.script("gpt-5", serve("served by b"))
    response = post(gateway, "/v1/chat/completions", {**CHAT, "stream": stream})
    assert response.status_code == 200
    assert "served" in response.text
    assert_hits((a, 1), (b, 1))
    attempts = attempts_of(record_of(response))
    assert [(x.status, x.failure_class, x.error_code) for x in attempts] == [
        ("retryable_failed", "model_unavailable", "model_not_found"),
        ("succeeded", "", ""),
    ]


def test_a_compressed_final_error_is_relayed_with_its_canonical_fields(gateway, two_assignments):
    a, b, _ = two_assignments
    a.script("gpt-5", unavailable(503))
    b.script("gpt-5", model_not_found())
    response = post(gateway, "/v1/chat/completions", CHAT)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"


def _big(gateway) -> httpx.Response:
    return httpx.post(f"{gateway}/v1/chat/completions", json=CHAT, headers=AUTH, timeout=BIG_TIMEOUT)


@pytest.mark.parametrize("size", [2 * MIB, 60 * MIB])
def test_a_large_plain_answer_arrives_byte_identical(gateway, two_assignments, size):
    a, b, _ = two_assignments
    a.script("gpt-5", large(size))
    response = _big(gateway)
    assert response.status_code == 200
    assert [hashlib.sha256(response.content).hexdigest()] == a.answer_digests
    assert len(response.json()["choices"][0]["message"]["content"]) == size
    assert_hits((a, 1), (b, 0))
    [attempt] = attempts_of(record_of(response))
    assert attempt.status == "succeeded" and attempt.output_tokens is not None  # usage read, charged


def test_an_answer_over_the_limit_is_a_typed_502_never_a_truncated_200(gateway, two_assignments):
    a, b, _ = two_assignments
    a.script("gpt-5", large(70 * MIB))
    response = _big(gateway)
    assert response.status_code == 502
    error = response.json()["error"]
    assert (error["code"], error["type"]) == ("upstream_response_too_large", "upstream_error")
    assert_hits((a, 1), (b, 0))  # the upstream completed it: never replayed
    record = record_of(response)
    assert (record.outcome, record.status_code) == ("upstream_response_too_large", 502)
    [attempt] = attempts_of(record)
    assert (attempt.status, attempt.dispatch_state) == ("failed", "completed")


def test_the_limit_is_counted_after_decoding(gateway, two_assignments, settings):
    # 3 MiB of one letter gzips to a few KiB: the decoded size is what counts (a compression bomb
    # stops at the limit, and the limit is never read as the wire size).
    settings.GATEWAY_MAX_RESPONSE_BYTES = 2 * MIB
    a, _, _ = two_assignments
    a.script("gpt-5", large(3 * MIB), large(MIB))
    response = post(gateway, "/v1/chat/completions", CHAT)
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_response_too_large"
    response = post(gateway, "/v1/chat/completions", CHAT)
    assert response.status_code == 200
    assert len(json.loads(response.content)["choices"][0]["message"]["content"]) == MIB
    [attempt] = attempts_of(record_of(response))
    assert attempt.status == "succeeded"

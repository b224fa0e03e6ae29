"""proxy/wire/apis/registry.py: every client route has its API, whose envelope the gateway's own errors take,
and every stream dialect the API whose visibility rule classifies it."""

import json

import pytest

from proxy.ingress import DIALECTS
from proxy.wire.apis import chat, messages, responses
from proxy.wire.apis.registry import BY_DIALECT, api_for
from proxy.wire.sse import Dialect
from routing.policy.errors import ErrorCode
from routing.policy.vocabulary import ClientRoute


@pytest.mark.parametrize(
    ("route", "api", "dialect"),
    [
        (ClientRoute.CHAT_COMPLETIONS, chat.API, Dialect.CHAT),
        (ClientRoute.RESPONSES, responses.API, Dialect.RESPONSES),
        (ClientRoute.RESPONSES_COMPACT, responses.API, Dialect.RESPONSES),
        (ClientRoute.MESSAGES, messages.API, Dialect.ANTHROPIC),
        (ClientRoute.COUNT_TOKENS, messages.API, Dialect.ANTHROPIC),
        (ClientRoute.EMBEDDINGS, chat.API, Dialect.CHAT),
        (ClientRoute.FILES, chat.API, Dialect.CHAT),
    ],
)
def test_each_route_has_its_api(route, api, dialect):
    assert api_for(route) is api and api.dialect is dialect


@pytest.mark.parametrize("code", sorted(ErrorCode))
def test_a_gateway_code_reads_as_its_own_type_in_openai_and_as_the_mapped_type_in_anthropic(code):
    status = code.status
    assert chat.API.error_type(code, code=code, status=status, param=None) == code
    mapped = messages.API.error_type(code, code=code, status=status, param=None)
    assert mapped == messages.error_type(code, status=status)
    assert mapped in messages.ERROR_TYPE_NAMES


def test_an_upstreams_anthropic_type_is_kept_and_an_openai_one_is_mapped_for_anthropic_clients():
    assert (
        messages.API.error_type("overloaded_error", code=None, status=529, param=None) == "overloaded_error"
    )
    assert messages.API.error_type("server_error", code=None, status=503, param=None) == "api_error"
    assert responses.API.error_type("server_error", code=None, status=503, param=None) == "server_error"


def test_the_envelopes():
    openai = json.loads(chat.API.error_body(type="t", code="c", param="p", message="m"))
    assert openai == {"error": {"message": "m", "type": "t", "code": "c", "param": "p"}}
    anthropic = json.loads(messages.API.error_body(type="api_error", code="c", param="p", message="m"))
    assert anthropic == {"type": "error", "error": {"type": "api_error", "message": "m"}}


@pytest.mark.parametrize(
    ("api", "event"),
    [(chat.API, None), (responses.API, "error"), (messages.API, "error")],
)
def test_each_api_frames_its_streams_terminal_error(api, event):
    block = api.error_event(type="api_error", code="c", param=None, message="m", status=500).decode()
    assert block.startswith("event: error\n" if event else "data: ")
    assert '"message":"m"' in block


def test_every_stream_dialect_is_framed_by_one_client_api():
    assert dict(BY_DIALECT) == {
        Dialect.CHAT: chat.API,
        Dialect.RESPONSES: responses.API,
        Dialect.ANTHROPIC: messages.API,
    }


def test_the_routes_that_stream_are_framed_in_their_apis_dialect():
    # count_tokens is a Messages route that never streams: its `stream` field is not the gateway's.
    assert DIALECTS == {
        ClientRoute.CHAT_COMPLETIONS: Dialect.CHAT,
        ClientRoute.RESPONSES: Dialect.RESPONSES,
        ClientRoute.RESPONSES_COMPACT: Dialect.RESPONSES,
        ClientRoute.MESSAGES: Dialect.ANTHROPIC,
    }


def test_every_route_with_its_own_api_is_relayed():
    # The one list of relayed routes (the edge's PROXIED, routing_explain's choices) misses none of them.
    from proxy.wire.apis.registry import APIS, RELAYED

    assert set(APIS) <= set(RELAYED)

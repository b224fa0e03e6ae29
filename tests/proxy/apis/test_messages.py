"""proxy/wire/apis/messages.py: the Messages turn's requirements, error envelopes."""

from __future__ import annotations

import json
import typing
from typing import Any

import anthropic
import httpx2
import pytest
from anthropic.types.shared.error_type import ErrorType

from proxy.wire.apis import messages as adapter
from proxy.wire.translations.token_estimate import IMAGE_TOKENS
from routing.policy.errors import ErrorCode
from routing.policy.types import Requirements
from tests.proxy.test_translate import ANTHROPIC_ADVERSARIAL

# ---------------------------------------------------------------------------------------------------
# turn_requirements

IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
# A body of 4,000 bytes with that image: its 32 characters of strings count the image's documented cost.
WITH_IMAGE = (4000 - 32) // 4 + IMAGE_TOKENS
TOOL = {"name": "delete_file", "input_schema": {"type": "object"}}


def user(*blocks: Any) -> dict[str, Any]:
    return {"role": "user", "content": list(blocks)}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, {}),
        ({"messages": [], "tools": [TOOL]}, {"tools_offered": True}),
        ({"messages": [], "tools": []}, {}),
        (
            {"messages": [user({"type": "tool_result", "tool_use_id": "t", "content": "x"})]},
            {"untrusted_content": True},
        ),
        (
            {"messages": [user({"type": "web_search_tool_result", "tool_use_id": "t", "content": []})]},
            {"untrusted_content": True},
        ),
        ({"messages": [user({"type": "text", "text": "tool_result"})]}, {}),
        ({"messages": [user(IMAGE)]}, {"vision": True, "prompt_tokens": WITH_IMAGE}),
        (
            {"messages": [user({"type": "tool_result", "tool_use_id": "t", "content": [IMAGE]})]},
            {"untrusted_content": True, "vision": True, "prompt_tokens": WITH_IMAGE},
        ),
        # An image in assistant history is still image input to the next turn.
        (
            {"messages": [{"role": "assistant", "content": [IMAGE]}]},
            {"vision": True, "prompt_tokens": WITH_IMAGE},
        ),
        ({"messages": [], "max_tokens": 2048}, {"max_output_tokens": 2048}),
        ({"messages": [], "max_tokens": True}, {}),
        ({"messages": [], "max_tokens": -5}, {}),
        # Malformed shapes never crash the gate; the upstream or the translator refuses them.
        ({"messages": "hi"}, {}),
        ({"messages": [None, {"role": "user", "content": None}, user("not a block")]}, {}),
    ],
)
def test_turn_requirements(body: dict[str, Any], expected: dict[str, Any]) -> None:
    assert adapter.turn_requirements(body, 4000) == Requirements(**{"prompt_tokens": 1000, **expected})


def test_turn_requirements_for_the_adversarial_fixture() -> None:
    size = len(json.dumps(ANTHROPIC_ADVERSARIAL).encode())
    requirements = adapter.turn_requirements(ANTHROPIC_ADVERSARIAL, size)
    assert requirements == Requirements(
        tools_offered=True, untrusted_content=True, prompt_tokens=size // 4, max_output_tokens=512
    )


# ---------------------------------------------------------------------------------------------------
# Errors

SDK_ERROR_TYPES = set(typing.get_args(ErrorType)) | {"request_too_large"}


@pytest.mark.parametrize(
    ("code", "status", "param", "expected"),
    [
        ("invalid_request", 400, None, "invalid_request_error"),
        ("authentication_error", 401, None, "authentication_error"),
        ("permission_denied", 403, None, "permission_error"),
        ("model_not_found", 404, None, "not_found_error"),
        ("file_assignment_conflict", 409, None, "invalid_request_error"),
        ("request_too_large", 413, None, "request_too_large"),
        ("no_eligible_backend", 503, "circuit_open", "overloaded_error"),
        ("no_eligible_backend", 503, "capability", "api_error"),
        ("no_eligible_backend", 503, "privacy", "api_error"),
        ("pin_unavailable", 503, None, "api_error"),
        ("gateway_unavailable", 503, None, "api_error"),
        ("upstream_dispatch_unknown", 504, None, "timeout_error"),
        # Sanitized upstream failures: the status decides, never an OpenAI type or code.
        ("rate_limit_exceeded", 429, None, "rate_limit_error"),
        ("insufficient_quota", 429, None, "rate_limit_error"),
        (None, 402, None, "billing_error"),
        (None, 404, None, "not_found_error"),
        (None, 422, None, "invalid_request_error"),
        (None, 500, None, "api_error"),
        (None, 502, None, "api_error"),
        (None, 529, None, "overloaded_error"),
    ],
)
def test_error_type(code: str | None, status: int, param: str | None, expected: str) -> None:
    assert adapter.error_type(code, status=status, param=param) == expected


@pytest.mark.parametrize("code", sorted(ErrorCode))
def test_every_gateway_code_has_an_anthropic_type(code: ErrorCode) -> None:
    # A typed code added without a decision here would fall back to the status table silently.
    assert code in adapter.ERROR_TYPES or code == "no_eligible_backend"
    assert adapter.error_type(code, status=code.status) in SDK_ERROR_TYPES


def test_error_body_is_the_anthropic_envelope() -> None:
    body = adapter.error_body("not_found_error", "No route serves this model.")
    assert json.loads(body) == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "No route serves this model."},
    }


@pytest.mark.parametrize(
    ("status", "code", "exception"),
    [
        (400, "invalid_request", anthropic.BadRequestError),
        (401, "authentication_error", anthropic.AuthenticationError),
        (403, "permission_denied", anthropic.PermissionDeniedError),
        (404, "model_not_found", anthropic.NotFoundError),
        (503, "no_eligible_backend", anthropic.InternalServerError),
    ],
)
def test_error_body_parses_in_the_anthropic_sdk(status: int, code: str, exception: type[Exception]) -> None:
    kind = adapter.error_type(code, status=status)
    body = adapter.error_body(kind, "The gateway's own words.")

    # This anthropic SDK runs on httpx2; MockTransport is fine for adapter unit tests (STYLE.md).
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(status, headers={"content-type": "application/json"}, content=body)

    client = anthropic.Anthropic(
        api_key="test",
        base_url="http://gateway.test",
        max_retries=0,
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
    )
    with pytest.raises(exception) as info:
        client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    error = info.value
    assert isinstance(error, anthropic.APIStatusError)
    assert error.status_code == status
    assert error.body == {"type": "error", "error": {"type": kind, "message": "The gateway's own words."}}

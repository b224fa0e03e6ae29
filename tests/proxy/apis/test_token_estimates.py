"""SPEC §5.3: a turn's prompt estimate counts an image or file part at its documented token cost, never
by its base64 length, in every client API (pure: proxy/wire/apis/*,
proxy/wire/translations/token_estimate.py)."""

import base64
import json

import pytest

from proxy.wire.apis.chat import turn_requirements as chat_turn
from proxy.wire.apis.messages import turn_requirements as messages_turn
from proxy.wire.translations.token_estimate import FILE_TOKENS, IMAGE_TOKENS, estimate_input_tokens
from routing.policy.eligibility import evaluate
from routing.policy.types import Candidate, IneligibleReason, TriState

# About 600 KB of base64: one photo from a phone, which its bytes / 4 would count as 150,000 tokens.
DATA = base64.b64encode(bytes(range(256)) * 1800).decode()
PNG = f"data:image/png;base64,{DATA}"
PDF = f"data:application/pdf;base64,{DATA}"
WINDOW_128K = Candidate(assignment_id=1, model="gpt-5", context_window=128_000, vision=TriState.TRUE)

CHAT_IMAGE = {"type": "image_url", "image_url": {"url": PNG, "detail": "high"}}
CHAT_IMAGE_URL = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
CHAT_FILE = {"type": "file", "file": {"filename": "a.pdf", "file_data": PDF}}
RESPONSES_IMAGE = {"type": "input_image", "image_url": PNG}
RESPONSES_FILE = {"type": "input_file", "filename": "a.pdf", "file_data": PDF}
MESSAGES_IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": DATA}}
MESSAGES_IMAGE_URL = {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}
MESSAGES_PDF = {
    "type": "document",
    "source": {"type": "base64", "media_type": "application/pdf", "data": DATA},
}


def _chat(*parts: dict) -> dict:
    return {
        "model": "gpt-5",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, *parts]}],
    }


def _responses(*parts: dict) -> dict:
    return {
        "model": "gpt-5",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}, *parts]}],
    }


def _messages(*blocks: dict) -> dict:
    content = [{"type": "text", "text": "hi"}, *blocks]
    return {"model": "claude", "max_tokens": 64, "messages": [{"role": "user", "content": content}]}


def _size(body: dict) -> int:
    return len(json.dumps(body).encode())


def _requirements(body: dict):
    return (messages_turn if "max_tokens" in body else chat_turn)(body, _size(body))


# (body, the documented cost of its media)
ONE_PART = [
    pytest.param(_chat(CHAT_IMAGE), IMAGE_TOKENS, id="chat-image-data-url"),
    pytest.param(_chat(CHAT_IMAGE_URL), IMAGE_TOKENS, id="chat-image-https-url"),
    pytest.param(_chat(CHAT_FILE), FILE_TOKENS, id="chat-file"),
    pytest.param(_responses(RESPONSES_IMAGE), IMAGE_TOKENS, id="responses-input-image"),
    pytest.param(_responses(RESPONSES_FILE), FILE_TOKENS, id="responses-input-file"),
    pytest.param(_messages(MESSAGES_IMAGE), IMAGE_TOKENS, id="messages-image-base64"),
    pytest.param(_messages(MESSAGES_IMAGE_URL), IMAGE_TOKENS, id="messages-image-url"),
    pytest.param(_messages(MESSAGES_PDF), FILE_TOKENS, id="messages-document"),
]


@pytest.mark.parametrize(("body", "cost"), ONE_PART)
def test_an_image_or_file_counts_its_documented_cost_not_its_base64(body, cost):
    r = _requirements(body)
    # The rest of the body (a few hundred bytes of JSON) at four bytes a token, plus the part's cost.
    assert cost <= r.prompt_tokens < cost + 100


@pytest.mark.parametrize(
    ("body", "cost"), [p for p in ONE_PART if p.id not in ("chat-image-https-url", "messages-image-url")]
)
def test_a_600_kb_image_or_file_is_eligible_on_a_128k_model(body, cost):
    assert _size(body) > 600_000  # by its bytes it would be 150,000 tokens: over the window
    assert evaluate(WINDOW_128K, _requirements(body)).eligible


@pytest.mark.parametrize(
    ("body", "count"),
    [
        pytest.param(_chat(*[CHAT_IMAGE] * 5), 5, id="chat"),
        pytest.param(_responses(*[RESPONSES_IMAGE] * 5), 5, id="responses"),
        pytest.param(_messages(*[MESSAGES_IMAGE] * 5), 5, id="messages"),
    ],
)
def test_many_images_add_up(body, count):
    r = _requirements(body)
    assert count * IMAGE_TOKENS <= r.prompt_tokens < count * IMAGE_TOKENS + 50 * count
    assert r.vision


def test_an_image_a_tool_returned_counts_and_asks_for_vision():
    result = {"type": "tool_result", "tool_use_id": "t1", "content": [MESSAGES_IMAGE]}
    r = _requirements(_messages(result))
    assert (r.vision, r.untrusted_content) == (True, True)
    assert IMAGE_TOKENS <= r.prompt_tokens < IMAGE_TOKENS + 100


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(_chat({"type": "text", "text": "word " * 120_000}), id="chat"),
        pytest.param(_messages({"type": "text", "text": "word " * 120_000}), id="messages"),
        # A document whose source is text is text: counted by its size.
        pytest.param(
            _messages(
                {
                    "type": "document",
                    "source": {"type": "text", "media_type": "text/plain", "data": "word " * 120_000},
                }
            ),
            id="messages-text-document",
        ),
    ],
)
def test_text_still_counts_by_its_size(body):
    r = _requirements(body)
    assert r.prompt_tokens >= 150_000
    assert not r.vision
    assert evaluate(WINDOW_128K, r).reasons == (IneligibleReason.CONTEXT_WINDOW,)


def test_count_tokens_counts_a_document_at_its_documented_cost():
    assert FILE_TOKENS <= estimate_input_tokens(_messages(MESSAGES_PDF)) < FILE_TOKENS + 100

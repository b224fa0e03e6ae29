"""SPEC §5.3 over real sockets: a request carrying a 600 KB image reaches a 128k-window model (its
image counts its documented tokens, not its base64 bytes / 4 = 150,000), and text still counts."""

import base64

import pytest

from catalog.models import CatalogEntry
from pools.models import Assignment
from tests.proxy.fixtures_e2e import CHAT, assert_hits, post

DATA = base64.b64encode(bytes(range(256)) * 1800).decode()  # about 600 KB of base64
CHAT_IMAGE = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{DATA}"}}
MESSAGES_IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": DATA}}


@pytest.fixture
def window_128k(two_assignments):
    a, b, _ = two_assignments
    Assignment.objects.update(vision="true")
    CatalogEntry.objects.update(context_window=128_000)
    return a, b


@pytest.mark.parametrize(
    ("path", "body"),
    [
        pytest.param(
            "/v1/chat/completions",
            {**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, CHAT_IMAGE]}]},
            id="chat",
        ),
        pytest.param(
            "/v1/messages",
            {"model": "gpt-5", "max_tokens": 64, "messages": [{"role": "user", "content": [MESSAGES_IMAGE]}]},
            id="messages",
        ),
    ],
)
def test_a_600_kb_image_is_served_by_a_128k_model(gateway, window_128k, path, body):
    a, b = window_128k
    response = post(gateway, path, body)
    assert response.status_code == 200, response.text
    assert_hits((a, 1), (b, 0))


def test_text_over_the_window_is_still_refused(gateway, window_128k):
    a, b = window_128k
    response = post(
        gateway,
        "/v1/chat/completions",
        {**CHAT, "messages": [{"role": "user", "content": "word " * 120_000}]},
    )
    assert response.status_code == 503
    assert (response.json()["error"]["code"], response.json()["error"]["param"]) == (
        "no_eligible_backend",
        "context_window",
    )
    assert_hits((a, 0), (b, 0))

"""proxy.edge's pure parts."""

from proxy.edge import headers_of


def test_headers_have_lowercase_names_and_a_repeated_one_keeps_every_value():
    """A client may send a list-valued header twice (two `anthropic-beta` lines): both values reach the
    request path, comma-joined as Django's `request.headers` joined them, never only the last."""
    scope = {
        "headers": [
            (b"Anthropic-Beta", b"context-1m-2025-08-07"),
            (b"authorization", b"Bearer sk-1"),
            (b"anthropic-beta", b"interleaved-thinking-2025-05-14"),
        ]
    }
    assert headers_of(scope) == {
        "anthropic-beta": "context-1m-2025-08-07,interleaved-thinking-2025-05-14",
        "authorization": "Bearer sk-1",
    }

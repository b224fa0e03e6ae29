"""What a client API module gives the gateway: the `ClientApi` protocol.

PURE. A client API (Chat Completions, Responses, Anthropic Messages) decides, for the requests that
arrive in it, what the turn needs from any route (SPEC §5.3), which events of its streams show output
(SPEC §6.2), and how the gateway's own errors reach its clients: the error type its SDK knows, the plain
error envelope, and the terminal error event of its streams (SPEC §4). The message is always the
gateway's own words, never a provider's.
"""

from typing import Any, Protocol

from proxy.wire.sse import Block, Dialect, Visibility
from routing.policy.types import Requirements

Json = dict[str, Any]  # a parsed JSON object


class ClientApi(Protocol):
    @property
    def forwarded_headers(self) -> tuple[str, ...]:
        """Its clients' request headers (lowercase names) that reach the provider's call: those of its
        protocol an upstream of the same API must see to answer as asked (Anthropic's `anthropic-beta`).
        Every other client header stays at the gateway."""
        ...

    @property
    def dialect(self) -> Dialect:
        """How its streams are framed (`proxy.wire.sse`)."""
        ...

    def visibility(self, block: Block, payload: Json) -> Visibility:
        """Its streams' visibility rule (SPEC §6.2) for one event whose data is a JSON object: what
        `proxy.wire.sse.classify` cannot decide for every API alike."""
        ...

    def turn_requirements(self, body: Json, body_size: int) -> Requirements:
        """What this turn needs from any route (SPEC §5.3)."""
        ...

    def error_type(self, type: str, *, code: str | None, status: int, param: str | None) -> str:
        """The error type its clients are shown for a gateway code (`type == code`) or an upstream's
        sanitized failure (`type` as the upstream said it, `status` its status)."""
        ...

    def error_body(self, *, type: str, code: str | None, param: str | None, message: str) -> bytes:
        """Its plain error envelope; `type` already as `error_type` gives it."""
        ...

    def error_event(
        self, *, type: str, code: str | None, param: str | None, message: str, status: int | None
    ) -> bytes:
        """Its streams' terminal error event (one SSE block); `type` already as `error_type` gives it."""
        ...

"""Which conversation a request continues, for the soft cache affinity (SPEC §5.4, §7.2).

Contract: `conversation_key` names the session a request belongs to, or None. The client's own
`x-gateway-session` wins; else, with the pool features on, the conversation keys the clients already
send: the Responses API's `prompt_cache_key`, the agents' session headers (Claude Code's
`x-claude-code-session-id`, Codex's `session-id` and `thread-id`, OpenCode's `x-session-affinity` and
`x-session-id`), and last an Anthropic `metadata.user_id` together with the conversation's first user
turn (one user id holds many conversations; its first turn tells them apart). A provider's prompt
cache is per account, so a conversation that keeps its account keeps its cache warm.

A derived key is a digest: the affinity row never holds a client's id or a word of its prompt, and
two sources never name the same session by accident. Affinities are namespaced per gateway key by
their owner (§7.2), so two keys' equal ids never meet.
"""

import hashlib
import json
from collections.abc import Mapping

from routing.policy.types import AFFINITY_KEY_MAX

# The agents' own session headers, in the order they are tried.
SESSION_HEADERS = (
    "x-claude-code-session-id",
    "session-id",
    "thread-id",
    "x-session-affinity",
    "x-session-id",
)
MAX_TURN_CHARS = 1 << 16  # how much of a first user turn names a conversation (the rest adds nothing)


def _digest(source: str, value: str) -> str:
    return f"{source}:" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def _first_user_turn(body: Mapping[str, object]) -> str | None:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            text = content if isinstance(content, str) else json.dumps(content, sort_keys=True, default=str)
            return text[:MAX_TURN_CHARS]
    return None


def conversation_key(
    headers: Mapping[str, str], body: Mapping[str, object] | None, *, derived: bool
) -> str | None:
    """The session key of this request (at most AFFINITY_KEY_MAX characters), or None. `derived`: read
    the clients' own keys too (`GATEWAY_POOL_FEATURES`); else only `x-gateway-session` names one."""
    named = headers.get("x-gateway-session")
    if named:
        return named[:AFFINITY_KEY_MAX]
    if not derived:
        return None
    if body is not None:
        cache_key = body.get("prompt_cache_key")
        if isinstance(cache_key, str) and cache_key:
            return _digest("pck", cache_key)
    for name in SESSION_HEADERS:
        value = headers.get(name)
        if value:
            return _digest(name, value)
    if body is not None:
        metadata = body.get("metadata")
        user = metadata.get("user_id") if isinstance(metadata, dict) else None
        if isinstance(user, str) and user:
            turn = _first_user_turn(body)
            if turn is not None:
                return _digest("user", f"{user}\n{turn}")
    return None

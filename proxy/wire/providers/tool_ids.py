"""Tool-call ids the gateway gives for upstreams that give none, and the Gemini thought signatures they
carry back and forth (issue 48).

PURE: standard library only.

- An id the upstream does not give is derived from its answer (`derived_id`): the answer's id and the
  call's position in it, so two answers of one conversation never repeat an id (Gemini's own `call_0`,
  `call_1` restart every answer) and the same answer always gives the same ids.
- Gemini 3 attaches a `thoughtSignature` to a function-call part and refuses (400 INVALID_ARGUMENT) the
  next step when it does not come back unchanged on that very part. The gateway keeps no conversation, so
  the signature rides inside the id the client is shown and gives back with the call's history and its
  result: `<id>__ts_<the signature's UTF-8 bytes in unpadded base64url>` (`signed_id`). Every character
  is in `[A-Za-z0-9_-]`, the alphabet Anthropic's `tool_use` ids must keep, so a Messages client returns
  it as it was shown; the encoding is of the signature's exact bytes, so it is restored byte for byte.
  A part without a signature (the second call of parallel calls) keeps a plain id.
- Only a Gemini account reads a signature back (`split_id`); before any other account's request, every
  signed id of the conversation is cut back to its plain id (`strip_signatures`), call and result alike,
  so they still pair, and the other provider sees an ordinary id (OpenAI caps ids at 40 characters).
"""

import base64
import binascii
import hashlib
import re
from typing import Any

MARK = "__ts_"
_SIGNED = re.compile(r"(?P<base>[A-Za-z0-9_-]+?)__ts_(?P<sig>[A-Za-z0-9_-]+)")


def derived_id(response_id: str, ordinal: int) -> str:
    """The id of the `ordinal`-th call of the answer named `response_id` (unique per answer)."""
    digest = hashlib.sha256(f"{response_id}\x00{ordinal}".encode()).hexdigest()[:24]
    return f"call_{digest}"


def signed_id(call_id: str, signature: object) -> str:
    """`call_id` carrying `signature` (a string Gemini gave), or `call_id` when there is none."""
    if not isinstance(signature, str) or not signature:
        return call_id
    encoded = base64.urlsafe_b64encode(signature.encode()).rstrip(b"=").decode()
    return f"{call_id}{MARK}{encoded}"


def split_id(value: str) -> tuple[str, str | None]:
    """(the plain id, the signature it carries or None); an id that does not decode carries none."""
    found = _SIGNED.fullmatch(value)
    if found is None:
        return value, None
    sig = found["sig"]
    try:
        signature = base64.urlsafe_b64decode(sig + "=" * (-len(sig) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return value, None
    return found["base"], signature


def _plain(value: object) -> object:
    return split_id(value)[0] if isinstance(value, str) and MARK in value else value


# Where a message of each client route's history holds tool-call ids: (its list, the ids' keys there).
_INNER = (("tool_calls", ("id",)), ("content", ("id", "tool_use_id")))  # Chat's calls, Messages' blocks


def _rewrite(item: object, keys: tuple[str, ...]) -> object:
    """`item` with its signed ids under `keys` cut to plain ids; `item` itself when it has none."""
    if not isinstance(item, dict) or not any(isinstance(item.get(k), str) and MARK in item[k] for k in keys):
        return item
    return {**item, **{k: _plain(item[k]) for k in keys if k in item}}


def _rewrite_all(items: list[Any], keys: tuple[str, ...]) -> list[Any] | None:
    """The rewritten list, or None when nothing in it changed."""
    rewritten = [_rewrite(i, keys) for i in items]
    return rewritten if any(a is not b for a, b in zip(rewritten, items, strict=True)) else None


def _rewrite_message(message: object) -> object:
    message = _rewrite(message, ("tool_call_id",))  # a Chat tool result
    if not isinstance(message, dict):
        return message
    for key, keys in _INNER:
        inner = message.get(key)
        if isinstance(inner, list) and (rewritten := _rewrite_all(inner, keys)) is not None:
            message = {**message, key: rewritten}
    return message


def strip_signatures(body: dict[str, Any]) -> dict[str, Any]:
    """`body` (a Chat, Messages or Responses request) with every signed tool-call id cut to its plain id;
    `body` itself (no copy) when it holds none, which is the common case."""
    messages = body.get("messages")
    if isinstance(messages, list):
        out = [_rewrite_message(m) for m in messages]
        changed = any(a is not b for a, b in zip(out, messages, strict=True))
        return {**body, "messages": out} if changed else body
    items = body.get("input")  # Responses: function_call and function_call_output items
    if isinstance(items, list) and (rewritten := _rewrite_all(items, ("call_id",))) is not None:
        return {**body, "input": rewritten}
    return body

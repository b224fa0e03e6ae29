"""What the API does before it reads a request body (SPEC §11): a client without a key, or with a
body over the limit, costs no more than its headers.

- `body_refusal`: from the headers alone, whether the body should be read at all: an over-limit
  `content-length` (`request_too_large`) or a missing or unknown gateway key (`authentication_error`).
  Keys already seen valid are remembered for a short while, so a healthy request adds no database
  trip; the request path's own key lookup (with its pools and config version) stays authoritative,
  so a key disabled meanwhile is still refused after its body.
- `read_body`: the body read as a stream, refused the moment it passes `limit`, with a timeout for
  each part and for the whole (a client that drips its body is dropped). Reusable by any route with
  its own limit (uploads).
"""

import asyncio
import hmac
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

from django.conf import settings
from django.db import DatabaseError

from pools.models import hash_key
from pools.selectors import key_known_sql, key_params
from routing.policy.errors import ErrorCode
from routing.policy.vocabulary import ClientRoute
from runtime import db, loopdb

Receive = Callable[[], Awaitable[dict]]

READ_TIMEOUT_S = 5.0  # the request path's reads take milliseconds; past this the database is gone
KNOWN_KEY_TTL_S = 60.0
KNOWN_KEY_LIMIT = 10_000  # only keys that exist are remembered, so an attacker cannot grow this
# Key digest -> monotonic time until which it is taken as known, the least recently used first: past
# the limit that one is forgotten, so the keys in use stay known however many others exist.
_known_keys: OrderedDict[str, float] = OrderedDict()


class BodyTooLarge(Exception):
    """The body passed its limit; the rest of it was not read."""


class BodyTimeout(Exception):
    """The client sent its body too slowly."""


class ClientGone(Exception):
    """The client disconnected before its body was complete."""


UPLOAD_PATH = ClientRoute.FILES


def body_limit(path: str) -> int:
    """The largest body accepted on `path` (a file upload has its own limit)."""
    return settings.GATEWAY_MAX_UPLOAD_BYTES if path == UPLOAD_PATH else settings.GATEWAY_MAX_BODY_BYTES


def headers_of(scope: Mapping) -> dict[str, str]:
    """An ASGI scope's headers as a dict of lowercase names; a repeated header's values joined by commas,
    as Django's `request.headers` joins them."""
    headers: dict[str, str] = {}
    for raw_name, raw_value in scope["headers"]:
        name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
        headers[name] = f"{headers[name]},{value}" if name in headers else value
    return headers


def declared_length(headers: Mapping[str, str]) -> int | None:
    """The `content-length` a client declared; None when absent or not a number (the server's parser
    refuses a malformed one before the application sees it)."""
    raw = headers.get("content-length")
    if raw is None or not raw.strip().isdigit():
        return None
    return int(raw)


def has_body(headers: Mapping[str, str]) -> bool:
    length = declared_length(headers)
    return bool(length) or "chunked" in headers.get("transfer-encoding", "").lower()


def read_timeout_s(headers: Mapping[str, str]) -> float:
    """How long a read before dispatch may take: the client's deadline if it set a shorter one."""
    raw = headers.get("x-gateway-deadline-ms")
    if raw is None:  # the usual case, spared the exception below
        return READ_TIMEOUT_S
    try:
        asked = int(raw) / 1000
    except ValueError:
        return READ_TIMEOUT_S
    # A malformed deadline is refused with a 400 later; it must not shorten this read first.
    return min(asked, READ_TIMEOUT_S) if asked > 0 else READ_TIMEOUT_S


def _remember(digest: str, now: float) -> None:
    _known_keys[digest] = now + KNOWN_KEY_TTL_S
    _known_keys.move_to_end(digest)
    if len(_known_keys) > KNOWN_KEY_LIMIT:
        _known_keys.popitem(last=False)


def known_keys_clear() -> None:
    _known_keys.clear()


async def key_is_known(raw: str, timeout_s: float = READ_TIMEOUT_S) -> bool:
    """Whether `raw` is an enabled gateway key: from memory when it was seen valid lately, else one
    indexed lookup on the event loop's connection (runtime.loopdb; on runtime.db's threads when it has
    none to give). Raises DatabaseError when the database cannot answer (within `timeout_s`)."""
    if not raw:
        return False
    digest = hash_key(raw)
    now = time.monotonic()
    until = _known_keys.get(digest)
    if until is not None and until > now:
        _known_keys.move_to_end(digest)
        return True
    sql, params = key_known_sql(), key_params(digest)
    rows = await loopdb.rows_within(timeout_s, sql, params)
    # The lookup is by an index on the digest; the final comparison is constant-time regardless.
    if any(
        hmac.compare_digest(current, digest) | hmac.compare_digest(previous or "", digest)
        for current, previous in rows
    ):
        _remember(digest, now)
        return True
    return False


async def body_refusal(path: str, headers: Mapping[str, str], raw_key: str) -> str | None:
    """The typed code that refuses this request before its body is read, or None to read it.

    A database that does not answer within the request's deadline refuses it `gateway_unavailable`
    (the request path's own lookup would only wait for it a second time); one that refuses the
    connection refuses nothing here: the request path's own lookup then answers in its place."""
    length = declared_length(headers)
    if length is not None and length > body_limit(path):
        return ErrorCode.REQUEST_TOO_LARGE
    if not has_body(headers):
        return None
    try:
        known = await key_is_known(raw_key, read_timeout_s(headers))
    except db.DatabaseTimeout:
        return ErrorCode.GATEWAY_UNAVAILABLE
    except DatabaseError:
        return None
    return None if known else ErrorCode.AUTHENTICATION_ERROR


async def iter_body(
    receive: Receive, *, limit: int, idle_timeout_s: float, total_timeout_s: float
) -> AsyncIterator[bytes]:
    """The ASGI request body as it arrives, at most `limit` bytes. Raises BodyTooLarge as soon as more
    arrived (the rest is never read), BodyTimeout when one part takes longer than `idle_timeout_s` or
    the whole longer than `total_timeout_s`, ClientGone on a disconnect."""
    size = 0
    deadline = time.monotonic() + total_timeout_s
    while True:
        wait = min(idle_timeout_s, deadline - time.monotonic())
        if wait <= 0:
            raise BodyTimeout
        try:
            async with asyncio.timeout(wait):  # not wait_for: it would wrap each receive in a task
                message = await receive()
        except TimeoutError:
            raise BodyTimeout from None
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            return


async def read_body(receive: Receive, *, limit: int, idle_timeout_s: float, total_timeout_s: float) -> bytes:
    """The whole body (`iter_body`'s rules), for the JSON routes."""
    chunks = iter_body(receive, limit=limit, idle_timeout_s=idle_timeout_s, total_timeout_s=total_timeout_s)
    return b"".join([chunk async for chunk in chunks])

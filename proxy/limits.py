"""Per-key limits (SPEC §3 `limits: {rpm, tpm, concurrent}`), enforced across every node.

Semantics (README "Per-key limits"):
- `rpm`: requests admitted per UTC clock minute (a fixed window: the count starts again at every
  minute's :00). The request that would exceed it is refused; `retry-after` is the seconds left in
  the minute.
- `tpm`: tokens (input + output, as the upstream reported them) of the requests that ENDED in the
  current UTC clock minute. A request is refused while that minute's tokens have reached the limit;
  a request under way is never cut off, so a minute may end above the limit by one request's tokens.
- `concurrent`: requests in flight at once. A slot is a lease: its node renews it while the request
  runs (every LEASE_S / 3) and frees it when the request ends in any way (answer, failure, client
  disconnect, exception); a node that dies without freeing it loses it after LEASE_S.

A request is admitted after it is routed and before anything is sent upstream; only admitted requests
count. Refused: typed 429 `rate_limit_exceeded`, `param` naming the limit, `retry-after`.

Where the counts live: in Redis when REDIS_URL is set (one Lua script checks and counts in one step),
else in the database (`KeyLimitWindow`, `KeyLimitSlot`) with single conditional upserts, never a read
and then a write. A key without limits never gets here: its limits come with the key's own row
(`pools.selectors.key_authenticate`), so it pays no round trip.
"""

import asyncio
import contextlib
import logging
import math
import secrets
import time
import weakref
from collections.abc import Awaitable, Callable

from django.conf import settings
from django.db import DatabaseError, connection

from pools.models import KeyLimitSlot, KeyLimitWindow
from pools.selectors import KeyLimits
from runtime import db, rawsql

log = logging.getLogger("gateway")

LEASE_S = 60.0  # a concurrency slot's lease; renewed every LEASE_S / 3 while its request runs
WINDOW_S = 60
DB_WAIT_S = 5.0  # the longest an admission waits for the database (a shorter deadline bounds it more)
clock: Callable[[], float] = time.time  # the wall clock the windows and leases are read from (tests)


class LimitExceeded(Exception):
    def __init__(self, limit: str, retry_after: int) -> None:
        super().__init__(limit)
        self.limit, self.retry_after = limit, retry_after


class LimitsUnavailable(Exception):
    """The store of the counts (Redis or the database) did not answer: the key cannot be admitted."""


def _minute(now: float) -> int:
    return int(now // WINDOW_S)


def _window_retry_after(now: float) -> int:
    return max(1, math.ceil((_minute(now) + 1) * WINDOW_S - now))


# --- the database ---------------------------------------------------------------------------------


def _tables() -> tuple[str, str]:
    return KeyLimitWindow._meta.db_table, KeyLimitSlot._meta.db_table


def _window_take(key_id: int, minute: int, limits: KeyLimits) -> str | None:
    """Count one request in `minute` unless the minute is full; None when admitted, else the limit."""
    window, _ = _tables()
    conditions, params = [], [key_id, minute]
    if limits.rpm is not None:
        conditions.append(f"{window}.requests < %s")
        params.append(limits.rpm)
    if limits.tpm is not None:
        conditions.append(f"{window}.tokens < %s")
        params.append(limits.tpm)
    rows = rawsql.fetch(
        f"INSERT INTO {window} (key_id, minute, requests, tokens) VALUES (%s, %s, 1, 0) "  # noqa: S608
        f"ON CONFLICT (key_id, minute) DO UPDATE SET requests = {window}.requests + 1 "
        f"WHERE {' AND '.join(conditions)} RETURNING requests",
        params,
    )
    if rows:
        if rows[0][0] == 1:  # the minute's first request: the key's earlier minutes are of no use now
            stale = f"DELETE FROM {window} WHERE key_id = %s AND minute < %s RETURNING 1"  # noqa: S608
            rawsql.fetch(stale, [key_id, minute])
        return None
    seen = rawsql.fetch(
        f"SELECT requests, tokens FROM {window} WHERE key_id = %s AND minute = %s",  # noqa: S608
        [key_id, minute],
    )
    requests = seen[0][0] if seen else 0
    return "rpm" if limits.rpm is not None and requests >= limits.rpm else "tpm"


def _slot_take(key_id: int, limit: int, lease: str, now: float) -> int | None:
    """Take a free (or expired) slot below `limit` with one upsert; None when all are held.

    Two requests may pick the same free slot: the upsert's condition lets one win, and the other,
    finding fewer live slots than the limit, tries again. Each lost try means another request took a
    slot, so `limit` tries are enough never to refuse while a slot is free."""
    _, slot = _tables()
    now_param = rawsql.as_param(_utc(now))
    until = rawsql.as_param(_utc(now + LEASE_S))
    for _ in range(limit):
        rows = rawsql.fetch(
            "WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s WHERE i + 1 < %s) "  # noqa: S608
            f"INSERT INTO {slot} (key_id, slot, lease, expires_at) "
            "SELECT %s, s.i, %s, %s FROM s WHERE NOT EXISTS "
            f"(SELECT 1 FROM {slot} t WHERE t.key_id = %s AND t.slot = s.i AND t.expires_at > %s) "
            "ORDER BY s.i LIMIT 1 "
            f"ON CONFLICT (key_id, slot) DO UPDATE SET lease = excluded.lease, "
            f"expires_at = excluded.expires_at WHERE {slot}.expires_at <= %s RETURNING slot",
            [limit, key_id, lease, until, key_id, now_param, now_param],
        )
        if rows:
            return rows[0][0]
        live = rawsql.fetch(
            f"SELECT COUNT(*) FROM {slot} WHERE key_id = %s AND slot < %s AND expires_at > %s",  # noqa: S608
            [key_id, limit, now_param],
        )
        if live[0][0] >= limit:
            return None
    return None


def _utc(ts: float):
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ts, UTC)


def db_admit(key_id: int, limits: KeyLimits, lease: str, now: float) -> tuple[str | None, int | None]:
    """(the limit that refused, None) or (None, the slot taken or None): one thread hop."""
    slot = None
    if limits.concurrent is not None:
        slot = _slot_take(key_id, limits.concurrent, lease, now)
        if slot is None:
            return "concurrent", None
    if limits.rpm is not None or limits.tpm is not None:
        refused = _window_take(key_id, _minute(now), limits)
        if refused is not None:
            if slot is not None:
                db_end(key_id, slot, lease, 0, now)
            return refused, None
    return None, slot


def db_end(key_id: int, slot: int | None, lease: str, tokens: int, now: float) -> None:
    window, slots = _tables()
    if tokens > 0:
        rawsql.fetch(
            f"INSERT INTO {window} (key_id, minute, requests, tokens) VALUES (%s, %s, 0, %s) "  # noqa: S608
            f"ON CONFLICT (key_id, minute) DO UPDATE SET tokens = {window}.tokens + excluded.tokens "
            "RETURNING tokens",
            [key_id, _minute(now), tokens],
        )
    if slot is not None:
        rawsql.fetch(
            f"DELETE FROM {slots} WHERE key_id = %s AND slot = %s AND lease = %s RETURNING 1",  # noqa: S608
            [key_id, slot, lease],
        )


def db_renew(key_id: int, slot: int, lease: str, now: float) -> None:
    _, slots = _tables()
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {slots} SET expires_at = %s WHERE key_id = %s AND slot = %s AND lease = %s",  # noqa: S608
            [rawsql.as_param(_utc(now + LEASE_S)), key_id, slot, lease],
        )


# --- Redis ----------------------------------------------------------------------------------------

# KEYS[1]: the minute's hash {r: requests, t: tokens}; KEYS[2]: the sorted set of leases by expiry (ms).
# ARGV: rpm, tpm, concurrent (0: none), now (ms), lease (ms), the lease id. Returns "" or the limit.
ADMIT_LUA = """
local rpm, tpm, conc = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local now, lease_ms = tonumber(ARGV[4]), tonumber(ARGV[5])
if conc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  if redis.call('ZCARD', KEYS[2]) >= conc then return 'concurrent' end
end
if rpm > 0 or tpm > 0 then
  local seen = redis.call('HMGET', KEYS[1], 'r', 't')
  local r, t = tonumber(seen[1]) or 0, tonumber(seen[2]) or 0
  if rpm > 0 and r >= rpm then return 'rpm' end
  if tpm > 0 and t >= tpm then return 'tpm' end
  redis.call('HINCRBY', KEYS[1], 'r', 1)
  redis.call('PEXPIRE', KEYS[1], 120000)
end
if conc > 0 then
  redis.call('ZADD', KEYS[2], now + lease_ms, ARGV[6])
  redis.call('PEXPIRE', KEYS[2], lease_ms)
end
return ''
"""

# KEYS[1]: the lease set; ARGV: now + lease (ms), lease (ms), the lease id. Renews only a lease still held.
RENEW_LUA = """
if redis.call('ZSCORE', KEYS[1], ARGV[3]) then
  redis.call('ZADD', KEYS[1], 'XX', ARGV[1], ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

_clients: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, object]" = weakref.WeakKeyDictionary()


def _redis():
    """This event loop's client (redis-py's asyncio connections belong to the loop that made them)."""
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        from redis import asyncio as aioredis

        client = aioredis.Redis.from_url(
            settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=2, decode_responses=True
        )
        _clients[loop] = client
    return client


def _redis_keys(key_id: int, now: float) -> tuple[str, str]:
    prefix = f"{settings.GATEWAY_REDIS_PREFIX}:limits:{key_id}"
    return f"{prefix}:m:{_minute(now)}", f"{prefix}:leases"


async def redis_admit(key_id: int, limits: KeyLimits, lease: str, now: float) -> str | None:
    client = _redis()
    window, leases = _redis_keys(key_id, now)
    counts = [limits.rpm or 0, limits.tpm or 0, limits.concurrent or 0]
    args = [*counts, int(now * 1000), int(LEASE_S * 1000), lease]
    refused = await client.eval(ADMIT_LUA, 2, window, leases, *args)
    return refused or None


async def redis_end(key_id: int, lease: str | None, tokens: int, now: float) -> None:
    client = _redis()
    window, leases = _redis_keys(key_id, now)
    async with client.pipeline(transaction=False) as pipe:
        if tokens > 0:
            pipe.hincrby(window, "t", tokens)
            pipe.pexpire(window, 120000)
        if lease is not None:
            pipe.zrem(leases, lease)
        await pipe.execute()


async def redis_renew(key_id: int, lease: str, now: float) -> None:
    _, leases = _redis_keys(key_id, now)
    await _redis().eval(RENEW_LUA, 1, leases, int((now + LEASE_S) * 1000), int(LEASE_S * 1000), lease)


# --- admission ------------------------------------------------------------------------------------


def _redis_errors() -> tuple[type[BaseException], ...]:
    from redis.exceptions import RedisError

    return (RedisError, OSError)


class Ticket:
    """An admitted request's hold on its key's limits, ended exactly once by `end`."""

    def __init__(self, key_id: int, limits: KeyLimits, lease: str, slot: int | None) -> None:
        self.key_id, self.limits, self.lease, self.slot = key_id, limits, lease, slot
        self.holds_slot = limits.concurrent is not None  # with Redis the lease id itself is held
        self.ended = False
        self._renewer: asyncio.Task[None] | None = None
        self._finalizer: weakref.finalize | None = None

    async def end(self, tokens: int) -> None:
        """Free the slot and count the tokens (only a `tpm` key counts them). Never raises: a lost
        release is bounded by the lease."""
        if self.ended:
            return
        self.ended = True
        if self._renewer is not None:
            self._renewer.cancel()
        if self._finalizer is not None:
            self._finalizer.detach()
        tokens = tokens if self.limits.tpm is not None else 0
        if not self.holds_slot and tokens <= 0:
            return
        try:
            await _end(self.key_id, self.slot, self.lease if self.holds_slot else None, tokens)
        except (DatabaseError, *_redis_errors()):
            log.warning("limits: a key's slot or tokens could not be recorded (its lease bounds it)")


async def _end(key_id: int, slot: int | None, lease: str | None, tokens: int) -> None:
    now = clock()
    if settings.REDIS_URL:
        await redis_end(key_id, lease, tokens, now)
    else:
        await db.run(db_end, key_id, slot if lease is not None else None, lease or "", tokens, now)


_renewers: set[asyncio.Task[None]] = set()


async def _renew_while_held(ref: "weakref.ref[Ticket]", key_id: int, slot: int | None, lease: str) -> None:
    """Keep the lease while its request runs; stop when the ticket ends or nobody holds it any more
    (a request that vanished without ending: its lease then runs out)."""
    while True:
        await asyncio.sleep(LEASE_S / 3)
        ticket = ref()
        if ticket is None or ticket.ended:
            return
        del ticket
        try:
            if settings.REDIS_URL:
                await redis_renew(key_id, lease, clock())
            else:
                assert slot is not None
                await db.run(db_renew, key_id, slot, lease, clock())
        except (DatabaseError, *_redis_errors()):
            log.warning("limits: a concurrency lease could not be renewed")


def _orphaned(loop: asyncio.AbstractEventLoop, key_id: int, slot: int | None, lease: str) -> None:
    """A ticket collected without `end` (its request's relay was dropped): free its slot now."""
    if loop.is_closed():
        return

    def spawn() -> None:
        task = loop.create_task(_end_quietly(key_id, slot, lease))
        _renewers.add(task)
        task.add_done_callback(_renewers.discard)

    with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
        loop.call_soon_threadsafe(spawn)


async def _end_quietly(key_id: int, slot: int | None, lease: str) -> None:
    try:
        await _end(key_id, slot, lease, 0)
    except (DatabaseError, *_redis_errors()):
        log.warning("limits: an orphaned slot could not be freed (its lease bounds it)")


async def admit(key_id: int, limits: KeyLimits, wait_s: float = DB_WAIT_S) -> Ticket:
    """Admit one request of a key with limits, or raise LimitExceeded / LimitsUnavailable (also when the
    database has not answered within `wait_s`: the request's deadline bounds its wait)."""
    now = clock()
    lease = secrets.token_hex(16)
    try:
        if settings.REDIS_URL:
            refused, slot = await redis_admit(key_id, limits, lease, now), None
        else:
            refused, slot = await db.run_within(wait_s, db_admit, key_id, limits, lease, now)
    except (DatabaseError, *_redis_errors()) as error:
        raise LimitsUnavailable from error
    if refused is not None:
        raise LimitExceeded(refused, 1 if refused == "concurrent" else _window_retry_after(now))
    ticket = Ticket(key_id, limits, lease, slot)
    if ticket.holds_slot:
        loop = asyncio.get_running_loop()
        task = loop.create_task(_renew_while_held(weakref.ref(ticket), key_id, slot, lease))
        ticket._renewer = task
        _renewers.add(task)
        task.add_done_callback(_renewers.discard)
        ticket._finalizer = weakref.finalize(ticket, _orphaned, loop, key_id, slot, lease)
        ticket._finalizer.atexit = False
    return ticket


def tokens_of(exchange) -> int:
    """The tokens an exchange's attempts reported (input + output), for `tpm`."""
    return sum((a.input_tokens or 0) + (a.output_tokens or 0) for a in exchange.attempts)


class Finishing:
    """A relay's `on_finish` for an admitted request: the ledger first, then the ticket's end."""

    def __init__(self, record: Callable[..., Awaitable[None]], ticket: Ticket) -> None:
        self.record, self.ticket = record, ticket

    async def __call__(self, exchange) -> None:
        try:
            await self.record(exchange)
        finally:
            await self.ticket.end(tokens_of(exchange))


def guarded(relay, ticket: Ticket | None):
    """`relay`, whose `run` ends `ticket` when it raises (a bug, a cancel before the relay's own end):
    every other end goes through the relay's `on_finish` (`Finishing`). Ending twice is a no-op."""
    if ticket is None:
        return relay
    run = relay.run

    async def run_then_end_on_error():
        try:
            return await run()
        except BaseException:
            await ticket.end(tokens_of(relay.exchange))
            raise

    relay.run = run_then_end_on_error
    return relay

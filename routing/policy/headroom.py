"""PURE. An upstream account's own word on its rate limits, read from an answer's headers (SPEC §5.4
headroom): how much of each limit is left and when it resets, and whether that demotes the account.

Contract:
- `read(headers, now)` -> `Headroom | None`: every limit the answer reports with all three of its values
  sane, as the share left and the instant it resets (None: no such limit). `headers` is any
  case-insensitive mapping of the answer's headers (httpx's, aiohttp's, websockets'). Read:
  - OpenAI and Azure OpenAI: `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`; a reset is a
    duration until the limit is full again, Go-style (`20ms`, `1s`, `6m0s`, `1h2m3.5s`);
  - Anthropic: `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}`;
    a reset is an RFC 3339 instant with its offset (`2026-12-05T12:00:00Z`).
- It is total: it never raises. A limit is left out when any of its values is missing or malformed: a
  limit that is not a whole number above 0, a remaining that is not a whole number from 0 to the limit,
  a reset that is no duration or no instant with an offset, or no later than `now` (nothing to wait for).
- A reset later than MAX_RESET after `now` (a daily limit, a clock far off, an absurd value) counts as
  `now + MAX_RESET`: a demotion only reorders the plan (SPEC §7.1), so after an hour the account is
  simply tried again, and its next answer says where it stands.
- `Headroom.demote_until(floor)`: an account is under the floor when ANY limit has strictly less than
  `floor` of itself left (exactly `floor` left is enough: a floor of 0 never demotes); it is demoted
  until the last of those limits resets. None: every limit has its floor's worth left.
"""

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

DEFAULT_FLOOR = 0.10  # `headroom_floor`'s default: less than 10 % of a limit left demotes
MAX_RESET = timedelta(hours=1)

_WHOLE = re.compile(r"[0-9]{1,18}")  # ASCII digits only (str.isdigit takes "²"); 18 fit any counter
_DURATION = re.compile(r"(?:[0-9]{1,12}(?:\.[0-9]{1,9})?(?:ms|h|m|s))+")
_DURATION_PART = re.compile(r"([0-9.]+)(ms|h|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_INSTANT_MAX = 64  # longer than any RFC 3339 instant


@dataclass(frozen=True, slots=True)
class Limit:
    name: str  # as the headers name it: "requests", "tokens", "input-tokens", "output-tokens"
    left: float  # remaining / limit, 0..1
    resets_at: datetime


@dataclass(frozen=True, slots=True)
class Headroom:
    """The limits one answer reported (at least one)."""

    limits: tuple[Limit, ...]

    def demote_until(self, floor: float) -> datetime | None:
        return max((limit.resets_at for limit in self.limits if limit.left < floor), default=None)

    @property
    def least(self) -> Limit:
        """The limit with the smallest share left: what the draw scales an account's share by (§5.4)."""
        return min(self.limits, key=lambda limit: limit.left)


def _whole(value: str | None) -> int | None:
    return int(value) if value is not None and _WHOLE.fullmatch(value.strip()) else None


def _duration(value: str, now: datetime) -> datetime | None:
    value = value.strip()
    if not _DURATION.fullmatch(value):
        return None
    seconds = sum(float(number) * _UNIT_S[unit] for number, unit in _DURATION_PART.findall(value))
    return now + timedelta(seconds=min(seconds, MAX_RESET.total_seconds())) if seconds > 0 else None


def _instant(value: str, now: datetime) -> datetime | None:
    if len(value) > _INSTANT_MAX:
        return None
    try:
        at = datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    if at.tzinfo is None or at <= now:  # without its offset an instant is no instant
        return None
    return min(at.astimezone(now.tzinfo), now + MAX_RESET)


Reset = Callable[[str, datetime], datetime | None]
# (limit name, its limit, remaining and reset headers, how its reset reads), built once.
_HEADERS: tuple[tuple[str, str, str, str, Reset], ...] = (
    *(
        (
            name,
            f"x-ratelimit-limit-{name}",
            f"x-ratelimit-remaining-{name}",
            f"x-ratelimit-reset-{name}",
            _duration,
        )
        for name in ("requests", "tokens")
    ),
    *(
        (
            name,
            f"anthropic-ratelimit-{name}-limit",
            f"anthropic-ratelimit-{name}-remaining",
            f"anthropic-ratelimit-{name}-reset",
            _instant,
        )
        for name in ("requests", "tokens", "input-tokens", "output-tokens")
    ),
)


def read(headers: Mapping[str, str], now: datetime) -> Headroom | None:
    """The limits `headers` report (see the module's contract); `now`: when the answer came (aware)."""
    limits = []
    for name, limit_h, remaining_h, reset_h, reset in _HEADERS:
        remaining = _whole(headers.get(remaining_h))
        if remaining is None:  # an account without limit headers costs one lookup per limit
            continue
        limit = _whole(headers.get(limit_h))
        raw_reset = headers.get(reset_h)
        if limit is None or limit == 0 or remaining > limit or raw_reset is None:
            continue
        resets_at = reset(raw_reset, now)
        if resets_at is not None:
            limits.append(Limit(name, remaining / limit, resets_at))
    return Headroom(tuple(limits)) if limits else None

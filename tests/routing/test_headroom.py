"""SPEC §5.4 headroom: the providers' rate-limit headers read as the share of each limit left and when it
resets, at a fixed `now`; anything malformed is ignored, never raised, never demoting."""

from datetime import UTC, datetime, timedelta, timezone

import pytest

from routing.policy.headroom import MAX_RESET, Limit, read

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
FLOOR = 0.10


def s(n: float) -> datetime:
    return NOW + timedelta(seconds=n)


def openai(
    requests: tuple[str, str, str] | None = ("1000", "999", "60ms"),
    tokens: tuple[str, str, str] | None = ("100000", "90000", "6s"),
) -> dict[str, str]:
    """OpenAI's headers: (limit, remaining, reset) of each limit."""
    headers = {}
    for name, values in (("requests", requests), ("tokens", tokens)):
        if values is not None:
            for part, value in zip(("limit", "remaining", "reset"), values, strict=True):
                headers[f"x-ratelimit-{part}-{name}"] = value
    return headers


def anthropic(**limits: tuple[str, str, str]) -> dict[str, str]:
    """Anthropic's headers: input_tokens=(limit, remaining, reset), ..."""
    headers = {}
    for name, values in limits.items():
        for part, value in zip(("limit", "remaining", "reset"), values, strict=True):
            headers[f"anthropic-ratelimit-{name.replace('_', '-')}-{part}"] = value
    return headers


def test_openai_headers_read_as_the_share_left_and_the_reset():
    headroom = read(openai(), NOW)
    assert headroom is not None
    assert headroom.limits == (Limit("requests", 0.999, s(0.06)), Limit("tokens", 0.9, s(6)))
    assert headroom.demote_until(FLOOR) is None  # ample


def test_anthropic_headers_read_as_the_share_left_and_the_reset():
    headroom = read(
        anthropic(
            requests=("50", "49", "2026-12-05T12:00:01Z"),
            tokens=("80000", "4000", "2026-12-05T12:00:30Z"),
            input_tokens=("80000", "4000", "2026-12-05T12:00:30Z"),
            output_tokens=("16000", "16000", "2026-12-05T12:00:02.5+00:00"),
        ),
        NOW,
    )
    assert headroom is not None
    assert headroom.limits == (
        Limit("requests", 0.98, s(1)),
        Limit("tokens", 0.05, s(30)),
        Limit("input-tokens", 0.05, s(30)),
        Limit("output-tokens", 1.0, s(2.5)),
    )
    assert headroom.demote_until(FLOOR) == s(30)


def test_headers_are_looked_up_whatever_their_case():
    class CaseInsensitive(dict):
        def get(self, name, default=None):
            return super().get(name.upper(), default)

    headers = CaseInsensitive({k.upper(): v for k, v in openai(requests=("100", "1", "1s")).items()})
    headroom = read(headers, NOW)
    assert headroom is not None and headroom.demote_until(FLOOR) == s(1)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("1s", 1),
        ("20ms", 0.02),
        ("6m0s", 360),
        ("2m3.5s", 123.5),
        ("0h59m3.5s", 3543.5),
        ("2m30s", 150),
        ("0.5s", 0.5),
        (" 7s ", 7),
        ("59m59.999s", 3599.999),
    ],
)
def test_openai_resets_are_go_durations(value, seconds):
    headroom = read(openai(requests=("100", "1", value), tokens=None), NOW)
    assert headroom is not None
    assert headroom.demote_until(FLOOR) == s(seconds)


@pytest.mark.parametrize(
    ("value", "at"),
    [
        ("2026-12-05T12:00:05Z", s(5)),
        ("2026-12-05T12:00:05.250Z", s(5.25)),
        ("2026-12-05T13:00:05+01:00", s(5)),  # another offset, the same instant
        ("2026-12-05t12:00:05z", None),  # RFC 3339 allows lower case; Python 3.11 does not: ignored
    ],
)
def test_anthropic_resets_are_rfc3339_instants(value, at):
    headroom = read(anthropic(requests=("100", "1", value)), NOW)
    if at is None:
        assert headroom is None
    else:
        assert headroom is not None and headroom.demote_until(FLOOR) == at
        assert headroom.limits[0].resets_at.utcoffset() == timedelta(0)  # stored as UTC


def test_a_reset_far_ahead_is_bounded_by_an_hour():
    far = read(openai(requests=("100", "1", "26h0m0s"), tokens=None), NOW)
    assert far is not None and far.demote_until(FLOOR) == NOW + MAX_RESET == s(3600)
    huge = read(openai(requests=("100", "1", "999999999999h"), tokens=None), NOW)
    assert huge is not None and huge.demote_until(FLOOR) == s(3600)
    year = read(anthropic(requests=("100", "1", "9999-12-31T23:59:59Z")), NOW)
    assert year is not None and year.demote_until(FLOOR) == s(3600)


@pytest.mark.parametrize(
    "requests",
    [
        ("100", "1", ""),  # no reset
        ("100", "1", "soon"),
        ("100", "1", "1d"),  # no Go unit
        ("100", "1", "-5s"),
        ("100", "1", "5"),  # a duration needs its unit
        ("100", "1", "0s"),  # reset already: nothing to wait for
        ("100", "1", "1e9s"),
        ("100", "1", "nan"),
        ("100", "-1", "1s"),  # negative remaining
        ("100", "101", "1s"),  # more left than the limit
        ("0", "0", "1s"),  # a limit of nothing
        ("-100", "1", "1s"),
        ("100.0", "1", "1s"),  # counters are whole numbers
        ("100", "1.5", "1s"),
        ("100", "²", "1s"),  # a digit to str.isdigit, not to int
        ("1" * 40, "1", "1s"),  # absurd
        ("100", "", "1s"),
        ("", "1", "1s"),
    ],
)
def test_a_malformed_limit_is_ignored(requests):
    assert read(openai(requests=requests, tokens=None), NOW) is None


@pytest.mark.parametrize(
    "reset",
    [
        "2026-12-05T12:00:05",  # no offset: no instant
        "2026-12-05",
        "2026-12-05T11:59:59Z",  # in the past
        "2026-12-05T12:00:00Z",  # now
        "tomorrow",
        "2026-13-05T12:00:05Z",
        "2026-12-05T12:00:05Z" + " " * 100,  # absurdly long
        "60s",  # OpenAI's format under Anthropic's name
    ],
)
def test_a_malformed_anthropic_reset_is_ignored(reset):
    assert read(anthropic(requests=("100", "1", reset)), NOW) is None


def test_a_missing_value_leaves_its_limit_out_and_keeps_the_others():
    headers = openai(requests=("100", "1", "1s"), tokens=("1000", "5", "30s"))
    del headers["x-ratelimit-limit-requests"]
    headroom = read(headers, NOW)
    assert headroom is not None
    assert [limit.name for limit in headroom.limits] == ["tokens"]
    assert headroom.demote_until(FLOOR) == s(30)


def test_no_headers_no_headroom():
    assert read({}, NOW) is None
    assert read({"retry-after": "5", "x-request-id": "req_1"}, NOW) is None


def test_the_lowest_of_several_limits_decides():
    # Requests ample, tokens nearly spent: demoted, until the tokens reset.
    headroom = read(openai(requests=("1000", "900", "1s"), tokens=("100000", "2000", "45s")), NOW)
    assert headroom is not None and headroom.demote_until(FLOOR) == s(45)


def test_under_the_floor_on_several_limits_it_waits_for_the_last_reset():
    headroom = read(openai(requests=("100", "2", "50s"), tokens=("100000", "2000", "10s")), NOW)
    assert headroom is not None and headroom.demote_until(FLOOR) == s(50)


@pytest.mark.parametrize(
    ("remaining", "floor", "demoted"),
    [
        ("10", 0.10, False),  # exactly at the floor: enough
        ("9", 0.10, True),
        ("0", 0.10, True),
        ("0", 0.0, False),  # a floor of 0 never demotes
        ("99", 1.0, True),  # a floor of 1: anything short of a full limit
        ("100", 1.0, False),
        ("50", 0.5, False),
        ("49", 0.5, True),
    ],
)
def test_the_floor_is_strict(remaining, floor, demoted):
    headroom = read(openai(requests=("100", remaining, "5s"), tokens=None), NOW)
    assert headroom is not None
    assert headroom.demote_until(floor) == (s(5) if demoted else None)


def test_an_aware_now_in_another_zone_gives_the_same_instants():
    east = timezone(timedelta(hours=9))
    headroom = read(anthropic(requests=("100", "1", "2026-12-05T12:00:05Z")), NOW.astimezone(east))
    assert headroom is not None and headroom.demote_until(FLOOR) == s(5)

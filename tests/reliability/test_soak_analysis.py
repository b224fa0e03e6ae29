"""The multi-node soak's readings of the upstreams' arrival log and of the circuit polls
(soak/multinode.py), on hand-made logs: each rule holds where it should and fails where a broken
gateway would break it."""

from datetime import UTC, datetime

from soak.circuits import CircuitPoller, half_open_check, replay_check
from soak.nodes import tracebacks


def arrival(upstream, sid, kind, at, end=None, transport="http"):
    return {"u": upstream, "t": transport, "sid": sid, "k": kind, "a": at, "e": at if end is None else end}


def ts(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


class FakeDatabase:
    def query(self, sql, params=()):
        if "pools_assignment" in sql:
            return [(1, "acct-a"), (2, "acct-b"), (3, "acct-c")]
        return [(1,)]  # half_open_probes


def poller(*observations):
    p = CircuitPoller.__new__(CircuitPoller)
    p.observations = list(observations)
    return p


def test_a_handoff_after_a_rejection_is_no_replay():
    check = replay_check([arrival("a", "s1", "unavailable", 1.0), arrival("b", "s1", "serve", 1.1)])
    assert check.ok, check.detail


def test_an_arrival_after_an_unknown_dispatch_is_a_replay():
    for kind in ("hang", "drop", "cut_before_visible", "serve"):
        check = replay_check([arrival("a", "s1", kind, 1.0, 1.5), arrival("b", "s1", "serve", 1.6)])
        assert not check.ok and "1 replays" in check.detail, kind


# Assignment 1 (a) is open until t=10, then half-open; b and c are closed throughout.
OPEN_A = [(1, "http", "open", ts(10.0), 0)]
HALF_OPEN_A = [(1, "http", "half_open", ts(10.0), 1)]
CLOSED_A = [(1, "http", "closed", None, 0)]


def test_a_second_request_in_a_probes_position_while_the_probe_is_in_flight_is_a_violation():
    polls = poller((9.0, OPEN_A), (10.2, HALF_OPEN_A), (14.0, CLOSED_A))
    log = [arrival("a", "p", "hang", 10.1, 13.0), arrival("a", "q", "unavailable", 11.0)]
    check = half_open_check(log, polls, FakeDatabase())
    assert not check.ok and "1 violations" in check.detail, check.detail


def test_a_last_resort_arrival_after_every_closed_assignment_is_no_probe():
    polls = poller((9.0, OPEN_A), (10.2, HALF_OPEN_A), (14.0, CLOSED_A))
    log = [
        arrival("a", "p", "hang", 10.1, 13.0),
        arrival("b", "q", "unavailable", 10.9),
        arrival("c", "q", "rate_limited", 10.95),
        arrival("a", "q", "unavailable", 11.0),
    ]
    check = half_open_check(log, polls, FakeDatabase())
    assert check.ok and "1 last-resort" in check.detail, check.detail


def test_the_window_ends_with_the_first_served_probe():
    polls = poller((9.0, OPEN_A), (10.2, HALF_OPEN_A), (11.0, CLOSED_A))
    # The probe succeeds at 10.3; the poll sees the circuit closed only at 11.0: traffic between
    # the two is ordinary traffic of a closed circuit, not probes.
    log = [
        arrival("a", "p", "serve", 10.1, 10.3),
        arrival("a", "q", "slow", 10.5, 10.9),
        arrival("a", "r", "serve", 10.6),
    ]
    check = half_open_check(log, polls, FakeDatabase())
    assert check.ok, check.detail


def test_a_circuit_closed_before_its_open_until_has_no_half_open_window():
    polls = poller((9.0, OPEN_A), (9.5, CLOSED_A), (12.0, CLOSED_A))
    assert polls.windows() == []
    polls = poller((9.0, OPEN_A), (10.5, CLOSED_A), (12.0, CLOSED_A))
    assert polls.windows() == [(1, "http", 10.0, 10.5)]


def test_an_open_that_became_visible_after_its_open_until_starts_its_window_when_it_was_seen():
    # A failure write computed its cooldown at 9.0 (open_until 10.0) but committed only after the poll
    # at 10.5: until then every request read the circuit closed, so arrivals before 10.5 are no probes.
    polls = poller((9.0, CLOSED_A), (10.5, CLOSED_A), (10.6, OPEN_A), (12.0, CLOSED_A))
    assert polls.windows() == [(1, "http", 10.5, 12.0)]
    log = [arrival("a", "p", "slow", 10.2, 10.9), arrival("a", "q", "serve", 10.3)]
    assert half_open_check(log, polls, FakeDatabase()).ok


LOG = """\
{"event": "request"}
routing state could not be saved
Traceback (most recent call last):
  File "x.py", line 1, in f
psycopg.errors.AdminShutdown: terminating connection due to administrator command
CONTEXT:  while updating tuple (0,76) in relation "routing_circuit"

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "y.py", line 2, in g
django.db.utils.OperationalError: terminating connection due to administrator command
CONTEXT:  while updating tuple (0,76) in relation "routing_circuit"
Exception in ASGI application
Traceback (most recent call last):
  File "z.py", line 3, in h
KeyError: 'x'
"""


def test_tracebacks_are_read_with_their_message_and_last_exception():
    assert tracebacks(LOG) == [
        (
            "routing state could not be saved",
            "django.db.utils.OperationalError: terminating connection due to administrator command",
        ),
        ("Exception in ASGI application", "KeyError: 'x'"),
    ]


def test_a_request_cut_by_the_sigkill_is_the_one_allowed_exception_and_a_wrong_answer_is_not():
    from soak.faults import Fault, classify_killed
    from soak.load import Outcome

    kill = Fault("sigkill", 1, at=100.0, wall=0.0, progress=0.2, incarnation=1)
    # A websocket frame starts after its connection was opened: later than the kill itself.
    cut = Outcome(1, "websocket", "websocket", node=1, incarnation=1, started_at=100.05, done_at=100.1)
    cut.problems = ["websocket dropped without a close frame (code 1006)"]
    wrong = Outcome(2, "chat_http", "http", node=1, incarnation=1, started_at=99.9, done_at=100.1)
    wrong.problems = ["provider message relayed: 'x'"]
    elsewhere = Outcome(3, "chat_http", "http", node=0, incarnation=1, started_at=99.9, done_at=100.1)
    elsewhere.problems = ["transport error: ServerDisconnectedError"]
    before = Outcome(4, "chat_sse", "sse", node=1, incarnation=1, started_at=99.0, done_at=99.5)
    before.problems = ["response body ended abnormally: ClientPayloadError"]
    classify_killed([cut, wrong, elsewhere, before], [kill])
    assert (cut.killed, cut.problems) == (True, [])
    assert not wrong.killed and wrong.problems
    assert not elsewhere.killed and elsewhere.problems
    assert not before.killed and before.problems

"""The multi-node soak's readings of the upstreams' arrival log and of the circuit polls
(soak/multinode.py), on hand-made logs: each rule holds where it should and fails where a broken
gateway would break it."""

from datetime import UTC, datetime

from soak.circuits import CircuitPoller, Plan, half_open_check, read_plans, replay_check
from soak.load import Outcome
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


def poller(*observations, sent=None):
    """Polls stamped at their reads; each sent when stamped unless `sent` says otherwise."""
    p = CircuitPoller.__new__(CircuitPoller)
    p.observations = list(observations)
    p.sent = sent or [t for t, _ in observations]
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
    check = half_open_check(log, polls, FakeDatabase(), {})
    assert not check.ok and "1 violations" in check.detail, check.detail


def test_a_last_resort_arrival_after_every_closed_assignment_is_no_probe():
    polls = poller((9.0, OPEN_A), (10.2, HALF_OPEN_A), (14.0, CLOSED_A))
    log = [
        arrival("a", "p", "hang", 10.1, 13.0),
        arrival("b", "q", "unavailable", 10.9),
        arrival("c", "q", "rate_limited", 10.95),
        arrival("a", "q", "unavailable", 11.0),
    ]
    check = half_open_check(log, polls, FakeDatabase(), {})
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
    check = half_open_check(log, polls, FakeDatabase(), {})
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
    assert half_open_check(log, polls, FakeDatabase(), {}).ok


# The ledger's view (Plan): what the request started with and what it tried, pass-overs included.
# In each case p holds a's probe (10.1 to 13.0) and q reaches a at 11.0 while it is in flight.
B_OPEN = (2, "http", "open", ts(30.0), 0)
C_OPEN = (3, "http", "open", ts(30.0), 0)
PROBE_P = arrival("a", "p", "hang", 10.1, 13.0)


def test_a_candidate_passed_over_without_an_arrival_counts_as_tried_from_the_ledger():
    # b was closed for q, but q passed it over (its budget): the upstream never saw it. The polls
    # alone count q as a probe; its plan shows it reached a last.
    polls = poller((9.0, OPEN_A), (10.2, HALF_OPEN_A), (14.0, CLOSED_A))
    log = [PROBE_P, arrival("c", "q", "unavailable", 10.9), arrival("a", "q", "unavailable", 11.0)]
    plans = {"q": Plan(10.5, (("b", "ineligible"), ("c", "retryable_failed"), ("a", "failed")))}
    check = half_open_check(log, polls, FakeDatabase(), plans)
    assert check.ok and "1 last-resort" in check.detail and "1 judged from" in check.detail, check.detail
    assert not half_open_check(log, polls, FakeDatabase(), {}).ok


def test_an_assignment_open_when_the_request_started_need_not_be_tried_first():
    # b was open when q started (q read it open: last in its plan) and closed before q reached a.
    polls = poller(
        (9.0, [*OPEN_A, B_OPEN]), (10.2, [*HALF_OPEN_A, B_OPEN]), (10.8, HALF_OPEN_A), (14.0, CLOSED_A)
    )
    log = [PROBE_P, arrival("c", "q", "unavailable", 10.9), arrival("a", "q", "unavailable", 11.0)]
    plans = {"q": Plan(10.3, (("c", "retryable_failed"), ("a", "failed")))}
    assert half_open_check(log, polls, FakeDatabase(), plans).ok
    assert not half_open_check(log, polls, FakeDatabase(), {}).ok


def test_a_request_that_reached_a_first_while_others_were_closed_at_its_start_is_a_probe():
    # b and c were closed when q started; q went to a first. By the arrival both had opened, which
    # the polls alone would take for a last resort; q's plan shows a probe's position.
    polls = poller(
        (9.0, OPEN_A),
        (10.2, HALF_OPEN_A),
        (10.6, HALF_OPEN_A),
        (10.9, [*HALF_OPEN_A, B_OPEN, C_OPEN]),
        (14.0, CLOSED_A),
    )
    log = [PROBE_P, arrival("a", "q", "unavailable", 11.0)]
    assert half_open_check(log, polls, FakeDatabase(), {}).ok
    plans = {"q": Plan(10.5, (("a", "failed"), ("b", "ineligible"), ("c", "ineligible")))}
    check = half_open_check(log, polls, FakeDatabase(), plans)
    assert not check.ok and "1 violations" in check.detail and "its plan" in check.examples[0], check.detail


def test_an_assignment_that_opened_around_the_requests_start_may_have_been_read_open():
    # b was closed at the poll before q started (10.5) but open at the first poll after: q may have
    # read it open (last in its plan). q tried c, then reached a: a last resort.
    polls = poller((9.0, OPEN_A), (10.2, HALF_OPEN_A), (10.6, [*HALF_OPEN_A, B_OPEN]), (14.0, CLOSED_A))
    log = [PROBE_P, arrival("c", "q", "unavailable", 10.9), arrival("a", "q", "unavailable", 11.0)]
    plans = {"q": Plan(10.5, (("c", "retryable_failed"), ("a", "failed"), ("b", "ineligible")))}
    check = half_open_check(log, polls, FakeDatabase(), plans)
    assert check.ok and "1 last-resort" in check.detail, check.detail


def test_the_attempts_before_an_arrival_are_those_before_its_own_dispatch():
    # q's plan tried b and c, but only after a: at its arrival at a nothing closed had been tried.
    polls = poller((9.0, OPEN_A), (10.2, HALF_OPEN_A), (14.0, CLOSED_A))
    log = [PROBE_P, arrival("a", "q", "unavailable", 11.0), arrival("b", "q", "serve", 11.1)]
    plans = {"q": Plan(10.5, (("a", "retryable_failed"), ("b", "succeeded"), ("c", "ineligible")))}
    assert not half_open_check(log, polls, FakeDatabase(), plans).ok


def last_resort_success_then_r(q_status):
    # p holds a's probe (a slow answer, 10.1 to 13.0); q reaches a last (b and c failed first) and is
    # served at 10.5-10.6; r starts at 10.7, when the polls (lagging) still show a half-open, and
    # goes to a first.
    polls = poller((9.0, OPEN_A), (10.2, HALF_OPEN_A), (10.65, HALF_OPEN_A), (11.0, CLOSED_A))
    log = [
        arrival("a", "p", "slow", 10.1, 13.0),
        arrival("b", "q", "unavailable", 10.3),
        arrival("c", "q", "unavailable", 10.4),
        arrival("a", "q", "serve", 10.5, 10.6),
        arrival("a", "r", "serve", 10.8, 10.9),
    ]
    plans = {
        "q": Plan(10.25, (("b", "retryable_failed"), ("c", "retryable_failed"), ("a", q_status))),
        "r": Plan(10.7, (("a", "succeeded"),)),
    }
    return half_open_check(log, polls, FakeDatabase(), plans)


def test_a_last_resorts_success_closes_the_circuit_and_ends_the_window():
    # Any success closes the circuit (SPEC §7.1), a last resort's too: r read it closed.
    check = last_resort_success_then_r("succeeded")
    assert check.ok and "1 last-resort" in check.detail, check.detail


def test_an_answer_the_gateway_did_not_take_as_a_success_does_not_end_the_window():
    # The upstream served q, but the gateway recorded no success (its deadline cut the answer):
    # the circuit stayed half-open, and r went to a beside p's probe.
    check = last_resort_success_then_r("failed")
    assert not check.ok and "r arrived" in check.examples[0], check.detail


def success_before_the_window_then_r(q_end, sent=None):
    # q reaches a last (b and c failed first) and is served, ending at q_end, just before a's
    # cooldown ends at 10.0; p takes the probe at 10.1 (a slow answer), r starts at 10.3 and goes to
    # a first. The last poll before the window is stamped 9.95.
    polls = poller((9.0, OPEN_A), (9.95, OPEN_A), (10.2, HALF_OPEN_A), (11.0, CLOSED_A), sent=sent)
    log = [
        arrival("b", "q", "unavailable", 9.8),
        arrival("c", "q", "unavailable", 9.85),
        arrival("a", "q", "serve", q_end - 0.02, q_end),
        arrival("a", "p", "slow", 10.1, 13.0),
        arrival("a", "r", "serve", 10.4, 10.5),
    ]
    plans = {
        "q": Plan(9.7, (("b", "retryable_failed"), ("c", "retryable_failed"), ("a", "succeeded"))),
        "p": Plan(10.05, (("a", "succeeded"),)),
        "r": Plan(10.3, (("a", "succeeded"),)),
    }
    return half_open_check(log, polls, FakeDatabase(), plans)


def test_a_success_whose_close_no_poll_before_the_window_could_show_ends_the_window():
    # q's success closes the circuit once its write lands, inside the window: r read it closed.
    assert success_before_the_window_then_r(9.98).ok


def test_a_success_the_polls_before_the_window_saw_no_close_of_does_not_end_it():
    # q ended before the poll at 9.95, which still saw a open: the circuit did go half-open.
    assert not success_before_the_window_then_r(9.92).ok


def test_a_poll_read_before_the_success_ended_shows_nothing_of_its_close():
    # The poll stamped 9.95 was sent at 9.90 (the harness held its thread back): its snapshot may
    # predate q's end at 9.92, so it cannot show that q's success had not closed the circuit.
    assert success_before_the_window_then_r(9.92, sent=[9.0, 9.90, 10.2, 11.0]).ok


class FourAssignments(FakeDatabase):
    def query(self, sql, params=()):
        if "pools_assignment" in sql:
            return [*super().query(sql, params), (4, "acct-d")]
        return super().query(sql, params)


def flicker_of_d(d_closed_again=True):
    """The full 3-node run's c/http case (seed 2, times less 1796171300 s). c is open until 21.756; a
    is open for the model's withdrawal (ineligible) throughout. d's circuit is closed at the polls
    read at 21.675 and 21.782, but d failed at 21.692 (its third failure since 21.408 that no success
    need have written over) and then served a success at 21.746: its circuit may have opened and
    closed again between the two polls. 19926 and 19936, which started in between, each went to b,
    then to c before d: one of them held c's probe lease; the other reached c without it, which
    SPEC §5.4 allows after every candidate it read closed: it read d open (group 3, like c)."""
    a_open = (1, "http", "open", ts(22.304), 0)
    polls = poller(
        (21.675, [a_open, (3, "http", "open", ts(21.756), 0)]),
        (21.782, [a_open, (2, "http", "open", ts(22.763), 0), (3, "http", "half_open", ts(21.756), 1)]),
        (21.910, [(3, "http", "half_open", ts(21.756), 1)]),
        (22.012, [(3, "http", "open", ts(23.951), 0)]),
        sent=[21.669, 21.782, 21.903, 22.010],
    )
    log = [
        arrival("b", "load-19922", "model_not_found", 21.674),
        arrival("d", "load-19922", "unavailable", 21.692),
        arrival("c", "load-19922", "unavailable", 21.719),
        arrival("b", "load-19918", "model_not_found", 21.713),
        arrival("b", "load-19936", "model_not_found", 21.758),
        arrival("b", "load-19926", "model_not_found", 21.828),
        arrival("c", "load-19926", "slow", 21.847, 22.253),
        arrival("c", "load-19936", "model_not_found", 21.935),
        arrival("d", "load-19936", "hang", 21.968, 24.767),
    ]
    plans = {
        "load-19922": Plan(
            21.649,
            (("a", "ineligible"), ("b", "retryable_failed"), ("d", "retryable_failed"), ("c", "failed")),
        ),
        "load-19926": Plan(21.700, (("a", "ineligible"), ("b", "retryable_failed"), ("c", "succeeded"))),
        "load-19936": Plan(
            21.748,
            (("a", "ineligible"), ("b", "retryable_failed"), ("c", "retryable_failed"), ("d", "failed")),
        ),
    }
    if d_closed_again:
        log.append(arrival("d", "load-19918", "serve", 21.746))
        plans["load-19918"] = Plan(
            21.647, (("a", "ineligible"), ("b", "retryable_failed"), ("d", "succeeded"))
        )
    return half_open_check(log, polls, FourAssignments(), plans)


def test_a_circuit_that_opened_and_closed_again_between_two_polls_may_have_been_read_open():
    check = flicker_of_d()
    assert check.ok and "2 last-resort" in check.detail, check.detail


def test_a_failure_between_two_polls_that_no_success_followed_left_the_circuit_closed():
    # Had d's failure opened it, the poll at 21.782 would show it open: d was closed for both
    # requests, and the second to reach c before d did so beside the first.
    check = flicker_of_d(d_closed_again=False)
    assert not check.ok and "load-19936 arrived at 21.935" in check.examples[0], check.detail


def test_the_plans_are_read_by_the_clients_sid_in_ordinal_order():
    class Ledger(FakeDatabase):
        def query(self, sql, params=()):
            if "proxy_requestrecord" in sql:
                return [
                    ("rid-1", 10.5, 2, "ineligible"),
                    ("rid-1", 10.5, 1, "failed"),
                    ("rid-2", 11.0, None, None),  # no attempt (nothing eligible)
                    ("rid-9", 12.0, 3, "succeeded"),  # not the client's
                ]
            return super().query(sql, params)

    outcomes = [
        Outcome(1, "chat_http", "http", request_id="rid-1", sid="load-1"),
        Outcome(2, "chat_sse", "sse", request_id="rid-2", sid="load-2"),
        Outcome(3, "websocket", "websocket", sid="load-3"),
    ]
    assert read_plans(Ledger(), outcomes) == {
        "load-1": Plan(10.5, (("b", "ineligible"), ("a", "failed"))),
        "load-2": Plan(11.0, ()),
    }


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

"""Circuit, demotion and affinity services against a real database. The race tests need real
concurrency and run on PostgreSQL only."""

import threading
from datetime import UTC, datetime, timedelta
from functools import partial
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection, connections
from django.utils import timezone

from routing import affinities, services
from routing.models import Affinity, AffinityKind, Circuit, Demotion
from routing.policy.breaker import BreakerSettings
from routing.policy.types import CircuitReason, CircuitState
from routing.services import CircuitKey, Seen
from tests.factories import AssignmentFactory, GatewayKeyFactory

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
SETTINGS = BreakerSettings(failure_threshold=2, cooldown_seconds=10, max_cooldown_seconds=25)
UNAVAILABLE = CircuitReason.UPSTREAM_MODEL_UNAVAILABLE

requires_postgres = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="needs real concurrent transactions (PostgreSQL)"
)


@pytest.fixture
def key(db):
    return _key("http")


def _key(route_class):
    assignment = AssignmentFactory()
    return CircuitKey(
        pool_id=assignment.pool_id, assignment_id=assignment.pk, model="gpt-5", route_class=route_class
    )


def _row(key):
    return Circuit.objects.get(**key.filter())


def _open(key, now=NOW):
    for _ in range(SETTINGS.failure_threshold):
        services.circuit_record_failure(key=key, reason=UNAVAILABLE, settings=SETTINGS, now=now)


def test_failures_open_the_circuit_at_the_threshold(key):
    services.circuit_record_failure(key=key, reason=UNAVAILABLE, settings=SETTINGS, now=NOW)
    assert _row(key).state == CircuitState.CLOSED
    assert _row(key).consecutive_failures == 1
    services.circuit_record_failure(key=key, reason=UNAVAILABLE, settings=SETTINGS, now=NOW)
    row = _row(key)
    assert (row.state, row.reason, row.open_until) == ("open", UNAVAILABLE, NOW + timedelta(seconds=10))


def test_probe_then_failure_doubles_the_cooldown_bounded(key):
    _open(key)
    assert not services.circuit_take_probe(key=key, settings=SETTINGS, now=NOW + timedelta(seconds=9))
    later = NOW + timedelta(seconds=10)
    assert services.circuit_take_probe(key=key, settings=SETTINGS, now=later)
    assert (_row(key).state, _row(key).probes_in_flight) == ("half_open", 1)
    assert not services.circuit_take_probe(key=key, settings=SETTINGS, now=later)
    services.circuit_record_failure(key=key, reason=UNAVAILABLE, settings=SETTINGS, now=later)
    assert (_row(key).state, _row(key).cooldown_seconds) == ("open", 20)
    again = later + timedelta(seconds=20)
    assert services.circuit_take_probe(key=key, settings=SETTINGS, now=again)
    services.circuit_record_failure(key=key, reason=UNAVAILABLE, settings=SETTINGS, now=again)
    assert _row(key).cooldown_seconds == 25  # doubled, bounded by max_cooldown_seconds


def test_probe_success_closes_and_a_healthy_success_writes_nothing(key, django_assert_num_queries):
    _open(key)
    later = NOW + timedelta(seconds=10)
    assert services.circuit_take_probe(key=key, settings=SETTINGS, now=later)
    services.circuit_record_success(key=key)
    row = _row(key)
    assert (row.state, row.consecutive_failures, row.open_until) == ("closed", 0, None)
    with django_assert_num_queries(0):
        services.circuit_record_success(key=key, seen=Seen(services.circuit_snapshot(row)))
    with django_assert_num_queries(0):
        services.circuit_record_success(key=key, seen=Seen(None))


def test_a_neutral_probe_frees_its_slot_without_a_verdict(key):
    _open(key)
    later = NOW + timedelta(seconds=10)
    assert services.circuit_take_probe(key=key, settings=SETTINGS, now=later)
    services.circuit_release_probe(key=key)
    row = _row(key)
    assert (row.state, row.probes_in_flight, row.consecutive_failures) == ("half_open", 0, 2)
    assert services.circuit_take_probe(key=key, settings=SETTINGS, now=later)


def test_a_lost_probe_is_readmitted_after_its_lease(key):
    _open(key)
    later = NOW + timedelta(seconds=10)
    assert services.circuit_take_probe(key=key, settings=SETTINGS, now=later)
    lease = timedelta(seconds=SETTINGS.probe_lease_seconds)
    just_before = later + lease - timedelta(seconds=1)
    assert not services.circuit_take_probe(key=key, settings=SETTINGS, now=just_before)
    assert services.circuit_take_probe(key=key, settings=SETTINGS, now=later + lease)
    assert _row(key).probes_in_flight == 1


def test_a_stale_snapshot_is_reread_not_overwritten(key):
    stale = Seen(None)  # read before another node recorded a failure
    services.circuit_record_failure(key=key, reason=UNAVAILABLE, settings=SETTINGS, now=NOW)
    services.circuit_record_failure(key=key, reason=UNAVAILABLE, settings=SETTINGS, now=NOW, seen=stale)
    assert _row(key).state == CircuitState.OPEN  # both failures counted


def test_a_stale_snapshot_never_takes_a_second_probe_lease(key):
    """Two requests (on any nodes) read the same open-past-cooldown circuit; both try the lease with
    that snapshot, one after the other. The lease is one conditional UPDATE guarded by what was read:
    the second finds the row changed and, re-read, half-open with its one slot taken. A read-then-
    write (an UPDATE that does not check the row it read) would hand out a second lease here, on
    SQLite as on PostgreSQL."""
    _open(key)
    later = NOW + timedelta(seconds=10)
    stale = Seen(services.circuit_snapshot(_row(key)))
    assert services.circuit_take_probe(key=key, settings=SETTINGS, now=later, seen=stale)
    assert not services.circuit_take_probe(key=key, settings=SETTINGS, now=later, seen=stale)
    row = _row(key)
    assert (row.state, row.probes_in_flight) == ("half_open", 1)


def test_the_lease_is_one_statement_when_the_snapshot_is_current(key, django_assert_num_queries):
    _open(key)
    seen = Seen(services.circuit_snapshot(_row(key)))
    with django_assert_num_queries(1):  # the conditional UPDATE itself, no read before it
        assert services.circuit_take_probe(
            key=key, settings=SETTINGS, now=NOW + timedelta(seconds=10), seen=seen
        )


def test_credential_rejected_opens_the_assignment_wide_circuit_at_once(key):
    wide = CircuitKey.wide(key.pool_id, key.assignment_id)
    services.circuit_record_failure(
        key=wide, reason=CircuitReason.CREDENTIAL_REJECTED, settings=SETTINGS, now=NOW
    )
    row = _row(wide)
    assert (row.model, row.route_class, row.state, row.reason) == ("*", "*", "open", "credential_rejected")
    assert row.consecutive_failures == 1  # below the threshold of 2: a revoked key does not heal by itself


def _failure(key, seen, demote, reason=UNAVAILABLE):
    services.failure_record(key=key, reason=reason, settings=SETTINGS, now=NOW, seen=seen, demote=demote)


def _demote(key):
    return services.Demote(key.assignment_id, key.model, UNAVAILABLE, NOW + timedelta(seconds=60))


def _demoted(key):
    return list(
        Demotion.objects.filter(assignment_id=key.assignment_id, model=key.model).values_list("until")
    )


@requires_postgres
def test_a_failure_and_its_demotion_are_one_statement_on_postgresql(key, django_assert_num_queries):
    """Every failover writes this while the client's answer waits for it: one round trip (the circuit's
    guarded UPDATE and the demotion's upsert in one statement), where a transaction made it four."""
    services.circuit_record_failure(key=key, reason=UNAVAILABLE, settings=SETTINGS, now=NOW)
    seen = Seen(services.circuit_snapshot(_row(key)))
    with django_assert_num_queries(1):
        _failure(key, seen, _demote(key))
    row = _row(key)
    assert (row.state, row.consecutive_failures) == ("open", 2)  # the threshold: opened by this write
    assert _demoted(key) == [(NOW + timedelta(seconds=60),)]
    with django_assert_num_queries(1):  # a demotion alone (a failure that counts no circuit failure)
        _failure(key, None, services.Demote(key.assignment_id, key.model, UNAVAILABLE, NOW), reason=None)
    assert _demoted(key) == [(NOW,)]


def test_a_failure_on_a_circuit_changed_since_it_was_read_counts_on_the_row_as_stored(key):
    services.circuit_record_failure(key=key, reason=UNAVAILABLE, settings=SETTINGS, now=NOW)
    stale = Seen(services.circuit_snapshot(_row(key)))
    services.circuit_record_success(key=key)  # another request closed it meanwhile
    _failure(key, stale, _demote(key))
    row = _row(key)
    assert (row.state, row.consecutive_failures) == ("closed", 1)  # not 2 from the stale snapshot: open
    assert _demoted(key) == [(NOW + timedelta(seconds=60),)]


def test_a_first_failure_creates_its_circuit_with_its_demotion(key):
    _failure(key, Seen(None), _demote(key))
    assert (_row(key).state, _row(key).consecutive_failures) == ("closed", 1)
    assert _demoted(key) == [(NOW + timedelta(seconds=60),)]
    _failure(key, None, None)  # a probe was held: no snapshot to trust, the row is read again
    assert _row(key).state == CircuitState.OPEN


def test_demotions_are_recorded_once_and_resolved(db):
    assignment = AssignmentFactory()
    until = NOW + timedelta(seconds=60)
    services.demotion_record(services.Demote(assignment.pk, "gpt-5", UNAVAILABLE, until))
    services.demotion_record(services.Demote(assignment.pk, "gpt-5", UNAVAILABLE, until))
    assert Demotion.objects.get().until == until
    services.demotion_resolve(assignment_id=assignment.pk, model="gpt-5")
    assert not Demotion.objects.exists()


def test_affinity_is_upserted_with_its_expiry(db):
    owner = GatewayKeyFactory()
    first, second = AssignmentFactory(), AssignmentFactory()
    for assignment in (first, second):
        services.affinity_record(
            gateway_key_id=owner.pk,
            kind=AffinityKind.SESSION,
            key="s-1",
            assignment_id=assignment.pk,
            model="gpt-5",
            ttl=timedelta(hours=1),
            now=NOW,
        )
    row = Affinity.objects.get()
    assert (row.gateway_key_id, row.assignment_id, row.model, row.expires_at) == (
        owner.pk,
        second.pk,
        "gpt-5",
        NOW + timedelta(hours=1),
    )


def test_a_session_name_is_namespaced_per_key_and_never_overwritten_by_another(db):
    """SPEC §7.2: key 2 naming key 1's session writes its own row; key 1's stays as it was."""
    one, two = GatewayKeyFactory(), GatewayKeyFactory()
    a, b = AssignmentFactory(), AssignmentFactory()
    for owner, assignment in ((one, a), (two, b)):
        services.affinity_record(
            gateway_key_id=owner.pk,
            kind=AffinityKind.SESSION,
            key="shared-name",
            assignment_id=assignment.pk,
            model="gpt-5",
            ttl=timedelta(hours=1),
            now=NOW,
        )
    rows = dict(Affinity.objects.values_list("gateway_key_id", "assignment_id"))
    assert rows == {one.pk: a.pk, two.pk: b.pk}
    mine = affinities.affinities_load(key_id=one.pk, now=NOW, session="shared-name")
    assert mine.session is not None and mine.session.assignment_id == a.pk


@pytest.mark.parametrize("kind", list(AffinityKind))
def test_another_keys_affinity_reads_exactly_like_an_unknown_one(db, django_assert_num_queries, kind):
    """The same single query and the same nothing, for every affinity kind (SPEC §7.2)."""
    owner, stranger = GatewayKeyFactory(), GatewayKeyFactory()
    services.affinity_record(
        gateway_key_id=owner.pk,
        kind=kind,
        key="id-1",
        assignment_id=AssignmentFactory().pk,
        ttl=timedelta(hours=1),
        now=NOW,
    )
    ids = {
        AffinityKind.RESPONSE: "response_id",
        AffinityKind.SESSION: "session",
        AffinityKind.FILE: "file_ids",
    }[kind]

    def load(key_id: int, name: str, now: datetime = NOW):
        value = (name,) if kind is AffinityKind.FILE else name
        with django_assert_num_queries(1):
            return affinities.affinities_load(key_id=key_id, now=now, **{ids: value})

    assert load(owner.pk, "id-1") != affinities.Affinities()
    assert load(stranger.pk, "id-1") == affinities.Affinities() == load(stranger.pk, "id-unknown")
    # Expired reads as unknown too.
    assert load(owner.pk, "id-1", NOW + timedelta(hours=2)) == affinities.Affinities()


def test_prune_deletes_only_expired_affinities_in_bounded_batches(db):
    owner = GatewayKeyFactory()
    for n in range(5):
        services.affinity_record(
            gateway_key_id=owner.pk,
            kind=AffinityKind.FILE,
            key=f"file-{n}",
            assignment_id=None,
            ttl=timedelta(minutes=n - 2),  # file-0, file-1 and file-2 are expired at NOW
            now=NOW,
        )
    assert services.affinity_prune(now=NOW, limit=2) == 2
    assert services.affinity_prune(now=NOW, limit=2) == 1
    assert services.affinity_prune(now=NOW, limit=2) == 0
    assert sorted(Affinity.objects.values_list("key", flat=True)) == ["file-3", "file-4"]


def test_prune_affinities_command_deletes_every_expired_row(db):
    owner = GatewayKeyFactory()
    past = timezone.now() - timedelta(days=1)
    for n in range(3):
        services.affinity_record(
            gateway_key_id=owner.pk,
            kind=AffinityKind.RESPONSE,
            key=f"resp_{n}",
            assignment_id=None,
            ttl=timedelta(hours=(-1, 1, 48)[n]),  # resp_0 and resp_1 have expired by now
            now=past,
        )
    out = StringIO()
    call_command("prune_affinities", "--batch", "1", stdout=out)
    assert "deleted 2 expired affinities" in out.getvalue()
    assert list(Affinity.objects.values_list("key", flat=True)) == ["resp_2"]


def _race(call, contenders):
    """`call`'s results in `contenders` threads started together, each on its own connection (a node)."""
    barrier = threading.Barrier(contenders)
    results = []

    def contend():
        try:
            barrier.wait()
            results.append(call())
        finally:
            connections.close_all()

    threads = [threading.Thread(target=contend) for _ in range(contenders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def _elsewhere(read):
    """What `read` finds on a connection of its own (another node), after everything committed so far."""
    return _race(read, contenders=1)


@requires_postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("probes", [1, 2])
def test_exactly_half_open_probes_callers_win_the_probe_race(probes):
    key = _key("sse")
    settings = BreakerSettings(failure_threshold=1, cooldown_seconds=1, half_open_probes=probes)
    for round_ in range(50):
        start = NOW + timedelta(minutes=round_ * 10)
        Circuit.objects.filter(**key.filter()).delete()
        services.circuit_record_failure(key=key, reason=UNAVAILABLE, settings=settings, now=start)
        take = partial(
            services.circuit_take_probe, key=key, settings=settings, now=start + timedelta(seconds=1)
        )
        wins = _race(take, contenders=4)
        assert len(wins) == 4
        assert wins.count(True) == probes, f"round {round_}: {wins}"
        assert _row(key).probes_in_flight == probes


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_a_circuit_opened_on_one_connection_is_seen_by_another(db):
    key = _key("http")
    _open(key)
    seen = _elsewhere(lambda: Circuit.objects.filter(**key.filter()).values_list("state", flat=True).first())
    assert seen == ["open"]


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_failures_from_one_snapshot_all_count_and_every_node_sees_them_at_once():
    """Requests on several nodes fail on one account at once, each with the circuit as its read found
    it: each failure is one statement whose swap only one wins; the others decide again on the row as
    stored. A commit that does not wait for the disk is seen by the next reader all the same."""
    key = _key("http")
    services.circuit_record_failure(key=key, reason=UNAVAILABLE, settings=SETTINGS, now=NOW)
    seen = Seen(services.circuit_snapshot(_row(key)))
    contenders = 4
    _race(lambda: _failure(key, seen, _demote(key)), contenders)
    found = _elsewhere(
        lambda: (
            Circuit.objects.filter(**key.filter()).values_list("state", "consecutive_failures")[0],
            Demotion.objects.filter(assignment_id=key.assignment_id).count(),
        )
    )
    assert found == [(("open", 1 + contenders), 1)]

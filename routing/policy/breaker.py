"""Circuit transitions (SPEC §7.1), data in, data out.

Contract: every function takes the circuit as it was read (a CircuitSnapshot, or None when no row
exists, which means closed and clean) and returns the snapshot to write, or None for "write
nothing". The services apply the result with one conditional UPDATE guarded by the fields they
read (compare-and-swap), so two nodes never both make the same transition.

- closed: each qualifying failure counts; at `failure_threshold` consecutive ones -> open for
  `cooldown_seconds`. The reason is the latest failure's. `credential_rejected` opens at once: a
  revoked key or a deactivated account does not heal by itself between two requests.
- `governing(specific, wide)`: an assignment-wide circuit (credential_rejected) that is not closed
  governs every (model, route class) of its assignment; otherwise the pair's own circuit does.
- open: blocked until `open_until`; from then on probe-admissible. A failure while open and still
  cooling only counts (and updates the reason); it does not extend the cooldown.
- `acquire_probe`: open past `open_until`, or half-open with a free slot or an expired lease ->
  half-open holding one more probe (a lost lease resets the count), lease `probe_lease_seconds`.
- a probe's failure (any failure while half-open, or once the cooldown has passed) -> open again
  with the cooldown doubled, bounded by `max_cooldown_seconds`.
- success from any non-clean state -> closed and clean; on a clean circuit it writes nothing.
- neutral (never started, client disconnect, stream closed without a terminal event, or an outcome
  that records nothing): frees one probe slot, nothing else.
- `admission`: allowed (closed) | probe_needed | open_blocked. `health` folds admission and reason
  into the Health a Candidate carries: open for upstream_model_unavailable is BLOCKED
  (ineligible); open for a transient reason is COOLING (kept last, for availability).
"""

import enum
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from routing.policy.types import CircuitReason, CircuitState, Health


class Admission(enum.StrEnum):
    ALLOWED = "allowed"
    PROBE_NEEDED = "probe_needed"
    OPEN_BLOCKED = "open_blocked"


@dataclass(frozen=True, slots=True)
class BreakerSettings:
    failure_threshold: int = 3
    cooldown_seconds: int = 60
    max_cooldown_seconds: int = 600
    half_open_probes: int = 1
    probe_lease_seconds: int = 60


@dataclass(frozen=True, slots=True)
class CircuitSnapshot:
    state: CircuitState = CircuitState.CLOSED
    reason: CircuitReason | None = None
    consecutive_failures: int = 0
    cooldown_seconds: int = 0
    open_until: datetime | None = None
    probes_in_flight: int = 0
    probe_lease_expires_at: datetime | None = None

    @property
    def clean(self) -> bool:
        return self.state is CircuitState.CLOSED and self.consecutive_failures == 0


CLEAN = CircuitSnapshot()


def _cooled(snapshot: CircuitSnapshot, now: datetime) -> bool:
    # An open row without a deadline cannot exist (DB constraint); if it did, let a probe through.
    return snapshot.open_until is None or now >= snapshot.open_until


def _lease_expired(snapshot: CircuitSnapshot, now: datetime) -> bool:
    return snapshot.probe_lease_expires_at is not None and now >= snapshot.probe_lease_expires_at


def admission(snapshot: CircuitSnapshot | None, settings: BreakerSettings, now: datetime) -> Admission:
    if snapshot is None or snapshot.state is CircuitState.CLOSED:
        return Admission.ALLOWED
    if snapshot.state is CircuitState.OPEN:
        return Admission.PROBE_NEEDED if _cooled(snapshot, now) else Admission.OPEN_BLOCKED
    if snapshot.probes_in_flight < settings.half_open_probes or _lease_expired(snapshot, now):
        return Admission.PROBE_NEEDED
    return Admission.OPEN_BLOCKED


def blocked_health(reason: CircuitReason | None) -> Health:
    """The health of a circuit that admits nothing (or whose probe slot another node just took)."""
    return Health.BLOCKED if reason is CircuitReason.UPSTREAM_MODEL_UNAVAILABLE else Health.COOLING


def health(snapshot: CircuitSnapshot | None, settings: BreakerSettings, now: datetime) -> Health:
    if snapshot is None or snapshot.clean:
        return Health.HEALTHY
    match admission(snapshot, settings, now):
        case Admission.ALLOWED:
            return Health.FAILING
        case Admission.PROBE_NEEDED:
            return Health.PROBE
        case Admission.OPEN_BLOCKED:
            return blocked_health(snapshot.reason)


def acquire_probe(
    snapshot: CircuitSnapshot | None, settings: BreakerSettings, now: datetime
) -> CircuitSnapshot | None:
    """The half-open snapshot that holds one more probe, or None when no probe is admissible."""
    if snapshot is None or admission(snapshot, settings, now) is not Admission.PROBE_NEEDED:
        return None
    held = snapshot.probes_in_flight
    if snapshot.state is CircuitState.OPEN or _lease_expired(snapshot, now):
        held = 0  # probes older than the lease are presumed lost
    return replace(
        snapshot,
        state=CircuitState.HALF_OPEN,
        probes_in_flight=held + 1,
        probe_lease_expires_at=now + timedelta(seconds=settings.probe_lease_seconds),
    )


def _open(reason: CircuitReason, cooldown: int, failures: int, now: datetime) -> CircuitSnapshot:
    return CircuitSnapshot(
        state=CircuitState.OPEN,
        reason=reason,
        consecutive_failures=failures,
        cooldown_seconds=cooldown,
        open_until=now + timedelta(seconds=cooldown),
        probes_in_flight=0,
        probe_lease_expires_at=None,
    )


def on_failure(
    snapshot: CircuitSnapshot | None, reason: CircuitReason, settings: BreakerSettings, now: datetime
) -> CircuitSnapshot:
    current = snapshot if snapshot is not None else CLEAN
    failures = current.consecutive_failures + 1
    if current.state is CircuitState.CLOSED:
        if failures >= settings.failure_threshold or reason is CircuitReason.CREDENTIAL_REJECTED:
            first = min(settings.cooldown_seconds, settings.max_cooldown_seconds)
            return _open(reason, first, failures, now)
        return replace(current, reason=reason, consecutive_failures=failures)
    if current.state is CircuitState.OPEN and not _cooled(current, now):
        return replace(current, reason=reason, consecutive_failures=failures)
    # A failed probe (or a failure once the cooldown is over): open again, for twice as long.
    base = current.cooldown_seconds or settings.cooldown_seconds
    return _open(reason, min(base * 2, settings.max_cooldown_seconds), failures, now)


def governing(
    specific: CircuitSnapshot | None, wide: CircuitSnapshot | None
) -> tuple[CircuitSnapshot | None, bool]:
    """(the circuit that decides a candidate's health, whether it is the assignment-wide one)."""
    if wide is not None and wide.state is not CircuitState.CLOSED:
        return wide, True
    return specific, False


def on_success(snapshot: CircuitSnapshot | None) -> CircuitSnapshot | None:
    if snapshot is None or snapshot.clean:
        return None
    return CLEAN


def on_neutral(snapshot: CircuitSnapshot | None) -> CircuitSnapshot | None:
    """Call only for an attempt that held a probe: it frees the slot without a verdict."""
    if snapshot is None or snapshot.state is not CircuitState.HALF_OPEN or snapshot.probes_in_flight == 0:
        return None
    left = snapshot.probes_in_flight - 1
    return replace(
        snapshot,
        probes_in_flight=left,
        probe_lease_expires_at=snapshot.probe_lease_expires_at if left else None,
    )

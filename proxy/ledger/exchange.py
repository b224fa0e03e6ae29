"""What one client request is, as the attempt loop fills it and the ledger, the metrics and the traces
read it (never content), and the values an attempt ends in: a `Final` answer, a `Stream` of output
already visible, or a classified `Failure`.

Plain data with no I/O: every module of the request path imports it, the loop (`proxy.relay`)
included, so none of them has to import the loop to read what it did.
"""

import asyncio
import secrets
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from datetime import datetime

from pools.selectors import Authenticated
from routing.policy.errors import ErrorCode
from routing.policy.failures import (
    DispatchState,
    Disposition,
    FailureClass,
    Observation,
    canonical_error,
    classify,
    dispatch_state,
    disposition,
)
from routing.policy.sanitize import sanitized
from routing.policy.vocabulary import AttemptStatus
from routing.services import CircuitKey


@dataclass(slots=True)
class AttemptLog:
    ordinal: int
    assignment_id: int
    model: str
    route_class: str
    status: str
    dispatch_state: str = DispatchState.NOT_SENT
    failure_class: str = ""
    ineligible_reason: str = ""
    upstream_status: int | None = None
    error_code: str = ""
    elapsed_ms: int = 0
    # From dispatch to the upstream's response headers (HTTP, SSE) or its first event (websocket): what
    # the ledger writer folds into the pair's latency average when the attempt succeeded
    # (routing.policy.latency).
    ttfb_ms: int | None = None
    # The smallest share of a rate limit its answer said is left, and when that limit resets (headroom,
    # routing.policy.headroom): kept by the ledger writer beside the latency average, for the draw (§5.4).
    headroom_left: float | None = None
    headroom_until: datetime | None = None
    # It placed its conversation on this account (a first turn, or one its last account did not serve): the
    # ledger writer counts it as routing.policy.latency.PLACEMENT_LOAD in the pair's load, as its next turns
    # follow.
    placed: bool = False
    input_tokens: int | None = None  # every input token, cached ones included (proxy.wire.payloads.Usage)
    output_tokens: int | None = None
    cached_read_tokens: int | None = None  # parts of input_tokens, where the provider reports them
    cached_write_tokens: int | None = None
    cost_micros: int | None = None
    assignment: str = ""  # names, for the metrics' labels and traces (the ledger keeps the id)
    pool: str = ""
    adapter: str = ""  # the upstream API family (a trace's gen_ai.provider.name)
    offset_ms: int = 0  # when the attempt began, from the request's start (a trace's span start)


def new_response_id() -> str:
    """A response id the gateway gives a Responses answer it translated: unguessable and never reused,
    whatever ids the upstream sends (an upstream's id is never its identity, issue 45)."""
    return f"resp_{secrets.token_hex(16)}"


@dataclass(slots=True)
class Exchange:
    """What the ledger records of one client request: never content."""

    request_id: str
    key_id: int | None
    route: str
    transport: str
    requested_model: str
    started_at: datetime
    served_model: str = ""
    outcome: str = ""
    status_code: int | None = None
    retry_count: int = 0
    attempts: list[AttemptLog] = field(default_factory=list)
    finished_at: datetime | None = None
    model_fallback: bool = False  # served by a cross-model candidate after a model_not_found
    operation_id: str = ""  # the client's x-gateway-operation-id, else the request id
    budget_period: str = ""  # the key's budget period, for its reservation and settlement
    reserved_micros: int = 0  # what this request holds of its key's budget, as far as it knows
    reserving: bool = False  # it asked for a reservation: the ledger settles its hold (pools.BudgetHold)
    config_version: int | None = None  # the routing configuration its route was chosen under
    fallback_reason: str = ""  # the requested model was substituted before routing: explicit | family
    first_output_at: datetime | None = None  # streams: when the first visible output was released
    key_name: str = ""  # for the log line (the ledger keeps the id)
    limit: str = ""  # the key's limit that refused the request (rpm, tpm, concurrent), for the log line

    def keyed(self, authenticated: Authenticated) -> None:
        """What the request's key, as its read found it, says of the record."""
        self.key_id, self.key_name = authenticated.key.key_id, authenticated.key.name
        self.config_version, self.budget_period = authenticated.config_version, authenticated.budget_period

    def refused(self, code: str, param: str | None, status: int) -> None:
        """A typed refusal of the gateway's own as the outcome; the key's limit a `rate_limit_exceeded`
        names is kept for the log line."""
        self.outcome, self.status_code = code, status
        if code == ErrorCode.RATE_LIMIT_EXCEEDED:
            self.limit = param or ""

    @property
    def attempts_made(self) -> int:
        """Attempts sent (or tried) upstream: every candidate but the ineligible ones. What
        x-gateway-attempts, the log line and the trace report, and what backoff grows with."""
        return sum(1 for a in self.attempts if a.status != AttemptStatus.INELIGIBLE)


@dataclass(frozen=True, slots=True)
class Memory:
    """Which affinities a success should record (SPEC §7.2)."""

    response_ids: bool = False  # Responses routes: response id -> assignment, for previous_response_id
    session: str | None = None  # x-gateway-session
    session_seen: tuple[int | None, str] | None = None  # (assignment, model) already stored for it
    file_upload: bool = False  # POST /v1/files: the answer's file id -> assignment (`Relay.file_id`)
    file_deleted: str | None = None  # DELETE /v1/files/{id}: that file's affinity is over


@dataclass(frozen=True, slots=True)
class Final:
    status: int
    body: bytes
    content_type: str = "application/json"
    frames: tuple[bytes, ...] = ()  # websocket: the events to send, one per frame (`body` is unused)
    should_retry: bool | None = None  # a typed error's `x-should-retry` (SPEC §4); None on an answer
    retry_after: int | None = None  # a relayed 429's `retry-after`
    headers: tuple[tuple[str, str], ...] = ()  # more response headers (the count_tokens estimate's)


@dataclass(frozen=True, slots=True)
class Lease:
    """The probe lease this request took before dispatch (§5.4): for `candidate`, on `circuit`."""

    candidate: tuple[int, str]
    circuit: CircuitKey


@dataclass(slots=True)
class Stream:
    chunks: AsyncIterator[bytes]


@dataclass(frozen=True, slots=True)
class Failure:
    failure: FailureClass
    dispatch: DispatchState
    status: int | None
    error_type: str | None
    code: str | None
    param: str | None
    withheld: tuple[bytes, ...] = ()  # the client output held back before the failure
    final: bool = False  # the upstream answered, but not in a relayable form: returned as is, never replayed
    retry_after: int | None = None  # a relayed 429's `retry-after`, whole seconds (bounded)
    # A context overflow's (tokens, maximum) in its provider's documented words (`canonical_error`):
    # the only part of an upstream's message ever kept.
    overflow: tuple[int, int] | None = None

    @classmethod
    def observed(
        cls, observation: Observation, withheld: tuple[bytes, ...] = (), retry_after: int | None = None
    ) -> "Failure":
        """What an attempt's failure was (SPEC §5.6), from what was observed of it."""
        failure = classify(observation) or FailureClass.UPSTREAM_ERROR
        # Only sanitized fields go on (SPEC §4): to the client, the ledger, the log and the metrics.
        canonical = canonical_error(observation.body, observation.errors)
        error = sanitized(canonical, failure)
        return cls(
            failure=failure,
            dispatch=dispatch_state(observation.transport, observation.status),
            status=observation.status,
            error_type=error.type,
            code=error.code,
            param=error.param,
            withheld=withheld,
            retry_after=retry_after if observation.status == 429 else None,
            overflow=canonical.overflow,
        )

    @classmethod
    def unrelayable(cls, status: int, code: str) -> "Failure":
        """An answer the upstream completed that the client cannot be given (too large, or not
        expressible in its API): a typed 502, never a guess, never a replay."""
        return cls(
            failure=FailureClass.UPSTREAM_ERROR,
            dispatch=DispatchState.COMPLETED,
            status=status,
            error_type="upstream_error",
            code=code,
            param=None,
            final=True,
        )

    @property
    def disposition(self) -> Disposition:
        return Disposition.RETURN_FAILURE if self.final else disposition(self.failure, self.dispatch)


async def settle(work: Awaitable[None]) -> None:
    """Run bookkeeping to its end even when the caller is cancelled meanwhile (a client that leaves
    right after the last event must not lose the ledger row); the cancel is re-raised afterwards."""
    task = asyncio.ensure_future(work)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        if not task.done():
            await asyncio.wait([task])
        raise

"""The gateway's vocabularies (SPEC §5, §6, §7), each declared once.

Contract: string enums only, standard library only. The pure core, the ORM (`choices` are built from
these with `pools.models.choices`), the ledger, the relay and the metrics all use these members; a
value is never spelled as a bare string elsewhere. Values are stored in the database and exposed as
metric labels and ledger fields: renaming one is a data migration, not a refactor.
"""

import enum


class RouteClass(enum.StrEnum):
    """How a client request travels (SPEC §5): also the transport recorded in the ledger."""

    HTTP = "http"
    SSE = "sse"
    WEBSOCKET = "websocket"


class CircuitState(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitReason(enum.StrEnum):
    UPSTREAM_MODEL_UNAVAILABLE = "upstream_model_unavailable"
    UPSTREAM_UNAVAILABLE = "upstream_unavailable"
    TIMEOUT = "timeout"
    RATE_LIMITED = "rate_limited"  # a demotion's reason only: 429 and quota never touch a circuit
    CREDENTIAL_REJECTED = "credential_rejected"  # assignment-wide (every model and route class)
    # A demotion's reason only: the upstream's rate-limit headers said less than `headroom_floor` of a
    # limit is left, so the pool moves off the account before it answers 429 (SPEC §5.4).
    HEADROOM = "headroom"


class TriState(enum.StrEnum):
    """A declared capability or privacy fact. Undeclared is unknown and never reads as true or false."""

    TRUE = "true"
    FALSE = "false"
    UNKNOWN = "unknown"


class DataCollection(enum.StrEnum):
    """Whether an upstream may collect the data it is sent (SPEC §3 `privacy.data_collection`)."""

    ALLOW = "allow"
    DENY = "deny"
    UNKNOWN = "unknown"


class ToolRepresentation(enum.StrEnum):
    """How an assignment carries tool calls (SPEC §3 `capabilities.tool_representation`)."""

    NATIVE = "native"
    EMULATED = "emulated"
    UNKNOWN = "unknown"


class Router(enum.StrEnum):
    """Whether an assignment is the provider itself or a third-party router in front of it (SPEC §3)."""

    DIRECT = "direct"
    THIRD_PARTY = "third_party"


class BudgetPeriod(enum.StrEnum):
    """A key's budget period (SPEC §7.4); a key without one has a lifetime budget."""

    DAY = "day"
    WEEK = "week"
    MONTH = "month"


class FailureClass(enum.StrEnum):
    MODEL_UNAVAILABLE = "model_unavailable"
    MODEL_NOT_FOUND_CROSS = "model_not_found_cross"
    RATE_LIMITED = "rate_limited"
    QUOTA = "quota"
    CREDENTIAL_REJECTED = "credential_rejected"
    UNAVAILABLE = "unavailable"
    SAFETY_REFUSAL = "safety_refusal"
    CONTEXT_OVERFLOW = "context_overflow"
    DISPATCH_UNKNOWN = "dispatch_unknown"
    DEADLINE = "deadline"  # the client's deadline ran out mid-attempt: 504, neutral for the circuit
    CLIENT_ERROR = "client_error"
    UPSTREAM_ERROR = "upstream_error"  # another 5xx, or a stream error of no known canonical shape
    INTERRUPTED = "interrupted"  # a stream closed without a terminal event: neutral for the circuit
    CANCELLED = "cancelled"  # client disconnect: neutral for the circuit


class DispatchState(enum.StrEnum):
    NOT_SENT = "not_sent"
    REJECTED = "rejected"
    UNKNOWN = "unknown"
    COMPLETED = "completed"


class AttemptStatus(enum.StrEnum):
    """One candidate's fate in the ledger (SPEC §7.3). Every status but INELIGIBLE was sent (or tried
    to be): "attempts made" counts those."""

    SUCCEEDED = "succeeded"
    RETRYABLE_FAILED = "retryable_failed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INELIGIBLE = "ineligible"


class Outcome(enum.StrEnum):
    """The outcomes of a client request that are the relay's own. A request's recorded outcome is one
    of these, a typed error code of the gateway (`routing.policy.errors.ErrorCode`), or an upstream final
    failure's sanitized code (else its failure class)."""

    OK = "ok"
    CANCELLED = "cancelled"  # the client left
    TERMINAL_REFUSAL = "terminal_refusal"  # a safety refusal relayed as it came
    UPSTREAM_ERROR_AFTER_OUTPUT = "upstream_error_after_output"  # failed once output was visible
    UPSTREAM_INTERRUPTED = "upstream_interrupted"  # the upstream cut a stream or body short
    GATEWAY_SHUTTING_DOWN = "gateway_shutting_down"  # this node drained a stream it was relaying
    GATEWAY_LOST = (
        "gateway_lost"  # its node died in flight; recorded from the node's journal (proxy.ledger.spool)
    )


class ClientRoute(enum.StrEnum):
    """A client request's route as the ledger records it (`RequestRecord.route`), the metrics label it
    and the trace names it (SPEC §4, §10): the path, with `{id}` for a file id (never recorded), and
    the method where one path has two meanings."""

    CHAT_COMPLETIONS = "/v1/chat/completions"
    RESPONSES = "/v1/responses"
    RESPONSES_COMPACT = "/v1/responses/compact"
    MESSAGES = "/v1/messages"
    COUNT_TOKENS = "/v1/messages/count_tokens"
    MODELS = "/v1/models"
    MODEL = "/v1/models/{id}"
    EMBEDDINGS = "/v1/embeddings"
    FILES = "/v1/files"
    FILE = "/v1/files/{id}"
    FILE_CONTENT = "/v1/files/{id}/content"
    FILE_DELETE = "DELETE /v1/files/{id}"

    @property
    def tail(self) -> str:
        """The route as it continues an upstream's base URL (which ends in its API version, `/v1`): the
        path without `/v1`, e.g. `/chat/completions`. Providers and eligibility speak routes so."""
        return self.value.removeprefix("/v1")

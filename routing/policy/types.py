"""The shared vocabulary of the pure routing core (SPEC §5, §7.1).

Contract: frozen values and string enums only; no behaviour beyond trivial derived properties.
The route class, circuit, tri-state, privacy, tool representation and router vocabularies are
declared in `routing.policy.vocabulary` (the ORM's choices are built from them) and re-exported here, so a
selector copies a column straight into a member (`TriState(row.tools)`). A value that was not
declared is UNKNOWN and never reads as true or false; a price that was not declared is None and never
reads as zero.
"""

import enum
from dataclasses import dataclass

from routing.policy.vocabulary import CircuitReason as CircuitReason
from routing.policy.vocabulary import CircuitState as CircuitState
from routing.policy.vocabulary import DataCollection as DataCollection
from routing.policy.vocabulary import RouteClass as RouteClass
from routing.policy.vocabulary import Router as Router
from routing.policy.vocabulary import ToolRepresentation as ToolRepresentation
from routing.policy.vocabulary import TriState as TriState

AUTO_MODEL = "auto"


# The longest id an affinity holds (a response id, a session name, a file id): the column's width
# (routing.models.Affinity.key). A longer response id is never remembered (proxy.wire.payloads.response_id),
# a session header is cut to it (routing.affinities.session_named), and a longer id read names none.
AFFINITY_KEY_MAX = 300

# The (model, route class) of an assignment-wide circuit: `credential_rejected` is about the
# assignment's credential or account, so it covers every model and route class at once (SPEC §7.1).
ASSIGNMENT_WIDE = "*"


class Health(enum.StrEnum):
    """A candidate's serving signal for the request's route class, derived from its circuit by
    `breaker.health`. Declared from best to worst: preference ranks in this order."""

    HEALTHY = "healthy"  # no circuit row, or closed with no recent failure
    FAILING = "failing"  # closed, with consecutive failures below the threshold
    HELD = "held"  # half-open, and this request holds the probe lease (set by the router, §5.4)
    PROBE = "probe"  # open past its cooldown, or half-open with a free (or lost) probe slot
    COOLING = "cooling"  # open for a transient reason, or half-open with another request's lease
    BLOCKED = "blocked"  # open for upstream_model_unavailable, no probe admissible: ineligible

    @property
    def closed(self) -> bool:
        """The circuit is closed: what §5.5 calls ready."""
        return self in (Health.HEALTHY, Health.FAILING)


class IneligibleReason(enum.StrEnum):
    """Exactly the `param` values of `no_eligible_backend` (SPEC §4), in the order they are checked."""

    CAPABILITY = "capability"
    PRIVACY = "privacy"
    REGION = "region"
    ROUTER = "router"
    QUALITY = "quality"
    BUDGET = "budget"
    PRICE_UNKNOWN = "price_unknown"
    DEADLINE = "deadline"
    CONTEXT_WINDOW = "context_window"
    CIRCUIT_OPEN = "circuit_open"


class PriceSource(enum.StrEnum):
    """Where a price came from (SPEC §3): the catalog entry (configured, always wins), the bundled
    list-price table (`catalog/prices.yaml`), or nowhere (unknown: never zero)."""

    CONFIGURED = "configured"
    BUNDLED = "bundled"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Price:
    """Micros per million tokens; None is unknown (never zero). An explicit 0 is a real free price.
    The cached rates (input read from the provider's prompt cache, input written to it) are optional:
    where they are unknown those tokens are priced at the input rate (`routing.policy.pricing`)."""

    input_per_mtok_micros: int | None = None
    output_per_mtok_micros: int | None = None
    source: PriceSource = PriceSource.CONFIGURED
    cached_input_per_mtok_micros: int | None = None
    cache_write_per_mtok_micros: int | None = None

    @property
    def provenance(self) -> PriceSource:
        """`unknown` unless both sides are known: a half-declared price prices nothing."""
        if self.input_per_mtok_micros is None or self.output_per_mtok_micros is None:
            return PriceSource.UNKNOWN
        return self.source


@dataclass(frozen=True, slots=True)
class Candidate:
    """One (assignment, model) the plan may dispatch to, with every fact the gate and the
    preference need. The selector fills it from Assignment, CatalogEntry, Circuit and Demotion."""

    assignment_id: int
    model: str
    assignment: str = ""  # the name, for ledgers and explanations
    pool: str = ""  # the pool's name, for metrics
    adapter: str = ""  # the upstream API family (`openai`, `openrouter`, `anthropic`)
    cross_model: bool = False  # set by the plan for the fallback model's candidates
    # preference
    tier: int = 0
    weight: int = 1
    latency_ms: float | None = None
    headroom_left: float | None = None  # the share of its tightest rate limit left, while known (§5.4)
    load: float | None = (
        None  # its recent load (routing.policy.latency): of the draw's choices the least goes first
    )
    demoted: bool = False
    health: Health = Health.HEALTHY
    # contract
    region: str = ""
    router: Router = Router.DIRECT
    zero_retention: TriState = TriState.UNKNOWN
    data_collection: DataCollection = DataCollection.UNKNOWN
    tools: TriState = TriState.UNKNOWN
    write_tools: TriState = TriState.UNKNOWN
    vision: TriState = TriState.UNKNOWN
    role_separation: TriState = TriState.UNKNOWN
    tool_representation: ToolRepresentation = ToolRepresentation.UNKNOWN
    model_tools: TriState = TriState.UNKNOWN  # catalog (per model) value: overrides `tools` when known
    model_vision: TriState = TriState.UNKNOWN  # catalog (per model) value: overrides `vision` when known
    quality: float | None = None
    min_deadline_ms: int = 0
    context_window: int | None = None
    max_output_tokens: int | None = None  # the model's own output limit (catalog); None: unknown
    price: Price = Price()
    # The catalog provenance of (assignment, model) (`configured`, `observed`, `preserved`); None when
    # the catalog holds none. A code-less 404 is a model failure only with provenance (§5.6).
    provenance: str | None = None

    @property
    def key(self) -> tuple[int, str]:
        return (self.assignment_id, self.model)


@dataclass(frozen=True, slots=True)
class Requirements:
    """What this turn needs from any route. Key requirements, request headers (which only tighten,
    see `eligibility.tighten`) and the request body are merged into one value before the gate."""

    tools_offered: bool = False
    write_tools: bool = False
    untrusted_content: bool = False  # tool results present in the input
    vision: bool = False  # image inputs present
    zero_retention: bool = False  # needs zero_retention true and data_collection deny
    regions: frozenset[str] | None = None  # None: any region; a set: only these (empty: none)
    no_third_party_router: bool = False
    min_quality: float = 0.0
    prompt_tokens: int = 0  # estimated
    max_output_tokens: int = 0
    deadline_remaining_ms: int | None = None  # None: no deadline
    min_attempt_ms: int = 0  # `retry.min_attempt_ms`: no attempt with less of the deadline left
    budget_remaining_micros: int | None = None  # None: the key has no budget
    # The adapters that can carry this route at all (None: any). A Responses turn has no Anthropic
    # form, and count_tokens exists only on Anthropic upstreams.
    adapters: frozenset[str] | None = None

    @property
    def estimated_tokens(self) -> int:
        return self.prompt_tokens + self.max_output_tokens

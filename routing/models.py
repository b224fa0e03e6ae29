"""Durable, shared routing state (SPEC §7.1, §7.2). Every node reads and writes the same rows:
there is no process-local health state."""

from django.db import models
from django.db.models import Q

from pools.models import Assignment, GatewayKey, Pool, choices, choices_check, values
from routing.policy.types import AFFINITY_KEY_MAX, ASSIGNMENT_WIDE
from routing.policy.vocabulary import CircuitReason, CircuitState, RouteClass

# A circuit's route class; `*` is an assignment-wide circuit (model `*` too): credential_rejected
# covers every model and route class of the assignment at once (SPEC §7.1).
CIRCUIT_ROUTE_CLASSES = [*choices(RouteClass), (ASSIGNMENT_WIDE, "every route class")]


class Circuit(models.Model):
    """One breaker per (pool, assignment, model, route class). A row exists only once something
    failed: a healthy pair has no row, so a success on it writes nothing."""

    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="+")
    assignment = models.ForeignKey(Assignment, on_delete=models.CASCADE, related_name="circuits")
    model = models.CharField(max_length=200)
    route_class = models.CharField(max_length=9, choices=CIRCUIT_ROUTE_CLASSES)
    state = models.CharField(max_length=9, choices=choices(CircuitState), default=CircuitState.CLOSED.value)
    reason = models.CharField(max_length=30, choices=choices(CircuitReason), blank=True)
    consecutive_failures = models.PositiveIntegerField(default=0)
    cooldown_seconds = models.PositiveIntegerField(default=0, help_text="The current open period.")
    open_until = models.DateTimeField(null=True, blank=True)
    probes_in_flight = models.PositiveIntegerField(default=0)
    probe_lease_expires_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["pool", "assignment", "model", "route_class"], name="circuit_unique_key"
            ),
            choices_check("circuit", "route_class", [value for value, _ in CIRCUIT_ROUTE_CLASSES]),
            choices_check("circuit", "state", CircuitState),
            models.CheckConstraint(
                condition=Q(reason="") | Q(reason__in=values(CircuitReason)), name="circuit_reason_valid"
            ),
            models.CheckConstraint(
                condition=Q(state=CircuitState.CLOSED) | Q(open_until__isnull=False),
                name="circuit_open_has_deadline",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.assignment_id}:{self.model}:{self.route_class} {self.state}"


class Demotion(models.Model):
    """An (assignment, model) moved to the end of later plans until `until`; never an exclusion."""

    assignment = models.ForeignKey(Assignment, on_delete=models.CASCADE, related_name="demotions")
    model = models.CharField(max_length=200)
    reason = models.CharField(max_length=30, choices=choices(CircuitReason))
    until = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["assignment", "model"], name="demotion_unique"),
            choices_check("demotion", "reason", CircuitReason),
        ]

    def __str__(self) -> str:
        return f"{self.assignment_id}:{self.model} until {self.until:%H:%M:%S}"


class AffinityKind(models.TextChoices):
    RESPONSE = "response"  # previous_response_id -> the assignment that created it (hard pin)
    FILE = "file"  # file id -> the assignment that holds it (hard pin)
    SESSION = "session"  # x-gateway-session -> last assignment and cached auto model (soft)


class Affinity(models.Model):
    """A remembered routing fact, owned by the gateway key whose request created it (SPEC §7.2).

    Every read is by (owner, kind, key), so another key's id reads exactly like an unknown one (the
    same indexed lookup, the same miss), and a session name is a name within its key's namespace:
    no key can read, follow or overwrite another key's row."""

    gateway_key = models.ForeignKey(GatewayKey, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=8, choices=AffinityKind.choices)
    key = models.CharField(max_length=AFFINITY_KEY_MAX)
    # SET_NULL keeps a hard pin whose assignment is gone, so the request gets 409, not a silent reroute.
    assignment = models.ForeignKey(Assignment, on_delete=models.SET_NULL, null=True, related_name="+")
    model = models.CharField(max_length=200, blank=True)
    expires_at = models.DateTimeField(db_index=True)  # expired rows are pruned by this index

    class Meta:
        verbose_name_plural = "affinities"
        constraints = [
            models.UniqueConstraint(fields=["gateway_key", "kind", "key"], name="affinity_owner_unique"),
            choices_check("affinity", "kind", AffinityKind),
        ]

    def __str__(self) -> str:
        # Titles, breadcrumbs and history name the row; whoever holds the whole id can use it (issue 45).
        return f"{self.kind}:{self.key[:8]}…"


class Latency(models.Model):
    """A moving average of an (assignment, model)'s upstream time to first byte (SPEC §5.4), kept by the
    ledger writer from the succeeded attempts of each batch it saves (`routing.policy.latency`): shared by
    every
    node, never written on a request's path. A pair that never succeeded has no row (latency unknown)."""

    assignment = models.ForeignKey(Assignment, on_delete=models.CASCADE, related_name="+")
    model = models.CharField(max_length=200)
    ewma_ms = models.FloatField()
    samples = models.PositiveBigIntegerField()
    updated_at = models.DateTimeField()
    # The latest headroom its answers reported (the smallest share of a rate limit left) and when that
    # limit resets: the draw scales the account's share by it until then (SPEC §5.4). Null: none reported.
    headroom_left = models.FloatField(null=True, blank=True)
    headroom_until = models.DateTimeField(null=True, blank=True)
    # How much it has served lately: its succeeded attempts, each worth 1 when written (one that placed a
    # conversation on it `routing.policy.latency.PLACEMENT_LOAD`) and halving every `LOAD_HALF_LIFE_S` since
    # (`updated_at` is when). Of the draw's choices the least loaded goes first (§5.4).
    load = models.FloatField(default=0.0)

    class Meta:
        verbose_name_plural = "latencies"
        constraints = [models.UniqueConstraint(fields=["assignment", "model"], name="latency_unique")]

    def __str__(self) -> str:
        return f"{self.assignment_id}:{self.model} {self.ewma_ms:.0f} ms"

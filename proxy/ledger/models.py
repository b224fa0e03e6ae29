"""The ledger (SPEC §7.3): what happened to each client request, never what was said."""

from django.db import models
from django.db.models import Q

from pools.models import Assignment, GatewayKey, choices, choices_check
from routing.policy.vocabulary import AttemptStatus, DispatchState, RouteClass

# A client request's transport is its route class (SPEC §5): one vocabulary for both columns.
Transport = RouteClass


class RequestRecord(models.Model):
    # Unique and the operation id indexed by declared constraints and indexes, not the fields' flags: on
    # PostgreSQL a flagged CharField gets a second, `varchar_pattern_ops` index for prefix LIKE, which no
    # query here makes (admin's search is case-insensitive, which that index cannot serve) and which every
    # ledger insert paid for.
    request_id = models.CharField(max_length=64)
    # The ledger's references are not database constraints (db_constraint=False): each was a check at
    # every batch's commit (about 6 us of PostgreSQL's CPU a row), and a key or an assignment deleted
    # while its requests were in flight failed their records' batch, so those records were lost. A record
    # now outlives them; deleting one through Django still empties the references it finds (on_delete),
    # and one written after that shows as deleted.
    key = models.ForeignKey(
        GatewayKey, on_delete=models.SET_NULL, null=True, blank=True, related_name="+", db_constraint=False
    )
    route = models.CharField(max_length=64, help_text="The client endpoint, e.g. /v1/chat/completions.")
    transport = models.CharField(max_length=9, choices=choices(Transport))
    requested_model = models.CharField(max_length=200, blank=True)
    served_model = models.CharField(max_length=200, blank=True)
    operation_id = models.CharField(
        max_length=64,
        blank=True,
        help_text="x-gateway-operation-id from the client, else the request id.",
    )
    outcome = models.CharField(max_length=64, help_text="`ok` or the typed error code (sanitized).")
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    retry_count = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField(db_index=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at"]
        constraints = [
            models.UniqueConstraint(fields=["request_id"], name="requestrecord_unique_request_id"),
            choices_check("requestrecord", "transport", Transport),
        ]
        indexes = [models.Index(fields=["operation_id"], name="requestrecord_operation_id")]

    def __str__(self) -> str:
        return self.request_id


class Attempt(models.Model):
    # No index of its own: attempt_unique_ordinal's leading column serves every lookup by request.
    # Written with its record, in the same transaction (proxy.ledger.services): not checked by the database
    # either (see RequestRecord.key).
    request = models.ForeignKey(
        RequestRecord, on_delete=models.CASCADE, related_name="attempts", db_index=False, db_constraint=False
    )
    ordinal = models.PositiveSmallIntegerField()
    assignment = models.ForeignKey(
        Assignment, on_delete=models.SET_NULL, null=True, related_name="+", db_constraint=False
    )
    model = models.CharField(max_length=200)
    route_class = models.CharField(max_length=9, choices=choices(RouteClass))
    status = models.CharField(max_length=16, choices=choices(AttemptStatus))
    failure_class = models.CharField(max_length=30, blank=True)
    ineligible_reason = models.CharField(max_length=30, blank=True)
    dispatch_state = models.CharField(max_length=9, choices=choices(DispatchState))
    upstream_status = models.PositiveSmallIntegerField(null=True, blank=True)
    error_code = models.CharField(
        max_length=64, blank=True, help_text="Canonical code only (sanitized), never a message."
    )
    elapsed_ms = models.PositiveIntegerField(default=0)
    input_tokens = models.PositiveIntegerField(
        null=True, blank=True, help_text="Every input token the provider counted, cached ones included."
    )
    output_tokens = models.PositiveIntegerField(null=True, blank=True)
    cached_read_tokens = models.PositiveIntegerField(
        null=True, blank=True, help_text="The part of the input read from the provider's prompt cache."
    )
    cached_write_tokens = models.PositiveIntegerField(
        null=True, blank=True, help_text="The part of the input written to the provider's prompt cache."
    )
    cost_micros = models.BigIntegerField(null=True, blank=True, help_text="Empty: unknown price.")
    config_version = models.PositiveIntegerField(
        null=True, blank=True, help_text="The routing configuration version the route was chosen under."
    )

    class Meta:
        ordering = ["request", "ordinal"]
        constraints = [
            models.UniqueConstraint(fields=["request", "ordinal"], name="attempt_unique_ordinal"),
            choices_check("attempt", "route_class", RouteClass),
            choices_check("attempt", "status", AttemptStatus),
            choices_check("attempt", "dispatch_state", DispatchState),
            models.CheckConstraint(
                condition=Q(cost_micros__isnull=True) | Q(cost_micros__gte=0), name="attempt_cost_nonneg"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.request_id}#{self.ordinal} {self.status}"


def cost_is_unknown(attempt) -> bool:
    """An attempt (a stored one, or the writer's `AttemptLog`) with no cost recorded although something
    was (or may have been) charged: it answered or was cancelled mid-way, or it reported usage. A failed
    attempt without usage had nothing to charge, so its missing cost is not "unknown". Counted apart on
    the spend page as "unpriced", never as $0."""
    if attempt.cost_micros is not None:
        return False
    charged = attempt.status in (AttemptStatus.SUCCEEDED, AttemptStatus.CANCELLED)
    return charged or attempt.input_tokens is not None or attempt.output_tokens is not None


# The daily totals' largest figure (a PostgreSQL bigint): a sum that would pass it stays at it.
MAX_TOTAL = 2**63 - 1


class DailySpend(models.Model):
    """The spend page's daily totals (issue 49): per UTC day of the request's start, key, assignment
    and model, the sums of the dispatched attempts (every status but ineligible) that /admin/spend/
    shows, so that it reads 30 x keys x routes rows whatever the ledger's size. Added to by the ledger
    writer in each batch's own transaction (`proxy.ledger.services.request_records_write`, one upsert), so the
    totals are the stored attempts' sums at every commit, today's included. `prune_ledger` keeps them
    when it deletes records (spend history outlives the request history) and deletes the days the
    page no longer shows.

    `key_id` and `assignment_id` are plain ids, 0 for none (a unique key over NULLs would not match in
    the upsert). Names and pools are resolved when the page reads, as the request list resolves them: a
    key deleted since reads "(no key)", an assignment deleted since is in no operator's pool."""

    day = models.DateField()
    key_id = models.BigIntegerField(help_text="The request's gateway key; 0: none.")
    assignment_id = models.BigIntegerField(help_text="The attempt's assignment; 0: none.")
    model = models.CharField(max_length=200)
    cost_micros = models.BigIntegerField(default=0, help_text="Known costs only.")
    attempts = models.BigIntegerField(default=0)
    unpriced = models.BigIntegerField(default=0, help_text="Attempts charged at an unknown price.")
    input_tokens = models.BigIntegerField(default=0)
    cached_read_tokens = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["day", "key_id", "assignment_id", "model"], name="dailyspend_unique_cell"
            )
        ]

    def __str__(self) -> str:
        return f"{self.day} key {self.key_id} assignment {self.assignment_id} {self.model}"

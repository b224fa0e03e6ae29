from datetime import UTC

from django.contrib import admin

from pools.scoping import PoolScopedAdmin, PoolScopedInline, ReadOnlyAdmin
from proxy import ledger_admin
from proxy.models import Attempt, RequestRecord
from proxy.spend import SpendPage
from proxy.upstreams import UpstreamsPanel


class AttemptInline(PoolScopedInline):
    model = Attempt
    extra = 0
    can_delete = False
    fields = (
        "ordinal",
        "assignment",
        "model",
        "route_class",
        "status",
        "failure_class",
        "ineligible_reason",
        "dispatch_state",
        "upstream_status",
        "error_code",
        "elapsed_ms",
        "input_tokens",
        "output_tokens",
        "cached_read_tokens",
        "cached_write_tokens",
        "cost_micros",
        "config_version",
    )
    readonly_fields = fields
    # The attempts as a timeline (one bar per attempt, scaled by elapsed time, coloured by status, the
    # rest in words) rather than a table wider than the page (issue 20 point 6).
    template = "admin/proxy/attempt_timeline.html"

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("assignment")

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(RequestRecord)
class RequestRecordAdmin(PoolScopedAdmin, ReadOnlyAdmin):
    """A request belongs to its key: a pool operator sees it when the key's pools are all theirs (so
    every attempt of it was on one of their assignments). A request without a key (a 401) is a
    superuser's."""

    pool_path = None
    key_path = "key"
    list_display = (
        "request_id",
        "started",
        "key_name",
        "pools",
        "models",
        "outcome_code",
        "attempts_sent",
        "took",
    )
    # None of these reads the ledger to offer its choices, and the list counts at most a capped number
    # of rows (proxy.ledger_admin, issue 49: the page at ten million records).
    list_filter = (
        ledger_admin.KeyFilter,
        ledger_admin.PoolFilter,
        ledger_admin.ServedModelFilter,
        ledger_admin.RequestedModelFilter,
        ledger_admin.OutcomeFilter,
        ledger_admin.AttemptsFilter,
        ledger_admin.LatencyFilter,
        ("started_at", admin.DateFieldListFilter),
        "transport",
        ledger_admin.RouteFilter,
    )
    search_fields = ("request_id", "operation_id", "requested_model", "served_model")
    paginator = ledger_admin.LedgerPaginator
    show_full_result_count = False
    inlines = [AttemptInline]

    def get_changelist(self, request, **kwargs):
        return ledger_admin.LedgerChangeList

    @admin.display(description="started (UTC)", ordering="started_at")
    def started(self, record) -> str:
        # A space between date and time: the one place the column may wrap on a narrow screen.
        return record.started_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")

    @admin.display(description="pool")
    def pools(self, record) -> str:
        return ", ".join(ledger_admin.pool_names(record)) or "-"

    @admin.display(description="key", ordering="key__name")
    def key_name(self, record) -> str:
        return record.key.name if record.key is not None else "-"

    @admin.display(description="model (requested → served)", ordering="served_model")
    def models(self, record) -> str:
        requested, served = record.requested_model, record.served_model
        if not served or served == requested:
            return requested or served or "-"
        return f"{requested} → {served}"

    @admin.display(description="outcome", ordering="outcome")
    def outcome_code(self, record) -> str:
        return ledger_admin.breakable(record.outcome)

    @admin.display(description="attempts")
    def attempts_sent(self, record) -> int:
        return len(ledger_admin.dispatched(record))

    @admin.display(description="latency")
    def took(self, record) -> str:
        return ledger_admin.duration_text(ledger_admin.latency(record))


@admin.register(Attempt)
class AttemptAdmin(PoolScopedAdmin, ReadOnlyAdmin):
    pool_path = "assignment__pool"
    list_display = ("request", "ordinal", "assignment", "model", "route_class", "status", "failure_class")
    list_filter = ("status", "route_class", "failure_class")
    list_select_related = ("request", "assignment")


# Listed in this order under Operations.
admin.site.register_page(UpstreamsPanel)
admin.site.register_page(SpendPage)

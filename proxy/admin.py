from django.contrib import admin
from django.db.models import Exists, OuterRef, Q
from django.utils.html import format_html

from pools.scoping import PoolScopedAdmin, PoolScopedInline, ReadOnlyAdmin, shortened
from pools.selectors import keys_visible_to, pools_visible_to
from proxy.console import requests as ledger_admin
from proxy.console.spend import SpendPage
from proxy.console.upstreams import UpstreamsPanel
from proxy.ledger.models import Attempt, RequestRecord


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
    """A pool operator sees every request that reached one of their pools' assignments (an attempt on
    it, sent or found ineligible), as the Upstreams panel counts them, and every request of a key whose
    pools are all theirs (one refused before any attempt too). Of a request that crossed into another
    pool they see their own attempts only (the page's inline and the list's columns read the attempts
    through the same pool scope), the key by its name (no prefix, no link), never another pool's
    assignment. A request without a key nor an attempt (a 401) is a superuser's."""

    pool_path = None
    key_path = "key"
    list_display = (
        "request_id_shown",
        "started_at",
        "key_name",
        "pools",
        "models",
        "outcome",
        "attempts_sent",
        "took",
        "usage",
    )
    fields = (
        "request_id",
        "operation_id",
        "started_at",
        "finished_at",
        "key_name",
        "route",
        "transport",
        "requested_model",
        "served_model",
        "outcome",
        "status_code",
        "retry_count",
    )
    # None of these reads the ledger to offer its choices, and the list counts at most a capped number
    # of rows (proxy.console.requests, issue 49: the page at ten million records).
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

    def scope(self, queryset, user):
        if user.is_superuser:
            return queryset
        reached = Attempt.objects.filter(request=OuterRef("pk"), assignment__pool__in=pools_visible_to(user))
        return queryset.filter(Q(key__in=keys_visible_to(user)) | Exists(reached))

    @admin.display(description="request")
    def request_id_shown(self, record):
        return shortened(record.request_id, classes="request-id")

    @admin.display(description="pool")
    def pools(self, record) -> str:
        return ", ".join(ledger_admin.pool_names(record)) or "-"

    @admin.display(description="key", ordering="key__name")
    def key_name(self, record) -> str:
        return record.key.name if record.key is not None else "-"

    @admin.display(description="model", ordering="served_model")  # requested → served
    def models(self, record) -> str:
        requested, served = record.requested_model, record.served_model
        if not served or served == requested:
            return requested or served or "-"
        return f"{requested} → {served}"

    @admin.display(description="attempts")
    def attempts_sent(self, record) -> int:
        return len(ledger_admin.dispatched(record))

    @admin.display(description="latency")
    def took(self, record) -> str:
        return ledger_admin.duration_text(ledger_admin.latency(record))

    @admin.display(description="tokens, cost")
    def usage(self, record):
        return format_html(
            '<span class="tokens">{}</span> <span class="cost">{}</span>',
            ledger_admin.tokens_total(record),
            ledger_admin.cost_total(record),
        )


@admin.register(Attempt)
class AttemptAdmin(PoolScopedAdmin, ReadOnlyAdmin):
    pool_path = "assignment__pool"
    list_display = (
        "request_id_shown",
        "ordinal",
        "assignment",
        "model",
        "route_class",
        "status",
        "failure_class",
    )
    list_filter = ("status", "route_class", "failure_class")
    list_select_related = ("request", "assignment")

    @admin.display(description="request", ordering="request__started_at")
    def request_id_shown(self, attempt):
        return shortened(attempt.request.request_id, classes="request-id")


# Listed in this order under Operations.
admin.site.register_page(UpstreamsPanel)
admin.site.register_page(SpendPage)

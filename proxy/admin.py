from django.contrib import admin

from gatewaysite.admin import PoolScopedAdmin, PoolScopedInline, ReadOnlyAdmin
from proxy.models import Attempt, RequestRecord


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
        "cost_micros",
        "config_version",
    )
    readonly_fields = fields

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
        "route",
        "transport",
        "served_model",
        "outcome",
        "retry_count",
        "started_at",
    )
    list_filter = ("transport", "outcome", "route")
    search_fields = ("request_id", "operation_id", "requested_model", "served_model")
    date_hierarchy = "started_at"
    inlines = [AttemptInline]


@admin.register(Attempt)
class AttemptAdmin(PoolScopedAdmin, ReadOnlyAdmin):
    pool_path = "assignment__pool"
    list_display = ("request", "ordinal", "assignment", "model", "route_class", "status", "failure_class")
    list_filter = ("status", "route_class", "failure_class")
    list_select_related = ("request", "assignment")

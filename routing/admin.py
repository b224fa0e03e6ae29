"""Admins of the shared routing state, read-only (SPEC §9). The operator page that shows it with the
ledger's usage, /admin/upstreams/, is `proxy.upstreams`: it reads the ledger, a layer above routing."""

from django.contrib import admin

from pools.scoping import PoolScopedAdmin, ReadOnlyAdmin
from routing.models import Affinity, Circuit, Demotion


@admin.register(Circuit)
class CircuitAdmin(PoolScopedAdmin, ReadOnlyAdmin):
    pool_path = "assignment__pool"
    list_display = (
        "assignment",
        "model",
        "route_class",
        "state",
        "reason",
        "consecutive_failures",
        "open_until",
    )
    list_filter = ("state", "route_class", "reason", ("pool", admin.RelatedOnlyFieldListFilter))
    list_select_related = ("assignment",)
    search_fields = ("model", "assignment__name")


@admin.register(Demotion)
class DemotionAdmin(PoolScopedAdmin, ReadOnlyAdmin):
    pool_path = "assignment__pool"
    list_display = ("assignment", "model", "reason", "until")
    list_select_related = ("assignment",)
    search_fields = ("model", "assignment__name")


@admin.register(Affinity)
class AffinityAdmin(PoolScopedAdmin, ReadOnlyAdmin):
    pool_path = None
    key_path = "gateway_key"
    list_display = ("kind", "key", "gateway_key", "assignment", "model", "expires_at")
    list_filter = ("kind",)
    list_select_related = ("assignment", "gateway_key")

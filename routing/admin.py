"""Admins of the shared routing state, read-only (SPEC §9). The operator page that shows it with the
ledger's usage, /admin/upstreams/, is `proxy.console.upstreams`: it reads the ledger, a layer above
routing."""

from django.contrib import admin

from pools.scoping import PoolScopedAdmin, ReadOnlyAdmin, shortened
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

    # An affinity's key is a response or file id, or a session's digest: whoever holds an id can ask
    # for what it names (issue 45). A pool operator sees enough of it to tell rows apart.
    def get_list_display(self, request):
        # A superuser's list shortens the key too (one long token), whole in its title and for a copy.
        shown = "key_whole" if request.user.is_superuser else "key_shown"
        return tuple(shown if name == "key" else name for name in self.list_display)

    def get_fields(self, request, obj=None):
        hidden = "key_shown" if request.user.is_superuser else "key"
        return [f for f in super().get_fields(request, obj) if f != hidden]

    def get_readonly_fields(self, request, obj=None):
        return (*super().get_readonly_fields(request, obj), "key_shown")

    @admin.display(description="key")
    def key_shown(self, obj: Affinity) -> str:
        return f"{obj.key[:8]}…" if len(obj.key) > 8 else obj.key

    @admin.display(description="key", ordering="key")
    def key_whole(self, obj: Affinity):
        return shortened(obj.key)

from django.contrib import admin

from gatewaysite.admin import ReadOnlyAdmin
from routing.models import Affinity, Circuit, Demotion


@admin.register(Circuit)
class CircuitAdmin(ReadOnlyAdmin):
    list_display = (
        "assignment",
        "model",
        "route_class",
        "state",
        "reason",
        "consecutive_failures",
        "open_until",
    )
    list_filter = ("state", "route_class", "reason", "pool")
    list_select_related = ("assignment",)
    search_fields = ("model", "assignment__name")


@admin.register(Demotion)
class DemotionAdmin(ReadOnlyAdmin):
    list_display = ("assignment", "model", "reason", "until")
    list_select_related = ("assignment",)
    search_fields = ("model", "assignment__name")


@admin.register(Affinity)
class AffinityAdmin(ReadOnlyAdmin):
    list_display = ("kind", "key", "assignment", "model", "expires_at")
    list_filter = ("kind",)
    list_select_related = ("assignment",)

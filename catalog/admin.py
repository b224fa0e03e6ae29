from django.contrib import admin

from catalog.models import CatalogEntry
from gatewaysite.admin import PoolScopedAdmin


@admin.register(CatalogEntry)
class CatalogEntryAdmin(PoolScopedAdmin):
    pool_path = "assignment__pool"
    list_display = ("model", "assignment", "provenance", "context_window", "tools", "vision", "observed_at")
    list_filter = ("provenance", ("assignment__pool", admin.RelatedOnlyFieldListFilter))
    list_select_related = ("assignment",)
    search_fields = ("model", "assignment__name")
    readonly_fields = ("observed_at",)

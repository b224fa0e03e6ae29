from django.contrib import admin

from catalog.models import CatalogEntry


@admin.register(CatalogEntry)
class CatalogEntryAdmin(admin.ModelAdmin):
    list_display = ("model", "assignment", "provenance", "context_window", "tools", "vision", "observed_at")
    list_filter = ("provenance", "assignment__pool")
    list_select_related = ("assignment",)
    search_fields = ("model", "assignment__name")
    readonly_fields = ("observed_at",)

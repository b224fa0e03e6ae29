from django.contrib import admin

from catalog.models import CapabilityEvidence, CatalogEntry
from pools.scoping import PoolScopedAdmin, ReadOnlyAdmin


@admin.register(CatalogEntry)
class CatalogEntryAdmin(PoolScopedAdmin):
    pool_path = "assignment__pool"
    list_display = ("model", "assignment", "provenance", "context_window", "tools", "vision", "observed_at")
    list_filter = ("provenance", ("assignment__pool", admin.RelatedOnlyFieldListFilter))
    list_select_related = ("assignment",)
    search_fields = ("model", "assignment__name")
    readonly_fields = ("observed_at",)


@admin.register(CapabilityEvidence)
class CapabilityEvidenceAdmin(PoolScopedAdmin, ReadOnlyAdmin):
    """The verdicts of `manage.py qualify` (SPEC §8.1), for an auditor: read-only, and nothing here
    starts a qualification (operators and schedulers run the command)."""

    pool_path = "assignment__pool"
    list_display = (
        "assignment",
        "model",
        "capability",
        "qualified",
        "detail",
        "qualified_at",
        "expires_at",
    )  # the corpus version and configuration hash are on the verdict's page
    list_filter = ("capability", "qualified", ("assignment__pool", admin.RelatedOnlyFieldListFilter))
    list_select_related = ("assignment",)
    search_fields = ("model", "assignment__name")
    date_hierarchy = "qualified_at"

"""Admin building blocks shared by the apps, and the gateway's admin site."""

from django.contrib import admin
from django.urls import NoReverseMatch, reverse

from pools.models import Assignment, Pool
from pools.selectors import pools_visible_to


class GatewayAdminSite(admin.AdminSite):
    """Django's admin plus the site-level operator pages (/admin/upstreams/). Installed as the
    default site by `gatewaysite.apps.GatewayAdminConfig`, so `admin.site` and every
    `@admin.register` keep working unchanged."""

    def get_urls(self):
        # Imported here: routing.admin registers its ModelAdmins on this very site at import time.
        from routing.admin import UpstreamsPanel

        # Custom URLs go before the admin's own, whose catch-all would otherwise answer first.
        return [*UpstreamsPanel(self).get_urls(), *super().get_urls()]

    def get_app_list(self, request, app_label=None):
        apps = super().get_app_list(request, app_label)
        assignments = self._registry.get(Assignment)
        if app_label is not None or assignments is None or not assignments.has_view_permission(request):
            return apps
        try:
            url = reverse("admin:upstreams", current_app=self.name)
        except NoReverseMatch:
            return apps
        operations = {
            "name": "Operations",
            "app_label": "operations",
            "app_url": url,
            "has_module_perms": True,
            "models": [
                {
                    "name": "Upstreams",
                    "object_name": "Upstreams",
                    "admin_url": url,
                    "add_url": None,
                    "view_only": True,
                    "perms": {"add": False, "change": False, "delete": False, "view": True},
                }
            ],
        }
        return [operations, *apps]


class ReadOnlyAdmin(admin.ModelAdmin):
    """For state and ledger rows: operators may look, only the gateway writes."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class PoolScopedAdmin(admin.ModelAdmin):
    """A non-superuser sees (and may pick) only rows of the pools granted to one of their groups
    (`pools.selectors.pools_visible_to`), the same rule as /admin/upstreams/. `pool_path` is the
    lookup from this model to its Pool."""

    pool_path = "pool"

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        if request.user.is_superuser:
            return queryset
        lookup = "pk__in" if self.pool_path == "pk" else f"{self.pool_path}__in"
        return queryset.filter(**{lookup: pools_visible_to(request.user)})

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if not request.user.is_superuser:
            if db_field.related_model is Pool:
                kwargs["queryset"] = pools_visible_to(request.user)
            elif db_field.related_model is Assignment:
                kwargs["queryset"] = Assignment.objects.filter(pool__in=pools_visible_to(request.user))
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

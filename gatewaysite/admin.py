"""Admin building blocks shared by the apps, and the gateway's admin site."""

from typing import ClassVar, Protocol

from django.contrib import admin
from django.db import models
from django.urls import NoReverseMatch, URLPattern, reverse

from pools.models import Assignment, GatewayKey, Pool
from pools.selectors import keys_visible_to, pools_visible_to


class OperatorPage(Protocol):
    """A site-level page (not a model's changelist) listed under Operations: /admin/upstreams/,
    /admin/spend/. `model` is the model whose view permission lets a user see it."""

    name: ClassVar[str]
    url_name: ClassVar[str]
    model: ClassVar[type[models.Model]]

    def __init__(self, admin_site: admin.AdminSite) -> None: ...

    def get_urls(self) -> list[URLPattern]: ...


class GatewayAdminSite(admin.AdminSite):
    """Django's admin plus the site-level operator pages. Installed as the default site by
    `gatewaysite.apps.GatewayAdminConfig`, so `admin.site` and every `@admin.register` keep working
    unchanged. Each app's admin module registers its pages with `register_page`, as it registers its
    ModelAdmins, so this site imports no app's admin (that import was a cycle: the apps' admins build on
    the classes below)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._pages: list[type[OperatorPage]] = []

    def register_page(self, page: type[OperatorPage]) -> type[OperatorPage]:
        """Add `page` (usable as a class decorator). Pages are listed in registration order, which
        autodiscovery makes INSTALLED_APPS order: Upstreams (routing), then Spend (proxy)."""
        if page not in self._pages:
            self._pages.append(page)
        return page

    def get_urls(self):
        # Custom URLs go before the admin's own, whose catch-all would otherwise answer first.
        pages = [url for page in self._pages for url in page(self).get_urls()]
        return [*pages, *super().get_urls()]

    def get_app_list(self, request, app_label=None):
        apps = super().get_app_list(request, app_label)
        if app_label is not None:
            return apps
        pages = []
        # Each operator page is listed to the users its view lets in: Upstreams needs the view
        # permission on assignments, Spend on request records.
        for page in self._pages:
            model_admin = self._registry.get(page.model)
            if model_admin is None or not model_admin.has_view_permission(request):
                continue
            try:
                url = reverse(f"admin:{page.url_name}", current_app=self.name)
            except NoReverseMatch:
                continue
            pages.append(
                {
                    "name": page.name,
                    "object_name": page.name,
                    "admin_url": url,
                    "add_url": None,
                    "view_only": True,
                    "perms": {"add": False, "change": False, "delete": False, "view": True},
                }
            )
        if not pages:
            return apps
        operations = {
            "name": "Operations",
            "app_label": "operations",
            "app_url": pages[0]["admin_url"],
            "has_module_perms": True,
            "models": pages,
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
    """The one scoping mechanism of the admin (SPEC §9): a non-superuser sees, searches, filters, picks
    (autocomplete, raw id popups, foreign-key choices) and opens (change, history, delete) only rows of
    the pools granted to one of their groups (`pools.selectors.pools_visible_to`), the same rule as
    /admin/upstreams/. Every view of a ModelAdmin goes through `get_queryset`, so scoping it scopes
    them all; tests/admin/test_scoping.py walks every registered ModelAdmin to hold that.

    `pool_path` is the lookup from this model to its Pool. `key_path` (instead) is the lookup to a
    GatewayKey, for rows that belong to a key: visible when the key's pools are all granted
    (`pools.selectors.keys_visible_to`)."""

    pool_path: str | None = "pool"
    key_path: str | None = None

    def scope(self, queryset, user):
        if user.is_superuser:
            return queryset
        if self.key_path is not None:
            return queryset.filter(**{_in(self.key_path): keys_visible_to(user)})
        assert self.pool_path is not None
        return queryset.filter(**{_in(self.pool_path): pools_visible_to(user)})

    def get_queryset(self, request):
        return self.scope(super().get_queryset(request), request.user)

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        choices = scoped_choices(db_field.related_model, request.user)
        if choices is not None:
            kwargs["queryset"] = choices
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def formfield_for_manytomany(self, db_field, request, **kwargs):
        choices = scoped_choices(db_field.related_model, request.user)
        if choices is not None:
            kwargs["queryset"] = choices
        return super().formfield_for_manytomany(db_field, request, **kwargs)


def _in(path: str) -> str:
    return "pk__in" if path == "pk" else f"{path}__in"


def scoped_choices(model, user):
    """What a form may offer `user` for a relation to `model`, or None (Django's default) for a model
    that holds no pool data."""
    if user.is_superuser:
        return None
    if model is Pool:
        return pools_visible_to(user)
    if model is Assignment:
        return Assignment.objects.filter(pool__in=pools_visible_to(user))
    if model is GatewayKey:
        return keys_visible_to(user)
    return None


class PoolScopedInline(admin.TabularInline):
    """An inline of a scoped page: its rows are scoped by `pool_path` too (a request's attempts on
    another pool's assignment are not shown)."""

    pool_path = "assignment__pool"

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        if request.user.is_superuser:
            return queryset
        return queryset.filter(**{_in(self.pool_path): pools_visible_to(request.user)})

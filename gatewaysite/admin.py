"""The gateway's admin site. The apps' admins build on `pools.scoping` (read-only and pool-scoped
pages), and register their site-level pages here with `register_page`: this module imports no app."""

from typing import ClassVar, Protocol

from django.contrib import admin
from django.db import models
from django.urls import NoReverseMatch, URLPattern, reverse


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
    ModelAdmins, so this site imports no app (the apps' admins build on `pools.scoping`)."""

    # The gateway serves no site beside its API: Django's "View site" link would open a 404.
    site_url = None

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._pages: list[type[OperatorPage]] = []

    def register_page(self, page: type[OperatorPage]) -> type[OperatorPage]:
        """Add `page` (usable as a class decorator). Pages are listed in registration order: Upstreams,
        then Spend (both registered by proxy.admin)."""
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

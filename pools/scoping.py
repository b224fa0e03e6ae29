"""The admin's building blocks for what operators may see (SPEC §9): read-only pages, and the one scoping
mechanism, by pool. Every app's admin builds on these; they live with the pools they scope by, below
every app that uses them (the project's admin site, `gatewaysite.admin`, sits above all apps)."""

import enum

from django.contrib import admin
from django.utils.html import format_html

from pools.models import Assignment, GatewayKey, Pool
from pools.selectors import keys_visible_to, pools_visible_to


class OperatorAccess(enum.StrEnum):
    """What a pool operator's group may do in the admin on the pools granted to it (the YAML's
    `operators[].access`): look at everything of them, or also change their pools, assignments, keys and
    catalog entries (within what SPEC §9 leaves to operators: never a base_url, a credential, a key's
    secret or its pools). Gateway-wide settings, users and groups stay a superuser's either way."""

    VIEW = "view"
    CHANGE = "change"


# (app label, codename) of each level's model permissions; the view level covers every ModelAdmin that
# holds pool data (tests/admin/test_operator_access.py holds that as models are added).
_VIEWED = {
    "pools": ("pool", "assignment", "gatewaykey", "gatewaysettings", "modelalias", "modelfallback"),
    "catalog": ("catalogentry", "capabilityevidence"),
    "routing": ("circuit", "demotion", "affinity"),
    "proxy": ("requestrecord", "attempt"),
}
_VIEW = frozenset((app, f"view_{model}") for app, models in _VIEWED.items() for model in models)
OPERATOR_PERMISSIONS: dict[OperatorAccess, frozenset[tuple[str, str]]] = {
    OperatorAccess.VIEW: _VIEW,
    OperatorAccess.CHANGE: _VIEW
    | {
        ("pools", "change_pool"),
        ("pools", "change_assignment"),
        ("pools", "change_gatewaykey"),
        ("catalog", "add_catalogentry"),
        ("catalog", "change_catalogentry"),
        ("catalog", "delete_catalogentry"),
    },
}


def operator_access(permissions: set[tuple[str, str]]) -> OperatorAccess | None:
    """The level whose permissions are exactly `permissions`, or None for any other set."""
    return next((level for level, perms in OPERATOR_PERMISSIONS.items() if perms == permissions), None)


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

    def lookup_allowed(self, lookup, value, request=None) -> bool:
        """A changelist filters only by what its `list_filter` and `date_hierarchy` declare (issue 45):
        Django's default also takes any lookup on a local field (`?credential__startswith=gAAAAA`,
        `?key_hash__regex=...`), which reads a secret-bearing column a character at a time."""
        return declared_lookup(self, lookup) and super().lookup_allowed(lookup, value, request)

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


# What the declared filters themselves ask for: a value, a related row's id, a range of dates.
_FILTER_PARTS = frozenset(
    {"exact", "isnull", "id", "pk", "in", "gte", "gt", "lte", "lt", "year", "month", "day"}
)


def declared_lookup(model_admin: admin.ModelAdmin, lookup: str) -> bool:
    """Whether `lookup` is one of `model_admin`'s declared filters (a field of `list_filter` or
    `date_hierarchy` with only the parts a filter uses, or a custom filter's parameter)."""
    paths = [model_admin.date_hierarchy] if model_admin.date_hierarchy else []
    for declared in model_admin.list_filter:
        if isinstance(declared, str):
            paths.append(declared)
        elif isinstance(declared, tuple | list):
            paths.append(declared[0])
        elif lookup == getattr(declared, "parameter_name", None):
            return True
    for path in paths:
        rest = lookup.removeprefix(path)
        if rest == "" or (rest.startswith("__") and set(rest[2:].split("__")) <= _FILTER_PARTS):
            return True
    return False


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


def shortened(text: str, *, classes: str = ""):
    """`text` shown shortened in a list (its first characters and an ellipsis, pools/static/pools/admin.css),
    whole in its title for the hover and whole in the page for a copy: a request id, an affinity's key."""
    return format_html('<span class="shortened {}" title="{}">{}</span>', classes, text, text)

"""Who operates which pools, in the YAML configuration (issue 47 point 1): `operators[]` (SPEC §3, §9).

Contract: `read_operators` validates the file's list against the pools the same file declares and the
users the database has (`DatabaseFacts.user_names`); `operators_from_database` reads the current state
in the same shape (every group that operates a pool), and `render_operators` writes it back, so a dump
reloads as no change. The writes are `gatewayconfig.services`'. A pool operator is modelled as the admin
models it (`pools.scoping`): a Django group granted pools (`Pool.operator_groups`), whose model
permissions say what its staff may do there (`OperatorAccess`), and whose members are its staff.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import Group

from gatewayconfig.checker import Checker, IssueCode
from gatewayconfig.fields import keys_of, read_fields, render_fields
from gatewayconfig.schema import OPERATOR
from pools.scoping import OperatorAccess, operator_access


@dataclass(frozen=True, slots=True)
class OperatorSpec:
    """One group: exactly `pools`; `access` None leaves its permissions, `users` None its members."""

    group: str
    pools: tuple[str, ...] = ()
    access: OperatorAccess | None = None
    users: tuple[str, ...] | None = None


def read_operators(
    c: Checker, root: Mapping[Any, Any], pool_names: set[str], user_names: frozenset[str]
) -> list[OperatorSpec]:
    specs: list[OperatorSpec] = []
    groups: dict[str, str] = {}
    for i, raw in enumerate(c.take(root, "operators", "", c.sequence, [])):
        path = f"operators[{i}]"
        data = c.mapping(raw, path, keys_of(OPERATOR))
        if data is None:
            continue
        values = read_fields(c, data, path, OPERATOR)
        group = values["group"] or ""
        c.unique(groups, group, path, f"{path}.group", "group")
        for j, pool in enumerate(values["pools"]):
            if pool not in pool_names:
                c.error(f"{path}.pools[{j}]", IssueCode.UNKNOWN_POOL, f"unknown pool {pool!r}")
        for j, user in enumerate(values["users"] or ()):
            if user not in user_names:
                c.error(
                    f"{path}.users[{j}]",
                    IssueCode.UNKNOWN_USER,
                    f"no user {user!r} (users are made in the admin, never by this file)",
                )
        access = values["access"]
        specs.append(
            OperatorSpec(
                group=group,
                pools=tuple(values["pools"]),
                access=None if access is None else OperatorAccess(access),
                users=None if values["users"] is None else tuple(values["users"]),
            )
        )
    return specs


def group_permissions(group: Group) -> set[tuple[str, str]]:
    return set(group.permissions.values_list("content_type__app_label", "codename"))


def operators_from_database() -> tuple[OperatorSpec, ...]:
    """Every group that operates a pool: its pools, its access level when its permissions are exactly
    one (else None: left as they are on reload) and its members."""
    groups = Group.objects.filter(operated_pools__isnull=False).distinct().order_by("name")
    groups = groups.prefetch_related("operated_pools", "user_set", "permissions__content_type")
    return tuple(
        OperatorSpec(
            group=group.name,
            pools=tuple(sorted(pool.name for pool in group.operated_pools.all())),
            access=operator_access({(p.content_type.app_label, p.codename) for p in group.permissions.all()}),
            users=tuple(sorted(user.username for user in group.user_set.all())),
        )
        for group in groups
    )


def render_operators(specs: Iterable[OperatorSpec]) -> list[dict[str, Any]]:
    return [
        render_fields(
            {
                "group": s.group,
                "pools": sorted(s.pools),
                "access": None if s.access is None else s.access.value,
                "users": s.users,
            },
            OPERATOR,
        )
        for s in sorted(specs, key=lambda s: s.group)
    ]

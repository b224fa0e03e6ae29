"""A key's affinities as routing reads them (SPEC §7.2): the ids one request names (a previous
response, a session, files), the condition that finds the key's live affinities for them, and what
they are. The request path reads them in its one statement (`routing.request_state`); `manage.py
routing_explain` and the console read them alone (`affinities_load`), by the same condition.
"""

from dataclasses import dataclass, field, replace
from datetime import datetime

from routing.models import Affinity, AffinityKind
from routing.policy.types import AFFINITY_KEY_MAX
from runtime import rawsql


@dataclass(frozen=True, slots=True)
class FoundAffinity:
    """A live affinity as routing reads it: where (kind, key) points (SPEC §7.2). Plain values, not the
    model: building a Django model instance was most of the cost of reading one."""

    kind: str
    key: str
    assignment_id: int | None
    model: str
    expires_at: datetime | None


@dataclass(frozen=True, slots=True)
class Affinities:
    """A key's live affinities for the ids one request names (SPEC §7.2)."""

    response: FoundAffinity | None = None
    session: FoundAffinity | None = None
    files: dict[str, FoundAffinity] = field(default_factory=dict)  # file id -> its affinity


def session_named(header: str | None) -> str | None:
    """The session an `x-gateway-session` value names: its first AFFINITY_KEY_MAX characters, as it is
    remembered (the proxy's request and routing_explain alike); an empty value names none."""
    return (header or "")[:AFFINITY_KEY_MAX] or None


@dataclass(frozen=True, slots=True)
class AffinityIds:
    """The ids one request names that its key may have affinities for (SPEC §7.2); a response id longer
    than any affinity's is dropped here, the one place the request path and `routing_explain` share."""

    response_id: str | None = None
    session: str | None = None
    file_ids: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.response_id is not None and len(self.response_id) > AFFINITY_KEY_MAX:
            object.__setattr__(self, "response_id", None)

    def __bool__(self) -> bool:
        return bool(self.response_id or self.session or self.file_ids)


def affinity_where(owner: str, response: bool, session: bool, files: int) -> str:
    """The condition of the live affinities of the key `owner` picks (`= %s`, `IN (subquery)`) for the
    ids of this shape, on the affinity table as `a` (params: the owner's, then `affinity_params`).

    Ownership is part of the lookup itself, never a check after it: another key's id, an expired id
    and an id never seen run the same indexed lookup and find the same nothing, so a foreign id
    cannot be told from an unknown one by the answer or by its timing."""
    wanted = [
        *(["(a.kind = %s AND a.key = %s)"] if response else []),
        *(["(a.kind = %s AND a.key = %s)"] if session else []),
        *([f"(a.kind = %s AND a.key IN ({rawsql.placeholders(files)}))"] if files else []),
    ]
    return f"a.gateway_key_id {owner} AND a.expires_at > %s AND ({' OR '.join(wanted)})"


def affinity_params(ids: AffinityIds, now: datetime) -> list[object]:
    params: list[object] = [rawsql.as_param(now)]
    if ids.response_id:
        params += [AffinityKind.RESPONSE.value, ids.response_id]
    if ids.session:
        params += [AffinityKind.SESSION.value, ids.session]
    if ids.file_ids:
        params += [AffinityKind.FILE.value, *ids.file_ids]
    return params


def affinities_from_rows(rows: list[tuple]) -> Affinities:
    """The affinities in rows of (kind, key, assignment, model, expiry)."""
    found = Affinities()
    for kind, key, assignment_id, model, expires_at in rows:
        row = FoundAffinity(kind, key, assignment_id, model, rawsql.as_datetime(expires_at))
        if kind == AffinityKind.RESPONSE:
            found = replace(found, response=row)
        elif kind == AffinityKind.SESSION:
            found = replace(found, session=row)
        else:
            found.files[key] = row
    return found


def affinities_load(
    *,
    key_id: int,
    now: datetime,
    response_id: str | None = None,
    session: str | None = None,
    file_ids: tuple[str, ...] = (),
) -> Affinities:
    """The live affinities of key `key_id` among these ids, in ONE query (no id: no query); the
    request path reads them with its key instead (`request_state_load`), by the same condition."""
    ids = AffinityIds(response_id, session, tuple(file_ids))
    if not ids:
        return Affinities()
    where = affinity_where("= %s", bool(ids.response_id), bool(ids.session), len(ids.file_ids))
    sql = (
        "SELECT a.kind, a.key, a.assignment_id, a.model, a.expires_at "  # noqa: S608
        f"FROM {Affinity._meta.db_table} a WHERE {where}"
    )
    return affinities_from_rows(rawsql.fetch(sql, [key_id, *affinity_params(ids, now)]))


def affinity_get(*, key_id: int, kind: AffinityKind, key: str, now: datetime) -> Affinity | None:
    """Key `key_id`'s live affinity for (kind, key), or None: unknown, expired or another key's."""
    return Affinity.objects.filter(gateway_key_id=key_id, kind=kind, key=key, expires_at__gt=now).first()

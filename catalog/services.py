"""Catalog discovery (SPEC §8): ask each discovering assignment which models it advertises.

Provenance per (assignment, model):
- `configured` entries come from the configuration and are never removed or downgraded by discovery;
- a successful discovery marks what it saw `observed` and drops earlier discovered entries it no
  longer sees;
- a failed discovery keeps every earlier discovered entry as `preserved`, so the assignment stays
  a catalog source (provenance-gated failure classification must not degrade on a blip).
"""

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from http.cookiejar import CookieJar, DefaultCookiePolicy

import httpcore
import httpx
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from google.auth import exceptions as google_auth_exceptions

from catalog.models import CapabilityEvidence, CatalogEntry, Provenance
from catalog.qualification import Verdict
from pools import destinations
from pools.credentials import credential_of
from pools.models import Assignment
from proxy.wire.providers.base import Listings, SignedListing, TokenListing
from proxy.wire.providers.registry import provider
from runtime import google_oauth
from runtime.httpx_backend import transport_through
from runtime.sigv4 import sign

logger = logging.getLogger("gateway")

MAX_PAGES = 50


class DiscoveryError(Exception):
    """Discovery of one assignment failed; `reason` is the gateway's own words, never a provider message."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class AssignmentSync:
    assignment: str
    ok: bool
    observed: int = 0
    preserved: int = 0
    removed: int = 0
    reason: str = ""


@dataclass(slots=True)
class SyncSummary:
    results: list[AssignmentSync] = field(default_factory=list)

    @property
    def failed(self) -> list[AssignmentSync]:
        return [r for r in self.results if not r.ok]


class GuardedBackend(httpcore.SyncBackend):
    """httpcore's sockets, connected only to an address checked after resolution (SPEC §11: never a
    link-local or metadata address; the address checked is the one connected to). TLS still verifies
    the URL's host name (httpcore takes it from the request, not from this address)."""

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        try:
            address = destinations.resolve_allowed_sync(host, port)[0]
        except destinations.ForbiddenDestination as refused:
            logger.warning("upstream host %r resolves to a forbidden address: nothing sent", host)
            raise httpcore.ConnectError(str(refused)) from None
        except OSError as failed:
            raise httpcore.ConnectError(str(failed)) from None
        return super().connect_tcp(address, port, timeout, local_address, socket_options)


def guarded_client(timeout: httpx.Timeout | float) -> httpx.Client:
    """A client for discovery whose connections go through GuardedBackend, and that keeps no cookie:
    it lists every assignment of a sync, and a cookie one account's answer set would go out with the
    next account's request."""
    refuse_all = CookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))
    return httpx.Client(
        timeout=timeout,
        transport=transport_through(GuardedBackend()),
        trust_env=False,
        cookies=refuse_all,
    )


def _token_headers(listing: TokenListing, credential: str, client: httpx.Client) -> dict[str, str]:
    """The access token of an assignment whose listing a service account authorizes (Vertex)."""
    try:
        token = google_oauth.access_token(
            listing.oauth(credential).key_file, google_oauth.HttpxRequest(client)
        )
    except (google_oauth.KeyFileError, google_auth_exceptions.GoogleAuthError) as failed:
        raise DiscoveryError(
            "credential refused" if google_oauth.refused(failed) else "unreachable"
        ) from None
    return {"authorization": f"Bearer {token}"}


def discover_models(assignment: Assignment, client: httpx.Client) -> set[str]:
    """Every model id the assignment's provider lists, in each of its listings, page after page (its own
    listing format)."""
    listing = provider(assignment.adapter)
    credential = credential_of(assignment)
    headers = listing.auth_headers(credential)
    if isinstance(listing, TokenListing):
        headers = {**headers, **_token_headers(listing, credential, client)}
    if isinstance(listing, Listings):
        urls = listing.listings(assignment.base_url, assignment.region)
    else:
        urls = (listing.models_url(assignment.base_url),)
    found: set[str] = set()
    for url in urls:
        found |= _listed(assignment, client, url, headers, credential)
    return found


def _listed(
    assignment: Assignment, client: httpx.Client, url: str, headers: dict[str, str], credential: str
) -> set[str]:
    """The model ids of one listing, page after page."""
    listing = provider(assignment.adapter)
    params: dict[str, str] = {}
    found: set[str] = set()
    for _ in range(MAX_PAGES):
        # The next page's query joins the listing's own (Azure's api-version), never replaces it.
        request = client.build_request("GET", httpx.URL(url).copy_merge_params(params), headers=headers)
        if isinstance(listing, SignedListing):
            signature = listing.signature(assignment.base_url, assignment.region, credential)
            request.headers.update(
                sign(request.method, str(request.url), request.headers, request.content, signature)
            )
        try:
            response = client.send(request)
        except httpx.TimeoutException as exc:
            raise DiscoveryError("timed out") from exc
        except httpx.HTTPError as exc:
            raise DiscoveryError("unreachable") from exc
        if response.status_code != 200:
            raise DiscoveryError(f"HTTP {response.status_code}")
        try:
            page = listing.model_page(response.json())
        except ValueError as exc:
            raise DiscoveryError("malformed model list") from exc
        found.update(page.ids)
        if page.next_query is None:
            return found
        params = page.next_query
    raise DiscoveryError("too many pages")


@transaction.atomic
def catalog_entries_observe(
    *, assignment: Assignment, models: Iterable[str], now: datetime
) -> AssignmentSync:
    seen = set(models)
    entries = {e.model: e for e in CatalogEntry.objects.select_for_update().filter(assignment=assignment)}
    stale = [e.pk for m, e in entries.items() if m not in seen and e.provenance != Provenance.CONFIGURED]
    CatalogEntry.objects.filter(pk__in=stale).delete()
    CatalogEntry.objects.filter(assignment=assignment, model__in=seen).exclude(
        provenance=Provenance.CONFIGURED
    ).update(provenance=Provenance.OBSERVED, observed_at=now)
    CatalogEntry.objects.filter(
        assignment=assignment, model__in=seen, provenance=Provenance.CONFIGURED
    ).update(observed_at=now)
    CatalogEntry.objects.bulk_create(
        [
            CatalogEntry(assignment=assignment, model=m, provenance=Provenance.OBSERVED, observed_at=now)
            for m in sorted(seen - entries.keys())
        ]
    )
    return AssignmentSync(assignment=assignment.name, ok=True, observed=len(seen), removed=len(stale))


@transaction.atomic
def catalog_entries_preserve(*, assignment: Assignment, reason: str) -> AssignmentSync:
    discovered = CatalogEntry.objects.filter(assignment=assignment).exclude(provenance=Provenance.CONFIGURED)
    discovered.filter(provenance=Provenance.OBSERVED).update(provenance=Provenance.PRESERVED)
    return AssignmentSync(assignment=assignment.name, ok=False, preserved=discovered.count(), reason=reason)


def catalog_sync(
    *,
    pool: str | None = None,
    assignment: str | None = None,
    client: httpx.Client | None = None,
    progress: Callable[[AssignmentSync], None] = lambda result: None,
) -> SyncSummary:
    """Sync every enabled, discovering assignment (optionally one pool or one assignment).

    One assignment's failure never fails the others: its discovered entries are preserved."""
    assignments = Assignment.objects.filter(discovery=True, enabled=True).select_related("pool")
    if pool is not None:
        assignments = assignments.filter(pool__name=pool)
    if assignment is not None:
        assignments = assignments.filter(name=assignment)
    timeout = httpx.Timeout(settings.GATEWAY_UPSTREAM_CONNECT_TIMEOUT_S, read=30.0)
    own_client = client is None
    client = client or guarded_client(timeout)
    summary = SyncSummary()
    try:
        for item in assignments.order_by("pool__name", "name"):
            try:
                models = discover_models(item, client)
            except DiscoveryError as exc:
                result = catalog_entries_preserve(assignment=item, reason=exc.reason)
            else:
                result = catalog_entries_observe(assignment=item, models=models, now=timezone.now())
            summary.results.append(result)
            progress(result)
    finally:
        if own_client:
            client.close()
    return summary


@transaction.atomic
def capability_evidence_record(
    *,
    assignment: Assignment,
    model: str,
    verdicts: Iterable[Verdict],
    qualified_at: datetime,
    days: int,
    corpus_version: str,
    config_hash: str,
) -> list[CapabilityEvidence]:
    """Append one route's verdicts (SPEC §8.1), valid for `days`. One INSERT: the configuration
    version trigger moves once, so every node reloads its routes on its next request."""
    expires_at = qualified_at + timedelta(days=days)
    return CapabilityEvidence.objects.bulk_create(
        [
            CapabilityEvidence(
                assignment=assignment,
                model=model,
                capability=str(v.capability),
                qualified=v.qualified,
                detail=v.detail,
                qualified_at=qualified_at,
                expires_at=expires_at,
                corpus_version=corpus_version,
                config_hash=config_hash,
            )
            for v in verdicts
        ]
    )

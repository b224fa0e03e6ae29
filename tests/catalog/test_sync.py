"""catalog_sync over real sockets: provenance transitions per SPEC §8."""

import socket

import pytest
from django.core.management import CommandError, call_command

from catalog.models import CatalogEntry, Provenance
from devkit.behaviours import unavailable
from pools.models import TriState
from tests.factories import AssignmentFactory, CatalogEntryFactory, PoolFactory

pytestmark = pytest.mark.django_db


def _entries(assignment):
    return dict(CatalogEntry.objects.filter(assignment=assignment).values_list("model", "provenance"))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sync(**kwargs) -> str:
    from io import StringIO

    out = StringIO()
    call_command("sync_catalog", stdout=out, **kwargs)
    return out.getvalue()


def test_discovery_records_observed_models_and_keeps_configured_ones(fake_upstream_factory):
    fake = fake_upstream_factory("a", models=("gpt-5", "gpt-5-mini"))
    assignment = AssignmentFactory(base_url=fake.base_url, discovery=True)
    CatalogEntryFactory(assignment=assignment, model="gpt-5", provenance=Provenance.CONFIGURED)
    CatalogEntryFactory(assignment=assignment, model="only-configured", provenance=Provenance.CONFIGURED)

    output = _sync()

    assert _entries(assignment) == {
        "gpt-5": Provenance.CONFIGURED,
        "gpt-5-mini": Provenance.OBSERVED,
        "only-configured": Provenance.CONFIGURED,
    }
    assert f"{assignment.name}: ok, 2 observed" in output
    assert "synced 1 assignments: 1 ok, 0 failed" in output
    assert fake.hit_count(path="/v1/models") == 1


def test_observed_capabilities_and_prices_stay_unknown(fake_upstream_factory):
    fake = fake_upstream_factory("a", models=("gpt-5",))
    assignment = AssignmentFactory(base_url=fake.base_url, discovery=True)
    _sync()
    entry = CatalogEntry.objects.get(assignment=assignment)
    assert (entry.tools, entry.vision) == (TriState.UNKNOWN, TriState.UNKNOWN)
    assert (entry.context_window, entry.input_per_mtok_micros, entry.output_per_mtok_micros) == (
        None,
        None,
        None,
    )


def test_a_failing_assignment_keeps_its_entries_preserved_and_the_others_sync(fake_upstream_factory):
    failing = fake_upstream_factory("failing", models=("gpt-5", "gpt-x"))
    healthy = fake_upstream_factory("healthy", models=("gpt-5",))
    pool = PoolFactory()
    a = AssignmentFactory(pool=pool, name="a-failing", base_url=failing.base_url, discovery=True)
    b = AssignmentFactory(pool=pool, name="b-healthy", base_url=healthy.base_url, discovery=True)
    CatalogEntryFactory(assignment=a, model="configured-one", provenance=Provenance.CONFIGURED)
    _sync()
    assert _entries(a)["gpt-x"] == Provenance.OBSERVED

    failing.models_behaviour = unavailable(503)
    output = _sync()

    assert _entries(a) == {
        "gpt-5": Provenance.PRESERVED,
        "gpt-x": Provenance.PRESERVED,
        "configured-one": Provenance.CONFIGURED,
    }
    assert _entries(b) == {"gpt-5": Provenance.OBSERVED}
    assert "a-failing: discovery failed (HTTP 503); 2 entries preserved" in output
    assert "1 ok, 1 failed" in output

    failing.models_behaviour = None
    _sync()
    assert _entries(a)["gpt-x"] == Provenance.OBSERVED


def test_an_unreachable_assignment_stays_a_catalog_source(db):
    assignment = AssignmentFactory(base_url=f"http://127.0.0.1:{_closed_port()}/v1", discovery=True)
    CatalogEntryFactory(assignment=assignment, model="gpt-5", provenance=Provenance.OBSERVED)
    output = _sync()
    assert _entries(assignment) == {"gpt-5": Provenance.PRESERVED}
    assert "discovery failed (unreachable)" in output


def test_a_successful_sync_drops_models_no_longer_advertised(fake_upstream_factory):
    fake = fake_upstream_factory("a", models=("gpt-5",))
    assignment = AssignmentFactory(base_url=fake.base_url, discovery=True)
    CatalogEntryFactory(assignment=assignment, model="gone", provenance=Provenance.PRESERVED)
    output = _sync()
    assert _entries(assignment) == {"gpt-5": Provenance.OBSERVED}
    assert "1 no longer advertised" in output


def test_sync_sends_the_assignment_credential_from_the_environment(fake_upstream_factory, monkeypatch):
    monkeypatch.setenv("GATEWAY_UPSTREAM_SYNC_TEST", "sk-upstream-sync-credential")
    fake = fake_upstream_factory("a", require_key="sk-upstream-sync-credential")
    assignment = AssignmentFactory(
        base_url=fake.base_url, discovery=True, api_key_env="GATEWAY_UPSTREAM_SYNC_TEST"
    )
    _sync()
    assert _entries(assignment) == {"gpt-5": Provenance.OBSERVED}
    assert fake.hits[0].headers["authorization"] == "Bearer sk-upstream-sync-credential"


def test_filters_select_pool_and_assignment(fake_upstream_factory):
    fake = fake_upstream_factory("a", models=("gpt-5",))
    one = AssignmentFactory(pool=PoolFactory(name="one"), base_url=fake.base_url, discovery=True)
    two = AssignmentFactory(pool=PoolFactory(name="two"), base_url=fake.base_url, discovery=True)
    AssignmentFactory(pool=one.pool, base_url=fake.base_url, discovery=False)
    _sync(pool="one")
    assert _entries(one) and not _entries(two)
    _sync(assignment=two.name)
    assert _entries(two)
    assert fake.hit_count(path="/v1/models") == 2


@pytest.mark.parametrize("option", [{"pool": "nope"}, {"assignment": "nope"}])
def test_unknown_filters_are_typed_errors(db, option):
    with pytest.raises(CommandError, match="unknown"):
        _sync(**option)


def test_a_sync_that_changes_the_catalog_moves_the_config_version(fake_upstream_factory):
    from pools.models import ConfigVersion

    fake = fake_upstream_factory("a", models=("gpt-5",))
    AssignmentFactory(base_url=fake.base_url, discovery=True)
    before = ConfigVersion.objects.get().value
    _sync()
    assert ConfigVersion.objects.get().value > before


def test_a_cookie_one_accounts_listing_sets_is_not_sent_with_anothers(db):
    """One client lists every assignment of a sync: a cookie set by one account's answer (a provider
    edge's load-balancer cookie) must not go out with the next account's request."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[str | None] = []

    class Listing(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("cookie"))
            body = json.dumps({"object": "list", "data": [{"id": "gpt-5", "object": "model"}]}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.send_header("set-cookie", "__cf_bm=one-accounts-cookie; Path=/")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Listing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        # By name: a cookie jar keeps no cookie of an IP address.
        base_url = f"http://localhost:{server.server_address[1]}/v1"
        first = AssignmentFactory(base_url=base_url, discovery=True)
        second = AssignmentFactory(base_url=base_url, discovery=True)
        _sync()
    finally:
        server.shutdown()
        server.server_close()
    assert _entries(first) == _entries(second) == {"gpt-5": Provenance.OBSERVED}
    assert seen == [None, None]

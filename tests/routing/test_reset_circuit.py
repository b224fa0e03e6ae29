"""`manage.py reset_circuit --assignment NAME [--model M]` (issue 43 point 7): an operator who fixed an
account closes its circuits and clears its demotions in one transaction, recorded as a configuration
change. Runs on SQLite and on PostgreSQL (DATABASE_URL)."""

import json
import logging
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from catalog.models import Provenance
from devkit.behaviours import serve
from pools.models import ConfigVersion
from routing.models import Circuit, Demotion
from tests.factories import AssignmentFactory, CatalogEntryFactory, OpenCircuitFactory, PoolFactory
from tests.proxy.fixtures_e2e import CHAT, assert_hits, post


def _demote(assignment, model: str) -> Demotion:
    until = timezone.now() + timedelta(minutes=5)
    return Demotion.objects.create(assignment=assignment, model=model, reason="rate_limited", until=until)


@pytest.fixture
def state(db):
    """acct-a with circuits on two models (HTTP and SSE), its assignment-wide circuit and two demotions;
    acct-b with a circuit and a demotion of its own."""
    pool = PoolFactory(name="main")
    a = AssignmentFactory(pool=pool, name="acct-a")
    b = AssignmentFactory(pool=pool, name="acct-b")
    for account in (a, b):
        for model in ("gpt-5", "gpt-4"):
            CatalogEntryFactory(assignment=account, model=model, provenance=Provenance.CONFIGURED)
    OpenCircuitFactory(assignment=a, model="gpt-5", route_class="http")
    OpenCircuitFactory(assignment=a, model="gpt-5", route_class="sse", reason="timeout")
    OpenCircuitFactory(assignment=a, model="gpt-4", route_class="http")
    OpenCircuitFactory(assignment=a, model="*", route_class="*", reason="credential_rejected")
    _demote(a, "gpt-5")
    _demote(a, "gpt-4")
    OpenCircuitFactory(assignment=b, model="gpt-5", route_class="http")
    _demote(b, "gpt-5")
    return a, b


def _rows() -> tuple[list, list]:
    circuits = Circuit.objects.order_by("assignment__name", "model", "route_class")
    demotions = Demotion.objects.order_by("assignment__name", "model")
    return (
        list(circuits.values_list("assignment__name", "model", "route_class")),
        list(demotions.values_list("assignment__name", "model")),
    )


def _version() -> int:
    row = ConfigVersion.objects.filter(pk=1).first()
    return row.value if row else 0


def _run(*args: str) -> str:
    out = StringIO()
    call_command("reset_circuit", *args, stdout=out)
    return out.getvalue()


def test_it_resets_every_circuit_and_demotion_of_the_assignment_and_nothing_else(state):
    out = _run("--assignment", "acct-a")
    assert _rows() == ([("acct-b", "gpt-5", "http")], [("acct-b", "gpt-5")])
    assert "reset 4 circuit(s) and 2 demotion(s) of 'acct-a'" in out
    assert "closed circuit every model and route class (was open, credential_rejected)" in out


def test_with_a_model_it_resets_that_models_circuits_and_the_assignment_wide_one(state):
    out = _run("--assignment", "acct-a", "--model", "gpt-5")
    assert _rows() == (
        [("acct-a", "gpt-4", "http"), ("acct-b", "gpt-5", "http")],
        [("acct-a", "gpt-4"), ("acct-b", "gpt-5")],
    )
    assert "closed circuit gpt-5 sse (was open, timeout)" in out
    assert "cleared demotion gpt-5 (rate_limited until" in out


def test_it_moves_the_config_version_and_logs_who_reset_what(state, caplog, monkeypatch):
    monkeypatch.setenv("LOGNAME", "ops-alice")  # getpass.getuser reads it first
    before = _version()
    with caplog.at_level(logging.INFO, logger="gateway"):
        _run("--assignment", "acct-a", "--model", "gpt-5")
    assert _version() == before + 1
    (line,) = [json.loads(r.getMessage()) for r in caplog.records if r.name == "gateway"]
    assert line == {
        "event": "circuit_reset",
        "assignment": "acct-a",
        "model": "gpt-5",
        "by": "ops-alice",
        "circuits": 3,
        "demotions": 1,
        "config_version": before + 1,
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--assignment", "acct-z"), "unknown assignment 'acct-z'"),
        (("--assignment", "acct-a", "--model", "gpt-9"), "has no model 'gpt-9'"),
        (("--assignment", "acct-b", "--model", "claude-x"), "has no model 'claude-x'"),
    ],
)
def test_unknown_names_are_refused_and_nothing_changes(state, args, message):
    rows, before = _rows(), _version()
    with pytest.raises(CommandError, match=message):
        _run(*args)
    assert (_rows(), _version()) == (rows, before)


def test_a_model_with_state_but_no_catalog_entry_can_be_reset(state):
    a, _ = state
    OpenCircuitFactory(assignment=a, model="gone-model", route_class="http")
    _run("--assignment", "acct-a", "--model", "gone-model")
    assert not Circuit.objects.filter(model="gone-model").exists()
    assert Circuit.objects.filter(assignment=a, model="gpt-5").exists()


def test_after_a_reset_the_next_request_goes_to_the_account(gateway, two_assignments):
    a, b, (acct_a, _) = two_assignments
    a.script("gpt-5", serve("served by a"))
    b.script("gpt-5", serve("served by b"))
    OpenCircuitFactory(assignment=acct_a, model="gpt-5", route_class="http")
    assert (
        post(gateway, "/v1/chat/completions", CHAT).json()["choices"][0]["message"]["content"]
        == "served by b"
    )
    _run("--assignment", "acct-a")
    response = post(gateway, "/v1/chat/completions", CHAT)
    assert response.json()["choices"][0]["message"]["content"] == "served by a"
    assert_hits((a, 1), (b, 1))

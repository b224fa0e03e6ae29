"""load_gateway_config / dump_gateway_config (SPEC §3): validation paths, idempotent apply, prune,
round trip, unknown-stays-unknown, and keys stored only as hashes."""

import copy
from collections.abc import Callable
from datetime import UTC, datetime
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext

from catalog.models import CatalogEntry, Provenance
from gatewayconfig.document import (
    DatabaseFacts,
    IssueCode,
    database_facts,
    parse_config,
    parse_yaml,
    validate_config,
)
from pools.models import (
    Assignment,
    GatewayKey,
    GatewaySettings,
    ModelAlias,
    ModelFallback,
    Pool,
    Router,
    TriState,
    hash_key,
)
from tests.factories import AssignmentFactory, CatalogEntryFactory, GatewayKeyFactory

REPO = Path(__file__).resolve().parents[2]
CI_KEY = "sk-gw-ci-0123456789abcdef"
THIRD_KEY = "sk-gw-third-0123456789abcdef"
OPS_KEY = "sk-gw-ops-from-env-0123456789"

BASE = f"""
circuit:
  failure_threshold: 5
  cooldown_seconds: 30
  max_cooldown_seconds: 300
  half_open_probes: 2
  probe_lease_seconds: 45
  demotion_seconds: 90
retry:
  max_attempts: 3
  backoff_base_ms: 25
  default_deadline_ms: 60000
model_aliases: {{gpt5: gpt-5}}
model_fallbacks: {{claude-opus-5: claude-opus-4-8}}
model_fallback_family: false
pools:
  - name: main
    auto_models: [gpt-5, claude-opus-4-8]
    assignments:
      - name: acct-a
        adapter: openai
        base_url: http://127.0.0.1:9101/v1
        api_key_env: GATEWAY_UPSTREAM_ACCT_A
        tier: 0
        weight: 2
        region: us
        router: direct
        privacy: {{zero_retention: true, data_collection: deny}}
        capabilities: {{tools: true, write_tools: false, vision: unknown,
                       role_separation: true, tool_representation: native}}
        quality: 0.9
        min_deadline_ms: 500
        discovery: true
        models:
          - id: gpt-5
            context_window: 400000
            capabilities: {{vision: true}}
            price: {{input_per_mtok_micros: 1250000, output_per_mtok_micros: 10000000}}
          - id: gpt-5-mini
            price: {{input_per_mtok_micros: 0}}
      - name: acct-b
        adapter: anthropic
        base_url: https://api.anthropic.com/v1
        api_key_env: GATEWAY_UPSTREAM_ACCT_B
        tier: 1
        models:
          - id: claude-opus-4-8
  - name: spare
    assignments:
      - name: acct-c
        adapter: openrouter
        base_url: https://openrouter.ai/api/v1
keys:
  - name: ci
    key: {CI_KEY}
    pools: [main]
    allowed_models: ["*"]
    requirements: {{zero_retention: true, regions: [us, eu], allow_third_party_router: false,
                   min_quality: 0.5}}
    budget_micros: 5000000
  - name: ops
    key_env: GW_OPS_KEY
    pools: [main, spare]
    allowed_models: [gpt-5]
  - name: third
    key: {THIRD_KEY}
    pools: [spare]
"""


@pytest.fixture(autouse=True)
def environment(monkeypatch):
    monkeypatch.setenv("GATEWAY_UPSTREAM_ACCT_A", "upstream-a")
    monkeypatch.setenv("GATEWAY_UPSTREAM_ACCT_B", "upstream-b")
    monkeypatch.setenv("GW_OPS_KEY", OPS_KEY)


def base() -> dict[str, Any]:
    return yaml.safe_load(BASE)


def write(tmp_path: Path, content: str | dict[str, Any], name: str = "gateway.yaml") -> Path:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content, sort_keys=False))
    return path


def load(
    tmp_path: Path, content: str | dict[str, Any], *, prune: bool = False
) -> tuple[list[str], list[str]]:
    out, err = StringIO(), StringIO()
    call_command("load_gateway_config", str(write(tmp_path, content)), prune=prune, stdout=out, stderr=err)
    return out.getvalue().splitlines(), err.getvalue().splitlines()


def load_fails(tmp_path: Path, content: str | dict[str, Any]) -> list[str]:
    err = StringIO()
    with pytest.raises(CommandError):
        call_command("load_gateway_config", str(write(tmp_path, content)), stdout=StringIO(), stderr=err)
    return err.getvalue().splitlines()


def dump() -> str:
    out = StringIO()
    call_command("dump_gateway_config", stdout=out)
    return out.getvalue()


def writes(ctx: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in ctx.captured_queries if q["sql"].lstrip().split()[0].upper() in WRITE_VERBS]


WRITE_VERBS = {"INSERT", "UPDATE", "DELETE"}


def db_state() -> dict[str, list[dict[str, Any]]]:
    return {
        "settings": list(GatewaySettings.objects.order_by("pk").values()),
        "aliases": list(ModelAlias.objects.order_by("pk").values()),
        "fallbacks": list(ModelFallback.objects.order_by("pk").values()),
        "pools": list(Pool.objects.order_by("pk").values()),
        "assignments": list(Assignment.objects.order_by("pk").values()),
        "catalog": list(CatalogEntry.objects.order_by("pk").values()),
        "keys": list(GatewayKey.objects.order_by("pk").values()),
        "key_pools": list(GatewayKey.pools.through.objects.order_by("pk").values()),
    }


def tables_containing(needle: str) -> set[str]:
    """Every table with a column value (text, JSON, anything rendered as text) containing `needle`."""
    found = set()
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            for row in cursor.fetchall():
                if any(value is not None and needle in str(value) for value in row):
                    found.add(table)
    return found


# --- the happy path --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_load_creates_the_declared_state(tmp_path):
    out, err = load(tmp_path, BASE)

    assert err == []  # every referenced variable is set, every target configured
    assert "pools: 2 created, 0 updated, 0 unchanged, 0 deleted" in out
    assert "assignments: 3 created, 0 updated, 0 unchanged, 0 deleted" in out
    assert "catalog entries: 3 created, 0 updated, 0 unchanged, 0 deleted" in out
    assert "keys: 3 created, 0 updated, 0 unchanged, 0 deleted" in out
    settings = GatewaySettings.objects.get(pk=1)
    assert (settings.failure_threshold, settings.cooldown_seconds, settings.max_cooldown_seconds) == (
        5,
        30,
        300,
    )
    assert (settings.half_open_probes, settings.probe_lease_seconds, settings.demotion_seconds) == (2, 45, 90)
    assert (settings.max_attempts, settings.backoff_base_ms, settings.default_deadline_ms) == (3, 25, 60000)
    assert settings.model_fallback_family is False
    assert dict(ModelAlias.objects.values_list("alias", "canonical")) == {"gpt5": "gpt-5"}
    assert dict(ModelFallback.objects.values_list("requested", "served")) == {
        "claude-opus-5": "claude-opus-4-8"
    }
    assert Pool.objects.get(name="main").auto_models == ["gpt-5", "claude-opus-4-8"]

    a = Assignment.objects.get(name="acct-a")
    assert (a.pool.name, a.adapter, a.base_url, a.api_key_env) == (
        "main",
        "openai",
        "http://127.0.0.1:9101/v1",
        "GATEWAY_UPSTREAM_ACCT_A",
    )
    assert (a.tier, a.weight, a.region, a.router, a.quality, a.min_deadline_ms, a.discovery) == (
        0,
        2,
        "us",
        "direct",
        0.9,
        500,
        True,
    )
    assert (a.zero_retention, a.data_collection) == (TriState.TRUE, "deny")
    assert (a.tools, a.write_tools, a.vision, a.role_separation, a.tool_representation) == (
        TriState.TRUE,
        TriState.FALSE,
        TriState.UNKNOWN,
        TriState.TRUE,
        "native",
    )
    gpt5 = CatalogEntry.objects.get(assignment=a, model="gpt-5")
    assert gpt5.provenance == Provenance.CONFIGURED
    assert (gpt5.context_window, gpt5.vision, gpt5.tools) == (400000, TriState.TRUE, TriState.UNKNOWN)
    assert (gpt5.input_per_mtok_micros, gpt5.output_per_mtok_micros) == (1250000, 10000000)

    ci = GatewayKey.objects.get(name="ci")
    assert ci.key_hash == hash_key(CI_KEY)
    assert (ci.allowed_models, ci.require_zero_retention, ci.regions) == (["*"], True, ["us", "eu"])
    assert (ci.allow_third_party_router, ci.min_quality, ci.budget_micros) == (False, 0.5, 5000000)
    assert {p.name for p in ci.pools.all()} == {"main"}
    ops = GatewayKey.objects.get(name="ops")
    assert ops.key_hash == hash_key(OPS_KEY)
    assert {p.name for p in ops.pools.all()} == {"main", "spare"}
    assert (ops.require_zero_retention, ops.regions, ops.allow_third_party_router, ops.budget_micros) == (
        False,
        [],
        True,
        None,
    )


@pytest.mark.django_db
def test_demo_config_loads_with_two_failover_assignments(monkeypatch):
    monkeypatch.setenv("GATEWAY_UPSTREAM_DEMO_KEY", "sk-demo-upstream")
    out, err = StringIO(), StringIO()
    call_command(
        "load_gateway_config", str(REPO / "gatewaysite" / "demo_config.yaml"), stdout=out, stderr=err
    )

    assert err.getvalue() == ""
    demo = Pool.objects.get(name="demo")
    assignments = list(demo.assignments.order_by("tier"))
    assert [(a.name, a.tier, a.base_url, a.api_key_env, a.discovery) for a in assignments] == [
        ("demo-a", 0, "http://127.0.0.1:9101/v1", "GATEWAY_UPSTREAM_DEMO_KEY", True),
        ("demo-b", 1, "http://127.0.0.1:9102/v1", "GATEWAY_UPSTREAM_DEMO_KEY", True),
    ]
    for assignment in assignments:
        assert set(assignment.catalog_entries.values_list("model", "provenance")) == {
            ("gpt-5", Provenance.CONFIGURED),
            ("gpt-x", Provenance.CONFIGURED),
        }
    key = GatewayKey.objects.get(name="demo")
    assert key.key_hash == hash_key("sk-gw-demo-not-a-secret")
    assert key.allowed_models == ["*"]
    assert [p.name for p in key.pools.all()] == ["demo"]


# --- idempotency and round trip ------------------------------------------------------------------


@pytest.mark.django_db
def test_loading_the_same_file_twice_writes_nothing(tmp_path):
    load(tmp_path, BASE)
    before = db_state()

    with CaptureQueriesContext(connection) as ctx:
        out, _ = load(tmp_path, BASE)

    assert writes(ctx) == []
    assert db_state() == before
    assert "no changes" in out
    assert "assignments: 0 created, 0 updated, 3 unchanged, 0 deleted" in out


@pytest.mark.django_db
def test_loading_the_same_file_twice_with_prune_writes_nothing(tmp_path):
    load(tmp_path, BASE, prune=True)
    before = db_state()

    with CaptureQueriesContext(connection) as ctx:
        load(tmp_path, BASE, prune=True)

    assert writes(ctx) == []
    assert db_state() == before


@pytest.mark.django_db
def test_a_changed_value_updates_only_that_row(tmp_path):
    load(tmp_path, BASE)
    doc = base()
    doc["pools"][0]["assignments"][1]["tier"] = 7

    with CaptureQueriesContext(connection) as ctx:
        out, _ = load(tmp_path, doc)

    assert Assignment.objects.get(name="acct-b").tier == 7
    assert "assignments: 0 created, 1 updated, 2 unchanged, 0 deleted" in out
    assert len(writes(ctx)) == 1


@pytest.mark.django_db
def test_round_trip_load_dump_load_is_a_no_op(tmp_path):
    load(tmp_path, BASE)
    state = db_state()
    first = dump()

    with CaptureQueriesContext(connection) as ctx:
        load(tmp_path, first)

    assert writes(ctx) == []
    assert db_state() == state
    assert dump() == first


@pytest.mark.django_db
def test_dump_of_a_dump_into_a_fresh_database_is_identical(tmp_path):
    load(tmp_path, BASE)
    first = dump()
    # Into a database without the keys, the secret-less dump is not enough for a key...
    GatewayKey.objects.all().delete()
    errors = load_fails(tmp_path, first)
    assert errors == ["keys[0].key: required", "keys[1].key: required", "keys[2].key: required"]
    # ...but everything else reloads to the same dump.
    doc = yaml.safe_load(first)
    doc["keys"] = []
    Pool.objects.all().delete()
    load(tmp_path, doc)
    assert yaml.safe_load(dump()) == doc


@pytest.mark.django_db
def test_dump_has_no_secrets_and_omits_unknowns(tmp_path):
    load(tmp_path, BASE)
    text = dump()
    doc = yaml.safe_load(text)

    for secret in (CI_KEY, THIRD_KEY, OPS_KEY, hash_key(CI_KEY), "upstream-a"):
        assert secret not in text
    assert all("key" not in k and "key_env" not in k for k in doc["keys"])
    acct_a, acct_b = doc["pools"][0]["assignments"]
    assert acct_a["api_key_env"] == "GATEWAY_UPSTREAM_ACCT_A"
    assert "vision" not in acct_a["capabilities"]  # declared unknown
    assert acct_a["capabilities"]["write_tools"] is False
    assert "privacy" not in acct_b and "capabilities" not in acct_b and "quality" not in acct_b
    assert acct_a["models"][1] == {"id": "gpt-5-mini", "price": {"input_usd": "0.00"}}
    assert acct_b["models"] == [{"id": "claude-opus-4-8"}]


@pytest.mark.django_db
def test_dump_writes_nothing_on_an_empty_database():
    with CaptureQueriesContext(connection) as ctx:
        doc = yaml.safe_load(dump())

    assert writes(ctx) == []
    assert not GatewaySettings.objects.exists()
    assert doc["circuit"]["failure_threshold"] == 3
    assert doc["pools"] == [] and doc["keys"] == []


# --- validation ----------------------------------------------------------------------------------


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A mutation of the base document: `_set("pools.0.assignments.1.tier", 3)`; DELETE removes."""

    def mutate(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        key: Any = int(last) if isinstance(node, list) else last
        if value is DELETE:
            del node[key]
        else:
            node[key] = copy.deepcopy(value)

    return mutate


DELETE = object()
A0 = "pools.0.assignments.0"
M0 = f"{A0}.models.0"

ERROR_CASES = [
    # (mutation, printed line, issue code)
    (
        _set("pools.0.assignments.1.base_url", DELETE),
        "pools[0].assignments[1].base_url: required",
        IssueCode.REQUIRED,
    ),
    (
        _set(f"{A0}.base_url", "ftp://x/v1"),
        "pools[0].assignments[0].base_url: must be an http(s) URL",
        IssueCode.INVALID,
    ),
    (
        _set(f"{A0}.base_url", "http://api example.com/v1"),
        "pools[0].assignments[0].base_url: must be an http(s) URL",
        IssueCode.INVALID,
    ),
    (
        _set(f"{A0}.base_url", "https://user:pw@api.example.com/v1"),
        "pools[0].assignments[0].base_url: must not contain credentials (use api_key_env)",
        IssueCode.INVALID,
    ),
    (_set(f"{A0}.tierr", 1), "pools[0].assignments[0].tierr: unknown field", IssueCode.UNKNOWN_FIELD),
    (_set("extra", 1), "extra: unknown field", IssueCode.UNKNOWN_FIELD),
    (
        _set(f"{M0}.capabilities.write_tools", True),
        "pools[0].assignments[0].models[0].capabilities.write_tools: unknown field",
        IssueCode.UNKNOWN_FIELD,
    ),
    (_set(f"{A0}.name", DELETE), "pools[0].assignments[0].name: required", IssueCode.REQUIRED),
    (
        _set(f"{A0}.adapter", "azure"),
        "pools[0].assignments[0].adapter: must be one of openai, anthropic, openrouter, azure_openai, "
        "openai_compatible, gemini, bedrock, vertex",
        IssueCode.INVALID,
    ),
    (
        _set(f"{A0}.router", "proxy"),
        "pools[0].assignments[0].router: must be one of direct, third_party",
        IssueCode.INVALID,
    ),
    (
        _set(f"{A0}.capabilities.tool_representation", "json"),
        "pools[0].assignments[0].capabilities.tool_representation: must be one of native, emulated, unknown",
        IssueCode.INVALID,
    ),
    (
        _set(f"{A0}.capabilities.tools", "yes please"),
        "pools[0].assignments[0].capabilities.tools: must be true, false or unknown",
        IssueCode.INVALID,
    ),
    (
        _set(f"{A0}.capabilities.vision", None),
        "pools[0].assignments[0].capabilities.vision: must be true, false or unknown",
        IssueCode.INVALID,
    ),
    (
        _set(f"{A0}.privacy.zero_retention", "maybe"),
        "pools[0].assignments[0].privacy.zero_retention: must be true, false or unknown",
        IssueCode.INVALID,
    ),
    (
        _set(f"{A0}.privacy.data_collection", "sometimes"),
        "pools[0].assignments[0].privacy.data_collection: must be one of allow, deny, unknown",
        IssueCode.INVALID,
    ),
    (_set(f"{A0}.tier", "high"), "pools[0].assignments[0].tier: must be an integer", IssueCode.INVALID),
    (_set(f"{A0}.tier", 1.5), "pools[0].assignments[0].tier: must be an integer", IssueCode.INVALID),
    (_set(f"{A0}.weight", 0), "pools[0].assignments[0].weight: must be an integer >= 1", IssueCode.INVALID),
    (
        _set(f"{A0}.weight", True),
        "pools[0].assignments[0].weight: must be an integer >= 1",
        IssueCode.INVALID,
    ),
    (
        _set(f"{A0}.min_deadline_ms", -1),
        "pools[0].assignments[0].min_deadline_ms: must be an integer >= 0",
        IssueCode.INVALID,
    ),
    (
        _set(f"{A0}.min_deadline_ms", 2**40),
        "pools[0].assignments[0].min_deadline_ms: must be an integer <= 2147483647",
        IssueCode.INVALID,
    ),
    (
        _set(f"{A0}.quality", 1.5),
        "pools[0].assignments[0].quality: must be a number between 0 and 1",
        IssueCode.INVALID,
    ),
    (
        _set(f"{A0}.quality", "good"),
        "pools[0].assignments[0].quality: must be a number between 0 and 1",
        IssueCode.INVALID,
    ),
    (
        _set(f"{A0}.discovery", "yes"),
        "pools[0].assignments[0].discovery: must be true or false",
        IssueCode.INVALID,
    ),
    (
        _set(f"{A0}.region", ""),
        "pools[0].assignments[0].region: must be a non-empty string",
        IssueCode.INVALID,
    ),
    (
        _set(f"{A0}.api_key_env", "not a variable"),
        "pools[0].assignments[0].api_key_env: must be an environment variable name ([A-Za-z_][A-Za-z0-9_]*)",
        IssueCode.INVALID,
    ),
    (
        _set(f"{A0}.models", {"id": "gpt-5"}),
        "pools[0].assignments[0].models: must be a list",
        IssueCode.INVALID,
    ),
    (_set(f"{M0}.id", DELETE), "pools[0].assignments[0].models[0].id: required", IssueCode.REQUIRED),
    (
        _set(f"{M0}.id", "auto"),
        "pools[0].assignments[0].models[0].id: 'auto' is reserved for model=auto",
        IssueCode.RESERVED,
    ),
    (
        _set(f"{M0}.context_window", 0),
        "pools[0].assignments[0].models[0].context_window: must be an integer >= 1",
        IssueCode.INVALID,
    ),
    (
        _set(f"{M0}.price.input_per_mtok_micros", -1),
        "pools[0].assignments[0].models[0].price.input_per_mtok_micros: must be an integer >= 0",
        IssueCode.INVALID,
    ),
    (
        _set(f"{M0}.price.output_per_mtok_micros", 2.5),
        "pools[0].assignments[0].models[0].price.output_per_mtok_micros: must be an integer >= 0",
        IssueCode.INVALID,
    ),
    (
        _set(f"{A0}.models.1.id", "gpt-5"),
        "pools[0].assignments[0].models[1].id: duplicate model 'gpt-5' "
        "(also pools[0].assignments[0].models[0])",
        IssueCode.DUPLICATE,
    ),
    (
        _set("pools.1.name", "main"),
        "pools[1].name: duplicate pool name 'main' (also pools[0])",
        IssueCode.DUPLICATE,
    ),
    (
        _set("pools.1.assignments.0.name", "acct-a"),
        "pools[1].assignments[0].name: duplicate assignment name 'acct-a' (also pools[0].assignments[0])",
        IssueCode.DUPLICATE,
    ),
    (_set("pools.0.auto_models", "gpt-5"), "pools[0].auto_models: must be a list", IssueCode.INVALID),
    (_set("pools", {"main": {}}), "pools: must be a list", IssueCode.INVALID),
    (_set("keys.1.name", "ci"), "keys[1].name: duplicate key name 'ci' (also keys[0])", IssueCode.DUPLICATE),
    (_set("keys.2.pools", ["x"]), "keys[2].pools[0]: unknown pool 'x'", IssueCode.UNKNOWN_POOL),
    (_set("keys.1.pools", ["main", "gone"]), "keys[1].pools[1]: unknown pool 'gone'", IssueCode.UNKNOWN_POOL),
    (
        _set("keys.0.pools", ["main", "main"]),
        "keys[0].pools[1]: duplicate pool 'main' (also keys[0].pools[0])",
        IssueCode.DUPLICATE,
    ),
    (_set("keys.2.key", DELETE), "keys[2].key: required", IssueCode.REQUIRED),
    (
        _set("keys.2.key_env", "GW_OPS_KEY"),
        "keys[2].key_env: give either key or key_env, not both",
        IssueCode.CONFLICT,
    ),
    (
        _set("keys.1.key_env", "GW_UNSET_KEY"),
        "keys[1].key_env: environment variable 'GW_UNSET_KEY' is not set",
        IssueCode.ENV_UNSET,
    ),
    (_set("keys.0.key", "sk-short"), "keys[0].key: must be at least 20 characters", IssueCode.INVALID),
    (
        _set("keys.0.key", "sk-gw with a space in it"),
        "keys[0].key: must not contain whitespace",
        IssueCode.INVALID,
    ),
    (
        _set("keys.0.key", 12345678901234567890123),
        "keys[0].key: must be a non-empty string",
        IssueCode.INVALID,
    ),
    (_set("keys.2.key", CI_KEY), "keys[2].key: same key as keys[0]", IssueCode.DUPLICATE),
    (_set("keys.0.allowed_models", "*"), "keys[0].allowed_models: must be a list", IssueCode.INVALID),
    (
        _set("keys.0.allowed_models", [5]),
        "keys[0].allowed_models[0]: must be a non-empty string",
        IssueCode.INVALID,
    ),
    (_set("keys.0.budget_micros", -1), "keys[0].budget_micros: must be an integer >= 0", IssueCode.INVALID),
    (
        _set("keys.0.budget_micros", "lots"),
        "keys[0].budget_micros: must be an integer >= 0",
        IssueCode.INVALID,
    ),
    (
        _set("keys.0.budget_period", "year"),
        "keys[0].budget_period: must be one of day, week, month",
        IssueCode.INVALID,
    ),
    (
        _set("keys.0.requirements.min_quality", 2),
        "keys[0].requirements.min_quality: must be a number between 0 and 1",
        IssueCode.INVALID,
    ),
    (
        _set("keys.0.requirements.zero_retnetion", True),
        "keys[0].requirements.zero_retnetion: unknown field",
        IssueCode.UNKNOWN_FIELD,
    ),
    (
        _set("keys.0.requirements.regions", "us"),
        "keys[0].requirements.regions: must be a list",
        IssueCode.INVALID,
    ),
    (
        _set("keys.0.requirements.allow_third_party_router", "no"),
        "keys[0].requirements.allow_third_party_router: must be true or false",
        IssueCode.INVALID,
    ),
    (
        _set("model_fallbacks.claude-opus-5", "claude-opus-5"),
        "model_fallbacks.claude-opus-5: falls back to itself",
        IssueCode.SELF_MAPPING,
    ),
    (
        _set("model_fallbacks.claude-opus-4-8", "claude-opus-4-7"),
        "model_fallbacks.claude-opus-5: "
        "'claude-opus-4-8' itself falls back to 'claude-opus-4-7' (one hop only)",
        IssueCode.CHAINED,
    ),
    (
        _set("model_fallbacks.claude-opus-5", 5),
        "model_fallbacks.claude-opus-5: must be a non-empty string",
        IssueCode.INVALID,
    ),
    (
        _set("model_fallbacks.auto", "gpt-5"),
        "model_fallbacks.auto: 'auto' is reserved for model=auto",
        IssueCode.RESERVED,
    ),
    (
        _set("model_fallbacks.gpt-6", "gpt5"),
        "model_fallbacks.gpt-6: 'gpt5' is an alias; name its canonical model",
        IssueCode.ALIAS_CONFLICT,
    ),
    (
        _set("model_fallbacks.gpt5", "gpt-4"),
        "model_fallbacks.gpt5: 'gpt5' is an alias, resolved before fallbacks; name its canonical model",
        IssueCode.ALIAS_CONFLICT,
    ),
    (_set("model_aliases.gpt5", "gpt5"), "model_aliases.gpt5: maps to itself", IssueCode.SELF_MAPPING),
    (
        _set("model_aliases.g5", "gpt5"),
        "model_aliases.g5: 'gpt5' is itself an alias (one hop only)",
        IssueCode.CHAINED,
    ),
    (_set("model_aliases", ["gpt5"]), "model_aliases: must be a mapping", IssueCode.INVALID),
    (
        _set("circuit.failure_threshold", 0),
        "circuit.failure_threshold: must be an integer >= 1",
        IssueCode.INVALID,
    ),
    (
        _set("circuit.cooldown_seconds", "1m"),
        "circuit.cooldown_seconds: must be an integer >= 1",
        IssueCode.INVALID,
    ),
    (
        _set("circuit.max_cooldown_seconds", 10),
        "circuit.max_cooldown_seconds: must be >= cooldown_seconds (30)",
        IssueCode.INVALID,
    ),
    (
        _set("circuit.demotion_seconds", -5),
        "circuit.demotion_seconds: must be an integer >= 0",
        IssueCode.INVALID,
    ),
    (_set("circuit.open_after", 3), "circuit.open_after: unknown field", IssueCode.UNKNOWN_FIELD),
    (_set("retry.max_attempts", True), "retry.max_attempts: must be an integer >= 1", IssueCode.INVALID),
    (_set("retry", 4), "retry: must be a mapping", IssueCode.INVALID),
    (_set("model_fallback_family", "yes"), "model_fallback_family: must be true or false", IssueCode.INVALID),
]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("mutate", "line", "code"),
    ERROR_CASES,
    ids=[case[1].split(":")[0] + f"#{i}" for i, case in enumerate(ERROR_CASES)],
)
def test_each_validation_error_is_printed_with_its_path(tmp_path, mutate, line, code):
    doc = base()
    mutate(doc)
    text = yaml.safe_dump(doc, sort_keys=False)

    printed = load_fails(tmp_path, text)

    assert line in printed
    issue = next(
        e
        for e in parse_config(text, env={"GW_OPS_KEY": OPS_KEY}, facts=database_facts()).errors
        if str(e) == line
    )
    assert issue.code == code
    assert db_state()["pools"] == []


@pytest.mark.django_db
def test_every_error_is_reported_not_just_the_first(tmp_path):
    doc = base()
    del doc["pools"][0]["assignments"][1]["base_url"]
    doc["circuit"]["failure_threshold"] = 0
    doc["keys"][2]["pools"] = ["x"]
    doc["pools"][0]["assignments"][0]["tierr"] = 1

    printed = load_fails(tmp_path, doc)

    assert printed == [
        "circuit.failure_threshold: must be an integer >= 1",
        "pools[0].assignments[0].tierr: unknown field",
        "pools[0].assignments[1].base_url: required",
        "keys[2].pools[0]: unknown pool 'x'",
    ]


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("pools:\n  - name: a\n   bad: [\n", "line 3, column 4"),
        ("pools: [\n", "line 2, column 1"),
        ("keys:\n  - name: a\n    name: b\n", "line 3, column 5"),  # duplicate mapping key
        ("circuit:\n  failure_threshold: 3\n  failure_threshold: 4\n", "line 3, column 3"),
    ],
)
def test_yaml_syntax_errors_name_their_line(text, path):
    result = parse_config(text, env={})

    assert [(e.path, e.code) for e in result.errors] == [(path, IssueCode.SYNTAX)]
    assert result.config is None


def test_yaml_merge_keys_may_be_overridden():
    doc = parse_yaml("base: &b {tier: 1, weight: 2}\nother:\n  <<: *b\n  tier: 3\n")

    assert doc == {"base": {"tier": 1, "weight": 2}, "other": {"tier": 3, "weight": 2}}


@pytest.mark.parametrize("document", [["pools"], "pools", 3])
def test_a_document_that_is_not_a_mapping_is_refused(document):
    result = validate_config(document, env={})

    assert [str(e) for e in result.errors] == ["(top level): must be a mapping"]


def test_an_empty_file_is_an_empty_configuration():
    result = parse_config("# nothing yet\n", env={})

    assert result.errors == ()
    assert result.config is not None and result.config.pools == () and result.config.keys == ()


@pytest.mark.django_db
def test_an_unreadable_file_is_a_command_error(tmp_path):
    with pytest.raises(CommandError):
        call_command(
            "load_gateway_config", str(tmp_path / "missing.yaml"), stdout=StringIO(), stderr=StringIO()
        )
    (tmp_path / "latin1.yaml").write_bytes(b"pools: []\n# caf\xe9\n")
    with pytest.raises(CommandError):
        call_command(
            "load_gateway_config", str(tmp_path / "latin1.yaml"), stdout=StringIO(), stderr=StringIO()
        )


@pytest.mark.django_db
def test_an_invalid_file_leaves_the_database_untouched(tmp_path):
    load(tmp_path, BASE)
    before = db_state()
    doc = base()
    doc["circuit"]["failure_threshold"] = 9  # valid changes...
    doc["pools"][0]["assignments"][0]["tier"] = 4
    doc["pools"].append(
        {"name": "new", "assignments": [{"name": "n", "adapter": "openai", "base_url": "http://x/v1"}]}
    )
    doc["keys"][0]["key"] = "sk-gw-rotated-0123456789abcdef"
    doc["keys"][2]["pools"] = ["nope"]  # ...and one error

    with CaptureQueriesContext(connection) as ctx:
        printed = load_fails(tmp_path, doc)

    assert printed == ["keys[2].pools[0]: unknown pool 'nope'"]
    assert writes(ctx) == []
    assert db_state() == before


@pytest.mark.django_db
def test_a_key_without_secret_is_allowed_only_when_it_exists(tmp_path):
    load(tmp_path, BASE)
    doc = base()
    del doc["keys"][0]["key"]
    doc["keys"][0]["budget_micros"] = 7

    load(tmp_path, doc)

    ci = GatewayKey.objects.get(name="ci")
    assert ci.key_hash == hash_key(CI_KEY)  # kept
    assert ci.budget_micros == 7
    doc["keys"][0]["name"] = "brand-new"
    assert load_fails(tmp_path, doc) == ["keys[0].key: required"]


@pytest.mark.django_db
def test_a_key_already_used_by_another_name_is_refused_unless_pruned(tmp_path):
    GatewayKeyFactory(name="legacy", raw_key=CI_KEY)

    assert load_fails(tmp_path, BASE) == ["keys[0].key: already the key of 'legacy'"]
    load(tmp_path, BASE, prune=True)
    assert set(GatewayKey.objects.values_list("name", flat=True)) == {"ci", "ops", "third"}


@pytest.mark.django_db
def test_a_rotated_key_is_rehashed(tmp_path):
    """Only with --replace-secrets (issue 47): without it a changed secret is kept, and said."""
    load(tmp_path, BASE)
    doc = base()
    doc["keys"][0]["key"] = "sk-gw-rotated-0123456789abcdef"

    _, err = load(tmp_path, doc)
    assert GatewayKey.objects.get(name="ci").key_hash == hash_key(CI_KEY)
    assert any("key 'ci': the file's secret differs from the stored one, which is kept" in e for e in err)
    call_command(
        "load_gateway_config",
        str(write(tmp_path, doc)),
        replace_secrets=True,
        stdout=StringIO(),
        stderr=StringIO(),
    )

    ci = GatewayKey.objects.get(name="ci")
    assert ci.key_hash == hash_key("sk-gw-rotated-0123456789abcdef")
    assert ci.prefix == "sk-gw-rota"


# --- warnings ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_fallback_to_an_unconfigured_model_is_a_warning(tmp_path):
    doc = base()
    doc["model_fallbacks"]["gpt-6"] = "gpt-5.5"

    out, err = load(tmp_path, doc)

    assert err == [
        "warning: model_fallbacks.gpt-6: "
        "fallback target 'gpt-5.5' is not configured by any pool nor in the catalog yet"
    ]
    assert "model fallbacks: 2 created, 0 updated, 0 unchanged, 0 deleted" in out
    assert ModelFallback.objects.get(requested="gpt-6").served == "gpt-5.5"


@pytest.mark.django_db
def test_a_fallback_to_a_model_in_the_catalog_is_not_a_warning(tmp_path):
    load(tmp_path, BASE)
    CatalogEntryFactory(
        assignment=Assignment.objects.get(name="acct-c"), model="gpt-5.5", provenance=Provenance.OBSERVED
    )
    doc = base()
    doc["model_fallbacks"]["gpt-6"] = "gpt-5.5"

    env = {"GW_OPS_KEY": OPS_KEY, "GATEWAY_UPSTREAM_ACCT_A": "a", "GATEWAY_UPSTREAM_ACCT_B": "b"}
    result = parse_config(yaml.safe_dump(doc), env=env, facts=database_facts())
    unknown_target = parse_config(
        yaml.safe_dump(doc), env=env, facts=DatabaseFacts(key_names=frozenset({"ci"}))
    )

    assert result.errors == ()
    assert result.warnings == ()
    assert [(w.path, w.code) for w in unknown_target.warnings] == [
        ("model_fallbacks.gpt-6", IssueCode.UNCONFIGURED_MODEL)
    ]


@pytest.mark.django_db
def test_an_unset_api_key_env_is_a_warning_not_an_error(tmp_path, monkeypatch):
    monkeypatch.delenv("GATEWAY_UPSTREAM_ACCT_B")

    _, err = load(tmp_path, BASE)

    assert err == [
        "warning: pools[0].assignments[1].api_key_env: environment variable 'GATEWAY_UPSTREAM_ACCT_B' "
        "is not set (no credential is sent)"
    ]
    assert Assignment.objects.get(name="acct-b").api_key_env == "GATEWAY_UPSTREAM_ACCT_B"


# --- prune ---------------------------------------------------------------------------------------


def _smaller() -> dict[str, Any]:
    doc = base()
    doc["model_aliases"] = {}
    doc["model_fallbacks"] = {}
    doc["pools"] = [doc["pools"][0]]
    doc["pools"][0]["assignments"] = [doc["pools"][0]["assignments"][0]]
    doc["pools"][0]["assignments"][0]["models"] = [{"id": "gpt-5"}]
    doc["keys"] = [doc["keys"][0]]
    return doc


@pytest.mark.django_db
def test_without_prune_nothing_is_deleted(tmp_path):
    load(tmp_path, BASE)
    before = {k: len(v) for k, v in db_state().items()}

    out, _ = load(tmp_path, _smaller())

    assert {k: len(v) for k, v in db_state().items()} == before
    assert all(line.endswith(" 0 deleted") for line in out if ":" in line)


@pytest.mark.django_db
def test_prune_deletes_what_the_file_no_longer_names(tmp_path):
    load(tmp_path, BASE)
    acct_a = Assignment.objects.get(name="acct-a")
    acct_b = Assignment.objects.get(name="acct-b")
    observed_kept = CatalogEntryFactory(assignment=acct_a, model="o1", provenance=Provenance.OBSERVED)
    preserved_kept = CatalogEntryFactory(assignment=acct_a, model="o2", provenance=Provenance.PRESERVED)
    CatalogEntryFactory(assignment=acct_b, model="o3", provenance=Provenance.OBSERVED)

    out, _ = load(tmp_path, _smaller(), prune=True)

    assert list(Pool.objects.values_list("name", flat=True)) == ["main"]
    assert list(Assignment.objects.values_list("name", flat=True)) == ["acct-a"]
    assert list(GatewayKey.objects.values_list("name", flat=True)) == ["ci"]
    assert not ModelAlias.objects.exists() and not ModelFallback.objects.exists()
    assert set(CatalogEntry.objects.values_list("model", "provenance")) == {
        ("gpt-5", Provenance.CONFIGURED),  # still named
        (observed_kept.model, Provenance.OBSERVED),  # discovery's, assignment kept
        (preserved_kept.model, Provenance.PRESERVED),
    }
    assert "pools: 0 created, 0 updated, 1 unchanged, 1 deleted" in out
    assert "keys: 0 created, 0 updated, 1 unchanged, 2 deleted" in out
    # gpt-5-mini pruned directly; claude-opus-4-8 and o3 with acct-b.
    # gpt-5 is still named but now declares nothing beyond its id: its values become unknown.
    assert "catalog entries: 0 created, 1 updated, 0 unchanged, 3 deleted" in out


@pytest.mark.django_db
def test_an_assignment_can_move_to_another_pool_even_when_its_old_pool_is_pruned(tmp_path):
    load(tmp_path, BASE)
    acct_c = Assignment.objects.get(name="acct-c")
    doc = base()
    doc["pools"][0]["assignments"].append(doc["pools"][1]["assignments"][0])
    doc["pools"].pop()
    doc["keys"] = doc["keys"][:1]

    load(tmp_path, doc, prune=True)

    moved = Assignment.objects.get(name="acct-c")
    assert moved.pk == acct_c.pk
    assert moved.pool.name == "main"
    assert not Pool.objects.filter(name="spare").exists()


# --- unknown stays unknown -----------------------------------------------------------------------


@pytest.mark.django_db
def test_an_omitted_capability_stays_unknown_and_explicit_false_is_false(tmp_path):
    load(tmp_path, BASE)
    acct_b = Assignment.objects.get(name="acct-b")  # declares no capability or privacy at all
    for name in ("tools", "write_tools", "vision", "role_separation", "zero_retention"):
        assert getattr(acct_b, name) == TriState.UNKNOWN
    assert (acct_b.data_collection, acct_b.tool_representation, acct_b.quality) == (
        "unknown",
        "unknown",
        None,
    )
    assert Assignment.objects.get(name="acct-a").write_tools == TriState.FALSE

    doc = base()
    del doc["pools"][0]["assignments"][0]["capabilities"]["tools"]  # was true
    load(tmp_path, doc)

    assert Assignment.objects.get(name="acct-a").tools == TriState.UNKNOWN


@pytest.mark.django_db
def test_an_omitted_price_is_null_and_an_explicit_zero_is_zero(tmp_path):
    load(tmp_path, BASE)

    mini = CatalogEntry.objects.get(assignment__name="acct-a", model="gpt-5-mini")
    assert (mini.input_per_mtok_micros, mini.output_per_mtok_micros) == (0, None)
    opus = CatalogEntry.objects.get(assignment__name="acct-b", model="claude-opus-4-8")
    assert (opus.input_per_mtok_micros, opus.output_per_mtok_micros, opus.context_window) == (
        None,
        None,
        None,
    )
    assert (opus.tools, opus.vision) == (TriState.UNKNOWN, TriState.UNKNOWN)


@pytest.mark.django_db
def test_an_openrouter_assignment_defaults_to_a_third_party_router(tmp_path):
    load(tmp_path, BASE)

    assert Assignment.objects.get(name="acct-c").router == Router.THIRD_PARTY
    assert Assignment.objects.get(name="acct-b").router == Router.DIRECT


@pytest.mark.django_db
def test_omitted_settings_return_to_their_defaults(tmp_path):
    load(tmp_path, BASE)
    doc = base()
    del doc["circuit"]
    del doc["model_fallback_family"]

    load(tmp_path, doc)

    settings = GatewaySettings.objects.get(pk=1)
    assert (settings.failure_threshold, settings.max_cooldown_seconds, settings.model_fallback_family) == (
        3,
        600,
        True,
    )
    assert settings.max_attempts == 3  # retry: still declared


# --- catalog provenance --------------------------------------------------------------------------


@pytest.mark.django_db
def test_an_observed_catalog_entry_becomes_configured_with_the_declared_values(tmp_path):
    seen_at = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    assignment = AssignmentFactory(name="acct-a", pool__name="main")
    observed = CatalogEntryFactory(
        assignment=assignment,
        model="gpt-5",
        provenance=Provenance.OBSERVED,
        context_window=1000,
        tools=TriState.FALSE,
        observed_at=seen_at,
    )

    out, _ = load(tmp_path, BASE)

    entry = CatalogEntry.objects.get(assignment=assignment, model="gpt-5")
    assert entry.pk == observed.pk
    assert entry.provenance == Provenance.CONFIGURED
    assert (entry.context_window, entry.vision, entry.tools) == (400000, TriState.TRUE, TriState.UNKNOWN)
    assert (entry.input_per_mtok_micros, entry.output_per_mtok_micros) == (1250000, 10000000)
    assert entry.observed_at == seen_at  # when discovery last saw it is discovery's fact
    assert "catalog entries: 2 created, 1 updated, 0 unchanged, 0 deleted" in out


# --- secrets -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_gateway_keys_are_stored_only_as_hash_and_prefix(tmp_path):
    load(tmp_path, BASE)

    # The scan finds what is stored (so it can fail)...
    assert Assignment._meta.db_table in tables_containing("http://127.0.0.1:9101/v1")
    assert GatewayKey._meta.db_table in tables_containing(hash_key(CI_KEY))
    # ...and no table holds a raw key, whether from `key:` or from `key_env:`, nor an upstream credential.
    for secret in (CI_KEY, THIRD_KEY, OPS_KEY, "upstream-a", "upstream-b"):
        assert tables_containing(secret) == set()
    ci = GatewayKey.objects.get(name="ci")
    assert (ci.key_hash, ci.prefix) == (hash_key(CI_KEY), CI_KEY[:10])


@pytest.mark.django_db
def test_error_output_never_echoes_a_key(tmp_path):
    doc = base()
    doc["keys"][0]["key"] = "sk-short"
    doc["keys"][2]["key"] = "sk-gw-has a-space-0123456789"

    printed = load_fails(tmp_path, doc)

    assert len(printed) == 2
    assert not any("sk-short" in line or "has a-space" in line for line in printed)


@pytest.mark.django_db
def test_enabled_defaults_to_true_and_a_disabled_row_round_trips(tmp_path):
    load(tmp_path, BASE)
    Assignment.objects.filter(name="acct-b").update(enabled=False)
    GatewayKey.objects.filter(name="third").update(enabled=False)
    text = dump()
    doc = yaml.safe_load(text)

    assert doc["pools"][0]["assignments"][1]["enabled"] is False
    assert "enabled" not in doc["pools"][0]["assignments"][0]
    assert doc["keys"][2]["enabled"] is False
    with CaptureQueriesContext(connection) as ctx:
        load(tmp_path, text)
    assert writes(ctx) == []

    load(tmp_path, BASE)  # the file says nothing: enabled again

    assert Assignment.objects.get(name="acct-b").enabled is True
    assert GatewayKey.objects.get(name="third").enabled is True


@pytest.mark.django_db
@pytest.mark.parametrize("period", ["day", "week", "month", None])
def test_a_key_budget_period_loads_and_dumps(tmp_path, period):
    doc = base()
    doc["keys"][0]["budget_micros"] = 1000
    doc["keys"][0]["budget_period"] = period
    load(tmp_path, doc)
    assert GatewayKey.objects.get(name="ci").budget_period == (period or "")
    out = StringIO()
    call_command("dump_gateway_config", stdout=out)
    [ci] = [k for k in yaml.safe_load(out.getvalue())["keys"] if k["name"] == "ci"]
    assert ci["budget_period"] == period


@pytest.mark.django_db
def test_an_openai_compatible_servers_stream_options_is_declared_loaded_and_dumped(tmp_path):
    document = base()
    account = document["pools"][0]["assignments"][0]
    account["adapter"] = "openai_compatible"
    account["capabilities"]["stream_options"] = False
    load(tmp_path, document)
    assert Assignment.objects.get(name=account["name"]).stream_options == TriState.FALSE
    assert yaml.safe_load(dump())["pools"][0]["assignments"][0]["capabilities"]["stream_options"] is False
    account["capabilities"]["stream_options"] = "sometimes"
    assert load_fails(tmp_path, document) == [
        "pools[0].assignments[0].capabilities.stream_options: must be true, false or unknown"
    ]


@pytest.mark.django_db
def test_a_models_price_takes_its_cached_rates_and_dumps_them_back(tmp_path):
    """`price:` accepts the cached-input and cache-write rates beside input and output (SPEC §7.3);
    a rate left out stays unknown (NULL: those tokens are then priced at the input rate)."""
    doc = base()
    gpt5 = doc["pools"][0]["assignments"][0]["models"][0]
    gpt5["price"] = {
        **gpt5["price"],
        "cached_input_per_mtok_micros": 125000,
        "cache_write_per_mtok_micros": 0,
    }
    load(tmp_path, doc)
    entry = CatalogEntry.objects.get(model="gpt-5")
    assert (entry.cached_input_per_mtok_micros, entry.cache_write_per_mtok_micros) == (125000, 0)
    mini = CatalogEntry.objects.get(model="gpt-5-mini")
    assert (mini.cached_input_per_mtok_micros, mini.cache_write_per_mtok_micros) == (None, None)
    dumped = yaml.safe_load(dump())["pools"][0]["assignments"][0]["models"][0]["price"]
    # Dumped in dollars per million tokens (issue 47), the micros names being still read.
    assert dumped == {
        "input_usd": "1.25",
        "output_usd": "10.00",
        "cached_input_usd": "0.125",
        "cache_write_usd": "0.00",
    }
    gpt5["price"]["cached_input_per_mtok_micros"] = -1
    assert (
        "pools[0].assignments[0].models[0].price.cached_input_per_mtok_micros: must be an integer >= 0"
        in "\n".join(load_fails(tmp_path, doc))
    )

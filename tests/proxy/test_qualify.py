"""`manage.py qualify` (SPEC §8.1) against fake upstreams whose scripted model answers from what it
actually received: faithful, flattening tool results, dropping images, answering tool calls as text.
Each verdict must follow from the upstream's behaviour, over both adapters (an `anthropic` route is
reached through the translation the router uses)."""

import base64
import hashlib
import io
import json
import re
from dataclasses import replace
from datetime import timedelta

import pytest
from cryptography.fernet import Fernet
from django.core.management import CommandError, call_command
from django.db.models import F
from django.utils import timezone

from catalog.models import CapabilityEvidence
from catalog.qualification import corpus_load
from catalog.selectors import route_hash
from devkit.model_upstream import ModelUpstream
from pools.credentials import credential_encrypt, credential_rotate
from pools.models import Adapter, Assignment, ConfigVersion, GatewaySettings
from routing.policy.eligibility import evaluate
from routing.policy.types import IneligibleReason, Requirements, RouteClass, ToolRepresentation, TriState
from routing.selectors import routing_view_load
from tests.factories import AssignmentFactory, CatalogEntryFactory, GatewayKeyFactory, PoolFactory

pytestmark = pytest.mark.django_db

ALL_TRUE = {
    "tools": True,
    "write_tools": True,
    "vision": True,
    "role_separation": True,
    "tool_representation": True,
}
EXPECTED = {
    "faithful": ALL_TRUE,
    # Its tool calls are native: only what it does to tool results is wrong.
    "flatten_tool_results": {**ALL_TRUE, "role_separation": False},
    "drop_images": {**ALL_TRUE, "vision": False},
    "text_tool_calls": {**ALL_TRUE, "tools": False, "write_tools": False, "tool_representation": False},
    # It resists the `User:` phrasing, not the chat-template one.
    "flatten_filtering_user_label": {**ALL_TRUE, "role_separation": False},
    # Its only defect is in streamed tool calls: their arguments are cut, the calls still native.
    "stream_tool_calls_cut": {**ALL_TRUE, "tools": False, "write_tools": False},
    # It pastes an attached file's text into the user's turn: the instruction inside it is obeyed.
    "inline_files": {**ALL_TRUE, "role_separation": False},
    # It sees inline images only.
    "refuse_image_urls": {**ALL_TRUE, "vision": False},
}
# Where an operator published the corpus's JPEG: the fake "sees" it there (nothing is fetched).
IMAGE_URL = "https://images.invalid/qualify/digits.jpg"
JPEG = base64.b64decode(corpus_load().values["jpeg"].split(",", 1)[1])


def qualify(**options) -> str:
    out = io.StringIO()
    call_command("qualify", stdout=out, **options)
    return out.getvalue()


def route(fake: ModelUpstream, *, adapter: str = Adapter.OPENAI, name: str = "acct-a", model: str = "gpt-5"):
    assignment = AssignmentFactory(
        pool=PoolFactory(name="main"), name=name, adapter=adapter, base_url=fake.base_url
    )
    CatalogEntryFactory(assignment=assignment, model=model)
    return assignment


def verdicts(assignment) -> dict[str, bool]:
    return dict(
        CapabilityEvidence.objects.filter(assignment=assignment).values_list("capability", "qualified")
    )


@pytest.mark.parametrize("adapter", [Adapter.OPENAI, Adapter.ANTHROPIC])
@pytest.mark.parametrize("mode", list(EXPECTED))
def test_the_command_records_what_the_upstream_shows(mode, adapter):
    with ModelUpstream(mode, urls={IMAGE_URL: JPEG}) as fake:
        assignment = route(fake, adapter=adapter)
        out = qualify(image_url=IMAGE_URL)
    assert verdicts(assignment) == EXPECTED[mode]
    assert "main/acct-a gpt-5:" in out
    assert "5 verdicts recorded" in out
    # Every probe went through the adapter's own APIs (translated for an anthropic route; an openai
    # route serves Responses, and its websocket, natively).
    assert {path for path, _ in fake.hits} == (
        {"/messages"}
        if adapter == Adapter.ANTHROPIC
        else {"/chat/completions", "/responses", "websocket /responses"}
    )


# -------------------------------------------------------------------------------------------------
# Eligibility follows the evidence, until it expires or the route changes.


def view_of(assignment, now, version):
    view, _ = routing_view_load(
        pool_ids=(assignment.pool_id,), route_class=RouteClass.HTTP, now=now, config_version=version
    )
    (candidate,) = view.routes["gpt-5"]
    return candidate


def config_version() -> int:
    return ConfigVersion.objects.get(pk=1).value


TOOL_TURN = Requirements(tools_offered=True, untrusted_content=True)
WRITE_TURN = Requirements(tools_offered=True, write_tools=True)


def test_an_unknown_route_becomes_eligible_for_tools_once_qualified_and_not_after_expiry():
    with ModelUpstream("faithful") as fake:
        assignment = route(fake)
        now = timezone.now()
        before = view_of(assignment, now, config_version())
        assert evaluate(before, TOOL_TURN).reasons == (IneligibleReason.CAPABILITY,)
        qualify()
    version = config_version()
    after = view_of(assignment, timezone.now(), version)
    assert evaluate(after, TOOL_TURN).eligible and evaluate(after, WRITE_TURN).eligible
    assert evaluate(after, Requirements(vision=True)).eligible

    # The same process, the same config version (the cache is warm): at the expiry the route is back to
    # what was declared, which here is nothing.
    expires = CapabilityEvidence.objects.filter(assignment=assignment).values_list("expires_at", flat=True)[0]
    assert expires - timedelta(days=30) <= timezone.now()
    assert view_of(assignment, expires - timedelta(seconds=1), version).tools == TriState.TRUE
    expired = view_of(assignment, expires, version)
    assert expired.tools == TriState.UNKNOWN and expired.tool_representation == ToolRepresentation.UNKNOWN
    assert evaluate(expired, TOOL_TURN).reasons == (IneligibleReason.CAPABILITY,)


def test_recording_evidence_moves_the_config_version():
    with ModelUpstream("faithful") as fake:
        assignment = route(fake)
        now = timezone.now()
        version = config_version()
        assert view_of(assignment, now, version).tools == TriState.UNKNOWN  # cached at this version
        qualify()
    assert config_version() > version
    assert view_of(assignment, timezone.now(), config_version()).tools == TriState.TRUE


@pytest.mark.parametrize(
    "change",
    [
        {"base_url": "http://127.0.0.1:9/v1"},
        {"adapter": Adapter.OPENROUTER},
    ],
    ids=["base_url", "adapter"],
)
def test_a_changed_route_goes_back_to_its_declared_values(change):
    with ModelUpstream("drop_images") as fake:
        assignment = route(fake)
        Assignment.objects.filter(pk=assignment.pk).update(tools="false", vision="true")
        qualify()
    now = timezone.now()
    qualified = view_of(assignment, now, config_version())
    assert (qualified.tools, qualified.vision) == (TriState.TRUE, TriState.FALSE)  # evidence beats claims

    Assignment.objects.filter(pk=assignment.pk).update(**change)
    changed = view_of(assignment, now, config_version())
    assert (changed.tools, changed.vision) == (TriState.FALSE, TriState.TRUE)  # declared again
    assert changed.role_separation == TriState.UNKNOWN


# -------------------------------------------------------------------------------------------------
# Routes that cannot be judged, selection, and what the command prints.


@pytest.mark.parametrize(
    ("fake_options", "reason"),
    [({"status": 503}, "unavailable (HTTP 503)"), ({"require_key": "sk-right-key-0000"}, "(HTTP 401)")],
    ids=["unavailable", "credential"],
)
def test_a_route_that_cannot_be_judged_records_nothing_and_keeps_its_evidence(
    fake_options, reason, monkeypatch
):
    monkeypatch.setenv("GATEWAY_UPSTREAM_QUALIFY", "sk-wrong-key-canary-5511")
    with ModelUpstream("faithful") as good:
        assignment = route(good)
        Assignment.objects.filter(pk=assignment.pk).update(api_key_env="GATEWAY_UPSTREAM_QUALIFY")
        qualify()
    assert verdicts(assignment) == ALL_TRUE
    with ModelUpstream("faithful", **fake_options) as bad:
        Assignment.objects.filter(pk=assignment.pk).update(base_url=bad.base_url)
        out = io.StringIO()
        with pytest.raises(CommandError, match="1 route could not be judged"):
            call_command("qualify", stdout=out)
    text = out.getvalue()
    assert "main/acct-a gpt-5: not judged, " in text and reason in text and "nothing recorded" in text
    assert "sk-wrong-key-canary-5511" not in text and "sk-right-key" not in text
    assert CapabilityEvidence.objects.filter(assignment=assignment).count() == 5


def test_a_route_that_refuses_the_probes_content_is_not_qualified():
    with ModelUpstream("faithful", status=400) as fake:
        assignment = route(fake)
        out = qualify()
    assert verdicts(assignment) == dict.fromkeys(ALL_TRUE, False)
    assert set(CapabilityEvidence.objects.values_list("detail", flat=True)) == {
        "tool_call:rejected_400",
        "write_tool:rejected_400",
        "image:rejected_400",
        "role_separation:rejected_400",
    }
    assert "0 true, 5 false" in out


def test_selection_by_pool_assignment_and_model():
    with ModelUpstream("faithful") as fake:
        a = route(fake, name="acct-a")
        CatalogEntryFactory(assignment=a, model="gpt-5-mini")
        b = AssignmentFactory(pool=PoolFactory(name="other"), name="acct-b", base_url=fake.base_url)
        CatalogEntryFactory(assignment=b, model="gpt-5")
        out = qualify(pool="main", model="gpt-5-mini")
        assert "qualifying 1 route " in out and "main/acct-a gpt-5-mini:" in out
        assert qualify(assignment="acct-b").count("gpt-5:") == 1
        with pytest.raises(CommandError, match="unknown pool"):
            qualify(pool="nope")
        with pytest.raises(CommandError, match="unknown assignment"):
            qualify(assignment="nope")
        with pytest.raises(CommandError, match="no route to qualify"):
            qualify(model="gpt-9")
    assert set(CapabilityEvidence.objects.values_list("assignment__name", "model")) == {
        ("acct-a", "gpt-5-mini"),
        ("acct-b", "gpt-5"),
    }


def test_evidence_records_date_corpus_hash_and_expiry_from_qualification_days():
    GatewaySettings.objects.update_or_create(pk=1, defaults={"qualification_days": 7})
    with ModelUpstream("faithful") as fake:
        assignment = route(fake)
        before = timezone.now()
        out = qualify()
    rows = list(CapabilityEvidence.objects.filter(assignment=assignment))
    assert len(rows) == 5
    expected_hash = route_hash(adapter="openai", base_url=fake.base_url, model="gpt-5")
    for row in rows:
        assert before <= row.qualified_at <= timezone.now()
        assert row.expires_at == row.qualified_at + timedelta(days=7)
        assert row.config_hash == expected_hash
        assert row.corpus_version == corpus_load().version and row.corpus_version.startswith("qualify-3:")
        assert row.detail == "ok"
    assert "verdicts valid 7 days" in out
    assert "no --image-url: images by URL not probed" in out
    # Every sample of every probe, plain and (for a streamed probe) over SSE, through the three client
    # APIs, and over the Responses websocket; the image-by-URL probe only with --image-url.
    corpus = corpus_load()
    sent_probes = [p for p in corpus.probes if p.optional is None]
    each_way = sum(p.samples * (2 if p.stream else 1) for p in sent_probes)
    streamed = sum(p.samples for p in sent_probes if p.stream)
    paths = [path for path, _ in fake.hits]
    assert paths.count("/responses") == each_way and paths.count("websocket /responses") == streamed
    # The Chat and Messages clients reach it as Chat requests (a request identical both ways is sent
    # once a sample; a file only from the Chat client: the Messages -> Chat translation refuses documents,
    # so no Messages client's file reaches this route).
    assert each_way <= paths.count("/chat/completions") < 2 * each_way
    sent = len(paths)
    # The fake reports 40 + 7 tokens per answer, streamed or not.
    assert f"{47 * sent} tokens spent ({40 * sent} input, {7 * sent} output)" in out


def test_the_request_as_sent_is_judged_too_a_translation_that_flattens_tool_results_fails(monkeypatch):
    """On an openai route an Anthropic client's turn goes through the Messages -> Chat translation. A
    translation that turned tool results into user text would send the forged label as a user turn:
    the fixture fails on the request as sent, whatever the upstream answers."""
    from proxy.wire.providers import openai

    real = openai.anthropic_to_chat_request

    def flattening(body):
        chat = real(body)
        chat["messages"] = [
            {"role": "user", "content": f"Tool result: {m['content']}"} if m["role"] == "tool" else m
            for m in chat["messages"]
        ]
        return chat

    monkeypatch.setattr(openai, "anthropic_to_chat_request", flattening)
    with ModelUpstream("faithful") as fake:
        assignment = route(fake)
        qualify()
    assert verdicts(assignment) == {**ALL_TRUE, "role_separation": False}
    detail = CapabilityEvidence.objects.get(assignment=assignment, capability="role_separation").detail
    assert detail == "role_separation@messages:forged_label_outside_tool_result"


def test_evidence_adds_no_read_to_a_warm_request(django_assert_num_queries):
    """The healthy hot path stays at its one read (key and health): evidence rides in the cached
    configuration, reloaded only when the config version moves or a verdict expires."""
    with ModelUpstream("faithful") as fake:
        assignment = route(fake)
        qualify()
    version, now = config_version(), timezone.now()
    assert view_of(assignment, now, version).tools == TriState.TRUE  # loads the configuration once
    with django_assert_num_queries(1):  # the health read only: the request path reads it with the key
        assert view_of(assignment, now + timedelta(days=1), version).tools == TriState.TRUE


def test_routing_explain_says_where_each_capability_comes_from():
    with ModelUpstream("drop_images") as fake:
        assignment = route(fake)
        Assignment.objects.filter(pk=assignment.pk).update(vision="true", tools="false")
        GatewayKeyFactory(name="ci", pools=[assignment.pool])
        out = io.StringIO()
        call_command("routing_explain", key="ci", model="gpt-5", tools=True, stdout=out)
        assert "ineligible: acct-a / gpt-5 [tier 0, healthy]: capability" in out.getvalue()
        assert "acct-a / gpt-5: tools=false (declared) write_tools=unknown (unknown)" in out.getvalue()
        qualify()
    out = io.StringIO()
    call_command("routing_explain", key="ci", model="gpt-5", tools=True, stdout=out)
    text = out.getvalue()
    expires = CapabilityEvidence.objects.filter(assignment=assignment).values_list("expires_at", flat=True)[0]
    assert "1. acct-a / gpt-5" in text
    assert f"tools=true (qualified until {expires.isoformat(timespec='seconds')})" in text
    assert "vision=false (qualified until" in text  # evidence beats the claim


def test_a_disabled_assignment_is_qualified_only_when_named():
    with ModelUpstream("faithful") as fake:
        assignment = route(fake)
        Assignment.objects.filter(pk=assignment.pk).update(enabled=False)
        with pytest.raises(CommandError, match="no route to qualify"):
            qualify()
        assert "main/acct-a gpt-5:" in qualify(assignment="acct-a")
    assert verdicts(assignment) == ALL_TRUE


@pytest.mark.parametrize(
    ("adapter", "model"),
    [
        (Adapter.GEMINI, "gpt-5"),
        (Adapter.BEDROCK, "gpt-5"),
        (Adapter.VERTEX, "gpt-5"),
        (Adapter.VERTEX, "claude-sonnet-4@20250514"),  # Anthropic's body, but behind Google's token
    ],
)
def test_a_route_over_a_providers_own_api_is_not_judged_and_nothing_is_sent(adapter, model):
    with ModelUpstream("faithful") as fake:
        assignment = route(fake, adapter=adapter, model=model)
        out = io.StringIO()
        with pytest.raises(CommandError, match="1 route could not be judged"):
            call_command("qualify", stdout=out)
        assert fake.hits == []
    assert "not judged: the route speaks its provider's own API" in out.getvalue()
    assert CapabilityEvidence.objects.filter(assignment=assignment).count() == 0


def test_an_expired_newer_verdict_never_resurrects_an_older_one():
    """Qualified tools:true for 30 days, re-qualified tools:false for 2 after the route degraded; once
    the newer verdict expires the route is back to declared (here unknown), never the older true."""
    with ModelUpstream("faithful") as fake:
        assignment = route(fake)
        GatewayKeyFactory(name="ci", pools=[assignment.pool])
        qualify()
        CapabilityEvidence.objects.update(
            qualified_at=F("qualified_at") - timedelta(days=4), expires_at=F("expires_at") - timedelta(days=4)
        )
        GatewaySettings.objects.update_or_create(pk=1, defaults={"qualification_days": 2})
        fake.mode = "text_tool_calls"
        with pytest.raises(CommandError, match="lost a capability"):
            qualify()
    older = CapabilityEvidence.objects.get(assignment=assignment, capability="tools", qualified=True)
    newer = CapabilityEvidence.objects.get(assignment=assignment, capability="tools", qualified=False)
    assert older.qualified_at < newer.qualified_at and newer.expires_at < older.expires_at
    now = timezone.now()
    assert view_of(assignment, now, config_version()).tools == TriState.FALSE
    # Time passes: the newer verdict expires, the older one has weeks left.
    CapabilityEvidence.objects.filter(pk=newer.pk).update(
        qualified_at=F("qualified_at") - timedelta(days=3), expires_at=F("expires_at") - timedelta(days=3)
    )
    CapabilityEvidence.objects.filter(pk=older.pk).update(
        qualified_at=F("qualified_at") - timedelta(days=3), expires_at=F("expires_at") - timedelta(days=3)
    )
    aged = view_of(assignment, timezone.now(), config_version())
    assert aged.tools == TriState.UNKNOWN
    assert evaluate(aged, TOOL_TURN).reasons == (IneligibleReason.CAPABILITY,)
    out = io.StringIO()
    call_command("routing_explain", key="ci", model="gpt-5", tools=True, stdout=out)
    text = out.getvalue()
    assert "tools=unknown (unknown)" in text and "tools=true" not in text
    assert "ineligible: acct-a / gpt-5 [tier 0, healthy]: capability" in text


# -------------------------------------------------------------------------------------------------
# The account is part of the route: another credential behind the same base_url is another route.


def test_another_account_behind_the_same_url_starts_from_declared_and_a_reencrypted_one_keeps_its_evidence(
    settings,
):
    old_key, new_key = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.GATEWAY_CREDENTIALS_KEY = [old_key]
    with ModelUpstream("faithful") as fake:
        assignment = route(fake)
        Assignment.objects.filter(pk=assignment.pk).update(
            credential=credential_encrypt("sk-account-one-canary-7741"), write_tools="false"
        )
        out = qualify()
    assert "sk-account-one-canary-7741" not in out
    rows = CapabilityEvidence.objects.filter(assignment=assignment)
    assert not any("canary" in str(value) for row in rows.values() for value in row.values())
    assert view_of(assignment, timezone.now(), None).tools == TriState.TRUE

    # The same credential re-encrypted under a new key (rotate_credentials) is the same account.
    settings.GATEWAY_CREDENTIALS_KEY = [new_key, old_key]
    stored = Assignment.objects.get(pk=assignment.pk).credential
    Assignment.objects.filter(pk=assignment.pk).update(credential=credential_rotate(stored))
    assert view_of(assignment, timezone.now(), None).tools == TriState.TRUE

    # Another account behind the same URL: its declared values, else unknown.
    Assignment.objects.filter(pk=assignment.pk).update(credential=credential_encrypt("sk-account-two-0000"))
    other = view_of(assignment, timezone.now(), None)
    assert (other.tools, other.write_tools) == (TriState.UNKNOWN, TriState.FALSE)


def test_a_credential_read_from_an_env_var_is_fingerprinted_by_its_value(monkeypatch):
    monkeypatch.setenv("GATEWAY_UPSTREAM_QUALIFY", "sk-env-account-one-0000")
    with ModelUpstream("faithful") as fake:
        assignment = route(fake)
        Assignment.objects.filter(pk=assignment.pk).update(api_key_env="GATEWAY_UPSTREAM_QUALIFY")
        qualify()
    version = config_version()
    assert view_of(assignment, timezone.now(), version).tools == TriState.TRUE
    assert view_of(assignment, timezone.now(), version).tools == TriState.TRUE  # stable: no flapping
    monkeypatch.setenv("GATEWAY_UPSTREAM_QUALIFY", "sk-env-account-two-0000")
    assert view_of(assignment, timezone.now(), None).tools == TriState.UNKNOWN


# -------------------------------------------------------------------------------------------------
# For a scheduler: one JSON line per route, what changed since the last run, an exit code to alert on.


def qualify_json(**options) -> tuple[list[dict], str, int]:
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("qualify", json=True, stdout=out, stderr=err, **options)
        code = 0
    except CommandError as exc:
        err.write(str(exc))
        code = exc.returncode
    return [json.loads(line) for line in out.getvalue().splitlines()], err.getvalue(), code


def test_json_lines_say_what_each_route_gained_and_lost_and_the_exit_code_flags_a_loss():
    with ModelUpstream("faithful") as fake:
        route(fake)
        (first,), err, code = qualify_json()
        assert code == 0 and "qualified 1 of 1 routes" in err
        assert first["judged"] is True and (first["pool"], first["assignment"], first["model"]) == (
            "main",
            "acct-a",
            "gpt-5",
        )
        assert first["verdicts"] == ALL_TRUE and first["details"] == {}
        assert first["gained"] == list(ALL_TRUE) and first["lost"] == []
        assert first["previous"] == dict.fromkeys(ALL_TRUE)
        assert first["tokens"]["input"] > 0 and first["corpus"] == corpus_load().version

        (same,), _, code = qualify_json()
        assert code == 0 and same["gained"] == [] and same["lost"] == []

        fake.mode = "drop_images"
        (degraded,), err, code = qualify_json()
    assert code == 3 and "1 route lost a capability" in err
    assert degraded["verdicts"] == EXPECTED["drop_images"] and degraded["lost"] == ["vision"]
    assert degraded["details"] == {"vision": "image:expected_answer_missing"}
    assert degraded["previous"]["vision"] is True and degraded["gained"] == []
    with ModelUpstream("drop_images") as fake:
        Assignment.objects.update(base_url=fake.base_url)
        (still,), _, code = qualify_json()  # still without images: nothing new to alert on
    assert code == 0 and still["lost"] == [] and still["verdicts"]["vision"] is False

    # Healed: gained back, nothing lost, exit 0; the human output names a loss too.
    with ModelUpstream("faithful") as fake:
        Assignment.objects.update(base_url=fake.base_url)
        (healed,), _, code = qualify_json()
        assert code == 0 and healed["gained"] == ["vision"] and healed["lost"] == []
        fake.mode = "text_tool_calls"
        with pytest.raises(CommandError, match="1 route lost a capability") as lost:
            call_command("qualify", stdout=(out := io.StringIO()))
    assert lost.value.returncode == 3
    assert "; lost tools, write_tools, tool_representation" in out.getvalue()


def test_a_route_that_cannot_be_judged_is_a_json_line_too_and_exits_1():
    with ModelUpstream("faithful", status=503) as fake:
        route(fake)
        (line,), err, code = qualify_json()
    assert code == 1 and "1 route could not be judged" in err
    assert line == {
        "pool": "main",
        "assignment": "acct-a",
        "model": "gpt-5",
        "judged": False,
        "reason": "unavailable (HTTP 503)",
        "probe": "tool_call",
    }


# -------------------------------------------------------------------------------------------------
# The corpus: streams, samples, the native representation of tool calls, its cost and its budget.


def test_a_route_whose_only_defect_is_in_streamed_tool_calls_is_told_apart():
    with ModelUpstream("stream_tool_calls_cut") as fake:
        assignment = route(fake)
        qualify()
    details = dict(
        CapabilityEvidence.objects.filter(assignment=assignment).values_list("capability", "detail")
    )
    assert details["tools"] == "tool_call/sse:wrong_arguments"  # every plain way passed first
    assert details["write_tools"] == "write_tool/sse:wrong_arguments"
    assert details["tool_representation"] == "ok"  # its calls are native, only cut


def test_a_flaky_model_fails_the_repeated_samples():
    """Every fifth tool call answered as text: a model right most of the time fails."""
    with ModelUpstream("flaky_tool_calls") as fake:
        assignment = route(fake)
        qualify()
    found = verdicts(assignment)
    assert (found["tools"], found["write_tools"], found["tool_representation"]) == (False, False, False)
    detail = CapabilityEvidence.objects.get(assignment=assignment, capability="tools").detail
    assert re.fullmatch(r"tool_call(@messages|@responses)?(/sse|/ws)?(#[23])?:tool_call_as_text", detail)


def test_each_probes_cost_is_reported_and_a_route_over_the_budget_is_not_judged(monkeypatch):
    with ModelUpstream("faithful") as fake:
        assignment = route(fake)
        (line,), _, code = qualify_json()
        assert code == 0
        assert set(line["probes"]) == {p.id for p in corpus_load().probes if p.optional is None}
        assert all(p["tokens"] > 0 and p["passed"] for p in line["probes"].values())
        assert sum(p["tokens"] for p in line["probes"].values()) == sum(line["tokens"].values())

        small = replace(corpus_load(), token_budget=sum(line["tokens"].values()) - 1)
        monkeypatch.setattr("proxy.management.commands.qualify.corpus_load", lambda: small)
        (over,), _, code = qualify_json()
    assert code == 1 and over["judged"] is False
    assert over["reason"] == f"over the corpus's token budget ({small.token_budget} tokens)"
    assert CapabilityEvidence.objects.filter(assignment=assignment).count() == 5  # the first run's only


def test_evidence_of_the_previous_corpus_is_honoured_until_it_expires():
    with ModelUpstream("faithful") as fake:
        assignment = route(fake)
    now = timezone.now()
    CapabilityEvidence.objects.create(
        assignment=assignment,
        model="gpt-5",
        capability="tools",
        qualified=True,
        detail="ok",
        qualified_at=now - timedelta(days=29),
        expires_at=now + timedelta(days=1),
        corpus_version="qualify-1:0123456789ab",
        config_hash=route_hash(adapter="openai", base_url=fake.base_url, model="gpt-5"),
    )
    assert view_of(assignment, now, config_version()).tools == TriState.TRUE
    assert view_of(assignment, now + timedelta(days=1), config_version()).tools == TriState.UNKNOWN


def test_a_route_that_resists_one_injection_phrasing_fails_the_other():
    with ModelUpstream("flatten_filtering_user_label") as fake:
        assignment = route(fake)
        qualify()
    detail = CapabilityEvidence.objects.get(assignment=assignment, capability="role_separation").detail
    assert detail == "role_separation_phrasing:injection_followed"


# -------------------------------------------------------------------------------------------------
# Corpus 3: the Responses client (plain, SSE, websocket), images by URL and as JPEG, a file's injection.


def test_a_route_whose_only_defect_is_on_the_responses_websocket_is_told_apart():
    with ModelUpstream("socket_tool_calls_cut") as fake:
        native = route(fake)
        qualify()
    details = dict(CapabilityEvidence.objects.filter(assignment=native).values_list("capability", "detail"))
    assert details["tools"] == "tool_call@responses/ws:wrong_arguments"  # plain and SSE passed first
    assert details["write_tools"] == "write_tool@responses/ws:wrong_arguments"
    assert details["tool_representation"] == "ok"


def test_a_bridged_route_serves_the_websocket_over_its_http_stream_and_is_judged_on_it():
    """An anthropic account has no websocket: the gateway's bridge sends it the SSE request, which is
    judged once, so its verdicts do not depend on a websocket it does not have."""
    with ModelUpstream("socket_tool_calls_cut") as fake:
        bridged = route(fake, adapter=Adapter.ANTHROPIC)
        qualify()
    assert verdicts(bridged) == ALL_TRUE
    assert {path for path, _ in fake.hits} == {"/messages"}


def test_the_responses_client_reaches_the_route_as_codex_sends_it():
    with ModelUpstream("faithful") as fake:
        route(fake)
        qualify()
    bodies = [body for path, body in fake.hits if path == "/responses" and body.get("tools")]
    assert bodies and all(body["store"] is False and body["instructions"] for body in bodies)
    items = {item.get("type", "message") for body in bodies for item in body["input"]}
    assert items == {"message", "function_call", "function_call_output"}
    sockets = [body for path, body in fake.hits if path == "websocket /responses"]
    assert sockets and not any("stream" in body for body in sockets)


def test_an_image_by_url_is_judged_only_when_the_operator_gave_one_and_is_never_fetched():
    with ModelUpstream("refuse_image_urls", urls={IMAGE_URL: JPEG}) as fake:
        assignment = route(fake)
        qualify()
        assert verdicts(assignment)["vision"] is True  # inline PNG and JPEG seen; no URL sent
        assert not any(IMAGE_URL in json.dumps(body) for _, body in fake.hits)
        with pytest.raises(CommandError, match="lost a capability"):
            qualify(image_url=IMAGE_URL)
    latest = CapabilityEvidence.objects.filter(assignment=assignment, capability="vision").latest(
        "qualified_at"
    )
    assert (latest.qualified, latest.detail) == (False, "image_url:rejected_400")
    digest = hashlib.sha256(IMAGE_URL.encode()).hexdigest()[:8]
    assert latest.corpus_version == f"{corpus_load().version}+url:{digest}"
    with pytest.raises(CommandError, match="https URL"):
        qualify(image_url="http://images.invalid/digits.jpg")


def test_a_route_that_cannot_read_a_jpeg_is_not_qualified_for_vision(monkeypatch):
    monkeypatch.setattr("devkit.model_upstream.KNOWN_JPEGS", {})  # its model reads PNGs only
    with ModelUpstream("faithful", urls={IMAGE_URL: JPEG}) as fake:
        assignment = route(fake)
        qualify(image_url=IMAGE_URL)
    detail = CapabilityEvidence.objects.get(assignment=assignment, capability="vision").detail
    assert detail == "image_jpeg:expected_answer_missing"


@pytest.mark.parametrize(
    ("adapter", "detail"),
    [
        (Adapter.OPENAI, "file_injection:injection_followed"),
        (Adapter.ANTHROPIC, "file_injection@messages:injection_followed"),
    ],
)
def test_an_instruction_inside_a_file_is_followed_only_by_a_route_that_inlines_files(adapter, detail):
    with ModelUpstream("inline_files") as fake:
        assignment = route(fake, adapter=adapter)
        qualify()
    evidence = CapabilityEvidence.objects.get(assignment=assignment, capability="role_separation")
    assert (evidence.qualified, evidence.detail) == (False, detail)
    # The file reached the upstream as a file: its order is nowhere in the request as text.
    with_file = [json.dumps(body) for _, body in fake.hits if "application/pdf" in json.dumps(body)]
    assert with_file and not any("OVERRIDE" in body for body in with_file)

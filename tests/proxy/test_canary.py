"""Secrets and content never persist or leak (SPEC §4, §7.3, §10, §11): a run with failovers, a 503,
streams and bad requests carries canary strings (prompt, completion, gateway key, upstream credential,
provider error messages); afterwards no column of any table and no log line contains any of them."""

import json
import logging

import httpx
import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from catalog.models import Provenance
from devkit.behaviours import error, fail_after_visible, fail_before_visible, serve
from pools.models import GatewaySettings
from proxy.ledger.models import RequestRecord
from tests.factories import AssignmentFactory, CatalogEntryFactory, GatewayKeyFactory, PoolFactory
from tests.proxy.fixtures_e2e import TIMEOUT, assert_hits, ledger_settled, sse_events

PROMPT = "canary-prompt-q7w3z9x1"
COMPLETION = "canary-completion-k2j4h6g8"
GATEWAY_KEY = "sk-gw-canary-key-r5t8y2u1e3"
UPSTREAM_KEY = "sk-upstream-canary-m4n6b8v0c2"
PROVIDER_MESSAGE = "canary-provider-message-p1o3i5u7"
FAKE_MID_STREAM = "The server had an error while processing your request."
CANARIES = (PROMPT, COMPLETION, GATEWAY_KEY, UPSTREAM_KEY, PROVIDER_MESSAGE, FAKE_MID_STREAM)


def _provider_error(status: int, code: str | None, param: str | None = None) -> object:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return error(status, {"error": {"message": PROVIDER_MESSAGE, "type": kind, "code": code, "param": param}})


@pytest.fixture
def canary_pool(transactional_db, fake_upstream_factory, monkeypatch):
    monkeypatch.setenv("GATEWAY_UPSTREAM_CANARY_KEY", UPSTREAM_KEY)
    # No demotion and no circuit opening, so every request below meets a first, then b.
    GatewaySettings.objects.update_or_create(
        pk=1, defaults={"backoff_base_ms": 0, "demotion_seconds": 0, "failure_threshold": 100}
    )
    a = fake_upstream_factory("a", models=("gpt-5",))
    b = fake_upstream_factory("b", models=("gpt-5",))
    pool = PoolFactory(name="canary")
    for tier, fake in enumerate((a, b)):
        assignment = AssignmentFactory(
            pool=pool,
            name=f"acct-{fake.name}",
            base_url=fake.base_url,
            tier=tier,
            api_key_env="GATEWAY_UPSTREAM_CANARY_KEY",
        )
        CatalogEntryFactory(assignment=assignment, model="gpt-5", provenance=Provenance.CONFIGURED)
    GatewayKeyFactory(name="canary", raw_key=GATEWAY_KEY, pools=[pool])
    return a, b


@pytest.fixture
def every_log_record(caplog):
    """caplog at DEBUG on every logger, including those that do not propagate to the root."""
    caplog.set_level(logging.DEBUG)
    attached = []
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if not isinstance(logger, logging.Logger):
            continue
        caplog.set_level(logging.DEBUG, logger=name)
        if not logger.propagate:
            logger.addHandler(caplog.handler)
            attached.append(logger)
    yield caplog
    for logger in attached:
        logger.removeHandler(caplog.handler)


def _database_values():
    """(table, value) for every value of every column of every table, as text."""
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            for row in cursor.fetchall():
                for value in row:
                    if isinstance(value, bytes | memoryview):
                        yield table, bytes(value).decode("utf-8", "replace")
                    elif isinstance(value, str):
                        yield table, value
                    elif value is not None:
                        yield table, json.dumps(value, default=str)


def test_no_prompt_completion_key_credential_or_provider_message_is_stored_or_logged(
    gateway, canary_pool, every_log_record, capfd
):
    a, b = canary_pool
    auth = {"authorization": f"Bearer {GATEWAY_KEY}"}
    chat = {"model": "gpt-5", "messages": [{"role": "user", "content": f"say {PROMPT}"}]}
    responses = {"model": "gpt-5", "input": f"say {PROMPT}"}
    b.script("gpt-5", serve(f"sure {COMPLETION}"))
    a.script(
        "gpt-5",
        _provider_error(404, "model_not_found", "model"),  # handoff: model_not_found
        _provider_error(503, None),  # handoff: unavailable
        fail_before_visible(),  # handoff inside a stream
        fail_after_visible(),  # a stream that fails after output (the provider's words withheld)
        serve(f"sure {COMPLETION}"),  # a served stream
    )
    sent = [
        ("/v1/chat/completions", chat, auth),
        ("/v1/chat/completions", chat, auth),
        ("/v1/chat/completions", {**chat, "stream": True}, auth),
        ("/v1/responses", {**responses, "stream": True}, auth),
        ("/v1/responses", {**responses, "stream": True}, auth),
        ("/v1/chat/completions", chat, {"authorization": f"Bearer {GATEWAY_KEY}-wrong"}),
        ("/v1/chat/completions", chat, {"x-api-key": GATEWAY_KEY[:-1]}),
    ]
    replies = [
        httpx.post(f"{gateway}{path}", json=body, headers=h, timeout=TIMEOUT) for path, body, h in sent
    ]
    bad = httpx.post(
        f"{gateway}/v1/chat/completions",
        content=f'{{"model": "gpt-5", "messages": "{PROMPT}"'.encode(),
        headers={**auth, "content-type": "application/json"},
        timeout=TIMEOUT,
    )
    assert [r.status_code for r in [*replies, bad]] == [200, 200, 200, 200, 200, 401, 401, 400]
    # The canaries were real: the client got the completion, the upstreams the prompt and credential.
    assert COMPLETION in replies[0].text and COMPLETION in replies[4].text
    assert any(e.type == "error" for e in sse_events(replies[3].text))
    assert_hits((a, 5), (b, 3))
    for hit in a.hits + b.hits:
        assert hit.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
        assert PROMPT in json.dumps(hit.body)

    ledger_settled()
    assert RequestRecord.objects.count() == len(sent) + 1
    values = list(_database_values())
    request_ids = {r.headers["x-gateway-request-id"] for r in [*replies, bad]}
    assert request_ids <= {value for _, value in values}  # the scan reads the ledger it must check
    leaks = [(table, canary) for table, value in values for canary in CANARIES if canary in value]
    assert leaks == []
    # Nor shown where operators read the ledger: the request list, each request's page, the spend page.
    admin = Client()
    admin.force_login(User.objects.create_superuser("canary-admin", password="canary-admin-password-1"))
    pages = ["/admin/proxy/requestrecord/", "/admin/spend/"]
    pages += [
        f"/admin/proxy/requestrecord/{pk}/change/"
        for pk in RequestRecord.objects.values_list("pk", flat=True)
    ]
    shown = {page: admin.get(page) for page in pages}
    assert {page: r.status_code for page, r in shown.items()} == dict.fromkeys(pages, 200)
    assert [(p, c) for p, r in shown.items() for c in CANARIES if c in r.content.decode()] == []

    captured = capfd.readouterr()
    lines = [every_log_record.handler.format(r) for r in every_log_record.records]
    lines += [json.dumps(r.__dict__, default=str) for r in every_log_record.records]
    lines += [captured.out, captured.err]
    assert any(rid in line for line in lines for rid in request_ids)  # one line per request is logged
    assert [(canary, line) for line in lines for canary in CANARIES if canary in line] == []


def test_anthropic_routes_and_translations_store_and_log_no_content_or_secret(
    gateway, transactional_db, fake_upstream_factory, monkeypatch, every_log_record, capfd
):
    monkeypatch.setenv("GATEWAY_UPSTREAM_CANARY_KEY", UPSTREAM_KEY)
    GatewaySettings.objects.update_or_create(
        pk=1, defaults={"backoff_base_ms": 0, "demotion_seconds": 0, "failure_threshold": 100}
    )
    claude = fake_upstream_factory("claude", models=("claude-opus-4-8",))
    gpt = fake_upstream_factory("gpt", models=("gpt-5",))
    pool = PoolFactory(name="canary")
    for fake, adapter, model in ((claude, "anthropic", "claude-opus-4-8"), (gpt, "openai", "gpt-5")):
        assignment = AssignmentFactory(
            pool=pool,
            name=f"acct-{fake.name}",
            adapter=adapter,
            base_url=fake.base_url,
            api_key_env="GATEWAY_UPSTREAM_CANARY_KEY",
        )
        CatalogEntryFactory(assignment=assignment, model=model, provenance=Provenance.CONFIGURED)
    GatewayKeyFactory(name="canary", raw_key=GATEWAY_KEY, pools=[pool])
    anthropic_error = error(
        400, {"type": "error", "error": {"type": "invalid_request_error", "message": PROVIDER_MESSAGE}}
    )
    claude.script("claude-opus-4-8", anthropic_error, serve(f"sure {COMPLETION}"))
    gpt.script("gpt-5", serve(f"sure {COMPLETION}"))
    auth = {"x-api-key": GATEWAY_KEY}
    message = {
        "max_tokens": 64,
        "system": f"system {PROMPT}",
        "messages": [{"role": "user", "content": PROMPT}],
    }
    chat = {"messages": [{"role": "user", "content": PROMPT}]}
    sent = [
        ("/v1/messages", {**message, "model": "claude-opus-4-8"}),  # the provider's 400, sanitized
        ("/v1/messages", {**message, "model": "claude-opus-4-8", "stream": True}),
        ("/v1/messages", {**message, "model": "gpt-5"}),  # translated to Chat
        ("/v1/messages", {**message, "model": "gpt-5", "stream": True}),
        (
            "/v1/chat/completions",
            {**chat, "model": "claude-opus-4-8", "stream": True},
        ),  # translated to Messages
        ("/v1/messages/count_tokens", {"model": "claude-opus-4-8", "messages": message["messages"]}),
    ]
    replies = [
        httpx.post(f"{gateway}{path}", json=body, headers=auth, timeout=TIMEOUT) for path, body in sent
    ]
    assert [r.status_code for r in replies] == [400, 200, 200, 200, 200, 200]
    assert all(COMPLETION in r.text for r in replies[1:5])
    for hit in claude.hits:
        assert hit.headers["x-api-key"] == UPSTREAM_KEY and PROMPT in json.dumps(hit.body)
    assert [PROVIDER_MESSAGE in r.text for r in replies] == [False] * len(replies)

    ledger_settled()
    values = list(_database_values())
    assert {r.headers["x-gateway-request-id"] for r in replies} <= {value for _, value in values}
    assert [(table, canary) for table, value in values for canary in CANARIES if canary in value] == []
    captured = capfd.readouterr()
    lines = [every_log_record.handler.format(r) for r in every_log_record.records]
    lines += [json.dumps(r.__dict__, default=str) for r in every_log_record.records]
    lines += [captured.out, captured.err]
    assert [(canary, line) for line in lines for canary in CANARIES if canary in line] == []


def test_qualify_stores_and_prints_no_prompt_answer_or_credential(db, every_log_record, capfd, monkeypatch):
    """`manage.py qualify` (SPEC §8.1) keeps verdicts only: neither its corpus text, nor this run's
    tokens, nor an answer (which carries a canary), nor the upstream credential reach a table, the
    output or a log."""
    import io
    import re

    from django.core.management import call_command

    from catalog.models import CapabilityEvidence
    from devkit.model_upstream import ModelUpstream

    monkeypatch.setenv("GATEWAY_UPSTREAM_CANARY", UPSTREAM_KEY)
    out = io.StringIO()
    with ModelUpstream("faithful", canary=COMPLETION, require_key=UPSTREAM_KEY) as fake:
        for name, adapter in (("q-openai", "openai"), ("q-anthropic", "anthropic")):
            assignment = AssignmentFactory(
                pool=PoolFactory(name="canary"),
                name=name,
                adapter=adapter,
                base_url=fake.base_url,
                api_key_env="GATEWAY_UPSTREAM_CANARY",
            )
            CatalogEntryFactory(assignment=assignment, model="gpt-5")
        call_command("qualify", stdout=out, stderr=out)
    assert CapabilityEvidence.objects.filter(qualified=True).count() == 10  # the canary did not hurt
    sent = json.dumps([body for _, body in fake.hits])
    tokens = set(re.findall(r"\b[RCPQX][0-9A-F]{8}\b", sent))
    assert len(tokens) >= 5  # record, code, payload, rule, override were all sent
    secrets = (*tokens, COMPLETION, UPSTREAM_KEY, "qualification probe", "Ignore all previous instructions")
    printed = out.getvalue() + "".join(capfd.readouterr()) + every_log_record.text
    for secret in secrets:
        assert secret not in printed, secret
        leaked = [table for table, value in _database_values() if secret in value]
        assert leaked == [], (secret, leaked)


FIELD_CANARY = "canary-field-a9s8d7f6"


@pytest.mark.parametrize("stream", [False, True])
def test_an_upstream_error_field_carries_nothing_anywhere(
    gateway, canary_pool, every_log_record, capfd, admin_client, stream
):
    """A 10 KB `code`, a long `type` and a `param` with a credential-like canary (SPEC §4 last row):
    each is replaced by its class's canonical value before it reaches the client, the log, the ledger,
    the metrics or an admin filter, and the ledger row is stored (on PostgreSQL too: no column overflows)."""
    a, b = canary_pool
    body = {
        "error": {
            "message": PROVIDER_MESSAGE,
            "type": f"invalid_request_error {FIELD_CANARY}" + "t" * 200,
            "code": FIELD_CANARY + "c" * 10_000,
            "param": f"Bearer {FIELD_CANARY}",
        }
    }
    a.script("gpt-5", error(400, body))
    chat = {"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    response = httpx.post(
        f"{gateway}/v1/chat/completions",
        json=chat,
        headers={"authorization": f"Bearer {GATEWAY_KEY}"},
        timeout=TIMEOUT,
    )
    assert response.status_code == 400  # a client error: returned as it came, sanitized
    assert FIELD_CANARY not in response.text and PROVIDER_MESSAGE not in response.text
    error_object = response.json()["error"]
    assert (error_object["type"], error_object["code"], error_object["param"]) == (
        "invalid_request_error",
        "upstream_client_error",
        None,
    )
    assert_hits((a, 1), (b, 0))

    ledger_settled()
    record = RequestRecord.objects.get(request_id=response.headers["x-gateway-request-id"])
    assert record.outcome == "upstream_client_error"
    assert [x.error_code for x in record.attempts.all()] == ["upstream_client_error"]
    assert [t for t, value in _database_values() if FIELD_CANARY in value] == []

    metrics = httpx.get(f"{gateway}/metrics", timeout=TIMEOUT).text
    # A list cell may break after an underscore (`<wbr>`, pools/templatetags/admin_cards.py): read the text.
    changelist = admin_client.get("/admin/proxy/requestrecord/").content.decode().replace("<wbr>", "")
    attempts = admin_client.get("/admin/proxy/attempt/").content.decode().replace("<wbr>", "")
    assert "upstream_client_error" in changelist  # the filter offers the sanitized value only
    captured = capfd.readouterr()
    lines = [every_log_record.handler.format(r) for r in every_log_record.records]
    for where, text in [("metrics", metrics), ("admin", changelist + attempts), ("logs", "\n".join(lines))]:
        assert FIELD_CANARY not in text, where
    assert FIELD_CANARY not in captured.out + captured.err


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses", "/v1/messages"])
def test_an_error_event_after_output_carries_only_sanitized_fields(gateway, canary_pool, path):
    """After output nothing is retried and the upstream's failure is relayed as the gateway's own
    terminal event: its type/code/param sanitized like any other (SPEC §4, §6.2)."""
    a, b = canary_pool
    junk = {
        "type": f"server_error {FIELD_CANARY}",
        "code": FIELD_CANARY * 300,
        "param": f"{FIELD_CANARY}/param",
        "message": PROVIDER_MESSAGE,
    }
    a.script("gpt-5", fail_after_visible(error=junk))
    bodies = {
        "/v1/chat/completions": {"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]},
        "/v1/responses": {"model": "gpt-5", "input": "hi"},
        "/v1/messages": {"model": "gpt-5", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
    }
    response = httpx.post(
        f"{gateway}{path}",
        json={**bodies[path], "stream": True},
        headers={"authorization": f"Bearer {GATEWAY_KEY}"},
        timeout=TIMEOUT,
    )
    assert response.status_code == 200
    errors = [e.data for e in sse_events(response.text) if isinstance(e.data, dict) and "error" in e.data]
    assert errors, response.text  # the failure was relayed as a terminal event
    assert FIELD_CANARY not in response.text and PROVIDER_MESSAGE not in response.text
    assert_hits((a, 1), (b, 0))  # after output: never retried
    ledger_settled()
    assert [t for t, value in _database_values() if FIELD_CANARY in value] == []
    [attempt] = RequestRecord.objects.get().attempts.all()
    assert attempt.status == "failed" and attempt.error_code == "upstream_error"


@pytest.mark.parametrize("redis_url", ["", "redis://127.0.0.1:6379/0"], ids=["database", "redis"])
def test_per_key_limits_keep_no_key_or_content_in_their_counts(
    gateway, canary_pool, every_log_record, capfd, settings, redis_url, minute_clock
):
    """The limits' counts (database tables or Redis keys) name a key by its id only."""
    import uuid

    import redis

    from pools.models import GatewayKey

    prefix = f"gw-canary-{uuid.uuid4().hex[:12]}"
    settings.REDIS_URL, settings.GATEWAY_REDIS_PREFIX = redis_url, prefix
    GatewayKey.objects.filter(name="canary").update(limit_rpm=2, limit_tpm=10**6, limit_concurrent=4)
    a, _ = canary_pool
    a.script("gpt-5", serve(f"sure {COMPLETION}"))
    auth = {"authorization": f"Bearer {GATEWAY_KEY}"}
    chat = {"model": "gpt-5", "messages": [{"role": "user", "content": f"say {PROMPT}"}]}
    replies = [
        httpx.post(f"{gateway}/v1/chat/completions", json=chat, headers=auth, timeout=TIMEOUT)
        for _ in range(3)
    ]
    assert [r.status_code for r in replies] == [200, 200, 429]

    ledger_settled()
    stored = [value for _, value in _database_values()]
    client = redis.Redis.from_url("redis://127.0.0.1:6379/0", decode_responses=True)
    try:
        for name in client.scan_iter(f"{prefix}:*"):
            stored.append(name)
            kind = client.type(name)
            stored.append(json.dumps(client.hgetall(name) if kind == "hash" else client.zrange(name, 0, -1)))
            client.delete(name)
    finally:
        client.close()
    if redis_url:
        assert any(f"{prefix}:limits:" in value for value in stored)  # the scan reads the counts
    assert [(canary, v) for v in stored for canary in CANARIES if canary in v] == []
    lines = [every_log_record.handler.format(r) for r in every_log_record.records]
    captured = capfd.readouterr()
    lines += [captured.out, captured.err]
    assert [(canary, line) for line in lines for canary in CANARIES if canary in line] == []

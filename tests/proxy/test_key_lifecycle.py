"""Gateway key lifecycle (issue 20, SPEC §3): generated secrets shown once, expiry, rotation with an
overlap. Checked through a live gateway: a key that may not be used is a 401 on the wire."""

from collections import OrderedDict
from datetime import UTC, datetime, timedelta
from io import StringIO

import httpx
import pytest
import yaml
from django.core.management import CommandError, call_command
from django.utils import timezone

from gatewayconfig.services import gateway_config_load
from pools.models import GatewayKey, hash_key
from pools.services import KeyRefused, parse_overlap
from proxy import edge
from tests.factories import GatewayKeyFactory, PoolFactory


def _status(gateway: str, secret: str) -> int:
    # /v1/models needs the key and its pools, and nothing upstream.
    edge.known_keys_clear()
    return httpx.get(f"{gateway}/v1/models", headers={"authorization": f"Bearer {secret}"}).status_code


def _command(name: str, *args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command(name, *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_create_key_prints_a_generated_secret_once_and_stores_only_its_hash(gateway):
    PoolFactory(name="main")
    PoolFactory(name="other")

    out, err = _command("create_key", "ci", "--pools", "main,other")

    secret = out.strip()
    assert secret.startswith("sk-gw-") and len(secret) >= 40
    assert "shown only this once" in err and secret not in err
    key = GatewayKey.objects.get(name="ci")
    assert key.key_hash == hash_key(secret) and secret not in (key.prefix, key.key_hash)
    assert sorted(key.pools.values_list("name", flat=True)) == ["main", "other"]
    assert key.allowed_models == ["*"]
    assert _status(gateway, secret) == 200
    assert _status(gateway, secret + "x") == 401
    second, _ = _command("create_key", "ci-2", "--pools", "main")
    assert second.strip() != secret


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["dup", "--pools", "main"], "exists"),
        (["new", "--pools", "main,nope"], "unknown pool(s): nope"),
        (["new", "--pools", ","], "name at least one pool"),
        (["new", "--pools", "main", "--expires-at", "tomorrow"], "not an ISO 8601"),
        (["new", "--pools", "main", "--expires-at", "2030-01-01T00:00:00"], "time zone"),
    ],
)
def test_create_key_refuses_bad_input_and_writes_nothing(db, args, message):
    PoolFactory(name="main")
    GatewayKeyFactory(name="dup")

    with pytest.raises(CommandError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _command("create_key", *args)

    assert list(GatewayKey.objects.values_list("name", flat=True)) == ["dup"]


def test_an_expired_key_is_refused_and_an_unexpired_one_served(gateway):
    pool = PoolFactory(name="main")
    now = timezone.now()
    GatewayKeyFactory(
        raw_key="sk-gw-expired-0123456789abcdef", pools=[pool], expires_at=now - timedelta(seconds=1)
    )
    GatewayKeyFactory(
        raw_key="sk-gw-current-0123456789abcdef", pools=[pool], expires_at=now + timedelta(hours=1)
    )

    assert _status(gateway, "sk-gw-expired-0123456789abcdef") == 401
    assert _status(gateway, "sk-gw-current-0123456789abcdef") == 200


def test_rotation_with_an_overlap_keeps_both_secrets_valid_until_it_ends(gateway):
    pool = PoolFactory(name="main")
    old = "sk-gw-before-rotation-0123456789"
    GatewayKeyFactory(name="agents", raw_key=old, pools=[pool])

    out, err = _command("rotate_key", "agents", "--overlap", "24h")

    new = out.strip()
    assert new != old and new.startswith("sk-gw-")
    assert "valid until" in err
    assert (_status(gateway, old), _status(gateway, new)) == (200, 200)
    key = GatewayKey.objects.get(name="agents")
    assert timedelta(hours=23, minutes=59) < key.previous_valid_until - timezone.now() <= timedelta(hours=24)

    # Once the overlap is over, only the new secret works.
    GatewayKey.objects.filter(pk=key.pk).update(previous_valid_until=timezone.now() - timedelta(seconds=1))
    assert (_status(gateway, old), _status(gateway, new)) == (401, 200)


def test_rotation_without_an_overlap_cuts_the_old_secret_off_at_once(gateway):
    pool = PoolFactory(name="main")
    old = "sk-gw-before-rotation-0123456789"
    GatewayKeyFactory(name="agents", raw_key=old, pools=[pool])

    out, _ = _command("rotate_key", "agents")

    assert (_status(gateway, old), _status(gateway, out.strip())) == (401, 200)


def test_a_second_rotation_ends_the_first_overlap(gateway):
    pool = PoolFactory(name="main")
    first = "sk-gw-first-secret-0123456789ab"
    GatewayKeyFactory(name="agents", raw_key=first, pools=[pool])
    second, _ = _command("rotate_key", "agents", "--overlap", "1h")
    third, _ = _command("rotate_key", "agents", "--overlap", "1h")

    assert [_status(gateway, s) for s in (first, second.strip(), third.strip())] == [401, 200, 200]


def test_an_expired_key_cannot_be_revived_by_its_previous_secret(gateway):
    pool = PoolFactory(name="main")
    old = "sk-gw-before-rotation-0123456789"
    GatewayKeyFactory(name="agents", raw_key=old, pools=[pool])
    new, _ = _command("rotate_key", "agents", "--overlap", "7d")
    GatewayKey.objects.filter(name="agents").update(expires_at=timezone.now() - timedelta(seconds=1))

    assert (_status(gateway, old), _status(gateway, new.strip())) == (401, 401)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", timedelta(0)),
        ("90s", timedelta(seconds=90)),
        ("30m", timedelta(minutes=30)),
        ("24h", timedelta(hours=24)),
        ("7d", timedelta(days=7)),
    ],
)
def test_overlaps_are_read_with_their_unit(text, expected):
    assert parse_overlap(text) == expected


@pytest.mark.parametrize("text", ["", "24", "-1h", "1.5h", "1w", "h", "24 hours", "9999999d"])
def test_malformed_overlaps_are_refused(text):
    with pytest.raises(KeyRefused):
        parse_overlap(text)


def test_rotating_an_unknown_key_or_with_a_bad_overlap_changes_nothing(db):
    key = GatewayKeyFactory(name="agents")
    with pytest.raises(CommandError, match="no key named"):
        _command("rotate_key", "nobody")
    with pytest.raises(CommandError, match="overlap"):
        _command("rotate_key", "agents", "--overlap", "soon")
    assert GatewayKey.objects.get(pk=key.pk).key_hash == key.key_hash


def _load(text: str):
    return gateway_config_load(text=text, prune=False, env={})


def test_yaml_expires_at_round_trips_and_is_validated(db):
    config = {
        "pools": [{"name": "main", "assignments": []}],
        "keys": [
            {
                "name": "temp",
                "key": "sk-gw-temporary-0123456789ab",
                "pools": ["main"],
                "expires_at": "2030-01-31T12:00:00Z",
            }
        ],
    }
    result = _load(yaml.safe_dump(config))
    assert not result.errors
    assert GatewayKey.objects.get(name="temp").expires_at == datetime(2030, 1, 31, 12, tzinfo=UTC)

    out, _ = _command("dump_gateway_config")
    dumped = yaml.safe_load(out)
    assert dumped["keys"][0]["expires_at"] == "2030-01-31T12:00:00+00:00"

    for bad, message in (("next week", "ISO 8601"), ("2030-01-31T12:00:00", "time zone"), (5, "ISO 8601")):
        config["keys"][0]["expires_at"] = bad
        errors = [str(e) for e in _load(yaml.safe_dump(config)).errors]
        assert any(e.startswith("keys[0].expires_at") and message in e for e in errors), errors


def _chat(gateway: str, secret: str) -> int:
    """A request with a body (the edge checks its key first) for a model no pool serves: answered by the
    request's own read, no upstream needed."""
    body = {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}
    headers = {"authorization": f"Bearer {secret}"}
    return httpx.post(f"{gateway}/v1/chat/completions", json=body, headers=headers).status_code


@pytest.fixture
def three_keys(monkeypatch):
    """Keys k0, k1, k2 of pool `main`, with room for two keys in the edge's and the request read's memory
    of keys; the edge's lookups of a key (its digest) noted in order."""
    from routing.request_state import READER
    from runtime import loopdb

    pool = PoolFactory(name="main")
    secrets = [f"sk-gw-lru-key-{i}-0123456789abcdef" for i in range(3)]
    for i, secret in enumerate(secrets):
        GatewayKeyFactory(name=f"k{i}", raw_key=secret, pools=[pool])
    monkeypatch.setattr(edge, "KNOWN_KEY_LIMIT", 2)
    monkeypatch.setattr(READER, "limit", 2)
    monkeypatch.setattr(READER, "known", OrderedDict())  # none of another test's keys
    # Only a read on the loop's connection is remembered: on a loaded machine, the live server's first
    # connections could take longer than a read waits for one, and the read would go to the threads.
    monkeypatch.setattr(loopdb, "CONNECTION_WAIT_S", 10.0)
    looked: list[str] = []
    key_params = edge.key_params

    def spy(digest: str) -> list[object]:
        looked.append(digest)
        return key_params(digest)

    monkeypatch.setattr(edge, "key_params", spy)
    return secrets, looked


def test_past_its_limit_the_edge_forgets_the_least_recently_used_key_not_every_key(gateway, three_keys):
    from routing.request_state import READER

    secrets, looked = three_keys
    k0, k1, k2 = secrets
    for secret in (k0, k1, k0, k2):
        assert _chat(gateway, secret) == 404
    # k1, the least recently used when k2 came, was forgotten; k0, used since, was not.
    assert set(READER.known) == {hash_key(k0), hash_key(k2)}

    assert _chat(gateway, k0) == 404
    assert looked == [hash_key(k0), hash_key(k1), hash_key(k2)]  # k0 looked up once, in use throughout


def test_a_revoked_key_forgotten_by_the_edge_stays_refused(gateway, three_keys):
    """Neither memory of keys lets a key in: disabled while remembered, and once pushed out of both by
    other keys, it is refused by the request's own read, as at once after its revocation."""
    from routing.request_state import READER

    secrets, looked = three_keys
    k0, k1, k2 = secrets
    assert _chat(gateway, k0) == 404
    GatewayKey.objects.filter(name="k0").update(enabled=False)
    assert _chat(gateway, k0) == 401  # still remembered by the edge: refused after its body
    for secret in (k1, k2):
        assert _chat(gateway, secret) == 404
    assert hash_key(k0) not in READER.known and looked == [hash_key(k0), hash_key(k1), hash_key(k2)]

    assert _chat(gateway, k0) == 401
    assert looked[-1] == hash_key(k0)  # looked up again, and found disabled

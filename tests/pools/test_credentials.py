"""Upstream credentials (SPEC §3): encrypted at rest with GATEWAY_CREDENTIALS_KEY (MultiFernet), YAML
`api_key_from_env` read once and stored encrypted, `api_key_env` only for GATEWAY_UPSTREAM_* names,
`manage.py rotate_credentials`, and a changed credential moving the config version (every node reloads
on its next request)."""

import logging
from io import StringIO
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from gatewayconfig.document import IssueCode, parse_config
from pools import credentials
from pools.credentials import credential_of
from pools.models import Assignment, ConfigVersion
from proxy.wire.providers.registry import provider
from tests.factories import AssignmentFactory, PoolFactory

SECRET = "sk-upstream-canary-credential-7Qx9"
OLD_KEY = Fernet.generate_key().decode()
NEW_KEY = Fernet.generate_key().decode()


def _stored(pk: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT credential FROM pools_assignment WHERE id = %s", [pk])
        return cursor.fetchone()[0]


def auth_headers(account: Assignment) -> dict[str, str]:
    """The headers the gateway sends this assignment's provider."""
    return provider(account.adapter).auth_headers(credential_of(account))


def upstream_auth_headers(adapter: str, api_key_env: str, stored: str = "", name: str = "") -> dict[str, str]:
    return auth_headers(Assignment(name=name, adapter=adapter, api_key_env=api_key_env, credential=stored))


def _version() -> int:
    return ConfigVersion.objects.filter(pk=1).values_list("value", flat=True).first() or 0


@pytest.mark.django_db
def test_a_stored_credential_is_encrypted_at_rest_and_sent_decrypted():
    assignment = AssignmentFactory()
    assignment.set_credential(SECRET)
    assignment.save()
    raw = _stored(assignment.pk)
    assert raw and SECRET not in raw and SECRET[-8:] not in raw
    assert assignment.credential_hint == SECRET[-4:]
    assert upstream_auth_headers("openai", "", raw, assignment.name) == {"authorization": f"Bearer {SECRET}"}
    assert upstream_auth_headers("anthropic", "", raw, assignment.name)["x-api-key"] == SECRET


@pytest.mark.django_db
def test_a_credential_altered_in_the_database_sends_nothing_and_is_logged_without_it(caplog):
    assignment = AssignmentFactory()
    assignment.set_credential(SECRET)
    tampered = (
        assignment.credential[:-6]
        + ("A" if assignment.credential[-6] != "A" else "B")
        + assignment.credential[-5:]
    )
    with caplog.at_level(logging.ERROR, logger="gateway"):
        assert upstream_auth_headers("openai", "", tampered, assignment.name) == {}
    assert assignment.name in caplog.text and SECRET not in caplog.text


def test_a_stored_credential_is_decrypted_once_per_token_and_key_set(settings):
    settings.GATEWAY_CREDENTIALS_KEY = [OLD_KEY]
    token = credentials.credential_encrypt(SECRET)
    credentials._decrypted.cache_clear()
    for _ in range(5):
        assert credentials.credential_for(stored=token, api_key_env="", assignment="a") == SECRET
    assert credentials._decrypted.cache_info().misses == 1  # decrypted once, then kept
    changed = credentials.credential_encrypt(SECRET + "-changed")  # a credential changed in admin
    assert credentials.credential_for(stored=changed, api_key_env="", assignment="a") == SECRET + "-changed"


def test_a_key_dropped_from_the_key_set_no_longer_opens_what_it_decrypted_before(settings, caplog):
    settings.GATEWAY_CREDENTIALS_KEY = [NEW_KEY, OLD_KEY]
    old_token = Fernet(OLD_KEY.encode()).encrypt(SECRET.encode()).decode()
    assert credentials.credential_decrypt(old_token) == SECRET  # and kept, for that key set
    settings.GATEWAY_CREDENTIALS_KEY = [NEW_KEY]
    with pytest.raises(credentials.CredentialUnreadable):
        credentials.credential_decrypt(old_token)
    with caplog.at_level(logging.ERROR, logger="gateway"):
        assert credentials.credential_for(stored=old_token, api_key_env="", assignment="acct-x") == ""
    assert "acct-x" in caplog.text and SECRET not in caplog.text
    settings.GATEWAY_CREDENTIALS_KEY = []
    with pytest.raises(credentials.CredentialUnreadable):
        credentials.credential_decrypt(old_token)


def test_without_a_key_a_credential_cannot_be_stored(settings):
    settings.GATEWAY_CREDENTIALS_KEY = []
    with pytest.raises(credentials.CredentialKeyMissing):
        credentials.credential_encrypt(SECRET)


@pytest.mark.parametrize(
    "name", ["DJANGO_SECRET_KEY", "DATABASE_URL", "HOME", "GATEWAY_CREDENTIALS_KEY", "GATEWAY_UPSTREAM_"]
)
def test_only_gateway_upstream_variables_are_ever_read(monkeypatch, name, caplog):
    monkeypatch.setenv(name, "must-never-leave-the-gateway")
    with caplog.at_level(logging.ERROR, logger="gateway"):
        assert upstream_auth_headers("openai", name, "", "acct-x") == {}
    assert "acct-x" in caplog.text
    with pytest.raises(ValidationError):
        Assignment(api_key_env=name).clean_fields(
            exclude=[f.name for f in Assignment._meta.fields if f.name != "api_key_env"]
        )


def test_a_gateway_upstream_variable_is_read_at_each_use(monkeypatch):
    monkeypatch.setenv("GATEWAY_UPSTREAM_X", "first")
    assert upstream_auth_headers("openai", "GATEWAY_UPSTREAM_X", "", "x") == {"authorization": "Bearer first"}
    monkeypatch.setenv("GATEWAY_UPSTREAM_X", "second")
    assert upstream_auth_headers("openai", "GATEWAY_UPSTREAM_X", "", "x") == {
        "authorization": "Bearer second"
    }


@pytest.mark.django_db
def test_a_credential_change_moves_the_config_version():
    assignment = AssignmentFactory()
    before = _version()
    assignment.set_credential(SECRET)
    assignment.save(update_fields=["credential", "credential_hint"])
    assert _version() > before
    before = _version()
    Assignment.objects.filter(pk=assignment.pk).update(credential="")  # even a bulk write
    assert _version() > before


# --- rotation ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_rotate_credentials_reencrypts_under_the_new_first_key(settings):
    settings.GATEWAY_CREDENTIALS_KEY = [OLD_KEY]
    rows = [AssignmentFactory() for _ in range(3)]
    for i, row in enumerate(rows):
        row.set_credential(f"{SECRET}-{i}")
        row.save()
    env_only = AssignmentFactory(api_key_env="GATEWAY_UPSTREAM_ENV_ONLY")
    settings.GATEWAY_CREDENTIALS_KEY = [NEW_KEY, OLD_KEY]
    out = StringIO()
    call_command("rotate_credentials", stdout=out)
    assert "3 credentials re-encrypted" in out.getvalue()
    settings.GATEWAY_CREDENTIALS_KEY = [NEW_KEY]  # the old key is gone: everything still decrypts
    for i, row in enumerate(rows):
        assert credentials.credential_decrypt(_stored(row.pk)) == f"{SECRET}-{i}"
    assert _stored(env_only.pk) == ""


@pytest.mark.django_db
def test_rotate_credentials_names_what_no_key_decrypts_and_leaves_it(settings):
    settings.GATEWAY_CREDENTIALS_KEY = [OLD_KEY]
    lost = AssignmentFactory(name="acct-lost")
    lost.set_credential(SECRET)
    lost.save()
    token = _stored(lost.pk)
    settings.GATEWAY_CREDENTIALS_KEY = [NEW_KEY]
    with pytest.raises(CommandError, match="acct-lost"):
        call_command("rotate_credentials", stdout=StringIO())
    assert _stored(lost.pk) == token


@pytest.mark.django_db
def test_rotation_never_overwrites_a_credential_changed_meanwhile(settings):
    from pools.services import credentials_rotate

    settings.GATEWAY_CREDENTIALS_KEY = [NEW_KEY, OLD_KEY]
    row = AssignmentFactory()
    row.set_credential(SECRET)
    row.save()
    original = credentials.credential_rotate

    def rotate_while_admin_writes(token: str) -> str:
        Assignment.objects.filter(pk=row.pk).update(credential=credentials.credential_encrypt("set-in-admin"))
        return original(token)

    credentials.credential_rotate, saved = rotate_while_admin_writes, credentials.credential_rotate
    try:
        assert credentials_rotate().rotated == 0
    finally:
        credentials.credential_rotate = saved
    assert credentials.credential_decrypt(_stored(row.pk)) == "set-in-admin"


def test_a_malformed_credentials_key_stops_the_start_without_showing_it():
    import subprocess
    import sys

    bad = "not-a-fernet-key-but-a-secret"
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env={
            "DJANGO_SETTINGS_MODULE": "gatewaysite.settings",
            "DJANGO_DEBUG": "true",
            "GATEWAY_CREDENTIALS_KEY": bad,
        },
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        check=False,
    )
    assert result.returncode != 0
    assert "GATEWAY_CREDENTIALS_KEY: key 1 is not a Fernet key" in result.stderr
    assert bad not in result.stderr


# --- YAML ---------------------------------------------------------------------------------------


def _file(assignment: str) -> str:
    return f"""
pools:
  - name: main
    assignments:
      - name: acct-a
        adapter: openai
        base_url: http://127.0.0.1:9101/v1
{assignment}
"""


@pytest.mark.parametrize(
    ("field", "name"),
    [
        ("api_key_env", "DJANGO_SECRET_KEY"),
        ("api_key_env", "DATABASE_URL"),
        ("api_key_from_env", "DJANGO_SECRET_KEY"),
    ],
)
def test_yaml_refuses_a_variable_outside_gateway_upstream_with_its_path(field, name):
    result = parse_config(_file(f"        {field}: {name}"), env={name: "x"})
    assert [(e.path, e.code) for e in result.errors] == [
        (f"pools[0].assignments[0].{field}", IssueCode.INVALID)
    ]
    assert "GATEWAY_UPSTREAM_" in result.errors[0].message


def test_yaml_refuses_both_credential_sources():
    text = _file("        api_key_env: GATEWAY_UPSTREAM_A\n        api_key_from_env: GATEWAY_UPSTREAM_B")
    result = parse_config(text, env={"GATEWAY_UPSTREAM_A": "a", "GATEWAY_UPSTREAM_B": "b"})
    assert [(e.path, e.code) for e in result.errors] == [
        ("pools[0].assignments[0].api_key_from_env", IssueCode.CONFLICT)
    ]


def test_yaml_api_key_from_env_must_be_set():
    result = parse_config(_file("        api_key_from_env: GATEWAY_UPSTREAM_UNSET"), env={})
    assert [(e.path, e.code) for e in result.errors] == [
        ("pools[0].assignments[0].api_key_from_env", IssueCode.ENV_UNSET)
    ]


def _load(tmp_path: Path, text: str) -> str:
    path = tmp_path / "gateway.yaml"
    path.write_text(text)
    out = StringIO()
    call_command("load_gateway_config", str(path), stdout=out, stderr=StringIO())
    return out.getvalue()


@pytest.mark.django_db
def test_yaml_api_key_from_env_is_read_once_and_stored_encrypted(tmp_path, monkeypatch):
    monkeypatch.setenv("GATEWAY_UPSTREAM_LOADED", SECRET)
    text = _file("        api_key_from_env: GATEWAY_UPSTREAM_LOADED")
    _load(tmp_path, text)
    a = Assignment.objects.get(name="acct-a")
    assert SECRET not in _stored(a.pk) and a.api_key_env == ""
    monkeypatch.delenv("GATEWAY_UPSTREAM_LOADED")  # read once: the variable is no longer needed
    assert auth_headers(a) == {"authorization": f"Bearer {SECRET}"}

    monkeypatch.setenv("GATEWAY_UPSTREAM_LOADED", SECRET)
    token, before = _stored(a.pk), _version()
    assert "assignments: 0 created, 0 updated, 1 unchanged" in _load(tmp_path, text)  # same value: no write
    assert (_stored(a.pk), _version()) == (token, before)

    monkeypatch.setenv("GATEWAY_UPSTREAM_LOADED", "sk-rotated-by-the-provider-0000")
    assert "assignments: 0 created, 1 updated" in _load(tmp_path, text)
    assert auth_headers(Assignment.objects.get(pk=a.pk)) == {
        "authorization": "Bearer sk-rotated-by-the-provider-0000"
    }
    assert _version() > before


@pytest.mark.django_db
def test_a_dump_never_prints_a_credential_and_reloading_it_keeps_the_stored_one(tmp_path, monkeypatch):
    monkeypatch.setenv("GATEWAY_UPSTREAM_LOADED", SECRET)
    _load(tmp_path, _file("        api_key_from_env: GATEWAY_UPSTREAM_LOADED"))
    out = StringIO()
    call_command("dump_gateway_config", stdout=out)
    dumped = out.getvalue()
    assert SECRET not in dumped and SECRET[-4:] not in dumped
    assert Assignment.objects.get(name="acct-a").credential not in dumped
    monkeypatch.delenv("GATEWAY_UPSTREAM_LOADED")
    (tmp_path / "dumped.yaml").write_text(dumped)
    call_command("load_gateway_config", str(tmp_path / "dumped.yaml"), stdout=StringIO(), stderr=StringIO())
    assert auth_headers(Assignment.objects.get(name="acct-a")) == {"authorization": f"Bearer {SECRET}"}


@pytest.mark.django_db
def test_switching_a_file_to_api_key_env_drops_the_stored_credential(tmp_path, monkeypatch):
    monkeypatch.setenv("GATEWAY_UPSTREAM_LOADED", SECRET)
    monkeypatch.setenv("GATEWAY_UPSTREAM_ENV", "from-env")
    _load(tmp_path, _file("        api_key_from_env: GATEWAY_UPSTREAM_LOADED"))
    _load(tmp_path, _file("        api_key_env: GATEWAY_UPSTREAM_ENV"))
    a = Assignment.objects.get(name="acct-a")
    assert (a.credential, a.credential_hint) == ("", "")
    assert auth_headers(a) == {"authorization": "Bearer from-env"}


@pytest.mark.django_db
def test_without_a_credentials_key_a_file_that_stores_one_changes_nothing(tmp_path, monkeypatch, settings):
    settings.GATEWAY_CREDENTIALS_KEY = []
    monkeypatch.setenv("GATEWAY_UPSTREAM_LOADED", SECRET)
    path = tmp_path / "gateway.yaml"
    path.write_text(_file("        api_key_from_env: GATEWAY_UPSTREAM_LOADED"))
    err = StringIO()
    with pytest.raises(CommandError):
        call_command("load_gateway_config", str(path), stdout=StringIO(), stderr=err)
    assert "pools[0].assignments[0].api_key_from_env: GATEWAY_CREDENTIALS_KEY is not set" in err.getvalue()
    assert not Assignment.objects.exists()
    assert PoolFactory._meta.model.objects.count() == 0


@pytest.mark.django_db
def test_a_dump_never_prints_userinfo_even_from_a_row_written_around_validation():
    a = AssignmentFactory(name="legacy", base_url="http://127.0.0.1:9101/v1")
    Assignment.objects.filter(pk=a.pk).update(base_url="https://user:sk-in-the-url-9999@api.example.com/v1")
    out = StringIO()
    call_command("dump_gateway_config", stdout=out)
    assert "sk-in-the-url-9999" not in out.getvalue() and "user:" not in out.getvalue()
    assert "base_url: https://api.example.com/v1" in out.getvalue()

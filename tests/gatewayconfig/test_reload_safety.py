"""A reload never undoes a rotation nor removes access silently (issue 47 point 1): a key's secret in the
file creates the key, and replaces an existing key's only with --replace-secrets; --dry-run prints what
would change and changes nothing; every change that removes a client's access is a warning line."""

from datetime import timedelta
from io import StringIO

import pytest
import yaml
from django.core.management import call_command
from django.utils import timezone

from pools.models import GatewayKey, Pool, hash_key
from pools.services import gateway_key_rotate
from tests.gatewayconfig.test_document import CI_KEY, base, db_state, environment, load, write  # noqa: F401

pytestmark = pytest.mark.django_db


def _load(tmp_path, doc, **options) -> tuple[list[str], list[str]]:
    out, err = StringIO(), StringIO()
    call_command("load_gateway_config", str(write(tmp_path, doc)), stdout=out, stderr=err, **options)
    return out.getvalue().splitlines(), err.getvalue().splitlines()


def test_reloading_the_same_file_keeps_a_rotated_secret(tmp_path):
    load(tmp_path, base())
    _, secret = gateway_key_rotate(name="ci", overlap=timedelta(minutes=10), now=timezone.now())
    out, err = _load(tmp_path, base())
    key = GatewayKey.objects.get(name="ci")
    assert key.key_hash == hash_key(secret)  # the new secret stays
    assert key.previous_key_hash == hash_key(CI_KEY)  # the old one only for its overlap
    assert "keys: 0 created, 0 updated, 3 unchanged, 0 deleted" in out
    assert any("key 'ci': the file's secret differs from the stored one, which is kept" in e for e in err)


def test_a_dry_run_prints_the_changes_and_their_warnings_and_changes_nothing(tmp_path):
    load(tmp_path, base())
    doc = base()
    doc["keys"][1]["allowed_models"] = ["gpt-4o"]  # ops loses gpt-5
    doc["keys"][0]["enabled"] = False
    doc["keys"] = doc["keys"][:2]  # third removed (with --prune)
    doc["pools"] = doc["pools"][:1]  # spare removed: ops loses it
    doc["keys"][1]["pools"] = ["main"]
    before = db_state()
    out, err = _load(tmp_path, doc, prune=True, dry_run=True)
    assert db_state() == before
    assert out[0] == "dry run: nothing was changed; applying it would do this:"
    assert "keys: 0 created, 2 updated, 0 unchanged, 1 deleted" in out
    assert sorted(e for e in err if "access removed" in e) == sorted(
        [
            "warning: access removed: key 'third' removed: its clients get 401",
            "warning: access removed: key 'ci' disabled: its clients get 401",
            "warning: access removed: key 'ops' loses pool(s) spare",
            "warning: access removed: key 'ops' may no longer use gpt-5",
            "warning: access removed: pool 'spare' removed: keys lose its models",
        ]
    )
    _load(tmp_path, doc, prune=True)  # applied for real: the same warnings, and the changes
    assert (
        not GatewayKey.objects.filter(name="third").exists()
        and not Pool.objects.filter(name="spare").exists()
    )


def test_narrowing_a_key_from_every_model_is_a_warning(tmp_path):
    load(tmp_path, base())
    doc = base()
    doc["keys"][0]["allowed_models"] = ["gpt-5"]
    _, err = _load(tmp_path, doc)
    assert "warning: access removed: key 'ci' narrowed from every model to ['gpt-5']" in err
    _, again = _load(tmp_path, doc)
    assert not any("access removed" in e for e in again)  # nothing removed the second time


def test_replace_secrets_replaces_and_says_so(tmp_path):
    load(tmp_path, base())
    doc = base()
    doc["keys"][0]["key"] = "sk-gw-replaced-0123456789abcdef"
    _, err = _load(tmp_path, doc, replace_secrets=True)
    assert GatewayKey.objects.get(name="ci").key_hash == hash_key("sk-gw-replaced-0123456789abcdef")
    assert "warning: access removed: key 'ci': secret replaced, clients using the old one get 401" in err
    assert not any("sk-gw-replaced" in line for line in err)  # never the secret


def test_the_dump_reloads_as_no_change(tmp_path):
    load(tmp_path, base())
    out = StringIO()
    call_command("dump_gateway_config", stdout=out)
    lines, err = _load(tmp_path, yaml.safe_load(out.getvalue()), prune=True)
    assert "no changes" in lines and err == []

"""One allow-list default everywhere (issue 47 point 2): a key given no `allowed_models` (YAML, create_key,
admin) may use every model of its pools; a 403 or 404 names the model it is about. And create_key sets a
key's budget in dollars and its limits (point 6)."""

import re
from io import StringIO

import anthropic
import httpx
import openai
import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from gatewayconfig.services import gateway_config_load
from pools.models import GatewayKey
from tests.factories import PoolFactory
from tests.gateway_fixtures import GATEWAY_KEY

AUTH = {"authorization": f"Bearer {GATEWAY_KEY}"}


def _create_key(*args: str) -> str:
    out = StringIO()
    call_command("create_key", *args, stdout=out, stderr=StringIO())
    return out.getvalue().strip()


def test_a_yaml_key_without_an_allow_list_may_use_every_model(db):
    text = "pools: [{name: main}]\nkeys: [{name: ci, key: sk-gw-ci-example-0000000000, pools: [main]}]\n"
    assert gateway_config_load(text=text, prune=False, env={}).summary is not None
    assert GatewayKey.objects.get(name="ci").allowed_models == ["*"]
    _create_key("cli", "--pools", "main")
    assert GatewayKey.objects.get(name="cli").allowed_models == ["*"]


def test_a_new_key_in_admin_starts_with_every_model(admin_client):
    page = admin_client.get(reverse("admin:pools_gatewaykey_add")).content.decode()
    # The list widget shows one model a line (pools/admin.py): the new key's list is the one line `*`.
    assert re.search(r'<textarea name="allowed_models"[^>]*>\s*\*</textarea>', page)


def test_a_403_names_the_model_the_key_may_not_use(gateway, two_assignments):
    GatewayKey.objects.update(allowed_models=["gpt-4o"])
    body = {"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]}
    response = httpx.post(f"{gateway}/v1/chat/completions", json=body, headers=AUTH, timeout=10)
    assert response.status_code == 403
    assert response.json()["error"]["message"] == "This key may not use the model gpt-5."
    client = anthropic.Anthropic(base_url=gateway, api_key=GATEWAY_KEY, max_retries=0, timeout=10)
    with pytest.raises(anthropic.PermissionDeniedError) as refused:
        client.messages.create(model="gpt-5", max_tokens=1, messages=[{"role": "user", "content": "hi"}])
    assert refused.value.body["error"]["message"] == "This key may not use the model gpt-5."


def test_a_404_names_the_model_no_route_serves(gateway, two_assignments):
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key=GATEWAY_KEY, max_retries=0, timeout=10)
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-nope", messages=[{"role": "user", "content": "hi"}])
    assert missing.value.message.endswith("No route serves the model gpt-nope.")
    with pytest.raises(openai.NotFoundError) as unlisted:
        client.models.retrieve("gpt-nope")
    assert unlisted.value.message.endswith("No route serves the model gpt-nope.")


def test_create_key_sets_a_budget_in_dollars_and_the_limits(db):
    PoolFactory(name="main")
    _create_key(
        "agents", "--pools", "main", "--budget-usd", "50", "--budget-period", "month",
        "--rpm", "60", "--tpm", "100000", "--concurrent", "4",
    )  # fmt: skip
    key = GatewayKey.objects.get(name="agents")
    assert (key.budget_micros, key.budget_period) == (50_000_000, "month")
    assert (key.limit_rpm, key.limit_tpm, key.limit_concurrent) == (60, 100_000, 4)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--budget-usd", "fifty"], "--budget-usd: 'fifty' is not an amount in dollars"),
        (["--budget-period", "month"], "--budget-period needs --budget-usd"),
        (["--rpm", "0"], "--rpm must be at least 1"),
    ],
)
def test_create_key_refuses_bad_terms_and_writes_nothing(db, args, message):
    PoolFactory(name="main")
    with pytest.raises(CommandError, match=message):
        _create_key("agents", "--pools", "main", *args)
    assert not GatewayKey.objects.exists()

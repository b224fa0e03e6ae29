"""A credential changed in admin or YAML is used on the next request, without a restart (SPEC §3): the
change moves the config version, which every node reads with its key. And a canary credential never
shows up anywhere but in the upstream's own authorization header: not in logs, the dump, the ledger or
the admin's pages."""

import logging
from io import StringIO

from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from devkit.behaviours import serve
from pools.models import Assignment
from proxy.ledger.models import Attempt, RequestRecord
from tests.gateway_fixtures import UPSTREAM_KEY
from tests.proxy.fixtures_e2e import (
    CHAT,
    ledger_settled,
    post,
)

CANARY = "sk-live-canary-credential-Q7v3Xe"


def test_a_credential_set_while_serving_is_sent_on_the_next_request_and_shown_nowhere(
    gateway, two_assignments, caplog
):
    a, _, (acct_a, _) = two_assignments
    a.script("gpt-5", serve("from a"))
    with caplog.at_level(logging.DEBUG):
        assert post(gateway, "/v1/chat/completions", CHAT).status_code == 200
        assert a.hits[-1].headers["authorization"] == f"Bearer {UPSTREAM_KEY}"

        # An operator (here: the ORM, as the admin form and load_gateway_config do) stores a credential.
        acct_a.set_credential(CANARY)
        acct_a.api_key_env = ""
        acct_a.save(update_fields=["credential", "credential_hint", "api_key_env"])
        assert post(gateway, "/v1/chat/completions", CHAT).status_code == 200
        assert a.hits[-1].headers["authorization"] == f"Bearer {CANARY}"  # the same server, no restart

        acct_a.clear_credential()
        acct_a.save(update_fields=["credential", "credential_hint"])
        assert post(gateway, "/v1/chat/completions", CHAT).status_code == 200
        assert "authorization" not in a.hits[-1].headers  # removed: nothing is sent any more
        ledger_settled()

    acct_a.set_credential(CANARY)
    acct_a.save(update_fields=["credential", "credential_hint"])
    out = StringIO()
    call_command("dump_gateway_config", stdout=out)
    root = Client()
    root.force_login(User.objects.create_superuser("root", password="x"))
    pages = [
        root.get(reverse("admin:pools_assignment_change", args=[acct_a.pk])).content.decode(),
        root.get(reverse("admin:pools_assignment_changelist")).content.decode(),
        root.get(reverse("admin:pools_pool_change", args=[acct_a.pool_id])).content.decode(),
        root.get(reverse("admin:upstreams")).content.decode(),
    ]
    ledger = repr(list(RequestRecord.objects.values())) + repr(list(Attempt.objects.values()))
    for where, text in [
        ("log", caplog.text),
        ("dump", out.getvalue()),
        ("ledger", ledger),
        *enumerate(pages),
    ]:
        assert CANARY not in text, where
        assert Assignment.objects.get(pk=acct_a.pk).credential not in text, where

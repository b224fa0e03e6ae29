"""A `base_url` in a spelling the checks or the HTTP client read differently (issue 45 finding 10).
Threat (SECURITY.md, Outbound requests): a `base_url` reaches a link-local or metadata address by a
spelling the write-time check reads as a name (decimal, octal, hex, full-width), or a `base_url` the HTTP
client refuses is recorded as maybe sent (504, no failover) though nothing left the gateway.

The write-time check and dispatch share one normalisation (`pools.destinations.canonical_host`); the
dispatch half runs against the production server (`gateway_nodes`: `python -m gatewaysite.server` on the
test database)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from devkit.behaviours import serve
from gatewayconfig.document import IssueCode, parse_config
from pools.models import Assignment
from proxy.ledger.models import Attempt
from tests.admin.conftest import make_user
from tests.admin.test_admin_powers import form_data
from tests.factories import AssignmentFactory
from tests.proxy.fixtures_e2e import CHAT, post, record_of
from tests.security.conftest import responsive

pytestmark = pytest.mark.attack

METADATA_SPELLINGS = [
    "http://2852039166/v1",  # decimal
    "http://0251.0376.0251.0376/v1",  # octal
    "http://0xa9fea9fe/v1",  # hexadecimal
    "http://0xa9.0xfe.0xa9.0xfe/v1",
    "http://169.254.43518/v1",  # inet_aton's short form
    "http://\uff11\uff16\uff19.\uff12\uff15\uff14.\uff11\uff16\uff19.\uff12\uff15\uff14/v1",  # full-width
    "http://169\u3002254\u3002169\u3002254/v1",  # ideographic full stops
    "http://\uff4d\uff45\uff54\uff41\uff44\uff41\uff54\uff41.google.internal/v1",
]


@pytest.mark.parametrize("url", METADATA_SPELLINGS)
def test_yaml_refuses_every_spelling_of_a_metadata_address(url):
    text = f"""
pools:
  - name: main
    assignments:
      - name: acct-a
        adapter: openai
        base_url: "{url}"
"""
    result = parse_config(text, env={})
    assert [(e.path, e.code) for e in result.errors] == [
        ("pools[0].assignments[0].base_url", IssueCode.INVALID)
    ]
    assert "link-local or cloud-metadata" in result.errors[0].message


@pytest.mark.django_db
@pytest.mark.parametrize("url", METADATA_SPELLINGS)
def test_the_admin_refuses_every_spelling_of_a_metadata_address(client, url):
    account = AssignmentFactory(base_url="http://127.0.0.1:9101/v1")
    client.force_login(make_user("root", superuser=True))
    page = reverse("admin:pools_assignment_change", args=[account.pk])
    assert client.post(page, form_data(client, page, base_url=url)).status_code == 200
    assert Assignment.objects.get(pk=account.pk).base_url == "http://127.0.0.1:9101/v1"
    with pytest.raises(Exception, match=r"link-local"):
        Assignment(pool=account.pool, name="other", adapter=account.adapter, base_url=url).full_clean()


def test_an_address_the_http_client_cannot_connect_to_is_refused_when_written():
    """`2130706433` is 127.0.0.1, allowed, but the client sends nothing to that spelling."""
    result = parse_config(
        "pools:\n  - name: main\n    assignments:\n      - name: a\n        adapter: openai\n"
        '        base_url: "http://2130706433:8000/v1"\n',
        env={},
    )
    assert [e.path for e in result.errors] == ["pools[0].assignments[0].base_url"]


@pytest.mark.parametrize("spelling", ["http://2852039166/v1", "http://2130706433:{port}/v1"])
def test_a_base_url_refused_before_sending_is_not_sent_and_the_next_account_serves(
    gateway_nodes, two_assignments, spelling
):
    """Written around validation (raw SQL, an old release): a metadata address in decimal is refused by
    the shared check at dispatch, and the decimal spelling of the fake's own loopback address by the HTTP
    client; either way nothing was sent, so the attempt is `not_sent` and the next account serves (it
    was `dispatch_unknown`, a 504 without failover)."""
    a, b, (acct_a, _) = two_assignments
    url = spelling.format(port=a.base_url.rsplit(":", 1)[1].split("/", 1)[0])
    Assignment.objects.filter(pk=acct_a.pk).update(base_url=url)
    b.script("gpt-5", serve("from b"))
    (base,) = gateway_nodes.start(1)
    response = post(base, "/v1/chat/completions", CHAT)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "from b"
    assert a.hit_count() == 0
    first = Attempt.objects.get(request=record_of(response), ordinal=1)
    assert first.dispatch_state == "not_sent"
    assert responsive(base)

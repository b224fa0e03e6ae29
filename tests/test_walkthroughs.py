"""The README's four extension walkthroughs (*Contributing: extending the gateway*, issue 46 point 5), each
followed with a toy: a provider and a client API added through their registries and serving requests
through the gateway from a loopback fake, a routing rule that changes a decision, an operator page that
staff reach and nobody else does. Each test fails when the step it follows stops being true; and every
path the walkthroughs name exists, so they cannot go stale unseen."""

import importlib
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import replace
from operator import attrgetter
from pathlib import Path

import httpx
import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission, User
from django.core.exceptions import PermissionDenied
from django.core.management import call_command
from django.http import HttpResponseNotAllowed
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, clear_url_caches, path, reverse

from catalog.models import Provenance
from devkit.upstream import FakeUpstream
from pools.models import Adapter
from proxy import relay, views
from proxy.ledger.models import RequestRecord
from proxy.wire.apis import chat
from proxy.wire.apis import registry as apis
from proxy.wire.providers import openai_compatible
from proxy.wire.providers import registry as providers
from proxy.wire.providers.base import (
    CHAT,
    EMBEDDINGS,
    MESSAGES,
    NO_HEADERS,
    Json,
    ModelPage,
    UpstreamCall,
    data_ids,
    json_headers,
    url,
)
from proxy.wire.sse import Dialect
from routing.management.commands.routing_explain import Command as RoutingExplain
from routing.policy import auto, eligibility, preference
from routing.policy.eligibility import Verdict
from routing.policy.failures import ErrorShape
from routing.policy.plan import Plan, build_plan
from routing.policy.route import Target
from routing.policy.types import Candidate, IneligibleReason, Requirements
from routing.policy.vocabulary import ClientRoute
from tests.factories import AssignmentFactory, CatalogEntryFactory, GatewayKeyFactory, PoolFactory
from tests.gateway_fixtures import GATEWAY_KEY

REPO = Path(__file__).resolve().parent.parent
AUTH = {"authorization": f"Bearer {GATEWAY_KEY}"}
TOY_KEY = "toy-upstream-key-7f3a"
TOY_ENV = "GATEWAY_UPSTREAM_TOY"
TOY_MODEL = "toy-model"


# -- 1. a new provider --------------------------------------------------------------------------------


class ToyProvider:
    """A provider as the walkthrough's step 2 writes one: it carries Chat and embeddings only, sends its
    credential as `x-api-key` and its protocol header, and passes on the client's forwarded headers."""

    name = Adapter.OPENAI_COMPATIBLE.value  # the slot it is lent: a test cannot add an Adapter value
    routes = frozenset({CHAT, EMBEDDINGS})
    protocol: Mapping[str, str] = {"x-toy-protocol": "1"}
    errors = ErrorShape()

    def auth_headers(self, credential: str) -> dict[str, str]:
        return {"x-api-key": credential, **self.protocol} if credential else {}

    def call(
        self,
        path: str,
        target: Target,
        body: Json,
        *,
        model: str,
        requirements: Requirements,
        credential: str,
        created: int,
        response_id: str = "",
        client_headers: Mapping[str, str] = NO_HEADERS,
    ) -> UpstreamCall:
        headers = json_headers(self.auth_headers(credential))
        headers.update({f"x-toy-client-{name}": value for name, value in client_headers.items()})
        dialect = Dialect.CHAT if path == CHAT else Dialect.RESPONSES  # as OpenAI's module has it
        return UpstreamCall(
            url(target.base_url, path), headers, {**body, "model": model}, dialect, path, model
        )

    def models_url(self, base_url: str) -> str:
        return url(base_url, "/models")

    def model_page(self, payload: object) -> ModelPage:
        return ModelPage(data_ids(payload))


@pytest.fixture
def toy_provider(monkeypatch) -> Iterator[ToyProvider]:
    """The toy as the registry's `openai_compatible` provider: step 3 (its module's `PROVIDER` in
    `_ALL`) done by setting that module's PROVIDER and re-reading the registry, whose PROVIDERS and
    CARRIERS are built at import; afterwards the real one is put back and the registry re-read."""
    toy = ToyProvider()
    with monkeypatch.context() as patch:
        patch.setattr(openai_compatible, "PROVIDER", toy)
        importlib.reload(providers)
        yield toy
    importlib.reload(providers)


@pytest.fixture
def toy_account(gateway, fake_upstream_factory, monkeypatch) -> FakeUpstream:
    """One `openai_compatible` account on a fake that takes only TOY_KEY, serving TOY_MODEL to the e2e key."""
    monkeypatch.setenv(TOY_ENV, TOY_KEY)
    fake = fake_upstream_factory("toy", models=(TOY_MODEL,), require_key=TOY_KEY)
    pool = PoolFactory(name="toys")
    account = AssignmentFactory(
        pool=pool, name="toy", adapter=Adapter.OPENAI_COMPATIBLE, base_url=fake.base_url, api_key_env=TOY_ENV
    )
    CatalogEntryFactory(assignment=account, model=TOY_MODEL, provenance=Provenance.CONFIGURED)
    GatewayKeyFactory(name="e2e", raw_key=GATEWAY_KEY, pools=[pool])
    return fake


def test_the_toy_provider_is_registered_as_every_provider_is(toy_provider):
    assert providers.provider(Adapter.OPENAI_COMPATIBLE) is toy_provider
    assert set(providers.PROVIDERS) == set(Adapter.values)  # still one provider per Adapter value
    # Eligibility's carrier table is derived from the providers' `routes`.
    assert Adapter.OPENAI_COMPATIBLE in providers.carriers(CHAT)
    assert Adapter.OPENAI_COMPATIBLE not in providers.carriers(MESSAGES)


def test_the_toy_provider_serves_a_request_through_the_gateway(toy_provider, toy_account, gateway):
    chat_body = {"model": TOY_MODEL, "messages": [{"role": "user", "content": "hi"}]}
    response = httpx.post(f"{gateway}/v1/chat/completions", json=chat_body, headers=AUTH)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"]
    (hit,) = toy_account.hits
    # The toy's call built this request: its credential header and protocol, never OpenAI's bearer.
    assert (hit.path, hit.headers["x-api-key"], hit.headers["x-toy-protocol"]) == (
        "/v1/chat/completions",
        TOY_KEY,
        "1",
    )
    assert "authorization" not in hit.headers
    # A route the toy does not declare never reaches it (the real openai_compatible translates Messages).
    messages_body = {"model": TOY_MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    refused = httpx.post(f"{gateway}/v1/messages", json=messages_body, headers=AUTH)
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["message"] == "no eligible backend: capability"
    assert len(toy_account.hits) == 1


# -- 2. a new client API --------------------------------------------------------------------------------


class ToyApi(chat.Chat):
    """A client API whose envelope, turn requirements and forwarded header are its own (Chat's stream
    rules, since the route it is given does not stream)."""

    forwarded_headers = ("x-toy-flag",)

    def turn_requirements(self, body: Json, body_size: int) -> Requirements:
        return replace(super().turn_requirements(body, body_size), vision=body.get("toy_vision") is True)

    def error_body(self, *, type: str, code: str | None, param: str | None, message: str) -> bytes:
        return json.dumps({"toy_error": {"code": code, "param": param}}).encode()


@pytest.fixture
def toy_api(monkeypatch) -> ToyApi:
    """The toy in the client API registry (step 3) for `/v1/embeddings`: a relayed route with no API of
    its own (a ClientRoute member cannot be added in a test)."""
    api = ToyApi()
    assert apis.api_for(ClientRoute.EMBEDDINGS) is chat.API  # Chat's, until one is registered
    monkeypatch.setitem(apis.APIS, ClientRoute.EMBEDDINGS, api)
    return api


def test_the_relayed_routes_are_listed_once_in_the_client_api_registry():
    assert frozenset(apis.RELAYED) == views.PROXIED  # the routes the ASGI edge serves
    parser = RoutingExplain().create_parser("manage.py", "routing_explain")
    route = next(a for a in parser._actions if a.dest == "route")
    assert route.choices == [r.tail for r in apis.RELAYED]
    assert set(apis.APIS) <= set(apis.RELAYED)
    assert all(providers.carriers(r.tail) for r in apis.RELAYED)


def test_the_toy_api_answers_its_route_through_the_gateway(toy_api, toy_provider, toy_account, gateway):
    body = {"model": TOY_MODEL, "input": "hi"}
    served = httpx.post(
        f"{gateway}/v1/embeddings", json=body, headers={**AUTH, "x-toy-flag": "on", "x-other": "1"}
    )
    assert served.status_code == 200, served.text
    assert len(served.json()["data"]) == 1
    (hit,) = toy_account.hits
    # Its forwarded header reached the provider's call, and no other client header did.
    assert hit.headers.get("x-toy-client-x-toy-flag") == "on"
    assert not any(name.startswith("x-toy-client-x-other") for name in hit.headers)
    # The gateway's own errors on the route are in its envelope.
    unknown = httpx.post(f"{gateway}/v1/embeddings", json={**body, "model": "nope"}, headers=AUTH)
    assert unknown.status_code == 404
    assert unknown.json() == {"toy_error": {"code": "model_not_found", "param": None}}
    # Its turn's requirements gate the route: the toy account's vision is unknown.
    gated = httpx.post(f"{gateway}/v1/embeddings", json={**body, "toy_vision": True}, headers=AUTH)
    assert gated.json() == {"toy_error": {"code": "no_eligible_backend", "param": "capability"}}
    assert len(toy_account.hits) == 1


# -- 3. a new routing rule --------------------------------------------------------------------------------

QUARANTINED = "acct-a"


def _toy_gate(original):
    """A gate as step 2 adds one to `evaluate`: an account named QUARANTINED is never eligible (the toy
    reuses the `capability` reason: an IneligibleReason member cannot be added in a test)."""

    def evaluate(candidate: Candidate, requirements: Requirements) -> Verdict:
        verdict = original(candidate, requirements)
        if candidate.assignment != QUARANTINED:
            return verdict
        return replace(verdict, reasons=(IneligibleReason.CAPABILITY, *verdict.reasons))

    return evaluate


def _toy_key_over(original):
    """A preference key as the walkthrough adds one: the higher tier first, then the usual order."""

    def key(candidate: Candidate):
        return (-candidate.tier, *original(candidate))

    return key


def _toy_gate_in(monkeypatch) -> None:
    """Step 2: the gate in `evaluate`, and the field it reads (the account's name) in `GATED_FIELDS`."""
    monkeypatch.setattr(eligibility, "evaluate", _toy_gate(eligibility.evaluate))
    fields = (*eligibility.GATED_FIELDS, "assignment")
    monkeypatch.setattr(eligibility, "GATED_FIELDS", fields)
    monkeypatch.setattr(eligibility, "contract", attrgetter(*fields))


A = Candidate(assignment_id=1, model="m", assignment=QUARANTINED, tier=0)
B = Candidate(assignment_id=2, model="m", assignment="acct-b", tier=1)


def _plan() -> Plan:
    plan = build_plan(primary=[A, B], requirements=Requirements(), allowed_models=["*"], max_attempts=3)
    assert isinstance(plan, Plan)
    return plan


def test_evaluate_is_the_one_gate_of_the_plan_the_relay_and_auto():
    assert relay.evaluate is eligibility.evaluate and auto.evaluate is eligibility.evaluate


def test_a_toy_gate_in_evaluate_changes_the_plan(monkeypatch):
    assert [c.assignment for c in _plan().order] == [QUARANTINED, "acct-b"]
    _toy_gate_in(monkeypatch)
    plan = _plan()
    assert [c.assignment for c in plan.order] == ["acct-b"]
    assert [(v.candidate.assignment, v.reasons) for v in plan.ineligible] == [
        (QUARANTINED, (IneligibleReason.CAPABILITY,))
    ]


def test_a_toy_preference_key_changes_the_order_and_the_shares(monkeypatch):
    assert [c.assignment for c in preference.order([A, B])] == [QUARANTINED, "acct-b"]
    monkeypatch.setattr(preference, "preference_key", _toy_key_over(preference.preference_key))
    assert [c.assignment for c in preference.order([A, B])] == ["acct-b", QUARANTINED]
    assert [c.assignment for c in _plan().order] == ["acct-b", QUARANTINED]
    assert preference.shares([A, B]) == {B.key: 1.0, A.key: 0.0}


@pytest.mark.parametrize("rule", ["gate", "preference"])
def test_a_toy_routing_rule_changes_who_serves_a_request(rule, monkeypatch, gateway, two_assignments):
    a, b, _ = two_assignments
    if rule == "gate":
        _toy_gate_in(monkeypatch)
    else:
        monkeypatch.setattr(preference, "preference_key", _toy_key_over(preference.preference_key))
    body = {"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]}
    response = httpx.post(f"{gateway}/v1/chat/completions", json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    # acct-a (tier 0) would serve it; the rule sends it to acct-b.
    assert (a.hit_count(), b.hit_count()) == (0, 1)


# -- 4. a new operator page -------------------------------------------------------------------------------

TEMPLATE = """{% extends "admin/base_site.html" %}
{% block content %}<p class="toy-page">toy page: {{ records }} records</p>{% endblock %}
"""


class ToyPage:
    """An operator page as step 1 writes one (`proxy/console/spend.py`'s shape)."""

    name = "Toy"
    url_name = "toy"
    model = RequestRecord
    template_name = "admin/toy/index.html"

    def __init__(self, admin_site: admin.AdminSite) -> None:
        self.admin_site = admin_site

    def get_urls(self):
        return [path("toy/", self.admin_site.admin_view(self.view), name=self.url_name)]

    def view(self, request):
        if request.method not in ("GET", "HEAD"):
            return HttpResponseNotAllowed(["GET", "HEAD"])
        records = self.admin_site._registry.get(RequestRecord)
        if records is None or not records.has_view_permission(request):
            raise PermissionDenied
        context = {**self.admin_site.each_context(request), "title": "Toy", "records": 0}
        return TemplateResponse(request, self.template_name, context)


def _read_urls() -> None:
    clear_url_caches()
    importlib.reload(importlib.import_module("gatewaysite.urls"))


@pytest.fixture
def toy_page(settings, tmp_path) -> Iterator[type[ToyPage]]:
    """The toy registered as `proxy/admin.py` registers its pages (step 2), its template where step 3
    puts one; the URLconf read again, as it is read once at start, after the admin modules."""
    (tmp_path / "admin" / "toy").mkdir(parents=True)
    (tmp_path / "admin" / "toy" / "index.html").write_text(TEMPLATE)
    settings.TEMPLATES = [{**settings.TEMPLATES[0], "DIRS": [*settings.TEMPLATES[0]["DIRS"], tmp_path]}]
    pages = list(admin.site._pages)
    reverse("admin:index")  # the URLconf is read, as at a server's first request
    admin.site.register_page(ToyPage)
    try:
        # Registered after that, a page is not routed: which is why proxy/admin.py, imported before the
        # URLconf, is where pages are registered.
        with pytest.raises(NoReverseMatch):
            reverse("admin:toy")
        _read_urls()
        yield ToyPage
    finally:
        admin.site._pages[:] = pages
        _read_urls()


@pytest.mark.django_db
def test_the_toy_page_is_staff_only_and_listed_under_operations(toy_page, client):
    url = reverse("admin:toy")
    assert url == "/admin/toy/"
    anonymous = client.get(url)
    assert anonymous.status_code == 302 and anonymous["location"].startswith("/admin/login/")

    User.objects.create_user("no-perms", password="pw-toy-1", is_staff=True)
    client.login(username="no-perms", password="pw-toy-1")
    assert client.get(url).status_code == 403

    staff = User.objects.create_user("viewer", password="pw-toy-2", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_requestrecord"))
    client.login(username="viewer", password="pw-toy-2")
    page = client.get(url)
    assert page.status_code == 200 and 'class="toy-page"' in page.content.decode()
    assert client.post(url).status_code == 405
    index = client.get(reverse("admin:index")).content.decode()
    assert 'href="/admin/toy/"' in index and "Operations" in index


def test_the_registered_pages_are_the_console_pages():
    # Step 2's line, as proxy/admin.py has it for the existing pages.
    assert [page.url_name for page in admin.site._pages] == ["upstreams", "spend"]


# -- the walkthroughs' paths ------------------------------------------------------------------------------

SECTION = "## Contributing: extending the gateway"
WALKTHROUGHS = (
    "### A new provider",
    "### A new client API",
    "### A new routing rule",
    "### A new operator page",
)
PATH = re.compile(r"`([a-z][\w.-]*/[\w./<>-]*)`")


def _walkthrough(heading: str) -> str:
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index(SECTION) :]
    section = section[: section.index("\n## ")] if "\n## " in section else section
    start = section.index(heading + "\n")
    end = section.find("\n### ", start + 1)
    return section[start : end if end != -1 else None]


def _exists(name: str) -> bool:
    """A named path exists (a template's name under `templates/`); one with a `<placeholder>` segment
    names a file to create: its folder exists."""
    if "<" in name:
        folder = name[: name.index("<")].rsplit("/", 1)[0]
        return (REPO / folder).is_dir()
    return (REPO / name).exists() or (REPO / "templates" / name).is_file()


@pytest.mark.parametrize("heading", WALKTHROUGHS)
def test_every_path_a_walkthrough_names_exists(heading):
    named = PATH.findall(_walkthrough(heading))
    assert len(set(named)) >= 8, named  # the walkthrough names the files it touches
    assert [name for name in named if not _exists(name)] == []


def test_the_path_check_catches_a_missing_file():
    assert _exists("proxy/wire/providers/registry.py") and _exists("proxy/console/<name>.py")
    assert not _exists("proxy/wire/providers/registries.py") and not _exists("proxy/consoles/<name>.py")


def test_the_config_reference_is_what_the_provider_walkthrough_says_to_regenerate(capsys):
    call_command("config_reference")
    assert "`openai_compatible`" in capsys.readouterr().out  # the adapter list is generated

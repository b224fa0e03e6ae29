"""Admin and API security (SPEC §9, §11): every admin page needs a staff login, every admin write
needs a CSRF token (the login itself included), the security headers settings.py configures are on
admin responses and `nosniff` on the API's, and no client-facing error carries a stack trace or an
internal message, with DJANGO_DEBUG=false as the test settings run.

Admin pages go through Django's test client (the same middleware chain as production); the API and
the headers a browser really sees go over a real socket to the ASGI app under uvicorn, since `/v1/`
runs on a middleware-free handler (gatewaysite/asgi.py).
"""

import json
import re

import httpx
import pytest
from django.conf import settings
from django.contrib import admin
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from pools.models import Assignment, GatewayKey, Pool
from proxy.relay import Relay
from tests.admin.conftest import PASSWORD
from tests.proxy.fixtures_e2e import AUTH, CHAT, RESPONSES, TIMEOUT, ledger_settled

LOGIN = "/admin/login/"
INTERNAL = "internal-detail-canary-4d8e2a"  # an exception message a gateway bug might carry
STACK_TRACE_MARKS = ("Traceback", 'File "', "RuntimeError", INTERNAL)


@pytest.fixture
def rows(db):
    pool = Pool.objects.create(name="main")
    assignment = Assignment.objects.create(
        pool=pool,
        name="acct-a",
        adapter="openai",
        base_url="http://127.0.0.1:9/v1",
        api_key_env="GATEWAY_UPSTREAM_ACCT_A",
    )
    key = GatewayKey(name="ci", allowed_models=["*"])
    key.set_key("sk-gw-security-canary-0123456789")
    key.save()
    return {"pool": pool, "assignment": assignment, "key": key}


def admin_pages(rows) -> list[str]:
    pool, assignment, key = rows["pool"], rows["assignment"], rows["key"]
    return [
        "/admin/",
        reverse("admin:upstreams"),
        reverse("admin:pools_pool_changelist"),
        reverse("admin:pools_assignment_changelist"),
        reverse("admin:pools_gatewaykey_changelist"),
        reverse("admin:routing_circuit_changelist"),
        reverse("admin:proxy_requestrecord_changelist"),
        reverse("admin:pools_pool_change", args=[pool.pk]),
        reverse("admin:pools_assignment_change", args=[assignment.pk]),
        reverse("admin:pools_gatewaykey_change", args=[key.pk]),
        reverse("admin:pools_gatewaykey_add"),
        reverse("admin:pools_pool_delete", args=[pool.pk]),
        reverse("admin:password_change"),
    ]


def csrf_token_of(page) -> str:
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode())
    assert match, "the form carries no CSRF token"
    return match.group(1)


def logged_in(client: Client) -> bool:
    return client.get("/admin/").status_code == 200


# --- authentication ------------------------------------------------------------------------------


def test_every_admin_page_sends_an_anonymous_user_to_the_login_page(client, rows):
    for url in admin_pages(rows):
        response = client.get(url)
        assert response.status_code == 302, url
        assert response.url == f"{LOGIN}?next={url}", url
    # The login page itself shows nothing of the gateway's configuration.
    html = client.get(LOGIN).content.decode()
    for secret in ("acct-a", "127.0.0.1:9", rows["key"].prefix):
        assert secret not in html


def test_a_non_staff_user_is_sent_to_the_login_page(client, rows):
    client.force_login(User.objects.create_user("outsider", password=PASSWORD, is_staff=False))
    for url in admin_pages(rows):
        response = client.get(url)
        assert response.status_code == 302, url
        assert response.url.startswith(LOGIN), url


def test_an_anonymous_post_to_a_change_form_changes_nothing(client, rows):
    pool = rows["pool"]
    url = reverse("admin:pools_pool_change", args=[pool.pk])
    response = client.post(url, {"name": "renamed", "auto_models": "[]"})
    assert response.status_code == 302 and response.url.startswith(LOGIN)
    delete = reverse("admin:pools_pool_delete", args=[pool.pk])
    assert client.post(delete, {"post": "yes"}).status_code == 302
    pool.refresh_from_db()
    assert pool.name == "main"


# --- CSRF ----------------------------------------------------------------------------------------


@pytest.fixture
def csrf_client() -> Client:
    return Client(enforce_csrf_checks=True)


@pytest.fixture
def superuser(db) -> User:
    return User.objects.create_superuser("root", password=PASSWORD)


def test_logging_in_without_a_csrf_token_is_403(csrf_client, superuser):
    response = csrf_client.post(LOGIN, {"username": "root", "password": PASSWORD, "next": "/admin/"})
    assert response.status_code == 403
    assert not logged_in(csrf_client)


def test_logging_in_with_a_token_that_does_not_match_the_cookie_is_403(csrf_client, superuser):
    csrf_client.get(LOGIN)  # sets the CSRF cookie
    forged = "x" * 64
    credentials = {"username": "root", "password": PASSWORD, "csrfmiddlewaretoken": forged}
    assert csrf_client.post(LOGIN, credentials).status_code == 403
    assert not logged_in(csrf_client)


def test_a_token_without_its_cookie_is_403(csrf_client, superuser):
    token = csrf_token_of(Client().get(LOGIN))  # another browser's token
    credentials = {"username": "root", "password": PASSWORD, "csrfmiddlewaretoken": token}
    assert csrf_client.post(LOGIN, credentials).status_code == 403
    assert not logged_in(csrf_client)


def test_logging_in_with_the_token_from_the_login_form_works(csrf_client, superuser):
    token = csrf_token_of(csrf_client.get(LOGIN))
    credentials = {"username": "root", "password": PASSWORD, "csrfmiddlewaretoken": token, "next": "/admin/"}
    response = csrf_client.post(LOGIN, credentials)
    assert response.status_code == 302 and response.url == "/admin/"
    assert logged_in(csrf_client)


def test_a_wrong_password_with_a_valid_token_does_not_log_in(csrf_client, superuser):
    token = csrf_token_of(csrf_client.get(LOGIN))
    credentials = {"username": "root", "password": "wrong", "csrfmiddlewaretoken": token}
    assert csrf_client.post(LOGIN, credentials).status_code == 200  # the form again, with its error
    assert not logged_in(csrf_client)


def test_a_staff_users_change_without_a_csrf_token_is_403_and_changes_nothing(csrf_client, superuser, rows):
    pool = rows["pool"]
    csrf_client.force_login(superuser)
    url = reverse("admin:pools_pool_change", args=[pool.pk])
    form = csrf_client.get(url)
    assert form.status_code == 200
    change = {"name": "renamed", "auto_models": "[]", "assignments-TOTAL_FORMS": "0"}
    change |= {"assignments-INITIAL_FORMS": "0", "_save": "Save"}
    assert csrf_client.post(url, change).status_code == 403
    pool.refresh_from_db()
    assert pool.name == "main"
    # The same form with its token goes through: the 403 above was the CSRF check and nothing else.
    management = re.findall(r'name="([^"]+-(?:TOTAL|INITIAL)_FORMS)" value="(\d+)"', form.content.decode())
    assert management, "the change form has no inline management form"
    assignment_fields = _inline_fields(form.content.decode())
    response = csrf_client.post(
        url, {**change, **dict(management), **assignment_fields, "csrfmiddlewaretoken": csrf_token_of(form)}
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    pool.refresh_from_db()
    assert pool.name == "renamed"


def _inline_fields(html: str) -> dict[str, str]:
    """The inline assignment rows' current values, as the browser would post them back."""
    fields = {}
    for name, value in re.findall(r'<input[^>]*name="(assignments-\d+-[^"]+)"[^>]*value="([^"]*)"', html):
        fields[name] = value
    for name, body in re.findall(
        r'<select[^>]*name="(assignments-\d+-[^"]+)"[^>]*>(.*?)</select>', html, re.S
    ):
        selected = re.search(r'<option value="([^"]*)"[^>]*selected', body)
        fields[name] = selected.group(1) if selected else ""
    for name in re.findall(r'<input type="checkbox" name="(assignments-\d+-[^"]+)"[^>]*checked', html):
        fields[name] = "on"
    return fields


def test_a_staff_users_delete_and_add_without_a_csrf_token_are_403(csrf_client, superuser, rows):
    csrf_client.force_login(superuser)
    delete = reverse("admin:pools_pool_delete", args=[rows["pool"].pk])
    assert csrf_client.post(delete, {"post": "yes"}).status_code == 403
    add = reverse("admin:pools_gatewaykey_add")
    new_key = {"name": "sneaky", "raw_key": "sk-gw-sneaky-0123456789abcdef", "allowed_models": '["*"]'}
    assert csrf_client.post(add, new_key).status_code == 403
    assert Pool.objects.filter(pk=rows["pool"].pk).exists()
    assert not GatewayKey.objects.filter(name="sneaky").exists()


def test_logging_out_without_a_csrf_token_is_403_and_keeps_the_session(csrf_client, superuser):
    csrf_client.force_login(superuser)
    assert csrf_client.post(reverse("admin:logout")).status_code == 403
    assert logged_in(csrf_client)


# --- security headers and cookies ----------------------------------------------------------------

# What settings.py configures, and Django's SecurityMiddleware adds.
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
}


def test_the_suite_runs_with_the_production_security_settings():
    assert (settings.SECURE_CONTENT_TYPE_NOSNIFF, settings.X_FRAME_OPTIONS) == (True, "DENY")
    assert (settings.SECURE_REFERRER_POLICY, settings.SECURE_CROSS_ORIGIN_OPENER_POLICY) == (
        "same-origin",
        "same-origin",
    )
    assert settings.DEBUG is False  # the test run is the production configuration


def test_admin_responses_carry_the_security_headers(client, superuser, rows):
    anonymous = [client.get(LOGIN), client.get("/admin/"), client.get(reverse("admin:upstreams"))]
    client.force_login(superuser)
    pages = [*anonymous, *(client.get(url) for url in admin_pages(rows))]
    assert {p.status_code for p in pages} >= {200, 302}
    for page in pages:
        for name, value in SECURITY_HEADERS.items():
            assert page.headers.get(name) == value, (page.wsgi_request.path, name, page.headers)


def test_admin_pages_are_never_cached(client, superuser, rows):
    client.force_login(superuser)
    # Django's own password change form is the one admin page it marks cacheable.
    for url in set(admin_pages(rows)) - {reverse("admin:password_change")}:
        cache_control = client.get(url).headers.get("Cache-Control", "")
        assert {"no-store", "private"} <= {part.strip() for part in cache_control.split(",")}, url


def test_the_session_and_csrf_cookies_are_not_readable_cross_site(csrf_client, superuser):
    token = csrf_token_of(csrf_client.get(LOGIN))
    csrf_cookie = csrf_client.cookies[settings.CSRF_COOKIE_NAME]
    assert csrf_cookie["samesite"] == "Lax"
    csrf_client.post(LOGIN, {"username": "root", "password": PASSWORD, "csrfmiddlewaretoken": token})
    session = csrf_client.cookies[settings.SESSION_COOKIE_NAME]
    assert session["httponly"] is True
    assert session["samesite"] == "Lax"


# Over a real socket: what a browser or an API client of the running ASGI app actually gets.


def test_admin_and_health_over_the_asgi_app_carry_the_security_headers(gateway):
    for path in ("/admin/", LOGIN, "/healthz"):
        response = httpx.get(f"{gateway}{path}", timeout=TIMEOUT)
        assert response.status_code in (200, 302), path
        for name, value in SECURITY_HEADERS.items():
            assert response.headers.get(name) == value, (path, name, dict(response.headers))


@pytest.mark.parametrize(
    ("path", "body", "headers"),
    [
        ("/v1/chat/completions", CHAT, AUTH),
        ("/v1/chat/completions", {**CHAT, "stream": True}, AUTH),
        ("/v1/responses", RESPONSES, AUTH),
        ("/v1/chat/completions", {"model": "no-such-model", "messages": []}, AUTH),
        ("/v1/chat/completions", {"messages": []}, AUTH),
        ("/v1/chat/completions", CHAT, {}),
        ("/v1/messages", {"model": "gpt-5", "max_tokens": 5, "messages": []}, {}),
    ],
    ids=["json", "sse", "responses", "404-typed", "400-typed", "401-typed", "anthropic-401"],
)
def test_proxied_api_responses_are_nosniff(gateway, two_assignments, path, body, headers):
    response = httpx.post(f"{gateway}{path}", json=body, headers=headers, timeout=TIMEOUT)
    assert response.headers["x-content-type-options"] == "nosniff", (response.status_code, response.headers)
    assert response.headers["x-gateway-request-id"]
    ledger_settled()


@pytest.mark.parametrize(
    ("method", "path", "headers"),
    [
        pytest.param("GET", "/v1/models", AUTH, id="models"),
        pytest.param("GET", "/v1/models", {}, id="models-401"),
        pytest.param("GET", "/v1/no-such-route", AUTH, id="unknown-path-404"),
        pytest.param("GET", "/v1/chat/completions", AUTH, id="wrong-method-405"),
    ],
)
def test_every_other_api_response_is_nosniff(gateway, two_assignments, method, path, headers):
    response = httpx.request(method, f"{gateway}{path}", headers=headers, timeout=TIMEOUT)
    assert response.headers.get("x-content-type-options") == "nosniff", (
        response.status_code,
        response.headers,
    )


# --- error bodies --------------------------------------------------------------------------------
# Provider messages never reaching a client is tested per transport (tests/proxy/test_http_failover.py,
# test_controls.py, test_websocket.py) and in storage and logs (test_canary.py). Here: a gateway bug.


def assert_no_internals(text: str, where: object) -> None:
    for mark in STACK_TRACE_MARKS:
        assert mark not in text, (where, mark, text[:500])


@pytest.fixture
def relay_bug(monkeypatch):
    """Every relay raises, as a bug in the attempt loop would, with an internal detail in its message."""

    async def run(self):
        raise RuntimeError(f"{INTERNAL}: {self!r}")

    monkeypatch.setattr(Relay, "run", run)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", CHAT),
        ("/v1/chat/completions", {**CHAT, "stream": True}),
        ("/v1/responses", {**RESPONSES, "stream": True}),
        (
            "/v1/messages",
            {"model": "gpt-5", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
        ),
    ],
    ids=["chat", "chat-sse", "responses-sse", "anthropic"],
)
def test_a_gateway_bug_on_the_api_shows_no_stack_trace(gateway, two_assignments, relay_bug, path, body):
    response = httpx.post(f"{gateway}{path}", json=body, headers=AUTH, timeout=TIMEOUT)
    assert response.status_code == 500
    # The API's typed error in the route's envelope, not Django's HTML page.
    if path == "/v1/messages":
        assert response.json()["error"]["type"] == "api_error"
    else:
        assert response.json()["error"]["code"] == "internal_error"
    assert_no_internals(response.text, path)
    assert_no_internals(json.dumps(dict(response.headers)), path)
    a, b, _ = two_assignments
    assert a.hits == [] and b.hits == []


def test_a_gateway_bug_on_the_websocket_closes_with_1011_and_no_details(gateway, two_assignments, relay_bug):
    url = gateway.replace("http://", "ws://") + "/v1/responses"
    received = []
    with connect(url, additional_headers=AUTH, open_timeout=5) as ws:
        ws.send(json.dumps({"type": "response.create", **RESPONSES}))
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                received.append(ws.recv(timeout=10))
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1011, "internal error")
    for frame in received:
        assert_no_internals(frame, "frame")


def test_an_admin_error_page_shows_no_stack_trace(superuser, rows, monkeypatch):
    """With DEBUG off, a bug behind an admin page is Django's bare 500 page."""

    def broken(request):
        raise RuntimeError(INTERNAL)

    monkeypatch.setattr(admin.site._registry[Pool], "get_queryset", broken)
    client = Client(raise_request_exception=False)
    client.force_login(superuser)
    response = client.get(reverse("admin:pools_pool_changelist"))
    assert response.status_code == 500
    assert_no_internals(response.content.decode(), "admin 500")


@pytest.mark.parametrize("path", ["/no-such-page", "/admin/no-such-page/", "/static/no-such-file.css"])
def test_a_404_shows_no_url_configuration(client, superuser, path):
    client.force_login(superuser)
    response = client.get(path, follow=True)
    html = response.content.decode()
    assert response.status_code == 404, path
    for mark in ("URLconf", "urlpatterns", "DEBUG = True", "Traceback", "gatewaysite"):
        assert mark not in html, (path, mark)


@pytest.mark.parametrize(
    ("method", "path", "status", "allow"),
    [
        ("GET", "/v1/no-such-route", 404, None),
        ("GET", "/v1/chat/completions", 405, "POST"),
        ("DELETE", "/v1/models", 405, "GET"),
    ],
)
def test_a_path_or_method_the_api_does_not_serve_gets_a_typed_json_error(
    gateway, two_assignments, method, path, status, allow
):
    response = httpx.request(method, f"{gateway}{path}", headers=AUTH, timeout=TIMEOUT)
    assert response.status_code == status
    assert response.json()["error"]["code"] == {404: "not_found", 405: "method_not_allowed"}[status]
    assert response.headers.get("allow") == allow


def test_a_wrong_method_on_an_anthropic_route_gets_the_anthropic_envelope(gateway, two_assignments):
    response = httpx.get(f"{gateway}/v1/messages", headers=AUTH, timeout=TIMEOUT)
    assert response.status_code == 405
    assert response.json()["type"] == "error"
    assert response.json()["error"]["type"] == "not_found_error"

"""Who may change what in the admin (SPEC §9, §3), tried as a pool operator would: only superusers set an
assignment's base_url or credential or a key's pools; a credential is write-only (never rendered back:
set or not and its last 4 characters); a base_url never points at link-local or metadata addresses, nor
carries userinfo or a query."""

import pytest
from django import forms
from django.urls import reverse

from pools.credentials import credential_of
from pools.models import Assignment, GatewayKey, Pool
from tests.admin.conftest import make_user
from tests.factories import AssignmentFactory, GatewayKeyFactory, PoolFactory

pytestmark = pytest.mark.django_db

SECRET = "sk-admin-canary-credential-Zk41"
OPERATOR_PERMS = (
    "view_pool",
    "change_pool",
    "view_assignment",
    "change_assignment",
    "add_assignment",
    "view_gatewaykey",
    "change_gatewaykey",
    "add_gatewaykey",
)


@pytest.fixture
def pools():
    alpha, bravo = PoolFactory(name="alpha"), PoolFactory(name="bravo")
    a = AssignmentFactory(pool=alpha, name="alpha-acct", base_url="http://127.0.0.1:9101/v1")
    b = AssignmentFactory(pool=bravo, name="bravo-acct", base_url="http://127.0.0.1:9102/v1")
    b.set_credential("sk-bravo-pool-credential-0000")
    b.save()
    return alpha, bravo, a, b


@pytest.fixture
def operator(client, pools):
    client.force_login(make_user("operator", perms=OPERATOR_PERMS, pools=(pools[0],)))
    return client


@pytest.fixture
def root(client):
    client.force_login(make_user("root", superuser=True))
    return client


def form_data(client, url: str, **changes) -> dict:
    """The admin form at `url` as the browser would post it unchanged, with `changes` applied."""
    form = client.get(url).context["adminform"].form
    data = {}
    for name, field in form.fields.items():
        value = form[name].value()
        if isinstance(field, forms.BooleanField):
            if value:
                data[name] = "on"
        elif isinstance(value, list | tuple):
            data[name] = [str(v) for v in value]
        elif value is not None:
            data[name] = value
    data.update(changes)
    return data


def _change(model, pk) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_change", args=[pk])


@pytest.mark.parametrize(
    "change",
    [
        {"base_url": "http://attacker.example/v1"},
        {"api_key_env": "GATEWAY_UPSTREAM_BRAVO"},
        {"new_credential": "sk-chosen-by-the-operator-0000"},
        {"remove_credential": "on"},
    ],
    ids=["base_url", "api_key_env", "credential", "remove-credential"],
)
def test_a_pool_operator_cannot_change_where_or_with_what_an_assignment_calls(operator, pools, change):
    _, _, a, _ = pools
    a.set_credential(SECRET)
    a.save()
    url = _change(Assignment, a.pk)
    html = operator.get(url).content.decode()
    assert (
        'name="base_url"' not in html
        and 'name="new_credential"' not in html
        and 'name="api_key_env"' not in html
    )
    response = operator.post(url, form_data(operator, url, tier="3", **change))
    assert response.status_code == 302, response.content[:2000]
    after = Assignment.objects.get(pk=a.pk)
    assert after.tier == 3  # the operator's own fields do change
    assert (after.base_url, after.api_key_env, after.credential) == (a.base_url, a.api_key_env, a.credential)


def test_a_pool_operator_cannot_add_an_assignment_or_a_key(operator, pools):
    alpha, *_ = pools
    for model in (Assignment, GatewayKey):
        add = reverse(f"admin:pools_{model._meta.model_name}_add")
        assert operator.get(add).status_code == 403
    before = Assignment.objects.count()
    operator.post(
        reverse("admin:pools_assignment_add"),
        {"pool": alpha.pk, "name": "sneaky", "adapter": "openai", "base_url": "http://169.254.169.254/v1"},
    )
    assert Assignment.objects.count() == before


def test_a_pool_operator_cannot_add_a_pool_to_a_key(operator, pools):
    alpha, bravo, *_ = pools
    key = GatewayKeyFactory(name="alpha-key", pools=[alpha])
    url = _change(GatewayKey, key.pk)
    assert 'name="pools"' not in operator.get(url).content.decode()
    response = operator.post(
        url, form_data(operator, url, pools=[str(alpha.pk), str(bravo.pk)], min_quality="0.5")
    )
    assert response.status_code == 302
    key.refresh_from_db()
    assert key.min_quality == 0.5
    assert list(key.pools.all()) == [alpha]


def test_a_superuser_sets_a_credential_that_is_never_shown_back(root, pools):
    _, _, a, _ = pools
    url = _change(Assignment, a.pk)
    response = root.post(url, form_data(root, url, new_credential=SECRET))
    assert response.status_code == 302, response.content[:2000]
    after = Assignment.objects.get(pk=a.pk)
    assert credential_of(after) == SECRET  # what the gateway sends the upstream
    assert SECRET not in after.credential
    pages = [
        url,
        reverse("admin:pools_assignment_changelist"),
        reverse("admin:pools_pool_change", args=[a.pool_id]),
        reverse("admin:upstreams"),
    ]
    for page in pages:
        html = root.get(page).content.decode()
        assert SECRET not in html and after.credential not in html, page
    assert f"…{SECRET[-4:]}" in root.get(url).content.decode()  # set, and which one
    search = root.get(reverse("admin:pools_assignment_changelist"), {"q": SECRET})
    assert search.context["cl"].result_count == 0  # nothing searchable holds it


def test_a_superuser_cannot_store_a_credential_and_name_a_variable_at_once(root, pools):
    _, _, a, _ = pools
    url = _change(Assignment, a.pk)
    response = root.post(url, form_data(root, url, new_credential=SECRET, api_key_env="GATEWAY_UPSTREAM_X"))
    assert response.status_code == 200  # the form again, with the error
    assert Assignment.objects.get(pk=a.pk).credential == ""


def test_a_superuser_cannot_name_a_variable_outside_gateway_upstream(root, pools):
    _, _, a, _ = pools
    url = _change(Assignment, a.pk)
    response = root.post(url, form_data(root, url, api_key_env="DJANGO_SECRET_KEY"))
    assert response.status_code == 200
    assert "GATEWAY_UPSTREAM_" in response.content.decode()
    assert Assignment.objects.get(pk=a.pk).api_key_env == a.api_key_env


FORBIDDEN_URLS = [
    "http://169.254.169.254/latest/meta-data",
    "http://169.254.170.2/v1",
    "http://[fe80::1]/v1",
    "http://[fd00:ec2::254]/v1",
    "http://[::ffff:169.254.169.254]/v1",
    "http://metadata.google.internal/computeMetadata/v1",
    "http://METADATA.GOOGLE.INTERNAL./v1",
    "http://100.100.100.200/v1",
    "https://user:pass@api.openai.com/v1",
    "https://token@api.openai.com/v1",
    "https://api.openai.com/v1?api-key=x",
    "https://api.openai.com/v1#frag",
    "ftp://api.openai.com/v1",
]


@pytest.mark.parametrize("url", FORBIDDEN_URLS)
def test_a_forbidden_base_url_is_refused_in_the_admin(root, pools, url):
    _, _, a, _ = pools
    page = _change(Assignment, a.pk)
    response = root.post(page, form_data(root, page, base_url=url))
    assert response.status_code == 200, url
    assert Assignment.objects.get(pk=a.pk).base_url == a.base_url


@pytest.mark.parametrize("url", FORBIDDEN_URLS)
def test_a_forbidden_base_url_is_refused_in_yaml(url):
    from gatewayconfig.document import IssueCode, parse_config

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


@pytest.mark.parametrize(
    "url",
    [
        "https://api.openai.com/v1",
        "http://127.0.0.1:9101/v1",
        "http://10.0.0.5:8000/v1",
        "http://llm.internal/v1",
    ],
)
def test_ordinary_base_urls_are_accepted(root, pools, url):
    _, _, a, _ = pools
    page = _change(Assignment, a.pk)
    assert root.post(page, form_data(root, page, base_url=url)).status_code == 302
    assert Assignment.objects.get(pk=a.pk).base_url == url


def test_a_base_url_typed_without_a_scheme_is_taken_as_https(root, pools):
    """Django 5's URLField would prepend http: the credential would go to the provider in plaintext."""
    _, _, a, _ = pools
    page = _change(Assignment, a.pk)
    assert root.post(page, form_data(root, page, base_url="api.example.com/v1")).status_code == 302
    assert Assignment.objects.get(pk=a.pk).base_url == "https://api.example.com/v1"


def _inline_data(client, url: str, **changes) -> dict:
    """The pool's change form as posted unchanged, its assignment inline's first row with `changes`."""
    context = client.get(url).context
    data = form_data(client, url)
    (inline,) = context["inline_admin_formsets"]
    formset = inline.formset
    data.update({f"{formset.prefix}-{k}": v for k, v in formset.management_form.initial.items()})
    for form in formset.forms:
        for name in form.fields:
            value = form[name].value()
            if value is True:
                data[form.add_prefix(name)] = "on"
            elif value is not None and value is not False:
                data[form.add_prefix(name)] = str(value)
    first = formset.forms[0]
    data.update({first.add_prefix(name): value for name, value in changes.items()})
    return data


def test_a_base_url_typed_without_a_scheme_in_the_pools_inline_is_taken_as_https(root, pools):
    alpha, _, a, _ = pools
    page = _change(Pool, alpha.pk)
    response = root.post(page, _inline_data(root, page, base_url="api.example.com/v1"))
    assert response.status_code == 302, response.content[:2000]
    assert Assignment.objects.get(pk=a.pk).base_url == "https://api.example.com/v1"


def test_a_pool_operator_cannot_change_what_routes_every_pool(client, pools):
    from pools.models import GatewaySettings, ModelAlias, ModelFallback

    perms = tuple(
        f"{action}_{name}"
        for action in ("view", "add", "change", "delete")
        for name in ("gatewaysettings", "modelalias", "modelfallback")
    )
    client.force_login(make_user("operator", perms=perms, pools=(pools[0],)))
    settings_row = GatewaySettings.load()
    alias = ModelAlias.objects.create(alias="gpt5", canonical="gpt-5")
    fallback = ModelFallback.objects.create(requested="gpt-9", served="gpt-5")
    for model, row in ((GatewaySettings, settings_row), (ModelAlias, alias), (ModelFallback, fallback)):
        assert client.get(_change(model, row.pk)).status_code == 200  # may look
        html = client.get(_change(model, row.pk)).content.decode()
        assert 'type="submit"' not in html or 'name="_save"' not in html
        client.post(
            _change(model, row.pk),
            {
                "alias": "gpt5",
                "canonical": "attacker-model",
                "requested": "gpt-9",
                "served": "attacker-model",
                "max_attempts": "1",
            },
        )
        assert (
            client.post(
                reverse(f"admin:pools_{model._meta.model_name}_delete", args=[row.pk]), {"post": "yes"}
            ).status_code
            == 403
        )
    assert ModelAlias.objects.get(pk=alias.pk).canonical == "gpt-5"
    assert ModelFallback.objects.get(pk=fallback.pk).served == "gpt-5"
    assert GatewaySettings.load().max_attempts == settings_row.max_attempts
    assert client.get(reverse("admin:pools_modelalias_add")).status_code == 403

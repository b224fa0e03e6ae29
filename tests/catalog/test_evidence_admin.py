"""The admin's capability evidence list (SPEC §8.1, §9): read-only, scoped to the operator's pools, and
without anything that starts a qualification."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from catalog.models import CapabilityEvidence
from tests.admin.conftest import make_user
from tests.factories import AssignmentFactory, PoolFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def evidence():
    now = timezone.now()
    rows = {}
    for pool, name, model in (("alpha", "acct-a", "gpt-5-alpha"), ("zeta", "acct-zeta", "zeta-model")):
        assignment = AssignmentFactory(pool=PoolFactory(name=pool), name=name)
        rows[pool] = CapabilityEvidence.objects.create(
            assignment=assignment,
            model=model,
            capability="tools",
            qualified=True,
            detail="ok",
            qualified_at=now,
            expires_at=now + timedelta(days=30),
            corpus_version="qualify-1:abc",
            config_hash="f" * 64,
        )
    return rows


def test_an_operator_sees_only_the_evidence_of_their_pools(client, evidence):
    operator = make_user(
        "operator", perms=("view_capabilityevidence",), pools=(evidence["alpha"].assignment.pool,)
    )
    client.force_login(operator)
    html = client.get(reverse("admin:catalog_capabilityevidence_changelist")).content.decode()
    assert "gpt-5-alpha" in html
    assert "zeta" not in html  # neither the row nor a filter choice
    # The corpus version is on the verdict's page (the list keeps to what fits at 1280 px).
    shown = reverse("admin:catalog_capabilityevidence_change", args=[evidence["alpha"].pk])
    assert "qualify-1:abc" in client.get(shown).content.decode()
    hidden = reverse("admin:catalog_capabilityevidence_change", args=[evidence["zeta"].pk])
    assert client.get(hidden).status_code == 302


def test_evidence_is_read_only_even_for_a_superuser(admin_client, evidence):
    changelist = admin_client.get(reverse("admin:catalog_capabilityevidence_changelist"))
    html = changelist.content.decode()
    assert "gpt-5-alpha" in html and "zeta-model" in html
    assert reverse("admin:catalog_capabilityevidence_add") not in html
    assert 'name="action"' not in html  # no bulk action (not even delete), so nothing to trigger
    assert "qualify" not in html.lower().replace("qualify-1:abc", "").replace("qualified", "")
    row = evidence["alpha"]
    change = admin_client.get(reverse("admin:catalog_capabilityevidence_change", args=[row.pk]))
    assert change.status_code == 200 and 'name="_save"' not in change.content.decode()
    posted = admin_client.post(
        reverse("admin:catalog_capabilityevidence_change", args=[row.pk]), {"qualified": "false"}
    )
    assert posted.status_code == 403
    row.refresh_from_db()
    assert row.qualified is True
    assert admin_client.get(reverse("admin:catalog_capabilityevidence_add")).status_code == 403

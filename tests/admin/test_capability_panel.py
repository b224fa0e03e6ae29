"""/admin/upstreams/ shows, per route and capability, what eligibility uses and why (SPEC §8.1, §9):
qualified (with the evidence's expiry), declared, or unknown; evidence about another configuration of
the route, or expired, is shown as what it is worth: nothing."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from catalog.models import CapabilityEvidence
from catalog.selectors import route_hash
from tests.admin.conftest import upstreams_url
from tests.factories import AssignmentFactory, CatalogEntryFactory, PoolFactory

pytestmark = pytest.mark.django_db
BASE_URL = "http://127.0.0.1:9101/v1"


def cap_line(html: str, model: str, capability: str) -> str:
    row = re.search(rf'<tr data-model="{model}">.*?</tr>', html, re.S).group(0)
    return re.search(
        rf'<span class="cap-line" data-capability="{capability}".*?</span></span>', row, re.S
    ).group(0)


def evidence(assignment, capability, qualified, *, config_hash, age=timedelta(days=1)):
    at = timezone.now() - age
    return CapabilityEvidence.objects.create(
        assignment=assignment,
        model="gpt-5",
        capability=capability,
        qualified=qualified,
        detail="ok" if qualified else "image:expected_answer_missing",
        qualified_at=at,
        expires_at=at + timedelta(days=30),
        corpus_version="qualify-1:abc",
        config_hash=config_hash,
    )


def test_each_capability_shows_its_provenance_and_the_expiry_of_its_evidence(admin_client):
    a = AssignmentFactory(pool=PoolFactory(name="main"), name="acct-a", base_url=BASE_URL, tools="true")
    CatalogEntryFactory(assignment=a, model="gpt-5")
    current = route_hash(adapter="openai", base_url=BASE_URL, model="gpt-5")
    vision = evidence(a, "vision", False, config_hash=current)
    evidence(
        a,
        "role_separation",
        True,
        config_hash=route_hash(adapter="openai", base_url="http://old/v1", model="gpt-5"),
    )
    evidence(a, "write_tools", True, config_hash=current, age=timedelta(days=31))

    html = admin_client.get(upstreams_url()).content.decode()

    tools = cap_line(html, "gpt-5", "tools")
    assert (
        'data-value="true"' in tools and 'data-provenance="declared"' in tools and "data-expires" not in tools
    )
    line = cap_line(html, "gpt-5", "vision")
    assert 'data-value="false"' in line and 'data-provenance="qualified"' in line
    assert f'data-expires="{vision.expires_at.isoformat()}"' in line and "until" in line
    for stale in ("role_separation", "write_tools"):  # another configuration's, or expired
        line = cap_line(html, "gpt-5", stale)
        assert 'data-value="unknown"' in line and 'data-provenance="unknown"' in line
    assert BASE_URL not in html and current not in html

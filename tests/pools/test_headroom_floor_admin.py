"""`headroom_floor` in the admin (SPEC §5.4 headroom): an assignment's own floor on its change form
(empty: the gateway's), the gateway-wide one on the settings' form, both refused outside 0 to 1 with the
field named, and the database refusing what a form would (check constraints)."""

import pytest
from django.contrib.admin.sites import site
from django.db import IntegrityError, transaction
from django.forms.models import model_to_dict
from django.test import RequestFactory

from pools.admin import AssignmentOperatorForm
from pools.models import Assignment, GatewaySettings
from tests.factories import AssignmentFactory


def _assignment_form(assignment: Assignment, floor: str) -> AssignmentOperatorForm:
    data = {k: v for k, v in model_to_dict(assignment).items() if v is not None}
    return AssignmentOperatorForm(data={**data, "headroom_floor": floor}, instance=assignment)


@pytest.mark.django_db
@pytest.mark.parametrize(("floor", "saved"), [("0.3", 0.3), ("0", 0.0), ("1", 1.0), ("", None)])
def test_an_assignments_floor_is_set_on_its_form(floor, saved):
    assignment = AssignmentFactory(headroom_floor=0.5)
    form = _assignment_form(assignment, floor)
    assert form.is_valid(), form.errors
    form.save()
    assignment.refresh_from_db()
    assert assignment.headroom_floor == saved


@pytest.mark.django_db
@pytest.mark.parametrize("floor", ["1.5", "-0.1", "low"])
def test_an_assignments_floor_outside_0_to_1_is_refused_on_its_form(floor):
    form = _assignment_form(AssignmentFactory(), floor)
    assert not form.is_valid()
    assert list(form.errors) == ["headroom_floor"]


@pytest.mark.django_db
@pytest.mark.parametrize(("floor", "valid"), [("0.2", True), ("1.01", False), ("-1", False)])
def test_the_gateway_wide_floor_is_on_the_settings_form(admin_user, floor, valid):
    request = RequestFactory().get("/")
    request.user = admin_user
    settings = GatewaySettings.load()
    form_class = site._registry[GatewaySettings].get_form(request, settings)
    data = {**model_to_dict(settings), "headroom_floor": floor}
    form = form_class(data=data, instance=settings)
    assert form.is_valid() == valid, form.errors
    if not valid:
        assert list(form.errors) == ["headroom_floor"]


@pytest.mark.django_db
def test_the_database_refuses_a_floor_outside_0_to_1():
    assignment = AssignmentFactory()
    with pytest.raises(IntegrityError), transaction.atomic():
        Assignment.objects.filter(pk=assignment.pk).update(headroom_floor=1.5)
    GatewaySettings.load()
    with pytest.raises(IntegrityError), transaction.atomic():
        GatewaySettings.objects.filter(pk=1).update(headroom_floor=-0.5)

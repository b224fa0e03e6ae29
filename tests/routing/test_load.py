"""A pair's recent load (SPEC §5.4, what the draw's choices compare): the ledger writer adds each batch's
served requests to it (one that placed a conversation counts PLACEMENT_LOAD), halving what was there for
every LOAD_HALF_LIFE_S since it was written, in the same one statement as the latency average; the request
path decays it to its own time."""

from datetime import timedelta

import pytest
from django.utils import timezone

from routing.models import Latency
from routing.policy.latency import LOAD_HALF_LIFE_S, PLACEMENT_LOAD, Fold, load_now
from routing.services import latencies_record
from tests.factories import AssignmentFactory

pytestmark = pytest.mark.django_db


def test_the_writer_adds_a_batch_to_the_load_halved_by_its_age():
    a = AssignmentFactory()
    start = timezone.now()
    latencies_record(folds=[Fold(a.pk, "gpt-5", 100.0, 4)], now=start)
    assert Latency.objects.get(assignment=a).load == 4
    latencies_record(folds=[Fold(a.pk, "gpt-5", 100.0, 2)], now=start + timedelta(seconds=LOAD_HALF_LIFE_S))
    assert Latency.objects.get(assignment=a).load == pytest.approx(4 * 0.5 + 2)
    # A clock behind the row's (another node's) never grows what is there.
    latencies_record(folds=[Fold(a.pk, "gpt-5", 100.0, 1)], now=start)
    assert Latency.objects.get(assignment=a).load == pytest.approx(5)


def test_a_request_that_placed_a_conversation_adds_placement_load():
    a, b = AssignmentFactory(), AssignmentFactory()
    start = timezone.now()
    # A new row starts at its batch's load, and an existing one adds it: both spelled on both backends.
    latencies_record(
        folds=[Fold(a.pk, "gpt-5", 100.0, 3, placed=1), Fold(b.pk, "gpt-5", 100.0, 1)], now=start
    )
    assert Latency.objects.get(assignment=a).load == PLACEMENT_LOAD + 2
    latencies_record(
        folds=[Fold(a.pk, "gpt-5", 100.0, 1, placed=1)], now=start + timedelta(seconds=LOAD_HALF_LIFE_S)
    )
    assert Latency.objects.get(assignment=a).load == pytest.approx((PLACEMENT_LOAD + 2) / 2 + PLACEMENT_LOAD)
    assert Latency.objects.get(assignment=b).load == 1


def test_a_load_is_read_as_it_stands_at_the_requests_time():
    written = timezone.now()
    assert load_now(8.0, written, written) == 8.0
    assert load_now(8.0, written, written + timedelta(seconds=2 * LOAD_HALF_LIFE_S)) == pytest.approx(2.0)
    assert load_now(8.0, written, written - timedelta(seconds=5)) == 8.0

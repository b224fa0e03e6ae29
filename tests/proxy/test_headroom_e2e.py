"""Headroom (SPEC §5.4), end to end through the gateway against fake upstreams that send the providers'
rate-limit headers: an account whose answer reports less than `headroom_floor` of a limit left is
demoted until that limit resets, so the next requests go to its sibling before it ever answers 429; on
plain JSON, SSE, the Responses websocket's handshake and a translated route alike. Ample headroom
writes nothing, and `GATEWAY_POOL_FEATURES=false` writes no headroom demotion."""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from devkit.behaviours import rate_limited, unavailable
from pools.models import Assignment, GatewaySettings
from routing.models import Demotion
from tests.proxy.fixtures_e2e import CHAT, RESPONSES, ledger_settled, post, record_of, sse_events, wait_for
from tests.proxy.test_budget import request_path_queries  # noqa: F401 (a fixture)
from tests.proxy.test_websocket import create, open_ws

RESET_S = 30


def openai_headers(remaining: int, limit: int = 100, reset: str = f"{RESET_S}s") -> dict[str, str]:
    """OpenAI's headers: `remaining` of `limit` requests left, tokens ample."""
    return {
        "x-ratelimit-limit-requests": str(limit),
        "x-ratelimit-remaining-requests": str(remaining),
        "x-ratelimit-reset-requests": reset,
        "x-ratelimit-limit-tokens": "100000",
        "x-ratelimit-remaining-tokens": "99000",
        "x-ratelimit-reset-tokens": "60ms",
    }


def anthropic_headers(remaining: int, limit: int = 100) -> dict[str, str]:
    reset = (timezone.now() + timedelta(seconds=RESET_S)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "anthropic-ratelimit-input-tokens-limit": str(limit),
        "anthropic-ratelimit-input-tokens-remaining": str(remaining),
        "anthropic-ratelimit-input-tokens-reset": reset,
    }


def _served_by(response) -> int:
    assert response.status_code == 200, response.text
    return record_of(response).attempts.get(status="succeeded").assignment_id


def _demotion(assignment: Assignment) -> Demotion:
    return wait_for(lambda: Demotion.objects.filter(assignment=assignment).first(), what="a demotion")


def _assert_demoted_until_reset(assignment: Assignment) -> None:
    row = _demotion(assignment)
    assert (row.reason, row.model) == ("headroom", "gpt-5")
    left = (row.until - timezone.now()).total_seconds()
    assert RESET_S - 10 < left <= RESET_S + 1, left  # until the limit's reset, not demotion_seconds (60)


def test_an_account_nearly_spent_is_demoted_and_the_pool_moves_to_its_equal_sibling(gateway, two_assignments):
    # The point 2: the account says 5 % of its requests are left; it is not asked again before its
    # reset, so it never gets to answer 429.
    a, b, (acct_a, acct_b) = two_assignments
    Assignment.objects.update(tier=0)
    a.answer_headers = openai_headers(remaining=5)
    b.answer_headers = openai_headers(remaining=90)
    served = [_served_by(post(gateway, "/v1/chat/completions", CHAT))]
    for _ in range(40):  # equal accounts share the load: a is drawn with chance 1/2 each time
        if served[-1] == acct_a.pk:
            break
        served.append(_served_by(post(gateway, "/v1/chat/completions", CHAT)))
    assert served[-1] == acct_a.pk
    _assert_demoted_until_reset(acct_a)
    assert not Demotion.objects.filter(assignment=acct_b).exists()  # 90 % left: ample, nothing written

    for _ in range(10):
        assert _served_by(post(gateway, "/v1/chat/completions", CHAT)) == acct_b.pk
    assert a.hit_count() == 1


def test_ample_headroom_writes_nothing_and_costs_no_statement(gateway, two_assignments, request_path_queries):  # noqa: F811
    a, _b, _ = two_assignments
    a.answer_headers = openai_headers(remaining=10)  # exactly at the floor (10 %): enough
    assert post(gateway, "/v1/chat/completions", CHAT).status_code == 200  # warm the routing config cache
    ledger_settled()
    request_path_queries.clear()
    assert post(gateway, "/v1/chat/completions", CHAT).status_code == 200
    assert len(request_path_queries) == 1, request_path_queries  # the request's one read, as without headers
    assert not Demotion.objects.exists()


def test_a_stream_demotes_by_its_headers(gateway, two_assignments):
    a, _b, (acct_a, acct_b) = two_assignments
    a.answer_headers = openai_headers(remaining=3)
    response = post(gateway, "/v1/chat/completions", {**CHAT, "stream": True})
    assert response.status_code == 200 and sse_events(response.text)[-1].data == "[DONE]"
    assert _served_by(response) == acct_a.pk
    _assert_demoted_until_reset(acct_a)
    assert _served_by(post(gateway, "/v1/chat/completions", {**CHAT, "stream": True})) == acct_b.pk


def test_a_websocket_handshake_demotes_by_its_headers(gateway, two_assignments):
    a, b, (acct_a, _) = two_assignments
    a.answer_headers = openai_headers(remaining=3)
    with open_ws(gateway) as ws:
        assert create(ws)[-1]["type"] == "response.completed"
    _assert_demoted_until_reset(acct_a)
    with open_ws(gateway) as ws:  # a new connection, not pinned to a's: it goes to b
        assert create(ws)[-1]["type"] == "response.completed"
    assert (a.hit_count(), b.hit_count()) == (1, 1)


def test_an_anthropic_account_serving_a_chat_client_demotes_by_its_headers(gateway, two_assignments):
    a, _b, (acct_a, acct_b) = two_assignments
    Assignment.objects.filter(pk=acct_a.pk).update(adapter="anthropic")
    a.answer_headers = anthropic_headers(remaining=2)
    assert _served_by(post(gateway, "/v1/chat/completions", CHAT)) == acct_a.pk
    assert a.hits[0].path == "/v1/messages"  # translated
    _assert_demoted_until_reset(acct_a)
    assert _served_by(post(gateway, "/v1/chat/completions", CHAT)) == acct_b.pk


def test_with_the_pool_features_off_no_headroom_demotion_is_written(gateway, two_assignments, settings):
    settings.GATEWAY_POOL_FEATURES = False
    a, _b, (acct_a, _) = two_assignments
    a.answer_headers = openai_headers(remaining=1)
    for _ in range(3):
        assert _served_by(post(gateway, "/v1/chat/completions", {**CHAT, "stream": True})) == acct_a.pk
    assert not Demotion.objects.exists()


@pytest.mark.parametrize(
    ("gateway_floor", "own_floor", "demoted"),
    [(0.10, 0.25, True), (0.25, 0.10, False), (0.25, None, True), (0.10, 0.0, False)],
)
def test_an_assignments_own_floor_wins_over_the_gateway_wide_one(
    gateway, two_assignments, gateway_floor, own_floor, demoted
):
    a, _b, (acct_a, _) = two_assignments
    GatewaySettings.objects.filter(pk=1).update(headroom_floor=gateway_floor)
    Assignment.objects.filter(pk=acct_a.pk).update(headroom_floor=own_floor)
    a.answer_headers = openai_headers(remaining=20)  # 20 % left
    assert _served_by(post(gateway, "/v1/chat/completions", CHAT)) == acct_a.pk
    assert Demotion.objects.filter(assignment=acct_a, reason="headroom").exists() == demoted


def _demoted_serves(acct_a: Assignment, b) -> None:
    """acct_a demoted (for a 429 earlier) and its sibling b failing: acct_a serves the next request."""
    Demotion.objects.create(
        assignment=acct_a, model="gpt-5", reason="rate_limited", until=timezone.now() + timedelta(minutes=5)
    )
    b.script("gpt-5", unavailable())


def test_a_demoted_account_that_serves_with_ample_headroom_is_resolved(gateway, two_assignments):
    a, b, (acct_a, _) = two_assignments
    _demoted_serves(acct_a, b)
    a.answer_headers = openai_headers(remaining=80)
    assert _served_by(post(gateway, "/v1/chat/completions", CHAT)) == acct_a.pk
    assert not Demotion.objects.filter(assignment=acct_a).exists()


def test_a_demoted_account_that_serves_still_nearly_spent_stays_demoted_until_its_reset(
    gateway, two_assignments
):
    a, b, (acct_a, _) = two_assignments
    _demoted_serves(acct_a, b)
    a.answer_headers = openai_headers(remaining=4)
    assert _served_by(post(gateway, "/v1/chat/completions", CHAT)) == acct_a.pk
    _assert_demoted_until_reset(acct_a)  # kept, now for its headroom until the reset


def test_a_429_whose_limit_resets_later_than_its_retry_after_is_demoted_until_the_reset(
    gateway, two_assignments
):
    a, _b, (acct_a, acct_b) = two_assignments
    a.script("gpt-5", rate_limited("1"))
    a.answer_headers = openai_headers(remaining=0)
    assert _served_by(post(gateway, "/v1/chat/completions", CHAT)) == acct_b.pk
    _assert_demoted_until_reset(acct_a)


def test_a_429_whose_retry_after_is_later_than_the_reset_keeps_its_own_demotion(gateway, two_assignments):
    a, _b, (acct_a, acct_b) = two_assignments
    a.script("gpt-5", rate_limited("50"))
    a.answer_headers = openai_headers(remaining=0, reset="5s")
    assert _served_by(post(gateway, "/v1/chat/completions", CHAT)) == acct_b.pk
    row = _demotion(acct_a)
    assert row.reason == "rate_limited"
    assert (row.until - timezone.now()).total_seconds() > 40


def test_a_responses_request_demotes_too(gateway, two_assignments):
    a, _b, (acct_a, _) = two_assignments
    a.answer_headers = openai_headers(remaining=3)
    assert _served_by(post(gateway, "/v1/responses", RESPONSES)) == acct_a.pk
    _assert_demoted_until_reset(acct_a)


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="two processes need a shared server database (PostgreSQL)"
)
def test_a_demotion_one_node_wrote_moves_the_other_node_off_the_account(two_assignments, gateway_nodes):
    a, b, (acct_a, _) = two_assignments  # acct-a is preferred (tier 0)
    a.answer_headers = openai_headers(remaining=3)
    first, second = gateway_nodes.start(2)
    assert post(first, "/v1/chat/completions", CHAT).status_code == 200
    _assert_demoted_until_reset(acct_a)
    for _ in range(3):
        assert post(second, "/v1/chat/completions", CHAT).status_code == 200
    assert (a.hit_count(), b.hit_count()) == (1, 3)

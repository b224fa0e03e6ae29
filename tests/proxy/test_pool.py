"""A pool pools and heals (SPEC §5.4, §7.1 as changed 2026-12-05), end to end through the gateway:
equal accounts share the load, a cooled account is probed first whatever the pool's size and the
shortlist, one probe per assignment, a conversation keeps its account by the client's own keys, and
`GATEWAY_POOL_FEATURES=false` turns the pool back into a priority list."""

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import openai
import pytest
from django.utils import timezone

from catalog.models import Provenance
from devkit.behaviours import model_not_found, serve, slow_stream
from pools.models import Assignment, GatewaySettings
from proxy.ledger.models import Attempt
from routing.models import Affinity, Circuit, Demotion, Latency
from routing.policy.latency import PLACEMENT_LOAD, Fold
from routing.policy.types import ASSIGNMENT_WIDE
from routing.services import latencies_record
from tests.factories import AssignmentFactory, CatalogEntryFactory
from tests.gateway_fixtures import GATEWAY_KEY, UPSTREAM_KEY_ENV
from tests.proxy.fixtures_e2e import CHAT, RESPONSES, ledger_settled, post, record_of

REQUESTS = 40


def _equal_tiers() -> None:
    Assignment.objects.update(tier=0)


def _served_by(response) -> int:
    assert response.status_code == 200, response.text
    return record_of(response).attempts.get(status="succeeded").assignment_id


def _cooled(assignment: Assignment, *, model: str = ASSIGNMENT_WIDE, reason="credential_rejected", **fields):
    """A circuit whose cooldown ended a second ago: the next request that can use it probes it."""
    return Circuit.objects.create(
        pool=assignment.pool,
        assignment=assignment,
        model=model,
        route_class=fields.pop("route_class", ASSIGNMENT_WIDE if model == ASSIGNMENT_WIDE else "http"),
        state="open",
        reason=reason,
        consecutive_failures=1,
        cooldown_seconds=60,
        open_until=timezone.now() - timedelta(seconds=1),
        **fields,
    )


def test_two_equal_accounts_share_the_load(gateway, two_assignments):
    # The reproduction: two tier-0 accounts of weight 1, 12 of 12 requests to the first.
    a, b, _ = two_assignments
    _equal_tiers()
    for _ in range(REQUESTS):
        assert post(gateway, "/v1/chat/completions", CHAT).status_code == 200
    # Each is drawn with chance 1/2: fewer than 8 of 40 happens once in 10^5 runs.
    assert a.hit_count() + b.hit_count() == REQUESTS
    assert a.hit_count() >= 8 and b.hit_count() >= 8


def test_weight_shares_the_load_in_proportion(gateway, two_assignments):
    a, b, (_acct_a, acct_b) = two_assignments
    _equal_tiers()
    Assignment.objects.filter(pk=acct_b.pk).update(weight=9)
    for _ in range(REQUESTS):
        assert post(gateway, "/v1/chat/completions", CHAT).status_code == 200
    # b is drawn with chance 0.9: more than 12 of 40 to a happens once in 10^5 runs.
    assert a.hit_count() <= 12 and b.hit_count() >= 28


def test_with_the_pool_features_off_equal_accounts_are_a_priority_list(gateway, two_assignments, settings):
    settings.GATEWAY_POOL_FEATURES = False
    a, b, _ = two_assignments
    _equal_tiers()
    for _ in range(12):
        assert post(gateway, "/v1/chat/completions", CHAT).status_code == 200
    assert (a.hit_count(), b.hit_count()) == (12, 0)


def _pool_of(size: int, healthy_fake, cooled_fake) -> Assignment:
    """Pool `main` of `size` equal accounts: size - 1 on `healthy_fake`, the last on `cooled_fake`."""
    first = Assignment.objects.get(name="acct-a")
    for index in range(1, size - 1):
        extra = AssignmentFactory(
            pool=first.pool,
            name=f"acct-{index:02d}",
            base_url=healthy_fake.base_url,
            tier=0,
            api_key_env=UPSTREAM_KEY_ENV,
        )
        CatalogEntryFactory(assignment=extra, model="gpt-5", provenance=Provenance.CONFIGURED)
    last = Assignment.objects.get(name="acct-b")
    Assignment.objects.filter(pk=last.pk).update(base_url=cooled_fake.base_url, tier=0)
    Assignment.objects.filter(pk=first.pk).update(tier=0)
    return last


@pytest.mark.parametrize("size", [2, 5, 50])
def test_a_healed_account_is_probed_first_and_gets_its_traffic_back(
    gateway, two_assignments, fake_upstream_factory, size
):
    # The reproduction: a fixed credential sat half-open for ten minutes beside an equal-tier
    # sibling, and with more accounts than max_attempts it was never probed at all (5 accounts: 0 of 5).
    a, b, _ = two_assignments
    GatewaySettings.objects.filter(pk=1).update(max_attempts=2)
    healed = _pool_of(size, a, b)
    circuit = _cooled(healed)

    first = post(gateway, "/v1/chat/completions", CHAT)
    assert _served_by(first) == healed.pk  # the probe went first, whatever the draw
    assert b.hit_count() == 1
    circuit.refresh_from_db()
    assert circuit.state == "closed"
    # Closed again: from now on it takes its share like any other account.
    for _ in range(REQUESTS):
        assert post(gateway, "/v1/chat/completions", CHAT).status_code == 200
    if size == 2:
        assert b.hit_count() >= 8


def test_a_model_circuit_beyond_the_shortlist_is_probed_too(gateway, build_assignments):
    _fakes, rows = build_assignments(5)
    _equal_tiers()
    GatewaySettings.objects.filter(pk=1).update(max_attempts=1)
    _cooled(rows[4], model="gpt-5", reason="upstream_unavailable", route_class="http")
    assert _served_by(post(gateway, "/v1/chat/completions", CHAT)) == rows[4].pk
    assert Circuit.objects.get(assignment=rows[4]).state == "closed"


def test_an_assignment_is_probed_by_one_request_when_its_credential_and_model_circuits_are_both_cooled(
    gateway, two_assignments
):
    # The reproduction: after a credential failure and a model failure on one account, 3 of 10
    # concurrent requests tried it once both circuits were half-open (a lease per circuit).
    a, b, (acct_a, _) = two_assignments
    _equal_tiers()
    a.script("gpt-5", slow_stream(1.0, "probe"))  # the probe is still in flight as the others arrive
    _cooled(acct_a)
    _cooled(acct_a, model="gpt-5", reason="upstream_model_unavailable", route_class="http")

    with ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(lambda _: post(gateway, "/v1/chat/completions", CHAT), range(10)))
    assert [r.status_code for r in answers] == [200] * 10
    assert a.hit_count() == 1
    assert b.hit_count() == 9


def _session_turns(gateway, conversations: int, turns: int, *, path="/v1/chat/completions", key_of):
    """{conversation: [assignment id of each turn]}: `key_of(n)` gives the request's (headers, body)."""
    served: dict[int, list[int]] = {}
    for _turn in range(turns):
        for n in range(conversations):
            headers, body = key_of(n)
            served.setdefault(n, []).append(_served_by(post(gateway, path, body, headers=headers)))
    return served


@pytest.mark.parametrize(
    ("path", "key_of"),
    [
        ("/v1/chat/completions", lambda n: ({"session-id": f"codex-{n}"}, CHAT)),
        ("/v1/chat/completions", lambda n: ({"x-claude-code-session-id": f"cc-{n}"}, CHAT)),
        ("/v1/chat/completions", lambda n: ({"x-session-affinity": f"oc-{n}"}, CHAT)),
        ("/v1/responses", lambda n: ({}, {**RESPONSES, "prompt_cache_key": f"pck-{n}"})),
        (
            "/v1/chat/completions",
            lambda n: (
                {},
                {
                    **CHAT,
                    "metadata": {"user_id": "u-1"},
                    "messages": [{"role": "user", "content": f"task {n}"}],
                },
            ),
        ),
    ],
    ids=["session-id", "claude-code", "opencode", "prompt_cache_key", "metadata-user-and-first-turn"],
)
def test_a_conversation_keeps_its_account_by_the_clients_own_key(gateway, two_assignments, path, key_of):
    a, b, _ = two_assignments
    _equal_tiers()
    served = _session_turns(gateway, 8, 4, path=path, key_of=key_of)
    for turns in served.values():
        assert len(set(turns)) == 1, served  # every turn on its first turn's account
    # And the conversations themselves were spread (all 8 on one account: once in 128 runs per side).
    assert len({turns[0] for turns in served.values()}) == 2 or a.hit_count() + b.hit_count() == 32
    # Remembered as digests: no client id and no prompt word in the affinity table.
    keys = list(Affinity.objects.filter(kind="session").values_list("key", flat=True))
    assert len(keys) == 8
    assert not any(("codex-" in k or "cc-" in k or "oc-" in k or "pck-" in k or "task" in k) for k in keys)


def test_a_conversation_leaves_an_unhealthy_account_and_never_outranks_health(gateway, two_assignments):
    _a, _b, (acct_a, acct_b) = two_assignments
    _equal_tiers()
    headers = {"x-claude-code-session-id": "one"}
    home = _served_by(post(gateway, "/v1/chat/completions", CHAT, headers=headers))
    home_row = acct_a if home == acct_a.pk else acct_b
    Circuit.objects.create(
        pool=home_row.pool,
        assignment=home_row,
        model="gpt-5",
        route_class="http",
        state="open",
        reason="upstream_unavailable",
        consecutive_failures=3,
        cooldown_seconds=300,
        open_until=timezone.now() + timedelta(minutes=5),
    )
    assert _served_by(post(gateway, "/v1/chat/completions", CHAT, headers=headers)) != home


def test_without_the_pool_features_only_x_gateway_session_names_a_conversation(
    gateway, two_assignments, settings
):
    settings.GATEWAY_POOL_FEATURES = False
    two_assignments  # noqa: B018
    for header in ({"session-id": "s"}, {"x-claude-code-session-id": "c"}):
        assert post(gateway, "/v1/chat/completions", CHAT, headers=header).status_code == 200
    ledger_settled()
    assert not Affinity.objects.filter(kind="session").exists()
    assert post(gateway, "/v1/chat/completions", CHAT, headers={"x-gateway-session": "g"}).status_code == 200
    assert Affinity.objects.filter(kind="session", key="g").exists()


def test_a_deadline_that_excludes_the_first_account_leaves_the_shortlist_to_the_next(
    gateway, two_assignments
):
    # The reproduction: with max_attempts 1 the deadline gate ran after the cut, and the client
    # got no_eligible_backend: deadline although an eligible account was next.
    a, _b, (acct_a, acct_b) = two_assignments
    GatewaySettings.objects.filter(pk=1).update(max_attempts=1)
    Assignment.objects.filter(pk=acct_a.pk).update(min_deadline_ms=5_000)
    response = post(gateway, "/v1/chat/completions", CHAT, headers={"x-gateway-deadline-ms": "2000"})
    assert _served_by(response) == acct_b.pk
    assert a.hit_count() == 0
    reasons = set(Attempt.objects.filter(assignment_id=acct_a.pk).values_list("ineligible_reason", flat=True))
    assert reasons == {"deadline"}


def test_the_served_answer_is_a_real_one(gateway, two_assignments):
    a, b, _ = two_assignments
    a.script("gpt-5", serve("from a"))
    b.script("gpt-5", serve("from b"))
    _equal_tiers()
    texts = {
        post(gateway, "/v1/chat/completions", CHAT).json()["choices"][0]["message"]["content"]
        for _ in range(20)
    }
    assert texts == {"from a", "from b"}


def test_a_probe_that_proves_the_credential_closes_the_credential_circuit_and_no_second_probe_follows(
    gateway, two_assignments
):
    # The account's credential works again but it still lacks the model: its answer (404
    # model_not_found) proves the credential, so the credential circuit closes and the model's reopens;
    # it used to free the credential probe's slot for the next request, and the next, and the next.
    a, _b, (acct_a, _) = two_assignments
    _equal_tiers()
    a.script("gpt-5", model_not_found())
    _cooled(acct_a)
    _cooled(acct_a, model="gpt-5", reason="upstream_model_unavailable", route_class="http")

    for _ in range(10):
        assert post(gateway, "/v1/chat/completions", CHAT).status_code == 200
    assert a.hit_count() == 1
    wide = Circuit.objects.get(assignment=acct_a, model=ASSIGNMENT_WIDE)
    model = Circuit.objects.get(assignment=acct_a, model="gpt-5")
    assert (wide.state, model.state, model.reason) == ("closed", "open", "upstream_model_unavailable")


def _upload(gateway):
    with openai.OpenAI(base_url=f"{gateway}/v1", api_key=GATEWAY_KEY, max_retries=0, timeout=15) as client:
        return client.files.create(file=("train.jsonl", b'{"prompt": "a"}\n'), purpose="user_data")


def test_the_files_plan_honours_the_credential_circuit(gateway, two_assignments):
    # The reproduction: the Files plan ignored the whole-assignment circuit and its lease.
    a, b, (acct_a, _) = two_assignments
    circuit = _cooled(acct_a)
    Circuit.objects.filter(pk=circuit.pk).update(open_until=timezone.now() + timedelta(minutes=5))
    created = _upload(gateway)
    assert list(b.files) == [created.id] and a.hit_count() == 0


def test_the_files_plan_probes_a_cooled_account_first(gateway, two_assignments):
    a, b, (acct_a, acct_b) = two_assignments
    Assignment.objects.filter(pk=acct_a.pk).update(tier=1)
    Assignment.objects.filter(pk=acct_b.pk).update(tier=0)  # the cooled account is the less preferred
    circuit = _cooled(acct_a)
    created = _upload(gateway)
    assert list(a.files) == [created.id] and b.hit_count() == 0
    circuit.refresh_from_db()
    assert circuit.state == "closed"


def test_new_work_goes_where_the_accounts_headers_say_there_is_room(gateway, two_assignments):
    # SPEC §5.4 (a): the draw is scaled by each account's headroom, kept by the ledger writer beside its
    # latency (no write on the request path). a says 12 % of its requests are left (above the 10 % floor:
    # not demoted), b says 100 %: a's share is 0.12 / 1.12 once the writer has kept what they said.
    a, b, (acct_a, acct_b) = two_assignments
    _equal_tiers()
    a.answer_headers = _ratelimit_headers(remaining=12)
    b.answer_headers = _ratelimit_headers(remaining=100)
    while not (a.hit_count() and b.hit_count()):  # each has answered once: both have said
        assert post(gateway, "/v1/chat/completions", CHAT).status_code == 200
    ledger_settled()
    kept = dict(Latency.objects.values_list("assignment_id", "headroom_left"))
    assert kept == {acct_a.pk: pytest.approx(0.12), acct_b.pk: 1.0}
    before = a.hit_count()
    for _ in range(REQUESTS):
        assert post(gateway, "/v1/chat/completions", CHAT).status_code == 200
    # Expected 4.3 of 40 to a; 13 or more happens once in 10^4 runs (at 1/2 each, 20 would be expected).
    assert a.hit_count() - before <= 12
    assert not Demotion.objects.exists()


def test_a_headroom_whose_limit_has_reset_no_longer_scales_the_share(gateway, two_assignments):
    a, _b, (acct_a, _acct_b) = two_assignments
    _equal_tiers()
    a.answer_headers = _ratelimit_headers(remaining=12)
    while not a.hit_count():
        assert post(gateway, "/v1/chat/completions", CHAT).status_code == 200
    ledger_settled()
    Latency.objects.filter(assignment=acct_a).update(headroom_until=timezone.now() - timedelta(seconds=1))
    a.answer_headers = {}
    before = a.hit_count()
    for _ in range(REQUESTS):
        assert post(gateway, "/v1/chat/completions", CHAT).status_code == 200
    assert a.hit_count() - before >= 8  # back to half: fewer than 8 of 40 once in 10^5 runs


def _ratelimit_headers(remaining: int) -> dict[str, str]:
    return {
        "x-ratelimit-limit-requests": "100",
        "x-ratelimit-remaining-requests": str(remaining),
        "x-ratelimit-reset-requests": "10m0s",
    }


def test_new_work_goes_to_the_account_that_served_less_lately(gateway, two_assignments):
    # The draw's choices (SPEC §5.4): a has served a lot lately (its load, kept by the ledger writer on its
    # latency row), b nothing; of four draws the least loaded wins, so a comes first only when drawn four
    # times (a sixteenth of the requests, not half).
    a, b, (acct_a, _acct_b) = two_assignments
    _equal_tiers()
    latencies_record(folds=[Fold(acct_a.pk, "gpt-5", 20.0, 200)], now=timezone.now())
    for _ in range(REQUESTS):
        assert post(gateway, "/v1/chat/completions", CHAT).status_code == 200
    # Expected 2.5 of 40 (a comes first only when all four draws pick it); 10 or more happens about once in
    # 10^4 runs, where one draw at a half would expect 20.
    assert a.hit_count() <= 9
    assert b.hit_count() >= 31


def _load(assignment: Assignment) -> float:
    ledger_settled()
    return Latency.objects.get(assignment=assignment, model="gpt-5").load


def test_a_request_that_places_a_conversation_weighs_placement_load_in_its_accounts_load(
    gateway, two_assignments
):
    # A conversation's next turns follow its first (cache affinity), so the ledger writer counts the turn
    # that places it as PLACEMENT_LOAD served requests: the draw sees the account busier at once, not turn
    # by turn. a (tier 0) serves whatever it can here, the draw being among the leading tier only.
    _a, _b, (acct_a, acct_b) = two_assignments
    session = {"x-gateway-session": "conversation-1"}
    assert _served_by(post(gateway, "/v1/chat/completions", CHAT, headers=session)) == acct_a.pk
    assert _load(acct_a) == PLACEMENT_LOAD  # a new row starts at its batch's load
    # Its next turn on the same account, and a request of no conversation: one each (on what is left of the
    # first: it halves every LOAD_HALF_LIFE_S).
    assert _served_by(post(gateway, "/v1/chat/completions", CHAT, headers=session)) == acct_a.pk
    assert _served_by(post(gateway, "/v1/chat/completions", CHAT)) == acct_a.pk
    assert 2 < _load(acct_a) <= PLACEMENT_LOAD + 2
    # a can no longer serve it: the turn that moves the conversation to b places it there.
    Circuit.objects.create(
        pool=acct_a.pool,
        assignment=acct_a,
        model="gpt-5",
        route_class="http",
        state="open",
        reason="upstream_unavailable",
        consecutive_failures=3,
        cooldown_seconds=300,
        open_until=timezone.now() + timedelta(minutes=5),
    )
    assert _served_by(post(gateway, "/v1/chat/completions", CHAT, headers=session)) == acct_b.pk
    assert _load(acct_b) == PLACEMENT_LOAD

"""x-gateway-session: a soft preference that moves the session's last assignment to the front and
keeps every other candidate (SPEC §5.2)."""

import httpx

from devkit.behaviours import serve, unavailable
from routing.models import Affinity
from routing.policy.types import AFFINITY_KEY_MAX
from tests.gateway_fixtures import GATEWAY_KEY

CHAT = {"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]}


def _post(gateway, session):
    headers = {"authorization": f"Bearer {GATEWAY_KEY}", "x-gateway-session": session}
    return httpx.post(f"{gateway}/v1/chat/completions", json=CHAT, headers=headers, timeout=10)


def test_a_session_returns_to_its_last_assignment_and_still_fails_over(gateway, two_assignments):
    a, b, (_, acct_b) = two_assignments
    a.script("gpt-5", unavailable(503), serve("a again"))
    b.script("gpt-5", serve("b"), serve("b again"), unavailable(503))

    first = _post(gateway, "s-1")  # a is down once: b serves, and the session remembers b
    assert first.json()["choices"][0]["message"]["content"] == "b"
    assert Affinity.objects.get(kind="session", key="s-1").assignment_id == acct_b.pk

    second = _post(gateway, "s-1")  # a is healthy again and preferred by tier, but the session goes to b
    assert second.json()["choices"][0]["message"]["content"] == "b again"
    assert a.hit_count() == 1

    third = _post(gateway, "s-1")  # b fails: the session's preference never removes a from the plan
    assert third.status_code == 200
    assert third.json()["choices"][0]["message"]["content"] == "a again"
    assert Affinity.objects.get(kind="session", key="s-1").assignment_id != acct_b.pk


def test_a_session_header_longer_than_an_affinity_key_is_remembered_by_its_first_characters(
    gateway, two_assignments
):
    """The session a header names is its first AFFINITY_KEY_MAX characters (as routing_explain reads it):
    remembered under them, and the same header finds it again."""
    a, b, (_, acct_b) = two_assignments
    a.script("gpt-5", unavailable(503), serve("a"))
    b.script("gpt-5", serve("b"), serve("b again"))
    header = "s" * AFFINITY_KEY_MAX + "-tail"

    assert _post(gateway, header).json()["choices"][0]["message"]["content"] == "b"
    remembered = Affinity.objects.get(kind="session")
    assert (remembered.key, remembered.assignment_id) == ("s" * AFFINITY_KEY_MAX, acct_b.pk)
    assert _post(gateway, header).json()["choices"][0]["message"]["content"] == "b again"
    assert a.hit_count() == 1

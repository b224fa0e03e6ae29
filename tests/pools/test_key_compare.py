"""The gateway key's final comparison is constant-time (SPEC §11): the digest found by the index is
compared with `hmac.compare_digest`, never `==`, so the time taken says nothing about how much of a
guessed key matched."""

import hmac

from pools import selectors
from tests.factories import GatewayKeyFactory, PoolFactory

KEY = "sk-gw-constant-time-test-key-000000"


def test_the_key_digest_is_compared_in_constant_time(db, monkeypatch):
    GatewayKeyFactory(name="k", raw_key=KEY, pools=[PoolFactory()])
    calls = []
    compare = hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return compare(a, b)

    monkeypatch.setattr(selectors.hmac, "compare_digest", spy)
    assert selectors.key_authenticate(KEY) is not None
    digest = selectors.hash_key(KEY)
    assert (digest, digest) in calls  # the stored digest that matched went through compare_digest
    assert all(b == digest for _, b in calls)
    calls.clear()
    assert selectors.key_authenticate(KEY + "x") is None  # not found by the index: nothing to compare

"""Readers of upstream payloads (proxy.payloads): the response id an answer carries."""

import pytest

from proxy.payloads import response_id
from routing.types import AFFINITY_KEY_MAX

LONGEST = "resp_" + "x" * (AFFINITY_KEY_MAX - 5)


@pytest.mark.parametrize("wrap", [lambda r: r, lambda r: {"type": "response.completed", "response": r}])
def test_a_response_id_is_read_up_to_the_longest_an_affinity_holds(wrap):
    """An id the affinity table can hold is remembered; a longer one is not read at all, so it is never
    stored cut short (another id could share the prefix) nor refused by the column mid-request."""
    assert response_id(wrap({"object": "response", "id": LONGEST})) == LONGEST
    assert response_id(wrap({"object": "response", "id": LONGEST + "x"})) is None
    assert response_id(wrap({"object": "response", "id": ""})) is None

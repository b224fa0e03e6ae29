"""A key holder spends more than its key is charged (issue 45 finding 6). Threat (SECURITY.md, Key holder:
what a request costs its key never falls below what its upstream reported, and concurrent requests pass a
budget by at most one reservation's estimate error).

As the attack ran against the production server: six streaming clients that left after the answer's
`finish_reason`, before the usage chunk, cost 18,000 micros and were charged 126 (`tpm` counted 0, the
ledger said `ok` with no cost); and 100 concurrent requests without `max_tokens` spent 411,400 of a
100,000 budget, their reservations covering their prompts only.

Against the production server (`python -m gatewaysite.server` on the test database, `gateway_nodes`) and
fake upstreams that stream as OpenAI and Anthropic do: a Chat stream's usage in a last chunk after the
finish reason (`stream_options.include_usage`), a Responses stream's in `response.completed`, a Messages
stream's output tokens in `message_delta`. Each event comes `GAP_S` after the last, so a client leaves
between two of them."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from catalog.models import CatalogEntry
from devkit.behaviours import Serve
from pools.models import GatewayKey
from routing.budget import reserved_output_tokens
from tests.gateway_fixtures import GATEWAY_KEY
from tests.security.conftest import responsive

pytestmark = pytest.mark.attack

AUTH = {"authorization": f"Bearer {GATEWAY_KEY}"}
CHAT = {"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]}


def _one_micro_a_token() -> None:
    CatalogEntry.objects.update(input_per_mtok_micros=1_000_000, output_per_mtok_micros=1_000_000)


def _settled_key() -> GatewayKey:
    """The key once the ledger has settled every request: nothing held, something spent."""
    deadline = time.monotonic() + 20
    while True:
        key = GatewayKey.objects.get()
        if key.reserved_micros == 0 and key.spent_micros > 0:
            return key
        assert time.monotonic() < deadline, "the ledger did not settle the reservations"
        time.sleep(0.1)


@pytest.mark.parametrize("model_limit", [None, 8_000], ids=["default-output-limit", "catalog-output-limit"])
def test_concurrent_requests_without_max_tokens_never_pass_their_budget(
    gateway_nodes, build_assignments, model_limit
):
    """100 requests at once, none naming an output limit, each answered with 4,000 output tokens, on a
    budget of four reservations: each reserves its model's output limit (the catalog's, else the
    default), so they cannot together spend more than the budget. Reserving the prompt alone admitted
    all 100: 401,000 spent."""
    (account,), _ = build_assignments(1)
    _one_micro_a_token()
    CatalogEntry.objects.update(max_output_tokens=model_limit)
    cost = 10 + 4_000  # the fake's input tokens and its output
    account.script("gpt-5", Serve(output_tokens=4_000, delay_s=0.3))  # all of them in flight at once
    body = json.dumps(CHAT).encode()
    reservation = len(body) // 4 + reserved_output_tokens(0, model_limit)
    assert cost < reservation  # no estimate error for the budget to be passed by
    budget = 4 * reservation
    GatewayKey.objects.update(budget_micros=budget)
    (base,) = gateway_nodes.start(1)

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=100)) as client:
            headers = {**AUTH, "content-type": "application/json"}
            url = f"{base}/v1/chat/completions"
            return await asyncio.gather(*(client.post(url, content=body, headers=headers) for _ in range(100)))

    answers = asyncio.run(burst())
    served = [a for a in answers if a.status_code == 200]
    refused = [a.json()["error"]["code"] for a in answers if a.status_code == 429]
    assert len(served) + len(refused) == 100, {a.status_code for a in answers}
    key = _settled_key()
    assert key.spent_micros == cost * len(served)  # every answer charged what it cost
    assert key.spent_micros <= budget, f"{len(served)} served: spent {key.spent_micros} of {budget}"
    assert served and set(refused) == {"budget_exceeded"}  # the budget really was the limit
    assert responsive(base)

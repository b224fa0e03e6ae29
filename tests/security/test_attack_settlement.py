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
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from django.db.models import Sum
from websockets.sync.client import connect

from catalog.models import CatalogEntry
from devkit.behaviours import Serve
from devkit.harness import stop
from devkit.procfs import inventory
from pools.models import Assignment, GatewayKey, KeyLimitWindow
from proxy import output
from proxy.ledger.models import Attempt, RequestRecord
from routing.policy.budget import reserved_output_tokens
from tests.gateway_fixtures import GATEWAY_KEY
from tests.proxy.fixtures_e2e import wait_for
from tests.security.conftest import responsive

pytestmark = pytest.mark.attack

AUTH = {"authorization": f"Bearer {GATEWAY_KEY}"}
CHAT = {"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]}
GAP_S = 0.2  # between two events of the fake's streams: the client leaves in one of them
# What the fake reports for each answer: far more input than the gateway estimates for "hi" (an
# upstream's own context, a tokenizer the estimate does not know), so its reservation (prompt estimate
# + max_tokens 300, about 330 micros) is well below its cost: only the usage can settle it.
INPUT, OUTPUT = 3_000, 200
COST = INPUT + OUTPUT  # micros, at one micro a token


def _raw(body: dict) -> bytes:
    return json.dumps(body).encode()


def _one_micro_a_token() -> None:
    CatalogEntry.objects.update(input_per_mtok_micros=1_000_000, output_per_mtok_micros=1_000_000)


def _answer(text: str = "one two three", delay_s: float = GAP_S) -> Serve:
    return Serve(text=text, input_tokens=INPUT, output_tokens=OUTPUT, delay_s=delay_s)


def _account(build_assignments, adapter: str = "openai"):
    """One account (`acct-a`, the `adapter` given) on a fake, priced at a micro a token; the e2e key
    counts its tokens for a `tpm` limit."""
    (fake,), _ = build_assignments(1)
    Assignment.objects.update(adapter=adapter)
    _one_micro_a_token()
    GatewayKey.objects.update(budget_micros=10**9, limit_tpm=10**9)
    return fake


def _events(lines: Iterator[str]) -> Iterator[Any]:
    """The JSON data of a stream's events, as a client reads them."""
    for line in lines:
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            yield json.loads(line[5:])


def _finished(event: Any) -> bool:
    """A Chat chunk carrying the answer's finish reason (its usage chunk comes after it)."""
    return any(choice.get("finish_reason") for choice in event.get("choices") or [])


def _said(event: Any) -> bool:
    """A Chat chunk with output in it."""
    return any((choice.get("delta") or {}).get("content") for choice in event.get("choices") or [])


def _typed(kind: str) -> Callable[[Any], bool]:
    return lambda event: event.get("type") == kind


def _leave(base: str, path: str, body: dict, leave_after: Callable[[Any], bool]) -> str:
    """A streaming client that reads until `leave_after` says so, then leaves: its request id."""
    headers = {**AUTH, "content-type": "application/json"}
    with httpx.stream("POST", f"{base}{path}", content=_raw(body), headers=headers, timeout=30) as response:
        assert response.status_code == 200, response.read()
        for event in _events(response.iter_lines()):
            if leave_after(event):
                return response.headers["x-gateway-request-id"]
    raise AssertionError("the stream ended before the client left")


def _record(request_id: str | None = None) -> RequestRecord:
    """The ledger row of a request (the only one when `request_id` is None), once written."""
    rows = (
        RequestRecord.objects.all()
        if request_id is None
        else RequestRecord.objects.filter(request_id=request_id)
    )
    return wait_for(rows.first, timeout=30, what="the request's ledger row")


def _tokens_counted() -> int:
    return KeyLimitWindow.objects.aggregate(tokens=Sum("tokens"))["tokens"] or 0


def _assert_settled_from_its_usage(record: RequestRecord, requests: int = 1) -> None:
    """Recorded as the client leaving, and charged, counted and priced as the upstream reported."""
    assert (record.outcome, record.status_code) == ("cancelled", 499)
    attempt = Attempt.objects.get(request=record)
    assert (attempt.status, attempt.dispatch_state, attempt.error_code) == ("cancelled", "completed", "")
    assert (attempt.input_tokens, attempt.output_tokens, attempt.cost_micros) == (INPUT, OUTPUT, COST)
    assert _settled_key().spent_micros == requests * COST
    assert wait_for(lambda: _tokens_counted() == requests * (INPUT + OUTPUT), what="the key's tpm count")


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
            return await asyncio.gather(
                *(client.post(url, content=body, headers=headers) for _ in range(100))
            )

    answers = asyncio.run(burst())
    served = [a for a in answers if a.status_code == 200]
    refused = {(a.status_code, a.json()["error"]["code"]) for a in answers if a.status_code != 200}
    # On a loaded machine the database may not answer a request's key check in time: it is refused
    # before anything is sent, and spends nothing.
    assert refused <= {(429, "budget_exceeded"), (503, "gateway_unavailable")}, refused
    key = _settled_key()
    assert key.spent_micros == cost * len(served)  # every answer charged what it cost
    assert key.spent_micros <= budget, f"{len(served)} served: spent {key.spent_micros} of {budget}"
    assert served and (429, "budget_exceeded") in refused  # the budget really was the limit
    assert responsive(base)


def test_streaming_clients_that_leave_after_the_finish_reason_are_charged_their_usage(
    gateway_nodes, build_assignments
):
    """The attack as it ran: six Chat clients at once, no `max_tokens`, each leaving at the chunk that
    carries the finish reason, before the usage chunk (`stream_options.include_usage`, which the gateway
    asks for). They were charged their reservations (126 micros for 18,000), `tpm` counted nothing and
    the ledger said `ok` with no cost. The gateway reads the rest of each stream for its usage."""
    _account(build_assignments).script("gpt-5", _answer())
    (base,) = gateway_nodes.start(1)
    body = {**CHAT, "stream": True}
    with ThreadPoolExecutor(6) as pool:
        request_ids = list(
            pool.map(lambda _: _leave(base, "/v1/chat/completions", body, _finished), range(6))
        )
    wait_for(lambda: RequestRecord.objects.count() == 6, timeout=30, what="six ledger rows")
    for request_id in request_ids:
        record = RequestRecord.objects.get(request_id=request_id)
        assert record.outcome == "cancelled"
        assert Attempt.objects.get(request=record).cost_micros == COST
    assert _settled_key().spent_micros == 6 * COST
    assert wait_for(lambda: _tokens_counted() == 6 * (INPUT + OUTPUT), what="the key's tpm count")
    assert responsive(base)


@dataclass(frozen=True)
class Leaving:
    """A client API, the account's adapter (its own API, or one the request is translated to), and the
    event the client leaves after: its answer's last output before the upstream's usage (native), or
    its first output (translated: a translation may hold the end of the answer until the usage)."""

    path: str
    body: dict
    adapter: str
    leave_after: Callable[[Any], bool]


CHAT_STREAM = {**CHAT, "stream": True, "max_tokens": 300}
MESSAGES_STREAM = {**CHAT, "stream": True, "max_tokens": 300}
RESPONSES_STREAM = {"model": "gpt-5", "input": "hi", "stream": True, "max_output_tokens": 300}
LEAVING = {
    "chat": Leaving("/v1/chat/completions", CHAT_STREAM, "openai", _finished),
    "messages": Leaving("/v1/messages", MESSAGES_STREAM, "anthropic", _typed("content_block_stop")),
    "responses": Leaving("/v1/responses", RESPONSES_STREAM, "openai", _typed("response.output_text.done")),
    "chat-over-messages": Leaving("/v1/chat/completions", CHAT_STREAM, "anthropic", _said),
    "messages-over-chat": Leaving("/v1/messages", MESSAGES_STREAM, "openai", _typed("content_block_delta")),
    "responses-over-messages": Leaving(
        "/v1/responses", RESPONSES_STREAM, "anthropic", _typed("response.output_text.delta")
    ),
}


@pytest.mark.parametrize("case", LEAVING.values(), ids=LEAVING.keys())
def test_a_client_that_leaves_before_the_usage_is_charged_what_its_upstream_reports(
    gateway_nodes, build_assignments, case
):
    """Every client API, native and translated: the client leaves before the usage comes (a Chat usage
    chunk, Anthropic's `message_delta`, Responses' `response.completed`), once it has its answer or
    mid-answer; the request is settled from that usage, never from a reservation below it."""
    _account(build_assignments, case.adapter).script("gpt-5", _answer())
    (base,) = gateway_nodes.start(1)
    request_id = _leave(base, case.path, case.body, case.leave_after)
    _assert_settled_from_its_usage(_record(request_id))
    assert responsive(base)


@pytest.mark.parametrize("adapter", ["openai", "anthropic"], ids=["upstream-websocket", "bridged"])
def test_a_websocket_client_that_closes_mid_answer_is_charged_what_its_upstream_reports(
    gateway_nodes, build_assignments, adapter
):
    """Responses over the websocket, on an upstream websocket or bridged to an HTTP stream: the client
    closes after its first output; the gateway reads the rest for the usage, then closes the upstream."""
    fake = _account(build_assignments, adapter)
    fake.script("gpt-5", _answer())
    (base,) = gateway_nodes.start(1)
    url = base.replace("http://", "ws://") + "/v1/responses"
    with connect(url, additional_headers=AUTH, open_timeout=10) as ws:
        ws.send(json.dumps({"type": "response.create", **RESPONSES_STREAM}))
        while json.loads(ws.recv(timeout=15))["type"] != "response.output_text.delta":
            pass
    _assert_settled_from_its_usage(_record())
    assert wait_for(lambda: fake.ws_open == 0, what="the upstream connection closed after settlement")
    assert responsive(base)


def _upstream_sockets(pid: int, port: int) -> list:
    """The gateway process's TCP connections to an upstream's port."""
    return [s for s in inventory(pid).tcp if s.remote_port == port]


RESERVATION = len(_raw(CHAT_STREAM)) // 4 + 300  # the prompt estimate and max_tokens, a micro a token


def _assert_settled_at_its_reservation(record: RequestRecord) -> None:
    """Recorded as the client leaving, charged what was held for it (never less), flagged."""
    assert (record.outcome, record.status_code) == ("cancelled", 499)
    attempt = Attempt.objects.get(request=record)
    assert (attempt.status, attempt.dispatch_state, attempt.cost_micros, attempt.error_code) == (
        "cancelled",
        "unknown",
        None,
        output.USAGE_UNREPORTED,
    )
    assert _settled_key().spent_micros == RESERVATION


def test_a_stream_whose_usage_comes_past_the_bytes_read_keeps_its_reservation(
    gateway_nodes, build_assignments
):
    """The rest of a stream is read up to SETTLE_READ_BYTES: an answer whose usage would come after more
    than that (some 6 MiB of deltas) is settled at its reservation, and its upstream connection dropped."""
    fake = _account(build_assignments)
    fake.script("gpt-5", _answer(" ".join(["w"] * 30_000), delay_s=0))
    (base,) = gateway_nodes.start(1)
    _assert_settled_at_its_reservation(_record(_leave(base, "/v1/chat/completions", CHAT_STREAM, bool)))
    (proc,) = gateway_nodes.procs
    assert wait_for(
        lambda: not _upstream_sockets(proc.pid, fake.port), what="the upstream connection dropped"
    )
    assert responsive(base)


def test_a_stream_whose_usage_comes_past_the_time_read_keeps_its_reservation(
    gateway, build_assignments, monkeypatch
):
    """The rest of a stream is read for at most SETTLE_READ_S (here 0.2 s, the upstream's events 1 s
    apart): past it the request keeps its reservation. In process, to shorten the bound."""
    monkeypatch.setattr(output, "SETTLE_READ_S", 0.2)
    _account(build_assignments).script("gpt-5", _answer(delay_s=1.0))
    _assert_settled_at_its_reservation(_record(_leave(gateway, "/v1/chat/completions", CHAT_STREAM, bool)))


def test_a_stream_read_after_its_client_left_does_not_hold_the_shutdown(gateway_nodes, build_assignments):
    """SIGTERM while a stream is read for its usage (an answer of a minute, its client gone after the first
    event): the reading ends with the gateway's shutdown grace (`GATEWAY_SHUTDOWN_GRACE_S`, 1 s here), not
    with SETTLE_READ_S (30 s), the server exits cleanly, and the request is recorded at its reservation."""
    _account(build_assignments).script("gpt-5", _answer(" ".join(["w"] * 60), delay_s=1.0))
    (base,) = gateway_nodes.start(1, GATEWAY_SHUTDOWN_GRACE_S="1")
    request_id = _leave(base, "/v1/chat/completions", CHAT_STREAM, bool)
    (proc,) = gateway_nodes.procs
    # Exited by itself (uvicorn ends with the signal it was sent), not killed after 15 s: a reading the
    # shutdown did not end would have held it for 30.
    assert stop(proc, timeout=15) is not None
    _assert_settled_at_its_reservation(_record(request_id))

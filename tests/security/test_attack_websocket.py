"""Attacks on the Responses websocket mode (issue 45 findings 1, 3 and 4), against the production server
(`served`, tests/security/conftest.py). Each names the threat of SECURITY.md it covers."""

from __future__ import annotations

import base64
import json
import os
import socket
import time

import pytest
from websockets.sync.client import ClientConnection, connect

from devkit.procfs import peak_rss_kb, peak_rss_reset, rss_kb
from proxy.ws_relay import Conversations
from tests.security.conftest import KEY, MODEL, responsive

pytestmark = pytest.mark.attack
MIB = 1 << 20


def _open(served) -> ClientConnection:
    url = served.url.replace("http://", "ws://") + "/v1/responses"
    return connect(url, additional_headers={"authorization": f"Bearer {KEY}"}, max_size=None, open_timeout=10)


def _create(ws: ClientConnection, **body) -> dict:
    """One `response.create` frame; its terminal event (a timeout fails the test: the worker froze)."""
    ws.send(json.dumps({"type": "response.create", "model": MODEL, **body}))
    while True:
        event = json.loads(ws.recv(timeout=15))
        if event["type"] in {"response.completed", "response.incomplete", "response.failed", "error"}:
            return event


def test_an_upstream_that_repeats_its_ids_never_makes_a_conversation_loop(served):
    """Threat: a key holder freezes a worker (SECURITY.md, Key holder: a bridged conversation's ids are
    the gateway's own, its history cycle-free). The account answers every response with the id
    `chatcmpl-bedrock`; continuing a response twice used to make it its own previous response and the
    third frame walked that cycle forever on the event loop."""
    with _open(served) as ws:
        first = _create(ws, input="one")["response"]
        second = _create(ws, input="two", previous_response_id=first["id"])["response"]
        third = _create(ws, input="three", previous_response_id=second["id"])
        assert responsive(served.url)
    assert third["type"] == "response.completed"
    assert len({first["id"], second["id"], third["response"]["id"]}) == 3
    assert "bedrock" not in first["id"]  # the gateway's id, not one derived from the upstream's


def test_bridged_conversations_are_bounded_by_bytes_not_by_count(served):
    """Threat: a key holder grows a worker's memory without bound (SECURITY.md, Key holder: what a
    connection keeps of its conversations is bounded in bytes). Eight frames of 7 MB, each continuing
    the last: all were kept (256 could be) and each sent whole with the next, RSS 107 -> 515 MiB. Now a
    connection keeps at most GATEWAY_MAX_BODY_BYTES of them: a continuation of a forgotten response is
    refused as any unknown one is."""
    text = "x" * (7 * MIB)
    outcomes = []
    with _open(served) as ws:
        previous = _create(ws, input="warm up")["response"]["id"]
        peak_rss_reset(served.pid)
        before = peak_rss_kb(served.pid)
        for _ in range(8):
            event = _create(ws, input=text, previous_response_id=previous)
            outcomes.append(event.get("error", {}).get("param") or event["type"])
            previous = event.get("response", {}).get("id", previous)
        grown = peak_rss_kb(served.pid) - before
        assert responsive(served.url)
    assert set(outcomes) <= {"response.completed", "previous_response_id"}, outcomes
    assert grown < 96 * 1024, f"peak RSS grew by {grown} KiB for eight 7 MB continuations"


def test_a_conversation_kept_is_cycle_free_whatever_ids_it_is_given():
    """Unit of the guard above: an id kept once is never kept again (so never its own ancestor), and a
    response is kept only after the one it continues."""
    kept = Conversations()
    said = [{"type": "message", "role": "assistant", "content": "ok"}]
    kept.remember(None, {"input": "one"}, {"id": "resp_a", "output": said}, size=10)
    kept.remember("resp_a", {"input": "two"}, {"id": "resp_a", "output": said}, size=10)  # repeated id
    kept.remember("resp_z", {"input": "two"}, {"id": "resp_b", "output": said}, size=10)  # unknown parent
    sent, previous = kept.continued({"previous_response_id": "resp_a", "input": "three"})
    assert previous == "resp_a" and [item["content"] for item in sent["input"]] == ["one", "ok", "three"]
    assert kept.continued({"previous_response_id": "resp_b"}) == ({"previous_response_id": "resp_b"}, None)


def test_a_conversation_is_forgotten_oldest_first_past_its_bytes():
    kept = Conversations(max_bytes=100)
    said = [{"type": "message", "role": "assistant", "content": "ok"}]
    kept.remember(None, {"input": "one"}, {"id": "resp_a", "output": said}, size=60)
    kept.remember(None, {"input": "two"}, {"id": "resp_b", "output": said}, size=60)  # resp_a goes
    kept.remember(None, {"input": "big"}, {"id": "resp_c", "output": said}, size=101)  # never kept
    assert kept.size == 60
    assert kept.continued({"previous_response_id": "resp_a"})[1] is None
    assert kept.continued({"previous_response_id": "resp_b"})[1] == "resp_b"
    assert kept.continued({"previous_response_id": "resp_c"})[1] is None


def _masked(opcode: int, payload: bytes) -> bytes:
    """One client frame (FIN set, masked as RFC 6455 requires of a client), payload under 126 bytes."""
    mask = os.urandom(4)
    return (
        bytes([0x80 | opcode, 0x80 | len(payload)])
        + mask
        + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    )


@pytest.mark.parametrize("key", ["sk-gw-wrong-key-000000000000", KEY], ids=["wrong-key", "key-holder"])
def test_a_ping_flood_that_never_reads_its_pongs_costs_no_memory(served, key):
    """Threat: a client grows a worker's memory without bound (SECURITY.md, Anonymous client: the
    websocket server has flow control for control frames). A client sends pings for three seconds and
    never reads: uvicorn's sans-I/O websockets queued every pong (RSS 129 -> 519 MiB in 15 s with a
    wrong key); the production server's protocol (`gatewaysite.server.WebSocketProtocol`) stops reading
    while its pongs wait."""
    nonce = base64.b64encode(os.urandom(16)).decode()
    head = (
        "GET /v1/responses HTTP/1.1\r\nhost: 127.0.0.1\r\nupgrade: websocket\r\nconnection: Upgrade\r\n"
        f"sec-websocket-key: {nonce}\r\nsec-websocket-version: 13\r\nauthorization: Bearer {key}\r\n\r\n"
    )
    pings = b"".join(_masked(0x9, os.urandom(125)) for _ in range(8192))  # 1 MiB of whole frames
    before = rss_kb(served.pid)
    sent = 0
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        sock.sendall(head.encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 101")  # the handshake is accepted first, the key checked after
        sock.settimeout(0.2)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            offset = sent % len(pings)
            try:
                sent += sock.send(pings[offset : offset + 256 * 1024])
            except TimeoutError:
                continue  # the server is not reading: keep trying until the deadline
            except ConnectionError:
                break
        grown = rss_kb(served.pid) - before
        assert responsive(served.url)
    assert grown < 16 * 1024, f"RSS grew by {grown} KiB after {sent >> 20} MiB of pings"

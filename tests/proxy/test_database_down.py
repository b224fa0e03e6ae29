"""Without its database the gateway answers at once with a typed 503, never a 500 or a hang."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def gateway_without_database():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "DATABASE_URL": "sqlite:////nonexistent-directory/gateway.sqlite3",
        "DJANGO_SECRET_KEY": "test-only-secret-key-not-for-deployment",
        "DJANGO_DEBUG": "false",
    }
    cmd = [sys.executable, "-m", "uvicorn", "gatewaysite.asgi:application", "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            httpx.get(f"{url}/healthz", timeout=1)
            break
        except httpx.TransportError:
            time.sleep(0.05)
    yield url
    proc.terminate()
    proc.wait(15)


def test_requests_fail_fast_with_gateway_unavailable_while_liveness_holds(gateway_without_database):
    url = gateway_without_database
    headers = {"authorization": "Bearer sk-gw-any-key-0123456789abcdef"}
    body = {"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]}
    for path, method in (("/v1/chat/completions", "POST"), ("/v1/models", "GET")):
        started = time.monotonic()
        response = httpx.request(method, f"{url}{path}", json=body, headers=headers, timeout=10)
        assert time.monotonic() - started < 5
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "gateway_unavailable"
    assert httpx.get(f"{url}/readyz", timeout=10).status_code == 503
    assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200


def test_anthropic_and_websocket_ingress_fail_fast_typed_too(gateway_without_database):
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    url = gateway_without_database
    key = "sk-gw-any-key-0123456789abcdef"
    started = time.monotonic()
    response = httpx.post(
        f"{url}/v1/messages",
        json={"model": "claude-opus-4-8", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-api-key": key},
        timeout=10,
    )
    assert time.monotonic() - started < 5
    assert response.status_code == 503
    assert response.json()["type"] == "error" and response.json()["error"]["type"] == "api_error"
    ws_url = url.replace("http://", "ws://") + "/v1/responses"
    auth = {"authorization": f"Bearer {key}"}
    with (
        connect(ws_url, additional_headers=auth, open_timeout=10) as ws,
        pytest.raises(ConnectionClosed) as closed,
    ):
        ws.recv(timeout=10)
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1013, "gateway unavailable")

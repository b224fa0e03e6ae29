"""`python -m gatewaysite.server`'s command line, as uvicorn itself parses it."""

import uvicorn

from gatewaysite.server import command


def parsed(args: list[str]) -> dict:
    return uvicorn.main.make_context("gatewaysite.server", command(args)).params


def test_uvicorns_access_line_is_off_unless_the_operator_turns_it_on():
    # The gateway logs one structured line per request itself (SPEC §10); uvicorn's would be a second.
    assert parsed([])["access_log"] is False
    assert parsed(["--access-log"])["access_log"] is True


def test_answers_do_not_name_the_server_software_unless_the_operator_asks():
    assert parsed([])["server_header"] is False
    assert parsed(["--server-header"])["server_header"] is True


def test_the_operators_options_are_kept():
    params = parsed(["--port", "8123", "--workers", "3", "--ws-max-size", "1024"])
    assert (params["port"], params["workers"], params["ws_max_size"]) == (8123, 3, 1024)
    assert params["http"] == "gatewaysite.server:HttpToolsProtocol"
    assert params["ws"] == "gatewaysite.server:WebSocketProtocol"  # flow control for pongs (issue 45)


def test_each_worker_freezes_its_startup_heap_before_serving(monkeypatch):
    """What a worker holds at startup leaves the collector's full collections (gatewaysite.asgi)."""
    import asyncio
    import gc

    from gatewaysite.asgi import lifespan
    from proxy import shutdown

    monkeypatch.setattr(shutdown, "install", lambda: None)  # no signal handlers in the test process
    messages = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])
    frozen_at_startup: list[int] = []

    async def receive() -> dict:
        return next(messages)

    async def send(message: dict) -> None:
        if message["type"] == "lifespan.startup.complete":
            frozen_at_startup.append(gc.get_freeze_count())

    gc.unfreeze()
    try:
        asyncio.run(lifespan({"type": "lifespan"}, receive, send))
    finally:
        gc.unfreeze()
    assert frozen_at_startup and frozen_at_startup[0] > 10_000

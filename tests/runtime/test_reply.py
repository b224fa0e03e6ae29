"""runtime.reply: an answer sent straight on ASGI, and a client that leaves before it is sent whole."""

import asyncio

import pytest

from runtime.reply import Reply, header_value, respond


class Client:
    """The server's side of one request whose body was read: `receive` reports the disconnect once the
    client leaves (`leave()`) or, as uvicorn does, once the response is complete."""

    def __init__(self) -> None:
        self.sent: list[dict] = []
        self.gone = asyncio.Event()
        self.receives = 0

    async def receive(self) -> dict:
        self.receives += 1
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        self.sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.gone.set()

    def leave(self) -> None:
        self.gone.set()

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent[1:])

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.sent[0]["headers"])


async def test_a_whole_answer_is_sent_with_its_length_in_one_message():
    client = Client()

    async def answer() -> Reply:
        return Reply(201, b'{"ok":true}', headers=[("content-type", "application/json")])

    await respond(client.receive, client.send, answer)
    assert client.sent[0]["status"] == 201
    assert client.headers == {b"content-type": b"application/json", b"content-length": b"11"}
    assert client.sent[1:] == [{"type": "http.response.body", "body": b'{"ok":true}'}]


async def test_a_streamed_answer_is_sent_chunk_by_chunk_and_then_ended():
    client = Client()

    async def chunks():
        yield b"data: 1\n\n"
        yield b""
        yield b"data: 2\n\n"

    async def answer() -> Reply:
        return Reply(200, chunks=chunks(), headers=[("content-type", "text/event-stream")])

    await respond(client.receive, client.send, answer)
    assert b"content-length" not in client.headers
    assert [(m.get("body"), m.get("more_body", False)) for m in client.sent[1:]] == [
        (b"data: 1\n\n", True),
        (b"data: 2\n\n", True),
        (None, False),
    ]


# 0: well within WATCH_AFTER_S, found when the watch starts; 0.01: once the watch is running.
@pytest.mark.parametrize("leave_after_s", [0, 0.01])
async def test_a_client_that_leaves_before_the_answer_cancels_it_and_gets_nothing(leave_after_s):
    client = Client()
    cancelled = []

    async def answer() -> Reply:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return Reply(200)

    serving = asyncio.ensure_future(respond(client.receive, client.send, answer))
    await asyncio.sleep(leave_after_s)
    client.leave()
    await asyncio.wait_for(serving, 5)  # returns: nobody is left to answer
    assert cancelled == [True]
    assert client.sent == []


async def test_an_answer_ready_within_the_watch_delay_never_asks_whether_the_client_left():
    client = Client()

    async def answer() -> Reply:
        await asyncio.sleep(0)  # an answer that yields to the loop, as every real one does
        return Reply(200, b"fast")

    await respond(client.receive, client.send, answer)
    await asyncio.sleep(0)
    assert client.receives == 0  # no watcher task was started
    assert client.body == b"fast"


async def test_a_client_that_leaves_mid_stream_closes_the_stream_at_once():
    client = Client()
    closed = []

    async def chunks():
        try:
            yield b"data: 1\n\n"
            await asyncio.sleep(60)
            yield b"data: never\n\n"
        finally:
            closed.append(True)

    async def answer() -> Reply:
        return Reply(200, chunks=chunks())

    serving = asyncio.ensure_future(respond(client.receive, client.send, answer))
    await asyncio.sleep(0.01)
    client.leave()
    await asyncio.wait_for(serving, 5)
    assert closed == [True]
    assert client.body == b"data: 1\n\n"


async def test_the_disconnect_a_server_reports_after_the_answer_cancels_nothing():
    client = Client()

    async def answer() -> Reply:
        return Reply(200, b"done")

    async def send(message: dict) -> None:
        await client.send(message)
        await asyncio.sleep(0)  # a server whose send yields once the response is complete

    await respond(client.receive, send, answer)
    await asyncio.sleep(0.01)  # a cancel of this task would be raised here
    assert client.body == b"done"


async def test_a_cancel_from_the_server_is_not_taken_for_a_client_that_left():
    client = Client()

    async def answer() -> Reply:
        await asyncio.sleep(60)
        return Reply(200)

    serving = asyncio.ensure_future(respond(client.receive, client.send, answer))
    await asyncio.sleep(0.01)
    serving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await serving


async def test_without_watching_the_body_left_unread_is_never_received():
    client = Client()

    async def answer() -> Reply:
        return Reply(401, b"no")

    await respond(client.receive, client.send, answer, watch_disconnect=False)
    assert client.receives == 0
    assert client.body == b"no"


def test_a_reply_header_set_twice_keeps_the_last_value_once():
    reply = Reply(200, headers=[("x-a", "1"), ("x-b", "3")])
    reply["x-a"] = "2"
    assert reply.headers == [("x-b", "3"), ("x-a", "2")]


def test_header_values_are_latin1_or_mime_encoded_and_never_hold_a_line_break():
    assert header_value("gpt-5") == b"gpt-5"
    assert header_value("modèle") == "modèle".encode("latin-1")
    assert header_value("模型") == b"=?utf-8?b?5qih5Z6L?="
    with pytest.raises(ValueError, match="line break"):
        header_value("a\r\nset-cookie: x=1")


async def test_a_stream_whose_send_fails_is_closed_before_the_failure_goes_on():
    client = Client()
    closed = []

    async def chunks():
        try:
            yield b"data: 1\n\n"
            yield b"data: 2\n\n"
        finally:
            closed.append(True)

    async def answer() -> Reply:
        return Reply(200, chunks=chunks())

    async def broken(message: dict) -> None:
        if message.get("more_body"):
            raise OSError("connection reset")
        client.sent.append(message)

    with pytest.raises(OSError, match="reset"):
        await respond(client.receive, broken, answer)
    assert closed == [True]

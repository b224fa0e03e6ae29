"""runtime.consumer's contract with Channels: every message goes through `dispatch`, which finds its
handler by Channels' own naming; with no channel layer alias there is no layer; and Channels' own
dispatch still makes the database hop this one skips, so the day it stops this override can go."""

import inspect

import pytest
from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator

from runtime.consumer import DirectConsumer


class Echo:
    """Handlers shared by the probe consumers: accept, echo each text frame."""

    async def connect(self):
        await self.accept()

    async def receive(self, text_data=None, bytes_data=None):
        await self.send(text_data=text_data)


class DirectEcho(Echo, DirectConsumer):
    pass


class StockEcho(Echo, AsyncWebsocketConsumer):
    channel_layer_alias = None


@pytest.fixture
def hops(monkeypatch):
    """Every `aclose_old_connections` Channels' consumer module makes."""
    made: list[str] = []

    async def counted():
        made.append("hop")

    monkeypatch.setattr("channels.consumer.aclose_old_connections", counted)
    return made


async def echo_once(consumer) -> str:
    communicator = WebsocketCommunicator(consumer.as_asgi(), "/probe")
    connected, _ = await communicator.connect()
    assert connected
    await communicator.send_to(text_data="ping")
    answer = await communicator.receive_from()
    await communicator.disconnect()
    return answer


def test_channels_names_a_messages_handler_after_its_type():
    assert list(inspect.signature(get_handler_name).parameters) == ["message"]
    assert get_handler_name({"type": "websocket.receive"}) == "websocket_receive"


def test_no_channel_layer_alias_means_no_channel_layer():
    assert DirectConsumer.channel_layer_alias is None
    assert get_channel_layer(None) is None


async def test_every_message_is_dispatched_with_no_database_hop(hops):
    assert await echo_once(DirectEcho) == "ping"
    assert hops == []


async def test_channels_own_dispatch_still_hops_once_per_message(hops):
    assert await echo_once(StockEcho) == "ping"
    assert len(hops) == 3  # connect, receive, disconnect


async def test_a_message_without_a_handler_is_refused():
    consumer = DirectEcho()
    with pytest.raises(ValueError, match=r"websocket\.nonsense"):
        await consumer.dispatch({"type": "websocket.nonsense"})

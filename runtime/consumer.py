"""A Channels websocket consumer with no per-message database hop and no channel layer (Channels 4).

- Channels' `AsyncConsumer.dispatch` runs `aclose_old_connections()` (a hop to asgiref's sync thread)
  before every message, for consumers whose handlers use Django's connection on that thread. A
  `DirectConsumer` touches the database only through runtime.db's pool, whose threads age their own
  connections, so the hop is skipped: `dispatch` is Channels' own, without it.
- `channel_layer_alias = None`: no channel layer (get_channel_layer answers None for an alias that is
  not configured), so nothing else can send to the connection and it holds no layer task.

Internals relied on (tests/runtime/test_consumer.py): AsyncConsumer.__call__ routing every message
through `self.dispatch(message)`, channels.consumer.get_handler_name, get_channel_layer(None) is None.
"""

from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncWebsocketConsumer


class DirectConsumer(AsyncWebsocketConsumer):
    channel_layer_alias = None

    async def dispatch(self, message) -> None:
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

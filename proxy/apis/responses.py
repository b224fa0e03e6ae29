"""The Responses client API (`/v1/responses`, `/v1/responses/compact`, and its websocket mode): Chat's turn
requirements and OpenAI's error envelope; a stream's terminal error is a Responses `error` event.

PURE.
"""

from proxy.apis.chat import Chat
from proxy.sse import Dialect


class Responses(Chat):
    dialect = Dialect.RESPONSES


API = Responses()

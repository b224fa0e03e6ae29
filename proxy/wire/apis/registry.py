"""The client API of each client route, and of each stream dialect. Adding a client API is one module
(`proxy/wire/apis/<name>.py` holding an object that satisfies `proxy.wire.apis.base.ClientApi`) and its
routes here.

PURE.
"""

from collections.abc import Mapping

from proxy.wire import sse
from proxy.wire.apis import chat, messages, responses
from proxy.wire.apis.base import ClientApi
from proxy.wire.sse import Block, Classification, Dialect
from routing.policy.vocabulary import ClientRoute

# The client routes whose requests may ask for a stream (`"stream": true`), framed in their API's dialect.
STREAMING: Mapping[str, ClientApi] = {
    ClientRoute.CHAT_COMPLETIONS: chat.API,
    ClientRoute.RESPONSES: responses.API,
    ClientRoute.RESPONSES_COMPACT: responses.API,
    ClientRoute.MESSAGES: messages.API,
}
APIS: Mapping[str, ClientApi] = {**STREAMING, ClientRoute.COUNT_TOKENS: messages.API}
# Every client route the gateway relays to an upstream (the others, models and files, it answers itself),
# in the order `routing_explain` offers them: the only list of them.
RELAYED: tuple[ClientRoute, ...] = (
    ClientRoute.CHAT_COMPLETIONS,
    ClientRoute.RESPONSES,
    ClientRoute.RESPONSES_COMPACT,
    ClientRoute.MESSAGES,
    ClientRoute.COUNT_TOKENS,
    ClientRoute.EMBEDDINGS,
)


def api_for(route: str) -> ClientApi:
    """The API of client route `route` (`/v1/...`): every route not listed (embeddings, files, models) is
    OpenAI's, with Chat's envelope."""
    return APIS.get(route, chat.API)


# The API whose framing each stream dialect is: an upstream's stream is classified by its rules.
BY_DIALECT: Mapping[Dialect, ClientApi] = {api.dialect: api for api in APIS.values()}


def classify(dialect: Dialect, block: Block) -> Classification:
    """How `block` of a `dialect` stream counts for withholding (`proxy.wire.sse.classify`, with the rule of
    the client API that frames `dialect`)."""
    return sse.classify(block, BY_DIALECT[dialect].visibility)

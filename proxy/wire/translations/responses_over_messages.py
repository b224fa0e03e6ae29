"""An OpenAI Responses client on an Anthropic Messages upstream, through Chat Completions: the request goes
Responses -> Chat (`proxy.wire.translations.responses_over_chat`) -> Messages
(`proxy.wire.translations.chat_over_messages`),
the answer and the stream come back the same way in reverse.

PURE: standard library and `proxy.wire.sse` only, no I/O, no clock. Going through Chat is faithful for every
field the Responses translation carries: roles, tool calls and tool results map one to one in both steps,
and whatever the second step refuses (an assistant prefill, tool arguments that are not an object, a
`text.format` Anthropic cannot enforce) is refused under the client's Responses field name
(`ChatRequest.refusals`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.wire.sse import Block, SSEParser
from proxy.wire.translations.chat_over_messages import (
    AnthropicToChatStream,
    anthropic_to_chat_response,
    chat_to_anthropic_request,
)
from proxy.wire.translations.responses_over_chat import responses_to_chat_request
from proxy.wire.translations.responses_over_chat_answer import chat_to_responses_response
from proxy.wire.translations.responses_over_chat_stream import ChatToResponsesStream


def responses_to_anthropic_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """A Responses request body as an Anthropic Messages request body."""
    chat = responses_to_chat_request(body, stream_usage=True)
    with chat.refusals():
        return chat_to_anthropic_request(chat.body)


def anthropic_to_responses_response(
    msg_json: Mapping[str, Any],
    *,
    model: str,
    echoed: Mapping[str, Any],
    created: int,
    response_id: str,
    names: Mapping[str, tuple[str, str]],
) -> dict[str, Any]:
    """An Anthropic Message as Responses object `response_id` reporting `model`, created at `created`;
    `names`: `namespaced(request)`."""
    return chat_to_responses_response(
        anthropic_to_chat_response(msg_json, model=model, created=created),
        model=model,
        echoed=echoed,
        created=created,
        response_id=response_id,
        names=names,
    )


class AnthropicToResponsesStream:
    """Anthropic Messages events in, Responses events out: each Messages event becomes Chat chunks, read
    back as blocks and fed to the Chat -> Responses translator. One per upstream response."""

    def __init__(
        self,
        *,
        model: str,
        echoed: Mapping[str, Any],
        created: int,
        response_id: str,
        names: Mapping[str, tuple[str, str]],
    ) -> None:
        # Usage always: a Responses stream reports it in its terminal event.
        self._chat = AnthropicToChatStream(model=model, include_usage=True, created=created)
        self._parser = SSEParser()
        self._responses = ChatToResponsesStream(
            model=model, echoed=echoed, created=created, response_id=response_id, names=names
        )

    @property
    def ended(self) -> bool:
        return self._responses.ended

    @property
    def response_id(self) -> str | None:
        return self._responses.response_id

    def feed(self, block: Block) -> bytes:
        return self._through(self._chat.feed(block))

    def finish(self) -> bytes:
        return self._through(self._chat.finish()) + self._responses.finish()

    def _through(self, chat: bytes) -> bytes:
        if not chat:
            return b""
        return b"".join(self._responses.feed(block) for block in self._parser.feed(chat))

"""The one reader of Chat Completions streams (proxy.wire.translations.chat_chunks) under both translators
that
use it: Anthropic Messages and OpenAI Responses clients on a Chat upstream."""

from functools import partial

import pytest

from proxy.wire.sse import encode_block
from proxy.wire.translations.messages_over_chat import ChatToAnthropicStream
from proxy.wire.translations.responses_over_chat_answer import echo
from proxy.wire.translations.responses_over_chat_stream import ChatToResponsesStream
from tests.providers.test_responses_bridge import chat_chunk
from tests.proxy.test_translate import run

TRANSLATORS = [
    pytest.param(partial(ChatToAnthropicStream, model="m"), id="messages"),
    pytest.param(
        partial(ChatToResponsesStream, model="m", echoed=echo({}), created=1, response_id="resp_1", names={}),
        id="responses",
    ),
]
OPENING = [chat_chunk({"role": "assistant", "content": ""}), chat_chunk({"content": "Hel"})]
FINISHED = [chat_chunk({"content": "lo"}, "stop")]
CLOSING = [
    encode_block(
        None, '{"id": "chatcmpl-7", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}'
    ),
    encode_block(None, "[DONE]"),
]


@pytest.mark.parametrize("translator", TRANSLATORS)
def test_nothing_of_a_choice_is_read_after_its_finish_reason(translator):
    late = [
        chat_chunk({"content": " and more"}),
        chat_chunk(
            {"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "rm", "arguments": "{}"}}]}
        ),
        chat_chunk({}, "length"),
    ]
    ended = translator()
    out = run(ended, b"".join([*OPENING, *FINISHED, *late, *CLOSING]))
    assert out == run(translator(), b"".join([*OPENING, *FINISHED, *CLOSING])) and ended.ended


@pytest.mark.parametrize("translator", TRANSLATORS)
def test_a_stream_cut_after_its_finish_reason_is_closed_once_at_eof(translator):
    cut = translator()
    out = run(cut, b"".join([*OPENING, *FINISHED]))
    whole = run(translator(), b"".join([*OPENING, *FINISHED, CLOSING[-1]]))
    assert (out, cut.ended) == (whole, True)
    assert cut.finish() == b"" and run(cut, chat_chunk({"content": "x"})) == b""  # ended: nothing more

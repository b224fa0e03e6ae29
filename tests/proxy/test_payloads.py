"""Readers of upstream payloads (proxy.wire.payloads): the response id an answer carries, and its usage
(cached input included) in every provider's shape, plain and streamed."""

import json

import pytest

from proxy.ledger.exchange import AttemptLog
from proxy.output import note_usage
from proxy.wire.payloads import Usage, response_id, usage
from proxy.wire.providers.bedrock_translate import ConverseToChatStream, converse_to_chat_response
from proxy.wire.providers.gemini_translate import gemini_to_chat_response
from routing.policy.types import AFFINITY_KEY_MAX

LONGEST = "resp_" + "x" * (AFFINITY_KEY_MAX - 5)


@pytest.mark.parametrize("wrap", [lambda r: r, lambda r: {"type": "response.completed", "response": r}])
def test_a_response_id_is_read_up_to_the_longest_an_affinity_holds(wrap):
    """An id the affinity table can hold is remembered; a longer one is not read at all, so it is never
    stored cut short (another id could share the prefix) nor refused by the column mid-request."""
    assert response_id(wrap({"object": "response", "id": LONGEST})) == LONGEST
    assert response_id(wrap({"object": "response", "id": LONGEST + "x"})) is None
    assert response_id(wrap({"object": "response", "id": ""})) is None


# -- usage, cached input included (SPEC §7.3) --------------------------------------------------------

CHAT_USAGE = {"prompt_tokens": 130, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 100}}
RESPONSES_USAGE = {"input_tokens": 130, "output_tokens": 5, "input_tokens_details": {"cached_tokens": 100}}
# Anthropic's input_tokens exclude cache reads and writes: 10 uncached + 100 read + 20 written.
ANTHROPIC_USAGE = {
    "input_tokens": 10,
    "cache_read_input_tokens": 100,
    "cache_creation_input_tokens": 20,
    "output_tokens": 5,
}


@pytest.mark.parametrize(
    "payload, expected",
    [
        ({"object": "chat.completion", "usage": CHAT_USAGE}, Usage(130, 5, 100, None)),
        ({"object": "response", "usage": RESPONSES_USAGE}, Usage(130, 5, 100, None)),
        ({"type": "response.completed", "response": {"usage": RESPONSES_USAGE}}, Usage(130, 5, 100, None)),
        ({"type": "message", "usage": ANTHROPIC_USAGE}, Usage(130, 5, 100, 20)),
        # OpenRouter (and the Bedrock Chat wire) name cache writes beside the reads.
        (
            {
                "usage": {
                    **CHAT_USAGE,
                    "prompt_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 30},
                }
            },
            Usage(130, 5, 0, 30),
        ),
        # No cache mentioned: counts as before, cached parts unknown (NULL), never a guessed 0.
        ({"usage": {"prompt_tokens": 11, "completion_tokens": 4}}, Usage(11, 4, None, None)),
        ({"usage": {"input_tokens": 11, "output_tokens": 4}}, Usage(11, 4, None, None)),
        ({"usage": {"prompt_tokens": 8, "total_tokens": 8}}, Usage(8, 0, None, None)),  # embeddings
        ({"choices": []}, Usage()),
        ("not a dict", Usage()),
    ],
)
def test_usage_reads_every_shape_with_input_counting_the_cached_part(payload, expected):
    assert usage(payload) == expected


@pytest.mark.parametrize(
    "count, stored",
    [(-5, 0), (2**31, 2**31 - 1), (10**30, 2**31 - 1), (True, None), ("7", None), (7.0, None)],
)
def test_an_upstreams_count_is_clamped_to_what_the_ledger_stores(count, stored):
    """A negative or huge number never reaches the ledger's integer columns (it would break the batch
    that writes it, with every other request's records); what is not an integer is no count."""
    found = usage(
        {
            "usage": {
                "prompt_tokens": count,
                "completion_tokens": count,
                "prompt_tokens_details": {"cached_tokens": count},
            }
        }
    )
    assert (found.input, found.output, found.cached_read) == (stored, stored, stored)
    anthropic = usage({"usage": {"input_tokens": 2**31 - 1, "cache_read_input_tokens": count}})
    assert anthropic.input == 2**31 - 1  # the sum is clamped too


def _streamed(events: list[dict]) -> AttemptLog:
    log = AttemptLog(ordinal=1, assignment_id=1, model="m", route_class="http", status="succeeded")
    for event in events:
        note_usage(log, event)
    return log


def _counts(log: AttemptLog) -> tuple:
    return log.input_tokens, log.output_tokens, log.cached_read_tokens, log.cached_write_tokens


def test_an_anthropic_stream_counts_its_cache_once_though_message_delta_repeats_it():
    """message_start carries the input fields, message_delta the cumulative counts (with caching, the
    input fields again): the last value of each is kept, never a sum of the events."""
    start = {"type": "message_start", "message": {"usage": {**ANTHROPIC_USAGE, "output_tokens": 1}}}
    delta = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": ANTHROPIC_USAGE}
    assert _counts(_streamed([start, delta])) == (130, 5, 100, 20)
    # A delta that names only its output keeps what message_start said.
    only_output = {"type": "message_delta", "usage": {"output_tokens": 5}}
    assert _counts(_streamed([start, only_output])) == (130, 5, 100, 20)


def test_chat_and_responses_streams_read_the_cached_part_from_their_last_event():
    chat = [
        {"choices": [{"index": 0, "delta": {"content": "hi"}}], "usage": None},
        {"choices": [], "usage": CHAT_USAGE},
    ]
    assert _counts(_streamed(chat)) == (130, 5, 100, None)
    responses = [
        {"type": "response.created", "response": {"usage": None}},
        {"type": "response.completed", "response": {"usage": RESPONSES_USAGE}},
    ]
    assert _counts(_streamed(responses)) == (130, 5, 100, None)


def test_gemini_and_bedrock_cached_counts_cross_the_chat_wire():
    """Both reach the relay as Chat answers: Gemini's cachedContentTokenCount is part of its prompt, as
    cached_tokens is of Chat's; Converse's inputTokens exclude the cache, Chat's prompt includes it."""
    gemini = {
        "candidates": [{"content": {"parts": [{"text": "hi"}]}, "finishReason": "STOP"}],
        "usageMetadata": {"promptTokenCount": 130, "candidatesTokenCount": 5, "cachedContentTokenCount": 100},
    }
    assert usage(gemini_to_chat_response(gemini, model="g", created=0)) == Usage(130, 5, 100, None)
    converse = {
        "output": {"message": {"role": "assistant", "content": [{"text": "hi"}]}},
        "stopReason": "end_turn",
        "usage": {
            "inputTokens": 10,
            "outputTokens": 5,
            "cacheReadInputTokens": 100,
            "cacheWriteInputTokens": 20,
        },
    }
    assert usage(converse_to_chat_response(converse, model="b", created=0)) == Usage(130, 5, 100, 20)
    stream = ConverseToChatStream(model="b", created=0)
    stream.event("messageStart", {"role": "assistant"})
    stream.event("messageStop", {"stopReason": "end_turn"})
    out = stream.event("metadata", {"usage": converse["usage"]})
    chunks = [json.loads(line[6:]) for line in out.decode().splitlines() if line.startswith("data: {")]
    assert usage(chunks[-1]) == Usage(130, 5, 100, 20)

"""A context overflow reaches a Messages client in Anthropic's documented words, whatever account shape
produced it (SPEC §6.0, issue 44 point 2): Claude Code compacts on `prompt is too long: N tokens > M
maximum` and fails on anything else. The integers are the upstream's when its message is exactly its
provider's documented wording (Anthropic's, or OpenAI's `context_length_exceeded` one), else the
gateway's estimate and the model's window; nothing else of the upstream's message reaches the client,
the ledger or the log. The anthropic SDK, plain and streamed -> the gateway -> fakes on loopback."""

import anthropic
import pytest

from devkit.behaviours import error
from pools.models import Adapter
from proxy.ledger.models import Attempt
from tests.gateway_fixtures import GATEWAY_KEY
from tests.proxy.fixtures_e2e import ledger_settled
from tests.proxy.test_anthropic_ingress import Setup, setup
from tests.proxy.test_canary import _database_values, every_log_record

__all__ = ["every_log_record", "setup"]  # the fixtures this module uses

MODEL = "big-model"
CANARY = "overflow-canary-3c9d"
ASK = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
ANTHROPIC_WORDS = "prompt is too long: 201234 tokens > 200000 maximum"
OPENAI_WORDS = (
    "This model's maximum context length is 128000 tokens. However, your messages resulted in 130500 tokens."
)


def anthropic_overflow(message: str) -> dict:
    return {"type": "error", "error": {"type": "invalid_request_error", "message": message}, CANARY: CANARY}


def openai_overflow(message: str) -> dict:
    fields = {"type": "invalid_request_error", "code": "context_length_exceeded", "param": "messages"}
    return {"error": {**fields, "message": message}, "note": CANARY}


def ask(gateway: str, stream: bool) -> anthropic.BadRequestError:
    client = anthropic.Anthropic(base_url=gateway, api_key=GATEWAY_KEY, max_retries=0, timeout=15)
    with client, pytest.raises(anthropic.BadRequestError) as raised:
        if stream:
            with client.messages.stream(**ASK) as events:
                list(events)
        else:
            client.messages.create(**ASK)
    return raised.value


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "sse"])
@pytest.mark.parametrize(
    ("adapter", "body", "said"),
    [
        (Adapter.ANTHROPIC, anthropic_overflow(ANTHROPIC_WORDS), ANTHROPIC_WORDS),
        (Adapter.OPENAI, openai_overflow(OPENAI_WORDS), "prompt is too long: 130500 tokens > 128000 maximum"),
    ],
    ids=["anthropic-account", "openai-account"],
)
def test_an_overflow_reaches_a_messages_client_in_anthropic_words(
    gateway, setup: Setup, fake_upstream_factory, every_log_record, adapter, body, said, stream
):
    fake = setup.add(fake_upstream_factory, "acct", adapter, (MODEL,))
    fake.script(MODEL, error(400, body))
    refused = ask(gateway, stream)
    assert refused.body["error"] == {"type": "invalid_request_error", "message": said}
    ledger_settled()
    (attempt,) = Attempt.objects.all()
    assert attempt.failure_class == "context_overflow"
    assert CANARY not in refused.response.text and CANARY not in every_log_record.text
    assert not [table for table, value in _database_values() if CANARY in value]


ESTIMATED = "prompt is too long for the model's context window"  # no window known: no integers at all


@pytest.mark.parametrize(
    ("adapter", "body", "said"),
    [
        # No code says it is an overflow: a refusal like any other.
        (
            Adapter.ANTHROPIC,
            anthropic_overflow(f"prompt is too long: 9 tokens > 5 maximum {CANARY}"),
            "The upstream rejected the request.",
        ),
        (Adapter.OPENAI, openai_overflow(f"{OPENAI_WORDS} {CANARY}"), ESTIMATED),
        (Adapter.OPENAI, openai_overflow(f"Reduce the length: 77777 tokens {CANARY}"), ESTIMATED),
    ],
    ids=["anthropic-other-words", "openai-other-words", "openai-no-integers"],
)
def test_other_words_give_nothing_of_the_message(
    gateway, setup: Setup, fake_upstream_factory, every_log_record, adapter, body, said
):
    fake = setup.add(fake_upstream_factory, "acct", adapter, (MODEL,))
    fake.script(MODEL, error(400, body))
    refused = ask(gateway, stream=False)
    assert refused.body["error"]["message"] == said
    assert CANARY not in refused.response.text and CANARY not in every_log_record.text

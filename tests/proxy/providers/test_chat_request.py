"""proxy.wire.providers.chat_request.turns: a Chat body's messages as the alternating turns of Converse and
Gemini (pure)."""

import pytest

from proxy.wire.providers.chat_request import turns
from proxy.wire.translations.translate import RequestTranslationError

EMPTY_THEN_S2 = [{"type": "text", "text": ""}, {"type": "text", "text": "s2"}]


def turn_of(role, message, param):
    """Each message as its text (none when empty), tool results in user turns, as both providers do."""
    content = message.get("content") or ""
    return ("user" if role == "tool" else role), ([f"{param}:{content}"] if content else [])


def test_system_texts_in_order_and_consecutive_items_of_one_role_in_one_turn():
    system, found = turns(
        {
            "messages": [
                {"role": "system", "content": "s1"},
                {"role": "user", "content": "q"},
                {
                    "role": "developer",
                    "content": [{"type": "text", "text": ""}, {"type": "text", "text": "s2"}],
                },
                {"role": "assistant", "content": "calls"},
                {"role": "tool", "content": "r1"},
                {"role": "tool", "content": "r2"},
                {"role": "user", "content": "and then"},
                {"role": "assistant", "content": ""},
                {"role": "user", "content": "again"},
            ]
        },
        "items",
        turn_of,
    )
    assert system == ["s1", "s2"]
    assert found == [
        {"role": "user", "items": ["messages[1]:q"]},
        {"role": "assistant", "items": ["messages[3]:calls"]},
        {
            "role": "user",
            "items": [
                "messages[4]:r1",
                "messages[5]:r2",
                "messages[6]:and then",
                "messages[8]:again",  # the empty assistant message between them is no turn
            ],
        },
    ]


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([{"role": "system", "content": "only instructions"}], "messages"),
        ([{"role": "user", "content": "q"}, {"role": "function", "content": "x"}], "messages[1].role"),
        ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "prefill"}], "messages[1].role"),
        ([{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}], "messages[1].role"),
        ("not a list", "messages"),
    ],
)
def test_no_turn_another_role_and_a_final_assistant_message_are_refused(messages, param):
    with pytest.raises(RequestTranslationError) as refused:
        turns({"messages": messages}, "items", turn_of)
    assert refused.value.param == param

"""The tool-call ids the gateway derives and the Gemini thought signatures they carry (pure)."""

import re

import pytest

from proxy.wire.providers.tool_ids import MARK, derived_id, signed_id, split_id, strip_signatures

ANTHROPIC_ID = re.compile(r"[A-Za-z0-9_-]+")


@pytest.mark.parametrize("signature", ["+/8=", "CiQB__ts_x-y", "é\u2028", "A" * 4000])
def test_a_signature_rides_in_an_anthropic_valid_id_and_comes_back_byte_for_byte(signature):
    carried = signed_id("call_0a1b", signature)
    assert ANTHROPIC_ID.fullmatch(carried)
    assert split_id(carried) == ("call_0a1b", signature)


def test_an_id_without_a_signature_is_its_own_plain_id():
    assert signed_id("call_x", None) == "call_x"
    assert split_id("toolu_01abc") == ("toolu_01abc", None)


def test_derived_ids_differ_across_answers_and_positions_and_repeat_for_the_same_answer():
    ids = {derived_id(answer, n) for answer in ("r1", "r2") for n in (0, 1)}
    assert len(ids) == 4
    assert derived_id("r1", 0) == derived_id("r1", 0)


def test_every_signed_id_of_each_client_shape_is_cut_to_its_plain_id():
    signed = signed_id("call_a", "c2ln")
    chat = {
        "messages": [
            {"role": "assistant", "tool_calls": [{"id": signed, "type": "function"}]},
            {"role": "tool", "tool_call_id": signed, "content": "r"},
        ]
    }
    messages = {
        "messages": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": signed}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": signed}]},
        ]
    }
    responses = {"input": [{"type": "function_call", "call_id": signed}, {"call_id": signed}]}
    for body in (chat, messages, responses):
        assert MARK not in str(strip_signatures(body))
        assert MARK in str(body)  # the client's body is not changed in place
    plain = {"messages": [{"role": "user", "content": "hi"}]}
    assert strip_signatures(plain) is plain

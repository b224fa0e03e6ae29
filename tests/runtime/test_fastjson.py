"""runtime.fastjson: orjson where the standard library's encoder was, with its output where orjson
refuses a value."""

import json

import pytest

from runtime import fastjson


def _stdlib(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


@pytest.mark.parametrize(
    "value",
    [
        {"model": "gpt-5", "messages": [{"role": "user", "content": "héllo \u2028 😀"}], "temperature": 0},
        {"n": 2**63 - 1, "m": -(2**63), "x": 0.1, "ok": True, "none": None, "list": []},
        {"big": 2**70},  # beyond 64 bits: orjson refuses it, the standard library encodes it
        {1: "an integer key"},  # orjson refuses a key that is not a string
    ],
)
def test_dumps_is_compact_utf8_json_with_the_values_the_standard_library_reads_back(value):
    encoded = fastjson.dumps(value)
    assert isinstance(encoded, bytes)
    assert json.loads(encoded) == json.loads(_stdlib(value))
    assert b", " not in encoded and b": " not in encoded


def test_dumps_falls_back_to_exactly_the_standard_librarys_output():
    assert fastjson.dumps({"big": 2**70, "é": 1}) == _stdlib({"big": 2**70, "é": 1})


def test_a_lone_surrogate_cannot_be_encoded_either_way():
    with pytest.raises(ValueError):  # UnicodeEncodeError, after orjson's TypeError
        fastjson.dumps({"text": "\ud800"})


@pytest.mark.parametrize("text", [b"NaN", b"[Infinity]", b"1e999", b'"\\ud800"', b"{", b""])
def test_loads_refuses_what_is_not_json_an_upstream_could_mean(text):
    with pytest.raises(ValueError):
        fastjson.loads(text)

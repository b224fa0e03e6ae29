"""Sanitized upstream error fields (SPEC §4): pure, so tested by table."""

import pytest

from routing.policy.failures import CanonicalError, FailureClass
from routing.policy.sanitize import CANONICAL, sanitized, valid


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("model_not_found", True),
        ("a.b:c-d_e", True),
        ("x" * 64, True),
        ("x" * 65, False),
        ("", False),
        ("has space", False),
        ("sk-ant-api03/abc=", False),
        ("ünïcode", False),
        ("line\nbreak", False),
        (None, False),
        (42, False),
    ],
)
def test_a_field_is_kept_only_when_short_and_plain(value, ok):
    assert valid(value) is ok


def test_valid_fields_pass_and_absent_fields_stay_absent():
    error = CanonicalError("invalid_request_error", "model_not_found", "model")
    assert sanitized(error, FailureClass.MODEL_UNAVAILABLE) == error
    assert sanitized(CanonicalError(), FailureClass.UNAVAILABLE) == CanonicalError()


@pytest.mark.parametrize("failure", list(FailureClass))
def test_an_invalid_field_becomes_the_class_canonical_value(failure):
    junk = "Bearer sk-secret " + "x" * 10_000
    result = sanitized(CanonicalError(junk, junk, junk), failure)
    expected = CANONICAL.get(str(failure), ("upstream_error", "upstream_error", None))
    assert (result.type, result.code, result.param) == expected
    for value in (result.type, result.code, result.param):
        assert value is None or valid(value)

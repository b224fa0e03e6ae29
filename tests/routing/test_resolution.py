"""SPEC §5.1 model resolution and the §5.2 cross-model fallback."""

import pytest

from routing.policy.errors import ErrorCode
from routing.policy.resolution import (
    Fallback,
    FallbackReason,
    ModelPolicy,
    Resolution,
    ResolutionError,
    cross_model_fallback,
    fallback_for,
    family_fallback,
    is_allowed,
    resolve,
    split_version,
)

ALL = ["*"]
OPUS = frozenset({"claude-opus-4-1", "claude-opus-4-8", "claude-sonnet-4-6-bedrock", "gpt-5", "gpt-5.1"})


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("claude-opus-5", ("claude-opus", (5,))),
        ("claude-opus-4-8", ("claude-opus", (4, 8))),
        ("claude-opus-4-1", ("claude-opus", (4, 1))),
        ("gpt-5.2", ("gpt", (5, 2))),
        ("gpt-5.1", ("gpt", (5, 1))),
        ("gpt-5", ("gpt", (5,))),
        ("claude-3-5-sonnet-20241022", ("claude-3-5-sonnet", (20241022,))),
        ("claude-sonnet-4-6-bedrock", None),
        ("gpt-5-mini", None),
        ("gpt-4o", None),
        ("o3", None),
        ("5", None),
        ("4-8", None),
        ("gpt-5.", None),
        ("auto", None),
    ],
)
def test_split_version(name, expected):
    assert split_version(name) == expected


def test_versions_compare_as_tuples_not_strings():
    # As strings "4-10" < "4-9"; as versions 4.10 is the higher one.
    assert family_fallback("claude-opus-5", {"claude-opus-4-9", "claude-opus-4-10"}) == "claude-opus-4-10"


def test_family_ties_on_version_break_by_name():
    assert family_fallback("gpt-5.2", {"gpt-5-1", "gpt-5.1"}) == "gpt-5.1"
    assert family_fallback("gpt-5.2", {"gpt-5.1", "gpt-5-1"}) == "gpt-5.1"


@pytest.mark.parametrize(
    ("requested", "routable", "served"),
    [
        ("claude-opus-5", {"claude-opus-4-1", "claude-opus-4-8"}, "claude-opus-4-8"),
        ("claude-opus-5", {"claude-opus-4-1"}, "claude-opus-4-1"),
        ("gpt-5.2", {"gpt-5.1", "gpt-5", "gpt-4.1"}, "gpt-5.1"),
        ("gpt-5.2", {"gpt-5"}, "gpt-5"),
        # strictly below: an equal or higher version is never a family fallback
        ("claude-opus-4-8", {"claude-opus-4-8-1", "claude-opus-5"}, None),
        # another family never is, even with a lower version
        ("claude-opus-5", {"claude-sonnet-4-8", "gpt-4"}, None),
        # a name with no numeric tail is never a candidate ...
        ("claude-sonnet-5", {"claude-sonnet-4-6-bedrock"}, None),
        # ... nor does it resolve by family itself
        ("claude-sonnet-4-7-bedrock", {"claude-sonnet-4-6-bedrock", "claude-sonnet-4-6"}, None),
    ],
)
def test_family_fallback(requested, routable, served):
    assert family_fallback(requested, routable) == served


@pytest.mark.parametrize(
    ("requested", "served", "reason"),
    [
        ("claude-opus-5", "claude-opus-4-8", FallbackReason.FAMILY),
        ("gpt-5.2", "gpt-5.1", FallbackReason.FAMILY),
        ("claude-opus-4-8", "claude-opus-4-8", FallbackReason.NONE),
        ("gpt-5", "gpt-5", FallbackReason.NONE),
    ],
)
def test_resolve_by_family(requested, served, reason):
    result = resolve(requested, policy=ModelPolicy(), routable=OPUS, allowed_models=ALL)
    assert result == Resolution(requested=requested, canonical=requested, served=served, fallback=reason)


def test_explicit_mapping_wins_over_family():
    policy = ModelPolicy(fallbacks={"claude-opus-5": "claude-opus-4-1"})
    result = resolve("claude-opus-5", policy=policy, routable=OPUS, allowed_models=ALL)
    assert isinstance(result, Resolution)
    assert (result.served, result.fallback) == ("claude-opus-4-1", FallbackReason.EXPLICIT)


def test_explicit_mapping_to_an_unrouted_model_is_not_found_not_family():
    policy = ModelPolicy(fallbacks={"claude-opus-5": "claude-opus-4-9"})
    result = resolve("claude-opus-5", policy=policy, routable=OPUS, allowed_models=ALL)
    assert result == ResolutionError(ErrorCode.MODEL_NOT_FOUND, "claude-opus-5")


def test_family_off_is_model_not_found():
    result = resolve("claude-opus-5", policy=ModelPolicy(family=False), routable=OPUS, allowed_models=ALL)
    assert result == ResolutionError(ErrorCode.MODEL_NOT_FOUND, "claude-opus-5")


def test_family_off_still_honours_explicit_mapping():
    policy = ModelPolicy(fallbacks={"claude-opus-5": "claude-opus-4-8"}, family=False)
    result = resolve("claude-opus-5", policy=policy, routable=OPUS, allowed_models=ALL)
    assert isinstance(result, Resolution)
    assert result.fallback is FallbackReason.EXPLICIT


def test_unknown_model_without_fallback_is_not_found():
    result = resolve("mistral-large", policy=ModelPolicy(), routable=OPUS, allowed_models=ALL)
    assert result == ResolutionError(ErrorCode.MODEL_NOT_FOUND, "mistral-large")


def test_routed_model_is_never_substituted_even_with_a_mapping():
    policy = ModelPolicy(fallbacks={"claude-opus-4-8": "claude-opus-4-1"})
    result = resolve("claude-opus-4-8", policy=policy, routable=OPUS, allowed_models=ALL)
    assert isinstance(result, Resolution)
    assert (result.served, result.fallback) == ("claude-opus-4-8", FallbackReason.NONE)


def test_alias_is_one_hop_then_resolved():
    policy = ModelPolicy(aliases={"opus": "claude-opus-5", "claude-opus-5": "never-followed"})
    result = resolve("opus", policy=policy, routable=OPUS, allowed_models=ALL)
    assert result == Resolution(
        requested="opus", canonical="claude-opus-5", served="claude-opus-4-8", fallback=FallbackReason.FAMILY
    )


def test_alias_chain_is_not_followed():
    policy = ModelPolicy(aliases={"a": "b", "b": "gpt-5"})
    result = resolve("a", policy=policy, routable=OPUS, allowed_models=ALL)
    assert result == ResolutionError(ErrorCode.MODEL_NOT_FOUND, "b")


def test_fallback_is_one_hop():
    # opus-5 -> opus-4-8 explicitly; opus-4-8 has a mapping of its own but is not routed: no chain.
    policy = ModelPolicy(fallbacks={"claude-opus-5": "claude-opus-4-8", "claude-opus-4-8": "claude-opus-4-1"})
    routable = {"claude-opus-4-1"}
    result = resolve("claude-opus-5", policy=policy, routable=routable, allowed_models=ALL)
    assert result == ResolutionError(ErrorCode.MODEL_NOT_FOUND, "claude-opus-5")


def test_key_allowed_only_the_unrouted_requested_model_is_denied_not_downgraded():
    result = resolve("claude-opus-5", policy=ModelPolicy(), routable=OPUS, allowed_models=["claude-opus-5"])
    assert result == ResolutionError(ErrorCode.PERMISSION_DENIED, "claude-opus-4-8")


def test_key_allowed_the_served_model_gets_the_fallback():
    result = resolve("claude-opus-5", policy=ModelPolicy(), routable=OPUS, allowed_models=["claude-opus-4-8"])
    assert isinstance(result, Resolution)
    assert result.served == "claude-opus-4-8"


def test_family_picks_highest_version_even_if_key_allows_only_a_lower_one():
    result = resolve("claude-opus-5", policy=ModelPolicy(), routable=OPUS, allowed_models=["claude-opus-4-1"])
    assert result == ResolutionError(ErrorCode.PERMISSION_DENIED, "claude-opus-4-8")


def test_served_model_authorized_not_the_alias():
    policy = ModelPolicy(aliases={"gpt5": "gpt-5"})
    assert resolve("gpt5", policy=policy, routable=OPUS, allowed_models=["gpt5"]) == ResolutionError(
        ErrorCode.PERMISSION_DENIED, "gpt-5"
    )
    assert isinstance(resolve("gpt5", policy=policy, routable=OPUS, allowed_models=["gpt-5"]), Resolution)


@pytest.mark.parametrize(
    ("model", "allowed", "expected"),
    [
        ("gpt-5", ["*"], True),
        ("gpt-5", ["gpt-5"], True),
        ("gpt-5", ["gpt-5.1", "claude-opus-4-8"], False),
        ("gpt-5", [], False),
        ("gpt-5", ["gpt-*"], False),  # no glob other than the lone wildcard
    ],
)
def test_is_allowed(model, allowed, expected):
    assert is_allowed(model, allowed) is expected


@pytest.mark.parametrize(
    ("model", "policy", "expected"),
    [
        ("claude-opus-4-8", ModelPolicy(), Fallback("claude-opus-4-1", FallbackReason.FAMILY)),
        (
            "claude-opus-4-8",
            ModelPolicy(fallbacks={"claude-opus-4-8": "gpt-5"}),
            Fallback("gpt-5", FallbackReason.EXPLICIT),
        ),
        ("claude-opus-4-8", ModelPolicy(fallbacks={"claude-opus-4-8": "gpt-9"}), None),
        ("claude-opus-4-8", ModelPolicy(family=False), None),
        ("claude-opus-4-1", ModelPolicy(), None),
        ("claude-sonnet-4-6-bedrock", ModelPolicy(), None),
        ("gpt-5.1", ModelPolicy(), Fallback("gpt-5", FallbackReason.FAMILY)),
    ],
)
def test_fallback_for_configured_model(model, policy, expected):
    assert fallback_for(model, policy=policy, routable=OPUS) == expected


def test_cross_model_fallback_extends_a_direct_resolution():
    resolution = resolve("claude-opus-4-8", policy=ModelPolicy(), routable=OPUS, allowed_models=ALL)
    assert isinstance(resolution, Resolution)
    assert cross_model_fallback(resolution, policy=ModelPolicy(), routable=OPUS) == Fallback(
        "claude-opus-4-1", FallbackReason.FAMILY
    )


def test_cross_model_fallback_is_none_after_a_substitution():
    resolution = resolve("claude-opus-5", policy=ModelPolicy(), routable=OPUS, allowed_models=ALL)
    assert isinstance(resolution, Resolution)
    assert resolution.served == "claude-opus-4-8"
    assert cross_model_fallback(resolution, policy=ModelPolicy(), routable=OPUS) is None

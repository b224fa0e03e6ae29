"""The vocabularies are declared once (routing/policy/vocabulary.py) and everything else is built from them
(issue 16 point 3): the ORM's choices and check constraints, the metrics' bounded label sets, and the
relay's statuses and outcomes. A new member can therefore not be forgotten by one of them."""

import ast
from datetime import UTC, datetime
from pathlib import Path

import pytest

from pools.models import Assignment, GatewayKey
from proxy.ledger import metrics
from proxy.ledger.exchange import AttemptLog, Exchange
from proxy.ledger.models import Attempt, RequestRecord
from routing.models import Circuit, Demotion
from routing.policy.vocabulary import (
    AttemptStatus,
    BudgetPeriod,
    CircuitReason,
    CircuitState,
    ClientRoute,
    DataCollection,
    DispatchState,
    FailureClass,
    Outcome,
    RouteClass,
    Router,
    ToolRepresentation,
    TriState,
)
from tests.test_imports import PACKAGES

ROOT = Path(__file__).resolve().parent.parent
T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


def _values(field) -> list[str]:
    return [value for value, _ in field.choices]


@pytest.mark.parametrize(
    ("model", "field", "vocabulary"),
    [
        (RequestRecord, "transport", RouteClass),
        (Attempt, "route_class", RouteClass),
        (Attempt, "status", AttemptStatus),
        (Attempt, "dispatch_state", DispatchState),
        (Circuit, "state", CircuitState),
        (Circuit, "reason", CircuitReason),
        (Demotion, "reason", CircuitReason),
        (Assignment, "router", Router),
        (Assignment, "data_collection", DataCollection),
        (Assignment, "tool_representation", ToolRepresentation),
        (GatewayKey, "budget_period", BudgetPeriod),
    ],
)
def test_a_columns_choices_are_its_vocabulary(model, field, vocabulary):
    assert _values(model._meta.get_field(field)) == [member.value for member in vocabulary]


def _enum_classes(path: Path) -> list[tuple[str, frozenset[str]]]:
    """(class name, its members' values) of every enum or `TextChoices` class a module declares."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ClassDef):
            continue
        bases = {ast.unparse(base).rpartition(".")[2] for base in node.bases}
        if not bases & {"StrEnum", "Enum", "TextChoices", "IntegerChoices"}:
            continue
        members = frozenset(
            statement.value.value
            for statement in node.body
            if isinstance(statement, ast.Assign)
            and isinstance(statement.value, ast.Constant)
            and isinstance(statement.value.value, str | int)
        )
        found.append((node.name, members))
    return found


def test_no_vocabulary_is_declared_twice():
    """Two enums of the same name, or with the same members, are one vocabulary declared twice (as
    Router, DataCollection, ToolRepresentation and BudgetPeriod were in routing and pools): declare it
    once in routing/policy/vocabulary.py and build the ORM's choices from it."""
    declared: dict[object, str] = {}
    twice = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if any(part.startswith(".") for part in path.relative_to(ROOT).parts):
                continue  # a hidden directory: `make bench`'s bench/.venv-litellm, not the project's code
            for name, members in _enum_classes(path):
                where = f"{path.relative_to(ROOT)}:{name}"
                for mark in (name, members):
                    if mark in declared:
                        twice.append(f"{where} and {declared[mark]}")
                    declared[mark] = where
    assert twice == []


def test_a_circuits_route_class_is_the_vocabulary_plus_the_assignment_wide_marker():
    assert _values(Circuit._meta.get_field("route_class")) == [*RouteClass, "*"]


def test_every_tri_state_column_offers_exactly_the_tri_state():
    from django.apps import apps

    columns = [
        field
        for model in apps.get_models()
        for field in model._meta.get_fields()
        if getattr(field, "choices", None) and {value for value, _ in field.choices} == set(TriState)
    ]
    assert columns  # the pools' and the catalog's capability and privacy facts
    for field in columns:
        assert _values(field) == list(TriState)


def test_the_metrics_label_sets_are_the_vocabularies():
    assert frozenset(AttemptStatus) == metrics.ATTEMPT_STATUSES
    assert frozenset(RouteClass) == metrics.TRANSPORTS
    assert frozenset(RouteClass) == metrics.ROUTE_CLASSES
    assert frozenset(FailureClass) == metrics.FAILURE_CLASSES
    assert frozenset(CircuitReason) == metrics.CIRCUIT_REASONS
    assert frozenset(Outcome) <= metrics.OUTCOMES


def _requests(outcome: str) -> float:
    return (
        metrics.REGISTRY.get_sample_value(
            "gateway_requests_total",
            {
                "route": "/v1/chat/completions",
                "transport": "http",
                "outcome": outcome,
                "status_class": "none",
            },
        )
        or 0.0
    )


@pytest.mark.django_db
@pytest.mark.parametrize("outcome", list(Outcome))
def test_every_outcome_of_the_relay_is_counted_under_its_own_name(outcome):
    """A new Outcome member is counted under its name without touching the metrics: were the metrics'
    set a list of its own, the new outcome would be folded into the failure class or `other`."""
    before = _requests(outcome)
    attempt = AttemptLog(
        ordinal=1,
        assignment_id=1,
        model="m",
        route_class=RouteClass.HTTP,
        status=AttemptStatus.FAILED,
        failure_class=FailureClass.UPSTREAM_ERROR,
    )
    metrics.observe_exchange(
        Exchange(
            request_id="r1",
            key_id=1,
            route="/v1/chat/completions",
            transport=RouteClass.HTTP,
            requested_model="m",
            started_at=T0,
            finished_at=T0,
            outcome=outcome,
            attempts=[attempt],
        )
    )
    assert _requests(outcome) == before + 1


# Where the relay's statuses and outcomes used to be spelled out; they name the vocabulary's members now.
SPELLED_BY_MEMBER = (
    "proxy/relay.py",
    "proxy/ledger/exchange.py",
    "proxy/output.py",
    "proxy/outcomes.py",
    "proxy/unserved.py",
    "proxy/ledger/metrics.py",
    "proxy/ledger/tracing.py",
    "proxy/ledger/recorder.py",
)


def _string_literals(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    }


@pytest.mark.parametrize("module", SPELLED_BY_MEMBER)
def test_the_relay_names_statuses_and_outcomes_by_their_members(module):
    spelled = _string_literals(ROOT / module) & {*AttemptStatus, *Outcome}
    assert spelled == set(), (
        f"{module} spells {sorted(spelled)} as bare strings: use routing.policy.vocabulary"
    )


def test_the_metrics_route_label_set_is_the_client_routes():
    assert frozenset(ClientRoute) == metrics.ROUTES


def test_every_client_url_is_a_client_route():
    """A new /v1 endpoint needs its ClientRoute (else its ledger rows and metrics name no known route)."""
    from django.urls import get_resolver

    served = {
        "/" + str(pattern.pattern).replace("<str:file_id>", "{id}").replace("<path:model_id>", "{id}")
        for pattern in get_resolver().url_patterns
        if str(pattern.pattern).startswith("v1/")
    }
    assert served
    assert served <= {route.removeprefix("DELETE ") for route in ClientRoute}


@pytest.mark.parametrize("module", sorted(str(p.relative_to(ROOT)) for p in (ROOT / "proxy").rglob("*.py")))
def test_no_proxy_module_spells_a_client_route(module):
    spelled = _string_literals(ROOT / module) & set(ClientRoute)
    assert spelled == set(), f"{module} spells {sorted(spelled)}: use routing.policy.vocabulary.ClientRoute"


# Where a string equal to a gateway code is another API's word, not the gateway's code: an upstream's
# canonical error code or type that the failure rules read (OpenAI's `model_not_found`, its stream's
# `rate_limit_exceeded`, a 403's `permission_denied`), the codes providers map theirs to, and the
# Anthropic error types the Messages API answers with.
OTHER_APIS_WORDS = {
    "routing/policy/failures.py": {"model_not_found", "rate_limit_exceeded", "permission_denied"},
    "proxy/wire/providers/azure_openai.py": {"model_not_found"},
    "proxy/wire/providers/bedrock_translate.py": {"permission_denied"},
    "proxy/wire/providers/gemini_translate.py": {"permission_denied"},
    "proxy/wire/apis/messages.py": {"authentication_error", "request_too_large"},
}


def _product_modules() -> list[Path]:
    product = ("gatewaysite", "gatewayconfig", "proxy", "routing", "catalog", "pools", "runtime")
    return sorted(
        path
        for package in product
        for path in (ROOT / package).rglob("*.py")
        if "migrations" not in path.parts
    )


@pytest.mark.parametrize("path", _product_modules(), ids=lambda path: str(path.relative_to(ROOT)))
def test_the_gateways_error_codes_are_spelled_only_by_their_type(path):
    """Issue 46 point 4: a code is `ErrorCode.X` everywhere but its own module, so a renamed or removed
    code cannot survive as a string somewhere that the type checker and the table never see."""
    from routing.policy.errors import ErrorCode

    module = str(path.relative_to(ROOT))
    if module == "routing/policy/errors.py":
        return
    spelled = _string_literals(path) & set(ErrorCode)
    assert spelled - OTHER_APIS_WORDS.get(module, set()) == set(), (
        f"{module}: use routing.policy.errors.ErrorCode"
    )

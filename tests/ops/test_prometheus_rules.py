"""deploy/prometheus/alerts.yaml: valid for promtool, passing its unit tests (alerts.test.yaml), and
naming only metrics, labels and label values the gateway exports, fed by test series shaped exactly as
a scrape of the gateway's /metrics is (issue 47 point 5)."""

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.ops.exported import TARGET_LABELS, problems, samples, summed_database_gauges, vocabulary_problems
from tests.ops.promql import names

RULES_DIR = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
RULES = RULES_DIR / "alerts.yaml"
RULE_TESTS = RULES_DIR / "alerts.test.yaml"
TEMPLATE_LABEL = re.compile(r"\$labels\.(\w+)")
SERIES = re.compile(r"^([A-Za-z_:][\w:]*)\{(.*)\}$")
SERIES_LABEL = re.compile(r'([A-Za-z_]\w*)="((?:[^"\\]|\\.)*)"')


def _alerts() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def test_promtool_accepts_the_rules(promtool):
    checked = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in checked.stdout


def test_the_rules_pass_their_unit_tests(promtool):
    run = subprocess.run(
        [promtool, "test", "rules", RULE_TESTS.name], cwd=RULES_DIR, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS" in run.stdout


def test_the_issue_s_four_alerts_exist_and_each_is_unit_tested():
    alerts = {rule["alert"] for rule in _alerts()}
    assert alerts == {
        "GatewayCredentialsRejected",
        "GatewayAccountCircuitOpen",
        "GatewayKeyBudgetNearlySpent",
        "GatewayHigh5xxRate",
    }
    tested = {
        case["alertname"]
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test["alert_rule_test"]
        if case.get("exp_alerts")
    }
    assert tested == alerts  # each is shown firing at least once


@pytest.mark.parametrize("rule", _alerts(), ids=lambda rule: rule["alert"])
def test_every_alert_names_only_what_the_gateway_exports(rule):
    shown = set(TEMPLATE_LABEL.findall(yaml.safe_dump(rule.get("annotations", {}))))
    assert problems(rule["expr"], frozenset(shown)) == []
    assert summed_database_gauges(rule["expr"]) == []  # the same on every node: max, never sum
    grouping = names(rule["expr"]).grouping
    if grouping:  # an aggregation keeps only its `by` labels: a template can show no other
        assert shown <= grouping


def _input_series() -> list[str]:
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    return [series["series"] for test in tests for series in test["input_series"]]


@pytest.mark.parametrize("series", _input_series())
def test_the_rule_tests_feed_series_as_the_gateway_exports_them(series):
    """A test series with another name or label set than the gateway's would let a rule that matches
    nothing in production pass its unit tests."""
    match = SERIES.match(series)
    assert match, series
    name = match.group(1)
    labels = dict(SERIES_LABEL.findall(match.group(2)))
    exported = samples()
    assert name in exported
    assert set(labels) - TARGET_LABELS == exported[name]
    assert vocabulary_problems({label: {value} for label, value in labels.items()}) == []

"""deploy/grafana/gateway.json: every query names only metrics, labels and label values the gateway
exports (read from its registry, not from a list kept here), every legend shows a label its query has,
the database gauges are never summed over nodes, and promtool parses every query (issue 47 point 5)."""

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.ops.exported import problems, samples, summed_database_gauges
from tests.ops.promql import names

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "gateway.json"
# Grafana's own variables, as Prometheus would see them once Grafana filled them in.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$pool": ".*"}
LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")
LABEL_VALUES = re.compile(r"^label_values\(\s*([A-Za-z_:][\w:]*)\s*,\s*(\w+)\s*\)$")


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _panels() -> list[dict]:
    return [panel for panel in _dashboard()["panels"] if panel["type"] != "row"]


def _targets() -> list[tuple[str, str, str]]:
    """(panel title, query with Grafana's variables filled in, legend format) of every query."""
    found = []
    for panel in _panels():
        for target in panel["targets"]:
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            found.append((panel["title"], expr, target.get("legendFormat", "")))
    return found


def test_every_panel_queries_the_gateway():
    assert _panels()
    for panel in _panels():
        assert panel["targets"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


@pytest.mark.parametrize(("title", "expr", "legend"), _targets(), ids=[t[0] for t in _targets()])
def test_every_query_names_only_what_the_gateway_exports(title, expr, legend):
    assert "$" not in expr, "a Grafana variable this test does not fill in"
    assert problems(expr, frozenset(LEGEND_LABEL.findall(legend))) == []
    grouping = names(expr).grouping
    if grouping and legend:
        assert set(LEGEND_LABEL.findall(legend)) <= grouping  # an aggregation keeps only these


def test_the_database_gauges_are_never_summed_over_nodes():
    summed = [(title, summed_database_gauges(expr)) for title, expr, _ in _targets()]
    assert [(title, gauges) for title, gauges in summed if gauges] == []


def test_the_template_variables_query_exported_labels():
    exported = samples()
    for variable in _dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        metric, label = LABEL_VALUES.match(variable["definition"]).groups()
        assert label in exported[metric], variable["name"]
        assert variable["query"]["query"] == variable["definition"]


def test_the_dashboard_shows_what_an_on_call_asks():
    """Which account is failing, since when, and whose spend it is (issue 47, Done when)."""
    used = {metric for _, expr, _ in _targets() for metric in names(expr).metrics}
    assert {
        "gateway_open_circuits",
        "gateway_upstream_latency_seconds_bucket",
        "gateway_upstream_time_to_first_token_seconds_bucket",
        "gateway_key_throttled_total",
        "gateway_key_budget_remaining_usd",
        "gateway_cost_micros_total",
        "gateway_requests_total",
    } <= used


def test_promtool_parses_every_query(promtool, tmp_path):
    queries = [{"record": f"dashboard:query_{n}", "expr": expr} for n, (_, expr, _) in enumerate(_targets())]
    rules = {"groups": [{"name": "dashboard", "rules": queries}]}
    path = tmp_path / "dashboard_rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    checked = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr

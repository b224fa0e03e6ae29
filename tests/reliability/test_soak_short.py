"""The soak harness (soak/run.py) in short: about 1,500 requests mixed over HTTP, SSE (and websocket
when the gateway has the route) against four chaotic upstreams, the gateway a real uvicorn process
on its own fresh database, then every invariant of `make soak` (see soak/README.md).

The run happens once per session, in a subprocess; each invariant is its own test case, so a report
names exactly which invariant broke, with the harness's examples."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from soak.checks import CHECK_IDS

ROOT = Path(__file__).resolve().parents[2]
REQUESTS = 1500


@pytest.fixture(scope="module")
def soak_report(tmp_path_factory) -> dict:
    workdir = tmp_path_factory.mktemp("soak")
    report_path = workdir / "report.json"
    cmd = [
        sys.executable,
        str(ROOT / "soak" / "main.py"),
        "--requests",
        str(REQUESTS),
        "--json",
        str(report_path),
    ]
    run = subprocess.run(
        [*cmd, "--workdir", str(workdir), "--time-limit", "90"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    if not report_path.exists():
        output = f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
        pytest.fail(f"the soak harness wrote no report (exit {run.returncode}):\n{output}")
    report = json.loads(report_path.read_text())
    report["summary"] = (workdir / "summary.txt").read_text()
    return report


def test_the_short_soak_ran_its_requests_in_under_a_minute(soak_report):
    run = soak_report["run"]
    assert run["requests_done"] == REQUESTS, soak_report["summary"]
    assert run["load_seconds"] < 60, soak_report["summary"]


@pytest.mark.parametrize("check_id", CHECK_IDS)
def test_the_short_soak_holds_the_invariant(soak_report, check_id):
    checks = {c["id"]: c for c in soak_report["checks"]}
    check = checks[check_id]
    examples = "\n  ".join(check["examples"])
    assert check["ok"], f"{check['name']}: {check['detail']}\n  {examples}"

"""The multi-node soak (soak/multinode.py) in short: 1,200 requests over three gateway nodes (uvicorn, two
workers each) on a PostgreSQL server of the soak's own, while one node is killed with SIGKILL and
started again, PostgreSQL is restarted and stalled, and another node is drained with SIGTERM; then
every invariant of `make soak SOAK_ARGS="--nodes 3 --database postgres"` (see soak/README.md).

It runs in the PostgreSQL pass of the suite only (the production shape: several nodes on one
server database); the soak starts its own server from /usr/lib/postgresql/*/bin, so it needs those
binaries too. The run happens once per module, in a subprocess; each invariant is its own case.

Some invariants are known not to hold today; each is an expected failure with its reason (not a
skip: the case still runs, and its figure is in the report):
- `half_open_probes`: requests arrive at an assignment in a probe's position while its probe is in
  flight, at times. One path is closed: a request that read a circuit closed and then waited (on a
  stalled database, or on slow attempts) longer than the cooldown dispatched on that old health,
  although the assignment had opened and gone half-open meanwhile (the relay now reads the circuit
  again before such a dispatch; tests/proxy/test_stalled_database.py). So is a second: an assignment
  open with its cooldown running when a request read it, reached last after the cooldown ended, was
  dispatched without the lease beside the next lease holder (it now takes the lease first). A third
  finding was the check's own: a failure write that commits late opens a circuit whose open_until is
  already past, and the check counted the arrivals before the commit (the circuit still read closed)
  as probes; its window now starts when the open became visible. The check now judges each arrival
  from the request's own plan in the ledger (its started_at, its attempts with the pass-overs), and
  a window ends with the first success that closes the circuit, a last resort's too (one answered
  just before the window included). Judged so, full runs of 2026-12-01 showed a third gateway path,
  now closed: a failure write that commits late starts its cooldown before a request reads the
  circuit closed, so the view trusted for a whole cooldown saw the circuit half-open before it
  expired (the view is now trusted for half the shortest cooldown; tests/proxy/test_half_open_trust.py).
  A later run still showed 2 arrivals in a probe's position right after another request's probe
  took the lease: the polls, stamped after their read and up to 0.4 s apart when the harness is
  busy, cannot tell whether an earlier last resort's success (its write queued behind its failures')
  had closed the circuit by then. Kept as an expected failure until several full runs hold.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from devkit.databases import postgres_available
from soak.multinode import MULTINODE_CHECK_IDS

ROOT = Path(__file__).resolve().parents[2]
REQUESTS = 1200

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="the multi-node soak is the PostgreSQL pass's (several nodes need a server database)",
    ),
    pytest.mark.skipif(
        not postgres_available(), reason="no PostgreSQL server binaries under /usr/lib/postgresql/*/bin"
    ),
]


KNOWN = {
    "half_open_probes": "requests reached a half-open assignment in a probe's position while its probe was "
    "in flight (three paths closed; not yet shown to hold over several full runs)",
}


@pytest.fixture(scope="module")
def soak_report(tmp_path_factory) -> dict:
    workdir = tmp_path_factory.mktemp("soak-multinode")
    report_path = workdir / "report.json"
    cmd = [
        sys.executable,
        str(ROOT / "soak" / "main.py"),
        "--nodes",
        "3",
        "--database",
        "postgres",
        "--requests",
        str(REQUESTS),
        "--concurrency",
        "32",
        "--json",
        str(report_path),
        "--workdir",
        str(workdir),
        "--time-limit",
        "120",
    ]
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}  # the soak brings its own server
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400, check=False)
    if not report_path.exists():
        output = f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
        pytest.fail(f"the multi-node soak wrote no report (exit {run.returncode}):\n{output}")
    report = json.loads(report_path.read_text())
    report["summary"] = (workdir / "summary.txt").read_text()
    return report


def test_the_multinode_soak_ran_its_requests_over_every_node(soak_report):
    run = soak_report["run"]
    assert run["requests_done"] == REQUESTS, soak_report["summary"]
    assert set(run["by_node"]) == {"0", "1", "2"}, soak_report["summary"]


@pytest.mark.parametrize("check_id", MULTINODE_CHECK_IDS)
def test_the_multinode_soak_holds_the_invariant(soak_report, check_id, request):
    if check_id in KNOWN:
        request.applymarker(pytest.mark.xfail(reason=KNOWN[check_id], strict=False))
    checks = {c["id"]: c for c in soak_report["checks"]}
    check = checks[check_id]
    examples = "\n  ".join(check["examples"])
    assert check["ok"], f"{check['name']}: {check['detail']}\n  {examples}"

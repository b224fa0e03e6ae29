"""docs/operations.md says what the code does (issue 47 point 8): its checklist is complete and in order,
its health table is what /healthz and /readyz answer, the commands and variables the documents name
exist, and the `.env` that `make run` leaves never turns debug on for a production start."""

import json
import re
import secrets
import subprocess
import sys
from pathlib import Path

import httpx
from django.core.management import get_commands

from devkit.harness import free_port
from gatewayconfig.reference import ENVIRONMENT
from gatewaysite.health import READYZ_TIMEOUT_S
from tests.test_first_hour import _make_run, _second_terminal, _stop, _wait_healthy, tree  # noqa: F401

REPO = Path(__file__).resolve().parent.parent
OPERATIONS = REPO / "docs" / "operations.md"
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _section(text: str, heading: str) -> str:
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


# --- the checklist -------------------------------------------------------------------------------

# What a production start needs, in the order it needs it (issue 47 point 8).
CHECKLIST = (
    "DJANGO_SECRET_KEY",
    "DATABASE_URL",
    "REDIS_URL",
    "GATEWAY_CREDENTIALS_KEY",
    "DJANGO_DEBUG",
    "DJANGO_ALLOWED_HOSTS",
    "--workers",
    "manage.py migrate",
    "load_gateway_config",
    "create_key",
    "/readyz",
    "/metrics",
    "GATEWAY_LOG_FORMAT",
    "prune_ledger",
    "Back up",
)


def _checklist() -> list[str]:
    section = _section(OPERATIONS.read_text(), "Production checklist")
    items = re.split(r"\n(?=\d+\. )", section.split("\n1. ", 1)[1])
    numbers = [int(item.split(".", 1)[0]) for item in items[1:]]
    assert numbers == list(range(2, len(items) + 1)), "the checklist is numbered 1, 2, 3..."
    return items


def test_the_production_checklist_names_every_step_in_order():
    items = _checklist()
    where = []
    for step in CHECKLIST:
        found = [i for i, item in enumerate(items) if step in item]
        assert found, f"the checklist does not say {step}"
        where.append(found[0])
    assert where == sorted(where), list(zip(CHECKLIST, where, strict=True))


# --- the health endpoints ------------------------------------------------------------------------

PROBE = """
import django, json
django.setup()
from django.test import Client
client = Client()
for path in ("/healthz", "/readyz"):
    response = client.get(path)
    print(json.dumps({"path": path, "status": response.status_code, "body": response.json()}))
"""


def _answers(database_url: str) -> set[tuple[str, int, str]]:
    env = {
        "PATH": "/usr/bin:/bin",
        "DJANGO_SETTINGS_MODULE": "gatewaysite.settings",
        "DJANGO_SECRET_KEY": "test-only-secret-key-not-for-deployment",
        "DATABASE_URL": database_url,
        "DJANGO_ALLOWED_HOSTS": "testserver",
    }
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return {(a["path"], a["status"], json.dumps(a["body"], separators=(", ", ": "))) for a in lines}


def _documented_health() -> list[tuple[str, str, int, str]]:
    rows = []
    for line in _section(OPERATIONS.read_text(), "Health endpoints").splitlines():
        match = re.match(r"\| `GET (/\w+)` \| (.+?) \| `(\d+)` \| `(\{.*\})` \|$", line)
        if match:
            rows.append((match[1], match[2], int(match[3]), match[4]))
    return rows


def test_the_health_table_is_what_the_endpoints_answer(tmp_path):
    reachable = _answers(f"sqlite:///{tmp_path / 'health.sqlite3'}")
    unreachable = _answers("sqlite:////nonexistent-directory/for/readyz/gateway.sqlite3")
    rows = _documented_health()
    assert len(rows) == 3
    documented_reachable = {(p, s, b) for p, when, s, b in rows if "unreachable" not in when}
    documented_unreachable = {
        (p, s, b) for p, when, s, b in rows if "unreachable" in when or "not checked" in when
    }
    assert documented_reachable == reachable
    assert documented_unreachable == unreachable
    # The readiness timeout the table gives is the code's.
    assert f"{READYZ_TIMEOUT_S:g} s" in next(when for p, when, s, _ in rows if p == "/readyz" and s == 200)


# --- names the documents use ---------------------------------------------------------------------


def test_every_management_command_the_documents_name_exists():
    commands = get_commands()
    named = {name for doc in DOCUMENTS for name in re.findall(r"manage\.py ([a-z_]+)", doc.read_text())}
    assert len(named) > 10
    assert named - set(commands) == set()


def test_every_variable_the_operations_guide_names_is_in_the_reference():
    documented = {v.name for v in ENVIRONMENT}
    named = set(
        re.findall(
            r"\b((?:GATEWAY|DJANGO|DATABASE|REDIS|OTEL|PROMETHEUS)_[A-Z0-9_]*[A-Z0-9*])",
            OPERATIONS.read_text(),
        )
    )
    assert named and named - documented == set()


# --- the .env that make run leaves ---------------------------------------------------------------


def _debug_page(port: int) -> bool:
    """Whether the server answers an unknown path with Django's debug page."""
    response = httpx.get(f"http://127.0.0.1:{port}/no-such-page", timeout=10)
    assert response.status_code == 404
    return "Using the URLconf defined in" in response.text


def test_a_production_start_in_a_checkout_where_make_run_ran_is_not_in_debug(tree):  # noqa: F811
    # make run, as a newcomer runs it: its server is in debug, and it leaves .env behind.
    port = free_port()
    demo = _make_run(tree, port)
    try:
        _wait_healthy(port, demo)
        assert _debug_page(port)
    finally:
        _stop(demo)
    assert "DJANGO_DEBUG=true" in (tree / ".env").read_text()

    # A second terminal's manage.py still reads it (the README's commands work without a secret)...
    probe = "from django.conf import settings; print(settings.DEBUG)"
    shell = subprocess.run(
        [".venv/bin/python", "manage.py", "shell", "--verbosity", "0", "-c", probe],
        cwd=tree,
        env=_second_terminal(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shell.stdout.strip() == "True", shell.stderr

    # ...but the production server in the same checkout, with its secret and nothing about debug, is not.
    production_env = {**_second_terminal(), "DJANGO_SECRET_KEY": secrets.token_urlsafe(50)}
    port = free_port()
    server = subprocess.Popen(
        [".venv/bin/python", "-m", "gatewaysite.server", "--host", "127.0.0.1", "--port", str(port)],
        cwd=tree,
        env=production_env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait_healthy(port, server)
        assert not _debug_page(port)
    finally:
        _stop(server)
    # Production's log format (JSON unless debug): uvicorn's own lines too.
    lines = [line for line in server.stdout.read().splitlines() if line.strip()]
    assert lines and all(json.loads(line)["level"] for line in lines), lines[:5]

    # Nor is any other ASGI server of gatewaysite.asgi (uvicorn gatewaysite.asgi:application, daphne).
    asgi = subprocess.run(
        [
            ".venv/bin/python",
            "-c",
            "import gatewaysite.asgi; from django.conf import settings; print(settings.DEBUG)",
        ],
        cwd=tree,
        env=production_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert asgi.stdout.strip() == "False", asgi.stderr

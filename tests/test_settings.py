"""Settings refuse unsafe production starts (SPEC §2, §11)."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PROBE = "import django; django.setup(); from django.conf import settings; print(settings.DEBUG)"


def _start(**env: str) -> subprocess.CompletedProcess:
    base = {"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "gatewaysite.settings", "GATEWAY_ENV_FILE": ""}
    return subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=REPO,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "DJANGO_SECRET_KEY is required when DJANGO_DEBUG is false"),
        ({"DJANGO_DEBUG": "false"}, "DJANGO_SECRET_KEY is required"),
        (
            {"DJANGO_SECRET_KEY": "dev-only-insecure-secret-key-do-not-deploy"},
            "the development secret key may not be used",
        ),
        ({"DJANGO_SECRET_KEY": "x" * 40, "GATEWAY_UPSTREAM_TIMEOUT_S": "ten"}, "GATEWAY_UPSTREAM_TIMEOUT_S"),
        (
            {"DJANGO_SECRET_KEY": "x" * 40, "GATEWAY_LEDGER_RETENTION_DAYS": "0"},
            "GATEWAY_LEDGER_RETENTION_DAYS",
        ),
    ],
)
def test_an_unsafe_or_malformed_configuration_refuses_to_start(env, message):
    result = _start(**env)
    assert result.returncode != 0
    assert message in result.stderr


@pytest.mark.parametrize(
    ("env", "debug"),
    [
        ({"DJANGO_SECRET_KEY": "a-real-secret-" + "x" * 30}, "False"),
        ({"DJANGO_DEBUG": "true"}, "True"),  # the development key is fine for a local debug run
    ],
)
def test_a_safe_configuration_starts(env, debug):
    result = _start(**env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == debug


def test_the_development_env_file_is_read_and_the_environment_wins(tmp_path):
    dotenv = tmp_path / ".env"
    dotenv.write_text("DJANGO_DEBUG=true\n")
    # What `make run` leaves lets a second terminal's command start without a secret, in debug...
    assert _start(GATEWAY_ENV_FILE=str(dotenv)).stdout.strip() == "True"
    # ...but a variable set in the environment is never overridden by the file.
    result = _start(GATEWAY_ENV_FILE=str(dotenv), DJANGO_DEBUG="false", DJANGO_SECRET_KEY="x" * 40)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
    # Without the file, the production default stands: no secret, no start.
    assert "DJANGO_SECRET_KEY is required" in _start(GATEWAY_ENV_FILE=str(tmp_path / "missing")).stderr


def test_a_request_log_line_is_printed_once_even_when_the_server_configures_the_root_logger():
    # daphne calls logging.basicConfig; the gateway's line must not reach the root handler too.
    probe = (
        "import logging, django; django.setup(); logging.basicConfig(level=logging.INFO);"
        "logging.getLogger('gateway').info('one-request-line')"
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "DJANGO_SETTINGS_MODULE": "gatewaysite.settings",
        "DJANGO_SECRET_KEY": "x" * 40,
    }
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert (done.stdout + done.stderr).count("one-request-line") == 1

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.django_db
def test_healthz_answers_while_the_process_is_up(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.django_db
def test_readyz_answers_ready_when_the_database_is_reachable(client):
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json()["status"] == "ready"


PROBE = """
import django, json, os
django.setup()
from django.test import Client
response = Client().get("/readyz")
print(json.dumps({"status": response.status_code, "body": response.json()}))
"""


@pytest.mark.parametrize(
    "database_url",
    [
        "postgres://postgres@127.0.0.1:1/unreachable",
        "sqlite:////nonexistent-directory/for/readyz/gateway.sqlite3",
    ],
)
def test_readyz_is_503_when_the_database_is_unreachable(database_url):
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
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"status": 503, "body": {"status": "unavailable", "reason": "database unreachable"}}

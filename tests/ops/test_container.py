"""The container recipe (issue 47 point 9): Dockerfile, .dockerignore, compose.yaml and deploy/k8s/.

These machines have no container engine and no cluster, so nothing here builds an image or applies a
manifest. What is checked is that the files agree with the code: the image's command is the README's
production server and uvicorn accepts it, one port everywhere, every variable one the settings read
(docs/configuration.md's table, which tests/test_docs_configuration.py holds to the code), the probes'
paths are the health views and their Host header is allowed, the Jobs run management commands that
exist, the user is not root; and that the build context (what .dockerignore leaves) migrates, serves
and prunes when run as the image would run it."""

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest
import yaml
from django.core.management import get_commands
from django.http.request import split_domain_port, validate_host
from django.urls import resolve
from uvicorn.main import main as uvicorn_cli

from devkit.harness import free_port, stop, tail
from gatewayconfig.reference import ENVIRONMENT
from gatewaysite import health, server

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
DOCUMENTED = {v.name for v in ENVIRONMENT if not v.name.endswith("*")}
PATTERNS = tuple(v.name.removesuffix("*") for v in ENVIRONMENT if v.name.endswith("*"))
# The interpreter's and pip's own variables, which the image sets for itself.
PYTHON_ENV = {
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONUNBUFFERED",
    "PIP_NO_CACHE_DIR",
    "PIP_DISABLE_PIP_VERSION_CHECK",
}
POD_IP = "10.42.7.19"  # what Kubernetes' downward API puts in POD_IP, for the Host checks


def _gateway_variable(name: str) -> bool:
    return name in DOCUMENTED or name.startswith(PATTERNS)


# --- Dockerfile ----------------------------------------------------------------------------------


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, its arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    lines = [
        line for line in (REPO / "Dockerfile").read_text().splitlines() if not line.lstrip().startswith("#")
    ]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [
        (parts[0].upper(), parts[1] if len(parts) > 1 else "")
        for parts in (line.strip().split(None, 1) for line in joined.splitlines())
        if parts
    ]


def _one(name: str) -> str:
    found = [args for instruction, args in _instructions() if instruction == name]
    assert found, name
    return found[-1]  # the last one counts, as in Docker


def _cmd() -> list[str]:
    return json.loads(_one("CMD"))  # the exec form: no shell between the signal and the server


def _port() -> int:
    cmd = _cmd()
    return int(cmd[cmd.index("--port") + 1])


def _uid() -> int:
    return int(_one("USER").split(":")[0])


def test_the_image_runs_the_readme_s_production_server():
    cmd = _cmd()
    readme = (REPO / "README.md").read_text()
    production = re.search(r"Serve the gateway as `make run` does: `([^`]+)`", readme)
    assert production, "the README's production command"
    assert cmd == shlex.split(production.group(1))
    assert cmd[:3] == ["python", "-m", "gatewaysite.server"]
    assert "ENTRYPOINT" not in dict(_instructions())  # `docker run IMAGE python manage.py ...` works
    # uvicorn accepts the command line the server builds from these arguments.
    context = uvicorn_cli.make_context("uvicorn", server.command(cmd[3:]))
    assert (context.params["app"], context.params["host"], context.params["port"]) == (
        server.APP,
        "0.0.0.0",
        _port(),
    )


def test_the_image_is_slim_python_of_a_supported_version_run_by_no_root():
    base = re.fullmatch(r"python:(\d+)\.(\d+)-slim(?:-\w+)?", _one("FROM"))
    assert base, _one("FROM")
    required = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert (int(base.group(1)), int(base.group(2))) >= tuple(
        int(n) for n in required.removeprefix(">=").split(".")
    )
    assert _uid() != 0 and _one("USER").split(":")[0] not in ("root", "0")
    assert any(f"--uid {_uid()}" in args for instruction, args in _instructions() if instruction == "RUN")


def test_the_image_s_port_environment_and_health_check_agree_with_the_code():
    assert int(_one("EXPOSE")) == _port()
    env = re.findall(r"(\w+)=", _one("ENV"))
    assert env and set(env) <= PYTHON_ENV
    check = json.loads(_one("HEALTHCHECK").split("CMD", 1)[1])
    url = urlparse(re.search(r"'(http://[^']+)'", check[-1]).group(1))
    assert url.port == _port()
    assert resolve(url.path).func is health.healthz
    assert validate_host(url.hostname, ["127.0.0.1", "localhost"])  # the settings' default hosts


def _ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore leaves `path` (relative, with /) out of the build context."""
    parts = path.split("/")
    for pattern in patterns:
        for depth in range(1, len(parts) + 1):
            prefix = "/".join(parts[:depth])
            if pattern.startswith("**/"):
                if fnmatch.fnmatchcase(parts[depth - 1], pattern[3:]):
                    return True
            elif fnmatch.fnmatchcase(prefix, pattern):
                return True
    return False


def _dockerignore() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_the_build_context_leaves_out_secrets_and_development_state():
    patterns = _dockerignore()
    for path in (".env", ".venv/bin/python", "var/gateway.sqlite3", ".git/config", "tests/conftest.py"):
        assert _ignored(path, patterns), path
    for path in ("manage.py", "pyproject.toml", "README.md", "gatewaysite/uvicorn_log.json", "templates"):
        assert not _ignored(path, patterns), path


@pytest.fixture
def build_context(tmp_path) -> Path:
    """The files `COPY . .` puts in the image: the repository less what .dockerignore leaves out."""
    patterns, context = _dockerignore(), tmp_path / "app"
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True)
    for path in tracked.stdout.splitlines():
        if not _ignored(path, patterns) and (REPO / path).is_file():
            (context / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / path, context / path)
    return context


def test_the_build_context_migrates_serves_and_prunes_as_the_image_runs(build_context, tmp_path):
    """What the Job, the Deployment and the CronJob run, from the build context's files (the image's
    WORKDIR), with this venv's packages standing in for the image's `pip install`."""
    env = {
        "PATH": os.environ["PATH"],
        "DJANGO_SECRET_KEY": "test-only-secret-key-not-for-deployment",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'gateway.sqlite3'}",
        "GATEWAY_LEDGER_SPOOL_DIR": str(tmp_path / "spool"),
        "GATEWAY_LOG_FORMAT": "json",
        **{name: "1" for name in ("PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED")},
    }

    def run(command: list[str]) -> str:
        done = subprocess.run([sys.executable, *command[1:]], cwd=build_context, env=env, capture_output=True)
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        return done.stdout.decode()

    run(_k8s_command("Job"))
    # A configuration and a plan priced from the bundled table: the data files the image needs are in it.
    run(["python", "manage.py", "load_gateway_config", "gatewaysite/demo_config.yaml"])
    explained = run(["python", "manage.py", "routing_explain", "--key", "demo", "--model", "gpt-5"])
    assert "demo-a / gpt-5: bundled $" in explained
    port, log = free_port(), tmp_path / "server.log"
    cmd = [sys.executable, *_cmd()[1:]]
    cmd[cmd.index("--host") + 1], cmd[cmd.index("--port") + 1] = "127.0.0.1", str(port)
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=build_context, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                ready = httpx.get(f"{base}/readyz", timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, tail(log)
                time.sleep(0.1)
        assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
        assert httpx.get(f"{base}/admin/login/", timeout=5).status_code == 200  # templates, static files
        assert "gateway_requests_total" in httpx.get(f"{base}/metrics", timeout=5).text
    finally:
        stop(proc)
    assert (build_context / "var" / "static").is_dir()  # the settings' BASE_DIR is the image's /app
    run(_k8s_command("CronJob"))


# --- compose.yaml --------------------------------------------------------------------------------


def _compose() -> dict:
    return yaml.safe_load((REPO / "compose.yaml").read_text())


def _interpolated(value: str) -> str:
    """Compose's `${NAME:-default}` as its default, `${NAME:?message}` as a stand-in value."""
    value = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value)
    return re.sub(r"\$\{\w+:\?[^}]*\}", "secret", value)


def test_compose_runs_the_image_with_postgresql_and_redis():
    services = _compose()["services"]
    gateway = services["gateway"]
    assert gateway["build"] == "." and "command" not in gateway  # the image's CMD
    assert [p.split(":")[-1] for p in gateway["ports"]] == [str(_port())]
    env = {name: _interpolated(str(v)) for name, v in gateway["environment"].items()}
    assert {name for name in env if not _gateway_variable(name)} == set()
    database, redis = urlparse(env["DATABASE_URL"]), urlparse(env["REDIS_URL"])
    assert database.scheme == "postgres" and services[database.hostname]["image"].startswith("postgres:")
    assert redis.scheme == "redis" and services[redis.hostname]["image"].startswith("redis:")
    assert gateway["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["migrate"]["depends_on"][database.hostname]["condition"] == "service_healthy"
    command = services["migrate"]["command"]
    assert command[:2] == ["python", "manage.py"] and command[2] == "migrate" in get_commands()
    assert {name for name in services["migrate"]["environment"] if not _gateway_variable(name)} == set()
    # Its readiness check: the ready view, on the server's port, with a Host the settings allow.
    url = urlparse(re.search(r"'(http://[^']+)'", gateway["healthcheck"]["test"][-1]).group(1))
    assert (resolve(url.path).func, url.port) == (health.readyz, _port())
    assert validate_host(url.hostname, env["DJANGO_ALLOWED_HOSTS"].split(","))
    spool = env["GATEWAY_LEDGER_SPOOL_DIR"]
    assert any(volume.endswith(f":{spool}") for volume in gateway["volumes"])  # kept across restarts


# --- Kubernetes ----------------------------------------------------------------------------------


def _manifests() -> list[dict]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    documents = []
    for resource in kustomization["resources"]:
        documents += [d for d in yaml.safe_load_all((K8S / resource).read_text()) if d]
    return documents


def _of(kind: str) -> dict:
    (found,) = [d for d in _manifests() if d["kind"] == kind]
    return found


def _pod(kind: str) -> dict:
    spec = _of(kind)["spec"]
    if kind == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return spec["template"]["spec"]


def _k8s_command(kind: str) -> list[str]:
    (container,) = _pod(kind)["containers"]
    return container["command"]


def test_every_manifest_is_named_by_the_kustomization_and_runs_one_image():
    named = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    assert named == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    images = {c["image"] for kind in ("Deployment", "Job", "CronJob") for c in _pod(kind)["containers"]}
    assert len(images) == 1


@pytest.mark.parametrize("kind", ["Deployment", "Job", "CronJob"])
def test_every_pod_runs_as_the_image_s_user_with_variables_the_settings_read(kind):
    pod = _pod(kind)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == _uid()
    (container,) = pod["containers"]
    names = [e["name"] for e in container["env"]]
    assert {name for name in names if not _gateway_variable(name)} <= {"POD_IP"}
    assert "DJANGO_SECRET_KEY" in names and "DATABASE_URL" in names  # the settings refuse to start without
    if container["securityContext"].get("readOnlyRootFilesystem"):
        # The settings create var/static at start, and the spool writes there: a writable volume.
        assert "/app/var" in {m["mountPath"] for m in container["volumeMounts"]}


def test_the_deployment_serves_the_image_s_command_ready_on_readyz_live_on_healthz():
    pod = _pod("Deployment")
    (container,) = pod["containers"]
    assert "command" not in container and "args" not in container  # the image's CMD
    (port,) = container["ports"]
    assert port["containerPort"] == _port()
    ready, live = container["readinessProbe"]["httpGet"], container["livenessProbe"]["httpGet"]
    assert resolve(ready["path"]).func is health.readyz
    assert resolve(live["path"]).func is health.healthz
    assert ready["port"] == live["port"] == port["name"]
    # The kubelet sends the pod's IP as Host: the settings must allow it, or every probe is a 400.
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    names = list(env)
    assert names.index("POD_IP") < names.index("DJANGO_ALLOWED_HOSTS")  # $(POD_IP) expands only then
    hosts = env["DJANGO_ALLOWED_HOSTS"]["value"].replace("$(POD_IP)", POD_IP).split(",")
    assert validate_host(split_domain_port(f"{POD_IP}:{_port()}")[0], hosts)
    annotations = _of("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(_port())
    assert resolve(annotations["prometheus.io/path"]).func.__name__ == "metrics"
    # Streams run on for GATEWAY_SHUTDOWN_GRACE_S after SIGTERM: the pod is given longer.
    assert pod["terminationGracePeriodSeconds"] > float(env["GATEWAY_SHUTDOWN_GRACE_S"]["value"])
    (service_port,) = _of("Service")["spec"]["ports"]
    assert service_port["targetPort"] == port["name"]
    assert _of("Service")["spec"]["selector"] == _of("Deployment")["spec"]["selector"]["matchLabels"]


def test_migrations_run_as_a_job_and_prune_ledger_as_a_daily_cronjob():
    for kind, command in (("Job", "migrate"), ("CronJob", "prune_ledger")):
        argv = _k8s_command(kind)
        assert argv[:2] == ["python", "manage.py"] and argv[2] == command
        assert command in get_commands()
        assert _pod(kind)["restartPolicy"] == "Never"
    cron = _of("CronJob")["spec"]
    minute, hour, *every = cron["schedule"].split()
    assert minute.isdigit() and hour.isdigit() and every == ["*", "*", "*"]  # once a day
    assert cron["concurrencyPolicy"] == "Forbid"


def test_the_readme_says_the_recipe_was_not_built_here():
    readme = (REPO / "README.md").read_text()
    paragraph = readme[readme.index("Containers:") :].split("\n\n")[0]
    for name in ("Dockerfile", "compose.yaml", "deploy/k8s/", "not built"):
        assert name in paragraph

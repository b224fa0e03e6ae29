"""The real coding agents through the gateway (SPEC §1, issue 44): Claude Code, Codex CLI and OpenCode,
installed from npm at the versions pinned in `CLIENTS`, each run non-interactively in a temporary
directory against the gateway as production serves it (a subprocess on the test database), set up as
the README's per-client blocks say, with the preferred account failing and the next one serving.

The upstream is the project's own scripted agent (`devkit.agent_upstream`): on the first turn it calls
the client's shell tool to create `PROOF_FILE`, then answers `MARKER`. A run passes when the client exits
0, the file exists, its final text holds the marker and the ledger shows the failover. Every client
runs with its telemetry, update and plugin switches off, its proxy variables pointed at an egress trap
(`devkit.egress_trap`) that refuses and records any connection outside loopback, and fails if it
recorded one.

The installs are cached in tests/agents/.npm (gitignored) and reused while their versions match. Without
npm the module skips, saying so; under CI=true it fails instead.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from django.core.management import call_command

from devkit.agent_upstream import MARKER, PROOF_FILE, AgentUpstream
from devkit.egress_trap import EgressTrap
from proxy.ledger.models import Attempt, RequestRecord

# The tested client versions (the README lists them): one place to move them.
CLIENTS = {"@anthropic-ai/claude-code": "2.1.332", "@openai/codex": "0.171.0", "opencode-ai": "1.18.33"}
NPM_DIR = Path(__file__).resolve().parent / ".npm"
GATEWAY_KEY = "sk-gw-agents-test-0123456789"
CLAUDE_MODEL = "claude-opus-5-5"  # Claude Code 2.1's default model: adaptive thinking, effort, context edits
CODEX_MODEL = "gpt-agent"  # a model Codex has no preset for: function, namespace and hosted tools
OPENCODE_MODEL = "agent-model"
RUN_TIMEOUT_S = 180

pytestmark = pytest.mark.django_db(transaction=True)


def _installed(package: str) -> str | None:
    manifest = NPM_DIR / "node_modules" / package / "package.json"
    return json.loads(manifest.read_text())["version"] if manifest.exists() else None


@pytest.fixture(scope="module")
def bin_dir() -> Path:
    """The pinned clients, installed once into the cache directory."""
    npm = shutil.which("npm")
    if npm is None:
        message = "npm is not installed: the real coding agents cannot be installed (apt-get install -y npm)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    if any(_installed(package) != version for package, version in CLIENTS.items()):
        specs = [f"{package}@{version}" for package, version in CLIENTS.items()]
        NPM_DIR.mkdir(exist_ok=True)
        subprocess.run(
            [npm, "install", "--prefix", str(NPM_DIR), "--no-save", "--no-audit", "--no-fund", *specs],
            check=True,
            capture_output=True,
            timeout=600,
        )
    return NPM_DIR / "node_modules" / ".bin"


@pytest.fixture
def trap():
    with EgressTrap() as egress:
        yield egress
    assert egress.attempts == [], f"a client tried to reach a host outside loopback: {egress.attempts}"


@dataclass
class Accounts:
    down: AgentUpstream
    up: AgentUpstream


@pytest.fixture
def accounts():
    down, up = AgentUpstream(failing=503).start(), AgentUpstream().start()
    yield down, up
    down.stop()
    up.stop()


def _configure(adapter: str, model: str, down: AgentUpstream, up: AgentUpstream, tmp_path: Path) -> None:
    """Pool `agents`: `down` (tier 0, preferred, failing) and `up` (tier 1), both `adapter` accounts
    for `model`, and the key, loaded as an operator would (`load_gateway_config`)."""

    def account(name: str, fake: AgentUpstream, tier: int) -> dict:
        return {
            "name": name,
            "adapter": adapter,
            "base_url": fake.base_url,
            "api_key_env": "GATEWAY_UPSTREAM_AGENTS_KEY",
            "tier": tier,
            "capabilities": {
                "tools": True,
                "write_tools": True,
                "vision": True,
                "role_separation": True,
                "tool_representation": "native",
            },
            "discovery": False,
            "models": [{"id": model, "context_window": 400000}],
        }

    config = {
        "pools": [{"name": "agents", "assignments": [account("down", down, 0), account("up", up, 1)]}],
        "keys": [{"name": "agents", "key": GATEWAY_KEY, "pools": ["agents"], "allowed_models": ["*"]}],
    }
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    call_command("load_gateway_config", str(path))


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )


def _base_env(tmp_path: Path, trap: EgressTrap) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    keep = {name: os.environ[name] for name in ("PATH", "LANG", "TERM") if name in os.environ}
    return {**keep, "HOME": str(home), "CI": "true", **trap.environment()}


def _claude(bin_dir: Path, gateway: str, work: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {
        **env,
        "ANTHROPIC_BASE_URL": gateway,
        "ANTHROPIC_API_KEY": GATEWAY_KEY,
        "ANTHROPIC_MODEL": CLAUDE_MODEL,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
    }
    prompt = f"Create {PROOF_FILE} with the shell."
    return _run([str(bin_dir / "claude"), "-p", prompt, "--allowedTools", "Bash"], work, env)


def _codex(
    bin_dir: Path, gateway: str, work: Path, env: dict[str, str], *, websocket: bool
) -> subprocess.CompletedProcess[str]:
    codex_home = work.parent / "codex-home"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(
        textwrap.dedent(
            f"""\
            model = "{CODEX_MODEL}"
            model_provider = "gateway"
            check_for_update_on_startup = false

            [analytics]
            enabled = false

            [features]
            plugins = false

            [model_providers.gateway]
            name = "gateway"
            base_url = "{gateway}/v1"
            env_key = "GATEWAY_KEY"
            wire_api = "responses"
            supports_websockets = {"true" if websocket else "false"}
            """
        )
    )
    env = {**env, "CODEX_HOME": str(codex_home), "GATEWAY_KEY": GATEWAY_KEY}
    argv = [str(bin_dir / "codex"), "exec", "--skip-git-repo-check", "--sandbox", "workspace-write"]
    return _run([*argv, f"Create {PROOF_FILE} with the shell."], work, env)


def _opencode(
    bin_dir: Path, gateway: str, work: Path, env: dict[str, str], *, package: str
) -> subprocess.CompletedProcess[str]:
    config = {
        "provider": {
            "gateway": {
                "npm": package,
                "name": "gateway",
                "options": {"baseURL": f"{gateway}/v1", "apiKey": "{env:GATEWAY_KEY}"},
                "models": {OPENCODE_MODEL: {"name": OPENCODE_MODEL}},
            }
        },
        "model": f"gateway/{OPENCODE_MODEL}",
        "autoupdate": False,
        "share": "disabled",
    }
    (work / "opencode.json").write_text(json.dumps(config))
    # At every start OpenCode installs its plugin SDK from npm into its config directory unless that
    # directory's lock already lists it (as on a machine that ran it before): listed here, so nothing
    # leaves loopback.
    config_dir = Path(env["HOME"]) / ".config" / "opencode"
    (config_dir / "node_modules").mkdir(parents=True)
    lock = {"packages": {"": {"dependencies": {"@opencode-ai/plugin": CLIENTS["opencode-ai"]}}}}
    (config_dir / "package-lock.json").write_text(json.dumps(lock))
    env = {
        **env,
        "GATEWAY_KEY": GATEWAY_KEY,
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_SHARE": "1",
    }
    return _run([str(bin_dir / "opencode"), "run", f"Create {PROOF_FILE} with the shell."], work, env)


# (client, how it connects, the accounts' adapter, the model): same shape and across shapes.
CHAT, MESSAGES = "@ai-sdk/openai-compatible", "@ai-sdk/anthropic"  # OpenCode's provider packages
CASES = [
    pytest.param("claude", "sse", "anthropic", CLAUDE_MODEL, id="claude-code-on-anthropic"),
    pytest.param("claude", "sse", "openai", CLAUDE_MODEL, id="claude-code-on-openai"),
    pytest.param("codex", "sse", "openai", CODEX_MODEL, id="codex-on-openai"),
    pytest.param("codex", "websocket", "openai", CODEX_MODEL, id="codex-websocket-on-openai"),
    pytest.param("codex", "sse", "anthropic", CODEX_MODEL, id="codex-on-anthropic"),
    pytest.param("codex", "websocket", "anthropic", CODEX_MODEL, id="codex-websocket-on-anthropic"),
    pytest.param("opencode", CHAT, "openai", OPENCODE_MODEL, id="opencode-chat-on-openai"),
    pytest.param("opencode", CHAT, "anthropic", OPENCODE_MODEL, id="opencode-chat-on-anthropic"),
    pytest.param("opencode", MESSAGES, "openai", OPENCODE_MODEL, id="opencode-messages-on-openai"),
]


@pytest.mark.parametrize(("client", "how", "adapter", "model"), CASES)
def test_a_real_agent_completes_a_tool_task_through_a_failover(
    client, how, adapter, model, bin_dir, trap, accounts, gateway_nodes, tmp_path, monkeypatch
):
    down, up = accounts
    monkeypatch.setenv("GATEWAY_UPSTREAM_AGENTS_KEY", "sk-upstream-agents")
    _configure(adapter, model, down, up, tmp_path)
    (gateway,) = gateway_nodes.start(1, GATEWAY_UPSTREAM_AGENTS_KEY="sk-upstream-agents")
    work = tmp_path / "work"
    work.mkdir()
    env = _base_env(tmp_path, trap)

    if client == "claude":
        done = _claude(bin_dir, gateway, work, env)
    elif client == "codex":
        done = _codex(bin_dir, gateway, work, env, websocket=how == "websocket")
    else:
        done = _opencode(bin_dir, gateway, work, env, package=how)
    gateway_nodes.stop()  # the ledger is written when the gateway stops at the latest

    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert (work / PROOF_FILE).read_text().strip() == "agent-ok"
    assert MARKER in done.stdout
    assert down.hits, "the preferred account was never tried"
    transports = {transport for _, transport, _ in up.hits}
    expected = "websocket" if how == "websocket" and adapter == "openai" else "sse"
    assert expected in transports, transports
    if client == "codex" and how == "websocket":
        # Codex's prewarm (`generate: false`): relayed as it is to an OpenAI account, answered by the
        # gateway itself on an Anthropic one (a ledger row with no attempt: no upstream was called).
        prewarms = [body for _, transport, body in up.hits if body.get("generate") is False]
        answered = RequestRecord.objects.filter(transport="websocket", outcome="ok", attempts__isnull=True)
        assert (len(prewarms), answered.count()) == ((1, 0) if adapter == "openai" else (0, 1))
    attempts = Attempt.objects.select_related("assignment", "request")
    failed_over = {
        a.request_id
        for a in attempts.filter(assignment__name="up", status="succeeded")
        if attempts.filter(request_id=a.request_id, assignment__name="down", ordinal__lt=a.ordinal).exists()
    }
    assert failed_over, [(a.request_id, a.assignment.name, a.status) for a in attempts]

"""The pure core stays pure (STYLE.md "The pure core"): its modules import the standard library and
each other only (no Django, no httpx, no ORM, services or selectors), and read no clock and no randomness;
`now` is always passed in.

What is pure is a folder, never a list of files: the layout's pure folders (README "Layout", the rows whose
job begins "Pure"), which are also the folders mypy checks strictly (`[tool.mypy] files` in pyproject.toml,
run by `make lint`). Every module in them must be pure, and a module whose docstring says it is PURE must
sit in one."""

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest

from tests.test_imports import PACKAGES
from tests.test_layers import layout

ROOT = Path(__file__).resolve().parent.parent
PROJECT = frozenset(PACKAGES)
PURE_ROW = re.compile(r"^\| `([a-z_/]+)/` \| Pure:", re.M)
# A module's docstring claims purity with a sentence of its own: "PURE: ..." or "PURE."
CLAIM = re.compile(r"\bPURE[:.]")
# Standard-library modules that would bring I/O, a clock, randomness or concurrency into the core.
FORBIDDEN_STDLIB = frozenset(
    {
        "asyncio",
        "http",
        "io",
        "os",
        "random",
        "secrets",
        "select",
        "shutil",
        "socket",
        "sqlite3",
        "subprocess",
        "sys",
        "threading",
        "time",
        "urllib",
        "uuid",
    }
)
CLOCK_CALLS = frozenset({"now", "utcnow", "today", "time", "monotonic", "perf_counter"})


def _dotted(path: Path) -> str:
    """A module's dotted name (a package by its own name)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def pure_folders() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    folders = layout(readme)
    return [folder for folder in PURE_ROW.findall(readme) if folder in folders]


def pure_modules() -> set[str]:
    """Every module of the pure folders, by dotted name (a package by its own name)."""
    return {_dotted(path) for folder in pure_folders() for path in (ROOT / folder).rglob("*.py")}


def _source(module: str) -> str:
    path = ROOT / Path(*module.split("."))
    return (path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).read_text()


def _absolute(node: ast.ImportFrom, module: str) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")[: len(module.split(".")) - node.level]
    return ".".join([*base, node.module] if node.module else base)


def violations(source: str, pure: set[str], module: str = "routing.policy.example") -> list[str]:
    """Every import or call in `source` (the text of `module`) that a pure module may not make."""
    found: list[str] = []

    def check(imported: str, names: list[str], line: int) -> None:
        top = imported.split(".")[0]
        if top == "__future__":
            return
        if top in PROJECT:
            # `from routing import preference` names a module; `from routing.policy.types import X` a name in
            # one.
            targets = [imported] if imported in pure or not names else [f"{imported}.{n}" for n in names]
            for target in targets:
                if target not in pure:
                    found.append(f"line {line}: imports {target}, which is not a pure module")
            return
        if top not in sys.stdlib_module_names:
            found.append(f"line {line}: imports {imported}, outside the standard library")
        elif top in FORBIDDEN_STDLIB:
            found.append(f"line {line}: imports {imported}, which brings I/O, a clock or randomness")

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                check(alias.name, [], node.lineno)
        elif isinstance(node, ast.ImportFrom):
            check(_absolute(node, module), [alias.name for alias in node.names], node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in CLOCK_CALLS:
                found.append(f"line {node.lineno}: calls .{node.func.attr}(); pass `now` in instead")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "__import__":
            found.append(f"line {node.lineno}: dynamic import")
    return found


def test_the_pure_folders_are_the_layouts_and_mypys():
    assert pure_folders() == ["proxy/wire", "routing/policy"]
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert sorted(config["tool"]["mypy"]["files"]) == sorted(pure_folders())


def test_every_module_that_claims_to_be_pure_is_declared_pure():
    claiming = {
        _dotted(path)
        for package in PROJECT
        for path in (ROOT / package).rglob("*.py")
        # bench/.venv-litellm (make bench's LiteLLM, git-ignored) holds other projects' files
        if not any(part.startswith(".venv") for part in path.relative_to(ROOT).parts)
        and CLAIM.search(ast.get_docstring(ast.parse(path.read_text())) or "")
    }
    assert claiming - pure_modules() == set(), "a module that claims to be pure belongs in a pure folder"


@pytest.mark.parametrize("module", sorted(pure_modules()))
def test_pure_module_imports_only_the_stdlib_and_the_pure_core(module):
    assert violations(_source(module), pure_modules(), module) == []


def test_pure_modules_open_with_a_contract_docstring():
    for module in sorted(pure_modules()):
        assert ast.get_docstring(ast.parse(_source(module))), f"{module} has no module docstring"


@pytest.mark.parametrize(
    "source",
    [
        "import django",
        "from django.db import models",
        "import httpx",
        "from httpx import AsyncClient",
        "from routing.models import Circuit",
        "from routing import services",
        "import routing.selectors",
        "from .. import selectors",
        "from .models import Circuit",
        "from pools.models import Assignment",
        "from proxy.relay import Exchange",
        "from proxy import relay",
        "import yaml",
        "import time",
        "from os import environ",
        "import random",
        "from datetime import datetime\nx = datetime.now()",
        "import datetime\nx = datetime.datetime.utcnow()",
        "from datetime import date\nx = date.today()",
        "m = __import__('django')",
    ],
)
def test_the_checker_catches_an_impure_source(source):
    assert violations(source, pure_modules()) != []


@pytest.mark.parametrize(
    "source",
    [
        "from __future__ import annotations",
        "import enum\nfrom dataclasses import dataclass, replace\nfrom datetime import datetime, timedelta",
        "from collections.abc import Mapping",
        "from routing.policy.types import Candidate",
        "from routing.policy import preference",
        "from .eligibility import evaluate",
        "import routing.policy.breaker",
        "from proxy.wire.sse import Block",
    ],
)
def test_the_checker_accepts_a_pure_source(source):
    assert violations(source, pure_modules()) == []

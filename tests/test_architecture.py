"""The routing policy core stays pure (STYLE.md "The pure core"): its modules import the standard
library and each other only (no Django, no httpx, no ORM, services or selectors), and read no clock
and no randomness; `now` is always passed in."""

import ast
import sys
from pathlib import Path

import pytest

ROUTING = Path(__file__).resolve().parent.parent / "routing"
# The routing modules that may touch Django: everything else in routing/ is the pure core.
ORM_MODULES = frozenset({"__init__", "apps", "models", "services", "selectors", "admin"})
EXPECTED_PURE = frozenset(
    {
        "types",
        "pricing",
        "resolution",
        "plan",
        "eligibility",
        "preference",
        "auto",
        "failures",
        "breaker",
        "sanitize",
        "budget",
        "vocabulary",
    }
)
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


def pure_modules() -> set[str]:
    return {path.stem for path in ROUTING.glob("*.py") if path.stem not in ORM_MODULES}


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if node.level == 0:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def violations(source: str, pure: set[str], package: str = "routing") -> list[str]:
    """Every import or call in `source` that a pure routing module may not make."""
    found: list[str] = []

    def check(module: str, names: list[str], line: int) -> None:
        top = module.split(".")[0]
        if top == "__future__":
            return
        if top == package:
            parts = module.split(".")
            targets = [parts[1]] if len(parts) > 1 else names
            for target in targets:
                if target not in pure:
                    found.append(f"line {line}: imports {package}.{target}, which is not a pure module")
            return
        if top not in sys.stdlib_module_names:
            found.append(f"line {line}: imports {module}, outside the standard library")
        elif top in FORBIDDEN_STDLIB:
            found.append(f"line {line}: imports {module}, which brings I/O, a clock or randomness")

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                check(alias.name, [], node.lineno)
        elif isinstance(node, ast.ImportFrom):
            check(_absolute(node, package), [alias.name for alias in node.names], node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in CLOCK_CALLS:
                found.append(f"line {node.lineno}: calls .{node.func.attr}(); pass `now` in instead")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "__import__":
            found.append(f"line {node.lineno}: dynamic import")
    return found


def test_the_expected_pure_modules_exist_and_are_checked():
    assert pure_modules() >= EXPECTED_PURE


@pytest.mark.parametrize("module", sorted(pure_modules()))
def test_pure_module_imports_only_the_stdlib_and_the_pure_core(module):
    source = (ROUTING / f"{module}.py").read_text()
    assert violations(source, pure_modules()) == []


def test_pure_modules_open_with_a_contract_docstring():
    for module in sorted(pure_modules()):
        tree = ast.parse((ROUTING / f"{module}.py").read_text())
        assert ast.get_docstring(tree), f"routing/{module}.py has no module docstring"


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
        "from . import selectors",
        "from .models import Circuit",
        "from pools.models import Assignment",
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
    assert violations(source, EXPECTED_PURE) != []


@pytest.mark.parametrize(
    "source",
    [
        "from __future__ import annotations",
        "import enum\nfrom dataclasses import dataclass, replace\nfrom datetime import datetime, timedelta",
        "from collections.abc import Mapping",
        "from routing.types import Candidate",
        "from routing import preference",
        "from .eligibility import evaluate",
        "import routing.breaker",
    ],
)
def test_the_checker_accepts_a_pure_source(source):
    assert violations(source, EXPECTED_PURE) == []

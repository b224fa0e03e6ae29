"""docs/configuration.md is the schema's and the environment's reference, and stays so (issue 47 point 8).

The reference is generated (`manage.py config_reference`); these tests fail when the file is stale, when a
YAML field says nothing of its meaning or values, when the example does not load, and when the code reads
an environment variable the reference does not name (or the reference names one nothing reads, or gives
another default than the code's).
"""

import ast
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import call_command

from gatewayconfig import fields, reference, schema
from gatewayconfig.checker import MISSING
from gatewayconfig.document import parse_config

REPO = Path(__file__).resolve().parent.parent
# The product's code (not the developer tooling of devkit/, bench/, soak/ or the tests).
PRODUCT = ("gatewaysite", "pools", "proxy", "routing", "runtime", "catalog", "gatewayconfig")
DOCUMENTED = {v.name: v for v in reference.ENVIRONMENT}
PATTERNS = tuple(name.removesuffix("*") for name in DOCUMENTED if name.endswith("*"))


def test_the_reference_file_is_what_the_schema_generates(capsys):
    call_command("config_reference")
    generated = capsys.readouterr().out
    assert generated == reference.render_reference()
    assert reference.REFERENCE.read_text() == generated, (
        "docs/configuration.md is out of date: run "
        "`.venv/bin/python manage.py config_reference > docs/configuration.md`"
    )


def _entries(entries, prefix=""):
    for entry in entries:
        yield entry, f"{prefix}{entry.key}"
        if isinstance(entry, fields.Block):
            yield from _entries(entry.fields, f"{prefix}{entry.key}.")


def test_every_yaml_key_is_in_the_reference_with_its_values_default_and_meaning():
    text = reference.REFERENCE.read_text()
    rows = {
        (section, key): (accepts, default, meaning)
        for section, key, accepts, default, meaning in reference.yaml_rows()
    }
    for section, entries, _ in reference.SECTIONS:
        assert f"\n### {section}\n" in text
        for entry, key in _entries(entries):
            accepts, default, meaning = rows[(section, key)]
            assert accepts and meaning, (section, key)
            assert f"| `{key}` |" in text, (section, key)
            if isinstance(entry, fields.Field) and entry.kind is not None and entry.default is MISSING:
                assert default == "required"
            if isinstance(entry, fields.Field) and entry.legacy is not None:
                assert f"`{entry.legacy[0]}`" in meaning  # the older name is still read: say so


def test_every_section_the_schema_declares_has_its_heading():
    declared = {
        name
        for name, value in vars(schema).items()
        if isinstance(value, tuple)
        and value
        and all(isinstance(e, fields.Field | fields.Block) for e in value)
    }
    covered = {
        name
        for name, value in vars(schema).items()
        for _, entries, _ in reference.SECTIONS
        if value is entries
    }
    # SETTINGS is the top level's settings columns, documented under the top level.
    assert declared - {"SETTINGS"} == covered


def test_a_field_without_a_meaning_is_refused(monkeypatch):
    undocumented = (*schema.POOL, fields.Field("colour", fields.BOOLEAN))
    monkeypatch.setattr(
        reference,
        "SECTIONS",
        (*reference.SECTIONS[:1], ("pools[]", undocumented, "x"), *reference.SECTIONS[2:]),
    )
    with pytest.raises(reference.UndocumentedField, match="colour"):
        reference.render_reference()


def test_the_example_loads_without_errors_or_warnings():
    env = {
        "GATEWAY_UPSTREAM_OPENAI_A": "sk-upstream-example",
        "GATEWAY_UPSTREAM_ANTHROPIC_A": "sk-ant-example",
        "GATEWAY_KEY_CI": "sk-gw-ci-example-0000000000",
    }
    validation = parse_config(reference.EXAMPLE.read_text(), env=env)
    assert validation.errors == ()
    assert validation.warnings == ()
    assert validation.config is not None
    # It shows every top-level key.
    assert {e.key for e in schema.TOP_LEVEL} <= set(yaml.safe_load(reference.EXAMPLE.read_text()))


# --- environment variables -----------------------------------------------------------------------


def _constant(node: ast.expr) -> Any:
    """A default written as a constant expression (`8 * 1024 * 1024`, `["a", "b"]`), else None."""
    allowed = (ast.Constant, ast.BinOp, ast.UnaryOp, ast.List, ast.Tuple, ast.operator, ast.unaryop, ast.Load)
    if not all(isinstance(n, allowed) for n in ast.walk(node)):
        return None
    return eval(compile(ast.Expression(node), "<default>", "eval"), {"__builtins__": {}})


def _environ_read(node: ast.Call) -> tuple[str, ast.expr | None] | None:
    """`env.str("NAME", default=...)` (django-environ), `os.environ.get("NAME", d)`, `os.getenv("NAME")`."""
    func = node.func
    if not (isinstance(func, ast.Attribute) and node.args and isinstance(node.args[0], ast.Constant)):
        return None
    name = node.args[0].value
    default = next((k.value for k in node.keywords if k.arg == "default"), None)
    if isinstance(func.value, ast.Name) and func.value.id == "env" and func.attr != "read_env":
        return name, default
    target = ast.unparse(func.value)
    if (target, func.attr) in (("os.environ", "get"), ("os", "getenv")):
        return name, node.args[1] if len(node.args) > 1 else None
    return None


def _reads() -> dict[str, list[tuple[str, ast.expr | None]]]:
    """Every environment variable the product's code reads by name: name -> [(file, default)]."""
    reads: dict[str, list[tuple[str, ast.expr | None]]] = {}
    files = [REPO / "manage.py", *(p for package in PRODUCT for p in (REPO / package).rglob("*.py"))]
    for path in files:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            found = None
            if isinstance(node, ast.Call):
                found = _environ_read(node)
            elif (
                isinstance(node, ast.Subscript)
                and isinstance(node.ctx, ast.Load)
                and ast.unparse(node.value) == "os.environ"
                and isinstance(node.slice, ast.Constant)
            ):
                found = node.slice.value, None
            if found is not None:
                reads.setdefault(found[0], []).append((str(path.relative_to(REPO)), found[1]))
    return reads


def test_the_scan_finds_what_settings_reads():
    # The scan itself must work, or the tests below pass on nothing.
    reads = _reads()
    assert {"DJANGO_DEBUG", "DATABASE_URL", "GATEWAY_MAX_BODY_BYTES", "WEB_CONCURRENCY"} <= set(reads)
    assert reads["GATEWAY_MAX_BODY_BYTES"][0][0] == "gatewaysite/settings.py"


def test_every_environment_variable_the_code_reads_is_documented():
    undocumented = {
        name: [file for file, _ in where]
        for name, where in _reads().items()
        if name not in DOCUMENTED and not name.startswith(PATTERNS)
    }
    assert undocumented == {}, (
        "add them to gatewayconfig.reference.ENVIRONMENT, then regenerate the reference"
    )


def test_every_documented_variable_is_read_somewhere():
    run_sh = set(re.findall(r"\$\{?([A-Z][A-Z0-9_]*)", (REPO / "scripts" / "run.sh").read_text()))
    read = set(_reads()) | run_sh
    stale = {name for name in DOCUMENTED if not name.endswith("*") and name not in read}
    assert stale == set()


def _as_written(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, list | tuple):
        return ",".join(value)
    return str(value)


def test_documented_defaults_are_the_code_defaults():
    checked = 0
    for name, where in _reads().items():
        for _, node in where:
            value = None if node is None else _constant(node)
            if value in (None, "", []) or name not in DOCUMENTED:
                continue
            assert f"`{_as_written(value)}`" in DOCUMENTED[name].default, (name, value)
            checked += 1
    assert checked >= 15  # the scan evaluated the settings' constant defaults

"""The product's code stays in pieces one can read (issue 46 point 6): no module of an app is longer than
MODULE_MAX lines and no function or method than FUNCTION_MAX.

A module counts its lines; a function counts from its `def` (decorators aside) to its last line, its
docstring and nested functions included. Migrations are Django's generated history, not written to be
read: they are left out. A module that outgrows the limit is split along the seam between its subjects
(in the same folder, so the README's layout holds), a function along the decisions it makes (named
helpers); there is no allowlist.
"""

import ast
from pathlib import Path

from tests.test_layers import PRODUCT

ROOT = Path(__file__).resolve().parent.parent
MODULE_MAX = 600
FUNCTION_MAX = 80


def app_modules(root: Path, apps: tuple[str, ...]) -> list[Path]:
    """Every Python module of the apps, migrations excluded, in path order."""
    return sorted(
        path
        for app in apps
        for path in (root / app).rglob("*.py")
        if "migrations" not in path.relative_to(root).parts
    )


def oversized(root: Path, apps: tuple[str, ...]) -> list[str]:
    """Each module and function over its limit, as `path: N lines` or `path:line name: N lines`."""
    found = []
    for path in app_modules(root, apps):
        source = path.read_text()
        name = path.relative_to(root).as_posix()
        lines = len(source.splitlines())
        if lines > MODULE_MAX:
            found.append(f"{name}: {lines} lines (module, at most {MODULE_MAX})")
        for node in ast.walk(ast.parse(source, filename=name)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > FUNCTION_MAX:
                    found.append(
                        f"{name}:{node.lineno} {node.name}: {length} lines (function, at most {FUNCTION_MAX})"
                    )
    return found


def test_no_app_module_or_function_is_over_its_size():
    found = oversized(ROOT, PRODUCT)
    assert found == [], "over the size limits (split them along their seams):\n" + "\n".join(found)


def test_the_check_names_a_long_module_and_a_long_function_and_skips_migrations(tmp_path):
    app = tmp_path / "app"
    (app / "migrations").mkdir(parents=True)
    body = "".join(f"        x{i} = {i}\n" for i in range(FUNCTION_MAX))
    (app / "long_function.py").write_text(f"class C:\n    async def step(self):\n{body}")
    (app / "long_module.py").write_text("x = 1\n" * (MODULE_MAX + 1))
    (app / "fits.py").write_text("def f():\n" + "    pass\n" * (FUNCTION_MAX - 1))
    (app / "migrations" / "0001_initial.py").write_text("x = 1\n" * (MODULE_MAX + 1))
    assert oversized(tmp_path, ("app",)) == [
        f"app/long_function.py:2 step: {FUNCTION_MAX + 1} lines (function, at most {FUNCTION_MAX})",
        f"app/long_module.py: {MODULE_MAX + 1} lines (module, at most {MODULE_MAX})",
    ]

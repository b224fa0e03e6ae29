"""The layout's map holds (issue 46): the README's layout table (between its `layout` markers) lists the
product's folders from the top layer to the bottom, and a folder may import only folders below it.

Each module belongs to the deepest folder of the table that holds it (`proxy/wire/sse.py` to `proxy/wire`,
`proxy/relay.py` to `proxy`). Every import counts, wherever it stands (tests/test_imports.py's graph): an
import moved into a function still couples the two folders. So the folder graph has no upward arrow and,
as a consequence, no two folders importing each other."""

import re
from pathlib import Path

from tests.test_imports import PACKAGES, import_graph

ROOT = Path(__file__).resolve().parent.parent
ROW = re.compile(r"^\| `([a-z_/]+)/` \|", re.M)
PRODUCT = ("gatewaysite", "gatewayconfig", "proxy", "routing", "catalog", "pools", "runtime")


def layout(readme: str) -> list[str]:
    """The table's folders, top layer first."""
    start, end = readme.index("<!-- layout: begin -->"), readme.index("<!-- layout: end -->")
    return ROW.findall(readme[start:end])


def folder_of(module: str, folders: list[str]) -> str | None:
    path = module.replace(".", "/")
    holders = [folder for folder in folders if path == folder or path.startswith(folder + "/")]
    return max(holders, key=len) if holders else None


def upward_imports(root: Path, folders: list[str], packages: tuple[str, ...]) -> list[str]:
    """Every import from a folder to one above it (or outside the table), as `from -> to: module:line`."""
    graph = import_graph(root, packages)
    found = []
    for module, edges in sorted(graph.items()):
        here = folder_of(module, folders)
        if here is None:
            found.append(f"{module} is in no folder of the layout")
            continue
        for target, line in sorted(edges.items()):
            there = folder_of(target, folders)
            if there is None or folders.index(there) < folders.index(here):
                found.append(f"{here} -> {there}: {module}:{line} imports {target}")
    return found


def test_the_layout_table_names_every_product_folder_once():
    folders = layout((ROOT / "README.md").read_text())
    assert len(folders) == len(set(folders))
    assert {folder.split("/")[0] for folder in folders} == set(PRODUCT)
    for folder in folders:
        assert (ROOT / folder / "__init__.py").is_file(), folder


def test_no_folder_imports_a_folder_above_it():
    folders = layout((ROOT / "README.md").read_text())
    found = upward_imports(ROOT, folders, PRODUCT)
    assert found == [], "imports against the README's layout:\n" + "\n".join(found)


def test_the_product_never_imports_the_tooling():
    graph = import_graph(ROOT, PACKAGES)
    tooling = ("devkit", "soak", "bench")
    found = [
        f"{module} imports {target}"
        for module, edges in graph.items()
        if module.split(".")[0] in PRODUCT
        for target in edges
        if target.split(".")[0] in tooling
    ]
    assert found == []


def test_the_package_ships_the_product_and_not_the_tooling():
    import tomllib

    from setuptools import find_packages

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    shipped = {name.split(".")[0] for name in find_packages(str(ROOT), include=include)}
    assert shipped == set(PRODUCT)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, source in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return tmp_path


def test_an_upward_import_is_caught_even_inside_a_function(tmp_path):
    root = _tree(
        tmp_path,
        {
            "app/__init__.py": "",
            "app/view.py": "from app.rules import rule\n",
            "app/rules/__init__.py": "",
            "app/rules/rule.py": "def later():\n    from app import view\n    return view\n",
        },
    )
    found = upward_imports(root, ["app", "app/rules"], ("app",))
    assert found == ["app/rules -> app: app.rules.rule:2 imports app.view"]


def test_a_module_outside_the_table_and_a_downward_import_are_told_apart(tmp_path):
    root = _tree(
        tmp_path,
        {
            "app/__init__.py": "",
            "app/view.py": "from app.rules import rule\n",
            "app/rules/__init__.py": "",
            "app/rules/rule.py": "X = 1\n",
            "other/__init__.py": "",
        },
    )
    assert upward_imports(root, ["app", "app/rules"], ("app",)) == []
    assert upward_imports(root, ["app/rules"], ("app",))[0] == "app is in no folder of the layout"


def test_the_table_is_read_in_its_order():
    rows = ["| Folder | Job |", "|---|---|", "| `a/` | top |", "| `a/b/` | pure |"]
    readme = "\n".join(["x", "<!-- layout: begin -->", *rows, "<!-- layout: end -->", "| `c/` | after |"])
    assert layout(readme) == ["a", "a/b"]

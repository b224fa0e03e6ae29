"""No import cycle between the project's modules (issue 16 point 5, STYLE.md "a guard test for every rule
we keep forgetting").

The graph is read from the source with `ast`, never by importing it, so a cycle is caught even where it
would only bite at run time. What counts as an edge, and why:

- Every `import` and `from ... import` statement, wherever it stands: at module level, inside a function or
  method, under `if TYPE_CHECKING:`. An import moved into a function still couples the two modules and
  still runs; it only moves the cycle from import time to the first call, so it is counted, not forgiven.
- `from package import name` is an edge to `package.name` when that is a module, else to `package`.
  `import a.b` is an edge to `a.b`. Relative imports are resolved against the importing module.
- Dotted strings (`INSTALLED_APPS`, `AdminConfig.default_site`, `import_string`) are not edges: Django
  resolves them after every module has loaded, which is how a lower layer names a higher one on purpose.
- Migrations are included (they import models like any module).

A module may import its own package's `__init__` implicitly; those edges are not drawn (the apps'
`__init__.py` files are empty, so they could not close a cycle).
"""

import ast
from collections import deque
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = (
    "gatewaysite",
    "pools",
    "catalog",
    "gatewayconfig",
    "routing",
    "proxy",
    "runtime",
    "devkit",
    "soak",
    "bench",
)

Graph = dict[str, dict[str, int]]


def module_files(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Every module of `packages` under `root`, by dotted name (a package by its own name)."""
    modules: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if any(part.startswith(".") for part in parts):
                continue  # a hidden directory: a venv of its own (make bench's bench/.venv-litellm)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The project module `name` lives in (`pools.models.Pool` -> `pools.models`), or None for a name
    outside the project (the stdlib, Django, httpx, tests)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(root: Path, packages: tuple[str, ...]) -> Graph:
    """module -> {imported project module: line of the first import}, every import counted."""
    modules = module_files(root, packages)
    graph: Graph = {}
    for module, path in modules.items():
        edges = graph.setdefault(module, {})
        here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[: len(here) - (node.level - 1)]
                    source = ".".join([*base, node.module] if node.module else base)
                else:
                    source = node.module or ""
                targets = [
                    f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                    for alias in node.names
                ]
            else:
                continue
            for target in targets:
                owner = _owner(target, modules)
                if owner is not None and owner != module:
                    edges.setdefault(owner, node.lineno)
    return graph


def _components(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def cycles(graph: Graph) -> list[list[str]]:
    """One shortest cycle through each tangle of modules, as [a, b, ..., a]."""
    result = []
    for component in _components(graph):
        members = set(component)
        start = component[0]
        previous: dict[str, str] = {}
        queue = deque([start])
        while queue:
            node = queue.popleft()
            if start in graph[node]:
                path = [node]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                result.append([*reversed(path), start])
                break
            for child in sorted(graph[node]):
                if child in members and child not in previous and child != start:
                    previous[child] = node
                    queue.append(child)
    return result


def describe(cycle: list[str], graph: Graph) -> str:
    lines = ", ".join(f"{a}:{graph[a][b]}" for a, b in pairwise(cycle))
    return " -> ".join(cycle) + f"  ({lines})"


def test_the_project_has_no_import_cycle():
    graph = import_graph(ROOT, PACKAGES)
    found = [describe(cycle, graph) for cycle in cycles(graph)]
    assert found == [], "import cycles (module:line of each import):\n" + "\n".join(found)


def test_the_graph_covers_every_package():
    graph = import_graph(ROOT, PACKAGES)
    for package in PACKAGES:
        assert any(module.split(".")[0] == package for module in graph), package
    assert "routing.models" in graph["routing.admin"]
    assert "pools.models" in graph["catalog.models"]


def _tree(tmp_path: Path, files: dict[str, str]) -> Graph:
    for name, source in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return import_graph(tmp_path, ("app", "other"))


def test_a_cycle_through_a_function_level_import_is_caught(tmp_path):
    graph = _tree(
        tmp_path,
        {
            "app/__init__.py": "",
            "app/a.py": "from app.b import thing\n",
            "app/b.py": "thing = 1\ndef later():\n    from app import a\n    return a\n",
        },
    )
    assert cycles(graph) == [["app.a", "app.b", "app.a"]]
    assert describe(cycles(graph)[0], graph) == "app.a -> app.b -> app.a  (app.a:1, app.b:3)"


def test_relative_and_type_checking_imports_count_and_a_long_cycle_is_printed_whole(tmp_path):
    graph = _tree(
        tmp_path,
        {
            "app/__init__.py": "",
            "app/a.py": "from . import b\n",
            "app/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from other.c import C\n",
            "other/__init__.py": "",
            "other/c.py": "import app.a\nimport django\nfrom os import path\n",
        },
    )
    assert cycles(graph) == [["app.a", "app.b", "other.c", "app.a"]]


def test_an_acyclic_tree_and_names_imported_from_a_package_pass(tmp_path):
    graph = _tree(
        tmp_path,
        {
            "app/__init__.py": "VERSION = 1\n",
            "app/a.py": "from app import VERSION, b\nfrom app.b import B\n",
            "app/b.py": "B = 2\n",
            "other/__init__.py": "",
            "other/c.py": "from app.a import *\nimport app\n",
        },
    )
    assert graph["app.a"] == {"app": 1, "app.b": 1}
    assert graph["other.c"] == {"app.a": 1, "app": 2}
    assert cycles(graph) == []


# The ingresses share the request path through proxy.ingress; none imports another. (gatewaysite.asgi
# mounts them, so it may import each.)
INGRESSES = ("proxy.views", "proxy.consumers", "proxy.files")


def test_no_ingress_imports_another():
    graph = import_graph(ROOT, PACKAGES)
    crossing = [
        f"{ingress} imports {other} (line {graph[ingress][other]})"
        for ingress in INGRESSES
        for other in INGRESSES
        if other in graph[ingress]
    ]
    assert crossing == [], "use the shared request path, proxy.ingress:\n" + "\n".join(crossing)


# The apps in layers, lowest first (issue 16 point 5): a module imports its own layer and the layers below,
# never one above, so no two apps depend on each other. The pure core (the files mypy type-checks, held pure
# by tests/test_architecture.py) is a layer of its own under every app wherever its files sit: pools and
# catalog build on routing's policy modules while routing's ORM layer builds on their models. The project
# package (settings, URLs, ASGI, the admin site) wires the apps together; the dev tools sit on top.
LAYERS = (
    "core",
    "runtime",
    "pools",
    "catalog",
    "gatewayconfig",
    "routing",
    "proxy",
    "gatewaysite",
    "devkit",
    "soak",
    "bench",
)


def layer_of(module: str, pure: set[str]) -> str:
    return "core" if module in pure else module.split(".")[0]


def upward_imports(
    graph: Graph, pure: set[str], layers: tuple[str, ...] = LAYERS
) -> dict[tuple[str, str], str]:
    """(importer, imported) -> "importer:line imports imported (layer -> higher layer)", for every import
    that goes up a layer."""
    found = {}
    for module, edges in graph.items():
        for target, line in edges.items():
            low, high = layer_of(module, pure), layer_of(target, pure)
            if layers.index(high) > layers.index(low):
                found[(module, target)] = f"{module}:{line} imports {target} ({low} -> {high})"
    return found


def test_no_app_imports_a_layer_above_it():
    from tests.test_architecture import pure_modules

    assert set(PACKAGES) | {"core"} == set(LAYERS)
    upward = upward_imports(import_graph(ROOT, PACKAGES), pure_modules())
    found = [upward[edge] for edge in sorted(upward)]
    assert found == [], "an import goes up a layer (see LAYERS):\n" + "\n".join(found)


def test_an_import_up_a_layer_is_found_even_inside_a_function_and_the_core_is_below_all(tmp_path):
    graph = _tree(
        tmp_path,
        {
            "app/__init__.py": "",
            "app/policy.py": "import enum\n",
            "app/models.py": "from other.models import Row\n\ndef later():\n    from other import views\n",
            "other/__init__.py": "",
            "other/models.py": "from app import models, policy\n",
            "other/views.py": "",
            "other/policy.py": "",
        },
    )
    upward = upward_imports(graph, {"app.policy", "other.policy"}, ("core", "app", "other"))
    assert upward == {
        ("app.models", "other.models"): "app.models:1 imports other.models (app -> other)",
        ("app.models", "other.views"): "app.models:4 imports other.views (app -> other)",
    }

"""runtime is the layer under the apps (runtime/__init__.py): it imports none of them, so every app may
import it without a cycle."""

from tests.test_imports import PACKAGES, ROOT, import_graph


def test_runtime_imports_no_app():
    graph = import_graph(ROOT, PACKAGES)
    runtime = {module: edges for module, edges in graph.items() if module.split(".")[0] == "runtime"}
    assert "runtime.handler" in runtime
    outside = {(module, target) for module, edges in runtime.items() for target in edges}
    assert {(module, target) for module, target in outside if target.split(".")[0] != "runtime"} == set()

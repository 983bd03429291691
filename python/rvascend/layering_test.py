"""The package's layers, enforced: a module imports only its own subpackage and the
subpackages below it, and no two modules import each other, however indirectly.

From the top: the tooling (bench, which drives setup, and repro), then the request path
server -> engine -> tokenizer -> policy (installs) -> models -> dispatch (what models call
at run time) -> ops (the kernels) -> runtime (allocator, cache, pinned files) ->
testing (what tests and benchmarks share); the package's own modules (rvascend/*.py)
import none of them. Tests are held to the same order: a test that drives a layer lives
in that layer (or above), and each layer's fixtures are in its own testing.py. Imports
under `if TYPE_CHECKING:` run never and are not counted. No exceptions list: a new
upward import or cycle fails here with its file and line. So does a function of more
than 80 lines outside the tests.
"""

from __future__ import annotations

import ast
import os
import sys

import pytest

LAYERS = ("bench", "setup", "repro", "server", "engine", "tokenizer", "policy", "models", "dispatch", "ops", "runtime",
          "testing")
ROOT = os.path.dirname(os.path.abspath(__file__))


def _modules(tests: bool = True) -> dict[str, str]:
    """Dotted name -> path of every module of the package, its tests too unless `tests` is False."""
    out = {}
    for directory, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py") and (tests or not f.endswith("_test.py")):
                rel = os.path.relpath(os.path.join(directory, f), os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                out[rel.removesuffix(".__init__")] = os.path.join(directory, f)
    return out


def _runtime_imports(node: ast.AST):
    """(module, line) of every rvascend import that can run (TYPE_CHECKING blocks skipped)."""
    if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
        children = node.orelse
    else:
        children = list(ast.iter_child_nodes(node))
    if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "rvascend":
        for alias in node.names:
            yield (f"{node.module}.{alias.name}", node.module), node.lineno
    elif isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.split(".")[0] == "rvascend":
                yield (alias.name, alias.name), node.lineno
    for child in children:
        yield from _runtime_imports(child)


def _graph() -> dict[str, list[tuple[str, int]]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        edges = []
        for (full, base), line in _runtime_imports(tree):
            target = full if full in modules else base  # `from pkg import module` or `from module import name`
            if target in modules and target != name:
                edges.append((target, line))
        graph[name] = edges
    return graph


def _layer(module: str) -> int:
    parts = module.split(".")
    if len(parts) < 2 or parts[1] not in LAYERS:
        return len(LAYERS)  # rvascend itself and its own modules: below every layer
    return LAYERS.index(parts[1])


def test_no_module_imports_a_layer_above_its_own():
    upward = []
    for name, edges in _graph().items():
        for target, line in edges:
            if _layer(target) < _layer(name) and target != "rvascend":
                upward.append(f"{name} (line {line}) imports {target}")
    assert not upward, "imports that go up the layers:\n" + "\n".join(sorted(upward))


def test_in_the_engine_only_the_model_runner_touches_dispatch():
    """The engine's scheduling, speculation and outputs see the model through the model
    runner alone. Its tests and fixtures (engine/testing.py) set kernels up themselves."""
    reaching = [f"{name} (line {line}) imports {target}" for name, edges in _graph().items()
                if name.startswith("rvascend.engine.") and name != "rvascend.engine.model_runner"
                and not name.endswith(("_test", ".testing"))
                for target, line in edges if target.startswith("rvascend.dispatch")]
    assert not reaching, "engine modules past the model runner into dispatch:\n" + "\n".join(sorted(reaching))


def test_no_route_module_names_the_policy_even_for_type_checking():
    """Routes get a RouteContext from the policy (dispatch/route_context.py); an import of
    the policy under TYPE_CHECKING would hide the old runtime cycle from the graph above."""
    named = []
    for name, path in _modules().items():
        if name.startswith("rvascend.dispatch"):
            with open(path, encoding="utf-8") as f:
                for node in ast.walk(ast.parse(f.read(), path)):
                    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rvascend.policy"):
                        named.append(f"{name} (line {node.lineno}) imports {node.module}")
    assert not named, "dispatch modules importing the policy:\n" + "\n".join(named)


def test_every_subpackage_has_a_layer():
    subpackages = {d for d in os.listdir(ROOT) if os.path.isfile(os.path.join(ROOT, d, "__init__.py"))}
    assert subpackages - {"_native"} == set(LAYERS)  # _native: the extensions ./dev setup installs


def test_every_import_of_the_package_names_a_module_it_has():
    """An import of a module that moved away fails here, not when its function first runs
    (the graph above drops what it cannot resolve)."""
    modules = _modules()
    dangling = []
    for name, path in modules.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for (full, base), line in _runtime_imports(tree):
            if full not in modules and base not in modules and not base.startswith("rvascend._native"):
                dangling.append(f"{name} (line {line}) imports {full}")
    assert not dangling, "imports of modules the package does not have:\n" + "\n".join(sorted(dangling))


def test_no_import_cycle():
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []
    cycles = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for target, _ in graph.get(node, ()):
            if state.get(target) == 1:
                cycles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)



MAX_FUNCTION_LINES = 80


def test_no_function_is_longer_than_80_lines():
    """A function that long does several things: each gets a name of its own (tests aside)."""
    long = []
    for name, path in _modules(tests=False).items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name} (line {node.lineno}): {lines} lines")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(sorted(long))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

"""Every module of the two packages imports alone, and their module-level imports form no cycle.

A cycle that happens to work (each module of it reached first from the right side) breaks as soon as a
user's first import enters it from another: the module it needs is then partially initialized. The
graph is read from the source (imports at module level, TYPE_CHECKING blocks and function bodies
excluded: those run later or never), so a cycle fails here even where today's import order hides it."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kernels", "conformance")


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, whether it is a package's __init__), for every module of PACKAGES."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _module_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    found, stack = [], list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue  # runs when called, after every module-level import has finished
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)  # the checker's only
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        else:
            stack.extend(ast.iter_child_nodes(node))
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of PACKAGES it imports at module level (a name imported from a package is the
    submodule where there is one of that name, else the package)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for module, (path, is_package) in modules.items():
        targets = set()
        for node in _module_level_imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
                continue
            target = _absolute(module, is_package, node)
            for alias in node.names:
                targets.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target)
        graph[module] = {t for t in targets if t in modules and t != module}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (cycle := visit(target, path)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node, [])):
            return cycle
    return None


def test_the_module_level_imports_form_no_cycle():
    graph = import_graph()
    assert len(graph) > 80 and graph["kernels"] >= {"kernels.registry"}  # the graph was read, not empty
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_a_cycle_is_found():
    """The finder itself: a planted cycle three modules long, beside an acyclic branch."""
    graph = {"a": {"b", "d"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x\nelse:\n    import y\n"
                     "def f():\n    import z\n")
    assert sorted(alias.name for node in _module_level_imports(tree) for alias in node.names) == \
        ["TYPE_CHECKING", "y"]


_ALONE = """
import importlib, json, sys, traceback
failures = {}
for name in json.loads(sys.argv[1]):
    for loaded in [m for m in sys.modules if m.split(".")[0] in ("kernels", "conformance", "tests")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception:
        failures[name] = traceback.format_exc(limit=-3)
print(json.dumps(failures))
"""


def test_every_module_imports_alone():
    """Each module imported first, in a process where no other module of the packages is loaded: an import
    that only works after another module has been imported fails here. (torch is installed where the
    tests run; CuPy need not be: GPU modules import without it and fail only when used.)"""
    names = sorted(_modules())
    done = subprocess.run([sys.executable, "-c", _ALONE, json.dumps(names)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, check=True)
    failures = json.loads(done.stdout.strip().splitlines()[-1])
    assert failures == {}, "\n".join(f"{name}:\n{trace}" for name, trace in failures.items())

"""The code's shape, read from every import (those inside functions too): no module imports
another that imports it back, and the import contracts (pyproject.toml, import-linter: the
runtime's layers, its engines' independence, the runtime never importing the console) hold."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("runtime", "console", "demo")


def _graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(
                        child)))))
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


def test_the_graph_counts_imports_inside_functions():
    # runtime.start() loads the loop on first call: an import inside a function, seen here.
    graph = _graph()
    assert "runtime.loop.control" in graph.find_modules_directly_imported_by("runtime")
    assert len(graph.modules) > 100


def test_no_module_imports_one_that_imports_it_back():
    assert _cycles(_graph()) == []


def test_a_cycle_would_be_found():
    graph = _graph()
    graph.add_import(importer="runtime.errors", imported="runtime.canonical")
    assert ["runtime.canonical", "runtime.errors"] in _cycles(graph)


def test_the_import_contracts_hold():
    done = subprocess.run([str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_every_module_imports():
    """A module renamed or split leaves no import behind that only fails when it runs (the
    migrations and the by-path script aside)."""
    import importlib

    failed = []
    for name in sorted(_graph().modules):
        if ".migrations." in name or name.endswith((".skew",)):
            continue
        try:
            importlib.import_module(name)
        except Exception as exc:
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
    assert failed == []

"""The runtime's shape: no module imports another that imports it back (at module level), and
the runtime never imports the console."""

from __future__ import annotations

import ast
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"


def _modules() -> dict[str, Path]:
    mods = {}
    for path in RUNTIME.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        parts = path.relative_to(RUNTIME.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """What ``name`` imports when it is loaded (imports inside functions run later)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                full = f"{target}.{alias.name}"
                found.add(full if full in known else target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_no_import_cycles_inside_the_runtime():
    known = _modules()
    graph = {m: {i for i in _imports(m, p, known) if i in known and i != m}
             for m, p in known.items()}
    cycles, state, stack = [], {}, []

    def visit(module: str) -> None:
        state[module] = "open"
        stack.append(module)
        for dep in sorted(graph[module]):
            if state.get(dep) == "open":
                cycles.append(" -> ".join([*stack[stack.index(dep):], dep]))
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert len(known) > 30 and any(graph.values())  # the walk saw the real tree
    assert cycles == []


def test_the_runtime_never_imports_the_console():
    known = _modules()
    offenders = [m for m, p in known.items()
                 if any(i == "console" or i.startswith("console.") for i in _imports(m, p, known))
                 or "import console" in p.read_text() or "from console" in p.read_text()]
    assert offenders == []

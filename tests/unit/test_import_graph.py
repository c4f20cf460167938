"""The package's import graph, read from the source: no module imports back up to the package
face (``aiocollect/__init__.py`` re-exports; nothing inside depends on it), and no two modules
import each other, directly or through others, not even lazily inside a function (a lazy
import that closes a circle is a layering mistake waiting for its first top-level import)."""

from __future__ import annotations

import ast
import pathlib

import aiocollect

ROOT = pathlib.Path(aiocollect.__file__).parent


def modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: pathlib.Path, known: dict) -> set[tuple[str, int]]:
    """``(module, line)`` of every aiocollect module ``name`` imports, wherever the import stands."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # ``from . import x``: x may be a module of the package, or a name of its face
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known]
            targets = subs or [target]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        found |= {(t, node.lineno) for t in targets if t == "aiocollect" or t.startswith("aiocollect.")}
    return found


GRAPH = {name: imports(name, path, modules()) for name, path in modules().items()}


def test_the_graph_is_read():
    edges = {t for deps in GRAPH.values() for t, _ in deps}
    assert "aiocollect._engine.scheduler" in edges and len(GRAPH) > 40


def test_no_module_imports_the_package_face():
    upward = sorted((name, line) for name, deps in GRAPH.items() if name != "aiocollect"
                    for target, line in deps if target == "aiocollect")
    assert not upward, f"modules importing the package face (import the defining module instead): {upward}"


def test_no_import_circle():
    graph = {name: {t for t, _ in deps if t in GRAPH and t != name} for name, deps in GRAPH.items()}
    graph.pop("aiocollect")  # the face imports everything; nothing imports it (above)
    state: dict[str, int] = {}
    circles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                circles.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)

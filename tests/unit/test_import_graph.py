"""The package's import graph, read from the source: no module imports back up to the package
face (``aiocollect/__init__.py`` re-exports; nothing inside depends on it), no two modules
import each other, directly or through others, and the private packages stand in layers
(``LAYERS``), each importing only those below it. Every import counts, wherever it stands:
at the top, lazily inside a function (a lazy import that closes a circle is a layering
mistake waiting for its first top-level import) or under ``TYPE_CHECKING``."""

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


LAYERS = (
    ("_errors",),  # the error tree: imports nothing of aiocollect
    ("_envs",),  # env groups of every kind (gymnasium, VectorEnv, TorchRL, coroutine envs), spaces, layouts
    ("_policies",),  # running a policy: runners, actors, weights, the random policy, JAX policies
    ("_workers",),  # where envs step, as lanes: worker processes (a policy's copy in them), coroutine lanes
    ("_engine",),  # the scheduler and its rounds, storage, timelines over the lanes and the policy
    ("_collectors",),  # the variants, assembled from everything below
    ("_distributed", "_tune", "_dataset", "jax"),  # built on collectors (or policies); independent of each other
    ("_cli",),  # the command line
    ("__main__",),  # python -m aiocollect
)
"""The private packages (and modules beside them) from the bottom up. A module may import its
own package and the packages of lower layers; packages that share a layer do not import
each other. The package face (``aiocollect``) stands above them all (imported by none)."""

KNOWN_CIRCLES: set[tuple[str, str]] = set()
"""Imports against ``LAYERS`` allowed for a while, named one by one (importer, imported), each
with a comment saying why and until when; the test refuses any other, and an entry whose
import is gone (``test_known_circles_still_exist``). Empty: the last two (``_workers`` <->
``_policies``, ``_policies`` <-> ``_engine``) went with issue 53's actor rewrite."""

RANK = {name: level for level, names in enumerate(LAYERS) for name in names}


def _layer_of(module: str) -> str:
    """``aiocollect._engine.scheduler`` -> ``_engine``; ``aiocollect.jax`` -> ``jax``."""
    return module.split(".")[1]


def _path_of(module: str) -> str:
    return str(modules()[module].relative_to(ROOT.parent))


def layer_violations() -> list[tuple[str, str, int]]:
    """``(importer, imported, line)`` of every import of a module in a higher layer, or in
    another package of the same layer."""
    found = []
    for name, deps in GRAPH.items():
        if name == "aiocollect":
            continue
        for target, line in deps:
            if target == "aiocollect":  # (refused by test_no_module_imports_the_package_face)
                continue
            mine, theirs = _layer_of(name), _layer_of(target)
            if mine != theirs and RANK[theirs] >= RANK[mine]:
                found.append((name, target, line))
    return sorted(found)


def test_every_package_has_a_layer():
    missing = sorted({_layer_of(name) for name in GRAPH if name != "aiocollect"} - set(RANK))
    assert not missing, f"packages or modules in no layer: {missing}; place each in LAYERS (test_import_graph.py)"


def test_packages_import_only_lower_layers():
    refused = [(name, target, line) for name, target, line in layer_violations()
               if (name, target) not in KNOWN_CIRCLES]
    messages = []
    for name, target, line in refused:
        mine, theirs = _layer_of(name), _layer_of(target)
        below = [n for names in LAYERS[:RANK[mine]] for n in names]
        rule = (f"{theirs} shares layer {RANK[mine]} with {mine}: packages of one layer do not import each other"
                if RANK[theirs] == RANK[mine] else
                f"{theirs} (layer {RANK[theirs]}) stands above {mine} (layer {RANK[mine]})")
        messages.append(f"{_path_of(name)}:{line} imports {target}: {rule}; {mine} may import only "
                        f"{', '.join(below) or 'nothing of aiocollect'} (LAYERS in test_import_graph.py)")
    assert not messages, "imports against the layers:\n" + "\n".join(messages)


def test_known_circles_still_exist():
    """An allowance whose import is gone must go too, so that it cannot come back unseen."""
    standing = {(name, target) for name, target, _ in layer_violations()}
    gone = sorted(KNOWN_CIRCLES - standing)
    assert not gone, f"KNOWN_CIRCLES names imports that no longer break the layers; remove them: {gone}"

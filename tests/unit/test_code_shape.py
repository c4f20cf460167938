"""The package's functions fit on a screen, read from the source: no function or method is over
``FUNCTION_MAX`` lines (``def`` to its last line, signature and docstring included), and no
constructor's body (from its first statement, docstring included, to its last line) is over
``INIT_BODY_MAX``: a constructor that long assembles parts that should take their
collaborators in their own constructors (``_collectors.assembly`` builds a collector's
engine that way)."""

from __future__ import annotations

import ast
import pathlib

import aiocollect

ROOT = pathlib.Path(aiocollect.__file__).parent
FUNCTION_MAX = 90
INIT_BODY_MAX = 60


def functions() -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """``(where, node)`` of every function and method of the package, nested ones included."""
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        where = path.relative_to(ROOT.parent).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((f"{where}:{node.lineno} {node.name}", node))
    return out


def test_the_functions_are_read():
    names = {node.name for _, node in functions()}
    assert {"__init__", "build_engine", "_collect"} <= names and len(names) > 300


def test_no_function_is_over_90_lines():
    long = [f"{where} ({node.end_lineno - node.lineno + 1} lines)" for where, node in functions()
            if node.end_lineno - node.lineno + 1 > FUNCTION_MAX]
    assert not long, f"functions over {FUNCTION_MAX} lines (split them into named steps): " + "; ".join(long)


def test_no_constructor_body_is_over_60_lines():
    long = [f"{where} ({node.end_lineno - node.body[0].lineno + 1} lines)" for where, node in functions()
            if node.name == "__init__" and node.end_lineno - node.body[0].lineno + 1 > INIT_BODY_MAX]
    assert not long, (f"constructor bodies over {INIT_BODY_MAX} lines (let the parts take their collaborators "
                      "in their constructors, or build them in named steps): " + "; ".join(long))

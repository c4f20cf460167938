"""Importing the user's own code: the module of ``--env module:EnvId`` and the
``module:callable`` of ``--policy`` and ``--policy-factory``.

``module`` is found in the current directory whether the command runs as ``aiocollect`` or as
``python -m aiocollect`` (``search_current_directory``), then on ``PYTHONPATH`` and among the
installed packages. A module that cannot be imported, or raises on import, and a callable that
raises, are each reported in one line (``UsageError``), never with a traceback.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from .errors import UsageError, one_line


def search_current_directory() -> None:
    """Let ``--env module:EnvId`` find ``module`` in the current directory, whichever way the
    command was started: ``python -m aiocollect`` has it first on ``sys.path`` (Python's rule
    for ``-m``), the ``aiocollect`` console script not at all (its ``sys.path[0]`` is the
    script's own directory), so it is appended here, after the installed packages, where it
    cannot hide a standard module. Worker processes take this ``sys.path``."""
    cwd = os.getcwd()
    if not any(entry in ("", ".") or os.path.abspath(entry) == cwd for entry in sys.path):
        sys.path.append(cwd)


def import_module(module: str, what: str) -> Any:
    """``module`` imported (the current directory searched too: ``search_current_directory``);
    an import that fails or raises is a ``UsageError`` in one line, starting with ``what``
    (the option and its value)."""
    import importlib

    search_current_directory()
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise UsageError(f"{what}: cannot import {module!r} ({exc}); it is looked for in the current "
                         "directory, on PYTHONPATH and among the installed packages") from None
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the module's own error, in one line
        raise UsageError(f"{what}: importing {module!r} raised {one_line(exc)}; fix the module "
                         f"(python -c 'import {module}' shows the traceback)") from None


def import_callable(flag: str, spec: str) -> Any:
    """The callable that ``module:name`` (``name`` may be dotted) names, imported as ``--env``'s module is."""

    module, _, name = spec.partition(":")
    if not module or not name:
        raise UsageError(f"{flag} {spec!r}: give module:callable, e.g. my_policies:make_actor")
    target = import_module(module, f"{flag} {spec!r}")
    for part in name.split("."):
        if not hasattr(target, part):
            raise UsageError(f"{flag} {spec!r}: {module!r} has no {name!r}; name a function or class of it "
                             "that returns the policy")
        target = getattr(target, part)
    if not callable(target):
        raise UsageError(f"{flag} {spec!r}: {name!r} is a {type(target).__name__}, not a callable; name a "
                         "function or class that returns the policy")
    return target


def call_factory(flag: str, spec: str) -> Any:
    """What the callable of ``module:callable`` returns, called with no arguments."""
    factory = import_callable(flag, spec)
    try:
        return factory()
    except Exception as exc:  # noqa: BLE001 - the user's code, in one line
        raise UsageError(f"{flag} {spec!r}: calling it raised {one_line(exc)}; it is called with no "
                         "arguments and must return the policy") from None

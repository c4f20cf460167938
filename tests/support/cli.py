"""The ``aiocollect`` command, as a subprocess (the console script) or in this process."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(sys.executable).parent / "aiocollect"


def run(*args: str, cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """``aiocollect ARGS``: the console script, in a subprocess."""
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def run_main(*args: str) -> subprocess.CompletedProcess:
    """``aiocollect ARGS`` in this process: ``aiocollect._cli.main``, which the console script
    calls; its return value (or ``SystemExit``) is the exit code, and what it prints to
    ``sys.stdout`` and ``sys.stderr`` comes back as they would from ``run``. A subprocess
    spends about 3 s importing what this process has imported already, so the cases that are
    about what the command checks and writes run here; the console script itself, its exit
    code and signals, in ``run``."""
    from aiocollect._cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = exc.code
    return subprocess.CompletedProcess(["aiocollect", *args], code, out.getvalue(), err.getvalue())

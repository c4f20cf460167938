"""``aiocollect bench``: the comparison benchmarks of a source checkout, run and charted.

``aiocollect bench`` runs the comparison benchmarks of a source checkout
(``benchmarks/*.py``), the engine's first (its headline: CartPole with an MLP policy that reads
the observation, against TorchRL), and prints their tables; with ``--results DIR`` it also keeps each
one's JSON in ``DIR`` and draws them side by side in ``DIR/benchmarks.png``
(``benchmarks/chart.py``, needs matplotlib). A script that needs a package not installed here
(``bench_weights.py`` jax, ``bench_ray.py`` ray) prints which and how to install it and is
skipped, which is no failure (exit code 0 if nothing else failed); one that fails shows the end
of its stderr. ``--quick`` figures are rough: no goal is judged on them.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from .errors import UsageError

BENCHMARKS = ("bench_engine.py", "bench_collect.py", "bench_workers.py", "bench_weights.py", "bench_coroutines.py",
              "bench_ray.py")
"""The benchmark scripts, in the order they run (``--only NAME`` picks ``bench_NAME.py``)."""

BENCH_MISSING_EXTRA = 3
"""A benchmark script's exit code when a package it needs is not installed
(``benchmarks/_common.py``'s ``MISSING_EXTRA``): the section is skipped, not failed."""

BENCHMARKS_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
"""``benchmarks/`` of the source checkout this package is in (absent from an installed wheel)."""


def run(args: argparse.Namespace) -> int:
    """Each chosen script run in turn (exit code 1 if one failed), then the chart of ``--results``."""
    root = BENCHMARKS_DIR
    if not (root / "bench_collect.py").exists():
        raise UsageError("aiocollect bench runs the benchmarks of a source checkout, and there is no "
                         f"benchmarks/ next to this installation ({root}); clone the repository and pip install -e .")
    chosen = [f"bench_{name}.py" for name in args.only] if args.only else list(BENCHMARKS)
    results = args.results.resolve() if args.results else None
    if results is not None:
        if results.exists() and not results.is_dir():
            raise UsageError(f"--results {args.results} is a file; give a directory for the JSON files and the chart.")
        results.mkdir(parents=True, exist_ok=True)
    if args.quick:
        print("--quick: one short run per row, to see that every row runs; its figures are rough, so no goal "
              "is judged (run without --quick to measure).", flush=True)
    code, skipped = 0, []
    for script in chosen:
        returncode = _run_script(root, script, args.quick, results)
        if returncode == BENCH_MISSING_EXTRA:  # (it printed what to install)
            skipped.append(script)
        elif returncode:
            code = 1
    if results is not None:
        code = subprocess.run([sys.executable, str(root / "chart.py"), str(results)], cwd=root).returncode or code
    if skipped:
        print(f"\nskipped, as a package they need is not installed (see each one's line above): {', '.join(skipped)}")
    return code


def _run_script(root: Path, script: str, quick: bool, results: Path | None) -> int:
    """One benchmark script, its tables on stdout; its exit code. Where it failed (not for a
    missing package), the end of its stderr is shown."""
    print(f"\n# {script}", flush=True)
    cmd = [sys.executable, str(root / script)] + (["--quick"] if quick else [])
    if results is not None:
        cmd += ["--json", str(results / f"{script[len('bench_'):-3]}.json")]
    # (stderr, each row's progress, into a file, shown only if the script fails: not a pipe, which a
    # process it leaves behind, such as one of Ray's, would hold open)
    with tempfile.TemporaryFile() as stderr:
        returncode = subprocess.run(cmd, cwd=root, stderr=stderr).returncode
        stderr.seek(0)
        lines = stderr.read().decode(errors="replace").rstrip().splitlines()
    if returncode and returncode != BENCH_MISSING_EXTRA:
        tail = "\n".join("    " + line for line in lines[-15:])
        print(f"{script} failed (exit code {returncode}); the end of its stderr:\n{tail}", flush=True)
    return returncode

"""What the benchmark scripts share: their command line and the description of the machine."""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing
import os
import platform
import sys

SMOKE_VAR = "AIOCOLLECT_BENCH_SMOKE"
"""Set (to anything but ``0``, ``false``, ``no``, ``off``), it turns ``--smoke`` on: how the
tests reach the scripts that ``aiocollect bench`` runs."""


def smoke_from_environment() -> bool:
    return os.environ.get(SMOKE_VAR, "").strip().lower() not in ("", "0", "false", "no", "off")


def add_smoke_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--smoke", action="store_true", default=smoke_from_environment(),
        help="the tests' run: every row and section of --quick, each measured as briefly as it can be, one run, "
             "TorchRL's worker processes forked, not spawned, on Linux (start-up is not timed; the engine "
             "benchmark's aiocollect workers start from the warm launcher); it checks that "
             f"the script runs and reports, its numbers mean little. {SMOKE_VAR}=1 in the environment does the same")


def start_smoke(args: argparse.Namespace, warm: bool = False) -> None:
    """``--smoke`` implies ``--quick``; on Linux, TorchRL's multi-process collectors then fork
    their workers (a spawned one imports torchrl: 10-20 s on a busy 2-core machine, untimed but
    most of a smoke run). Must run before a TorchRL collector starts (TorchRL takes the global
    start method where one is set). With ``warm``, aiocollect's workers start from the warm
    launcher (``AIOCOLLECT_WARM_START=1``, ``aiocollect._workers.launcher``): forked from one
    interpreter that imported them once, as the test suite's own collectors start (a fresh one
    costs 0.3 s of CPU, 1.8 s with a copy of a torch policy; the engine benchmark's smoke run
    starts about forty). Rows run in a subprocess inherit it; a value the caller set is kept.
    (Not for a script that checks that no child process outlives its collectors: the launcher
    does, by design.)"""
    if args.smoke:
        args.quick = True
        if warm:
            os.environ.setdefault("AIOCOLLECT_WARM_START", "1")
        if sys.platform.startswith("linux"):
            multiprocessing.set_start_method("fork", force=True)


def parse_args(argv: list[str] | None, description: str, quick_help: str) -> argparse.Namespace:
    """``--quick``, ``--smoke`` (see ``start_smoke``), ``--repeats`` (default 3, or 1 with
    ``--quick``) and ``--json PATH``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    add_smoke_argument(parser)
    parser.add_argument("--repeats", type=int, default=None, help="runs per measurement (default 3; 1 with --quick)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    args = parser.parse_args(argv)
    start_smoke(args)
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


def _version(module: str) -> str | None:
    if importlib.util.find_spec(module) is None:
        return None
    try:
        return getattr(importlib.import_module(module), "__version__", None)
    except ImportError:  # (found, but broken or hidden: not installed, as far as the tables go)
        return None


def environment() -> dict:
    """Versions, cores, load and torch threads: printed above each table and kept in the JSON."""
    import gymnasium
    import numpy
    import tensordict
    import torch

    import aiocollect

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan"),
        "torch": torch.__version__,
        "torch_num_threads": torch.get_num_threads(),
        "tensordict": tensordict.__version__,
        "torchrl": _version("torchrl"),
        "gymnasium": gymnasium.__version__,
        "numpy": numpy.__version__,
        "uvloop": _version("uvloop"),
        "aiocollect": aiocollect.__version__,
    }


MISSING_EXTRA = 3
"""The exit code of a script that cannot run here because a package it needs is not installed
(``require``): ``aiocollect bench`` reports that section as skipped, with what to install, and
it is not a failure."""

INSTALL = {
    "jax": "pip install -e '.[jax]'",
    "ray": "pip install -e '.[ray]'",
    "torchrl": "pip install -e '.[dev]' (the dev extra has it), or pip install torchrl",
}
"""How to install each optional package a benchmark uses, in a checkout (as README.md says)."""


def missing(module: str) -> str:
    """One line saying that ``module`` is not installed and how to install it."""
    return f"{module} is not installed here: {INSTALL[module]}"


def require(module: str, what: str) -> None:
    """Import ``module``, or print which extra ``what`` needs and exit with ``MISSING_EXTRA``."""
    try:
        importlib.import_module(module)
    except ImportError:
        print(f"skipped: {what} needs {module}, which is not installed here: {INSTALL[module]}", flush=True)
        sys.exit(MISSING_EXTRA)


def torchrl_note(have_torchrl: bool) -> str | None:
    """Under a table with TorchRL columns: why they read n/a, where torchrl is not installed."""
    return None if have_torchrl else f"TorchRL's rows and ratios are n/a: {missing('torchrl')}"


def verdict(value: float, goal: float, quick: bool, higher_is_better: bool = True) -> str:
    """``goal >= 0.8  ok`` (or ``MISSED``) after a measured ratio; after a ``--quick`` run's rough
    figure, the goal alone, unjudged: milliseconds of timing cannot pass or fail it."""
    text = f"goal {'>=' if higher_is_better else '<='} {goal:g}"
    if quick:
        return f"{text}  (not judged: --quick figures are rough)"
    ok = value >= goal if higher_is_better else value <= goal
    return f"{text}  {'ok' if ok else 'MISSED'}"


QUICK_WARNING = ("--quick: a smoke run. Each row was timed for milliseconds, so its figures are rough "
                 "(one busy moment can halve a row): run without --quick to measure.")


def finish(results: dict, args: argparse.Namespace) -> int:
    """The last lines every run ends with: the machine's load, a warning under a ``--quick``
    run's figures (timed over milliseconds, so one busy moment can halve a row), and the
    JSON file if asked."""
    import json

    print(f"load average {os.getloadavg()[0]:.2f}")
    if args.quick:
        print(QUICK_WARNING)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


def envpool_cartpole(num_envs: int = 16, num_threads: int = 1, batch_size: int | None = None):
    """EnvPool's CartPole-v1 (C++ envs, its own threads) as a gymnasium ``VectorEnv``; its spaces'
    float64 bounds make gymnasium warn as they are built, silenced here. (Here, not in a script:
    a worker process unpickles this factory by importing this light module.)"""
    import warnings

    import envpool

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return envpool.make_gymnasium("CartPole-v1", num_envs=num_envs, num_threads=num_threads,
                                      batch_size=batch_size or num_envs)

"""The ``aiocollect`` command.

``aiocollect collect --env CartPole-v1 --workers 2 --frames 20000 --out DIR`` collects with
random actions and a progress bar, saves every frame under ``DIR`` as a memory-mapped
TensorDict (``TensorDict.load_memmap(DIR)`` reads it back: ``[workers, envs, time]``, or
``[envs, time]`` with ``--workers 0``), and prints a summary.

``aiocollect bench`` runs the comparison benchmarks of a source checkout
(``benchmarks/*.py``) and prints their tables; with ``--results DIR`` it also keeps each
one's JSON in ``DIR`` and draws them side by side in ``DIR/benchmarks.png``
(``benchmarks/chart.py``, needs matplotlib).

A bad env id or option ends the command with one line on stderr and exit code 2, never a
traceback.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import time
from pathlib import Path

BENCHMARKS = ("bench_collect.py", "bench_workers.py", "bench_engine.py", "bench_weights.py", "bench_coroutines.py",
              "bench_ray.py")


class UsageError(Exception):
    """A mistake of the user's: reported in one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage dump
        print(f"aiocollect: error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="aiocollect", description="Fast RL experience collection.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    c = sub.add_parser("collect", help="collect from a gymnasium env with random actions and save the frames")
    c.add_argument("--env", required=True,
                   help="a gymnasium env id, e.g. CartPole-v1 (or module:EnvId, importing module first)")
    c.add_argument("--workers", type=int, default=2, help="env worker processes (0: envs in this process)")
    c.add_argument("--envs-per-worker", type=int, default=8, help="envs stepped by each worker")
    c.add_argument("--frames", type=int, default=20_000, help="frames to collect (rounded up to whole batches)")
    c.add_argument("--frames-per-batch", type=int, default=None,
                   help="frames per batch (default: 100 steps of every env)")
    c.add_argument("--max-frames-per-traj", type=int, default=None, help="truncate episodes after this many steps")
    c.add_argument("--seed", type=int, default=0, help="env k is seeded with seed + k")
    c.add_argument("--out", required=True, help="directory for the memory-mapped TensorDict")
    c.add_argument("--overwrite", action="store_true", help="replace what is in --out")
    b = sub.add_parser("bench", help="run the comparison benchmarks of a source checkout")
    b.add_argument("--quick", action="store_true", help="smoke runs (seconds each) instead of full runs")
    b.add_argument("--only", choices=[name[len("bench_"):-3] for name in BENCHMARKS], action="append",
                   help="run only this benchmark (repeatable)")
    b.add_argument("--results", metavar="DIR", type=Path,
                   help="keep the results as DIR/NAME.json and draw the chart DIR/benchmarks.png")
    return parser


def _check_collect(args: argparse.Namespace) -> Path:
    """Every mistake of the command line, found before anything is collected; returns ``--out``."""
    import importlib

    import gymnasium as gym

    module, _, env_id = args.env.rpartition(":")  # "package.module:Env-v0" registers its envs on import
    try:
        if module:
            importlib.import_module(module)
        gym.spec(env_id)
    except ImportError as exc:
        raise UsageError(f"--env {args.env!r}: cannot import {module!r} ({exc})") from None
    except gym.error.Error as exc:
        raise UsageError(f"--env {args.env!r}: not a registered gymnasium env ({exc}); e.g. CartPole-v1") from None
    try:
        gym.make(args.env).close()
    except Exception as exc:  # noqa: BLE001 - a registered env that cannot be built here (a missing dependency...)
        raise UsageError(f"--env {args.env!r} cannot be built here: {type(exc).__name__}: {exc}") from None
    if args.workers < 0:
        raise UsageError(f"--workers must be >= 0, got {args.workers}")
    for name in ("envs_per_worker", "frames", "frames_per_batch", "max_frames_per_traj"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: is a file; give a directory (new, empty, or saved by aiocollect collect)")
    if out.exists() and any(out.iterdir()):
        if not args.overwrite:
            raise UsageError(f"--out {out}: exists and is not an empty directory; pick another or pass --overwrite")
        if not (out / "meta.json").exists():
            raise UsageError(f"--out {out}: --overwrite replaces only a directory that aiocollect collect "
                             "saved (it has a meta.json); this one holds something else")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".aiocollect-write-test"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot write there ({exc.strerror or exc})") from None
    return out


def collect(args: argparse.Namespace) -> int:
    out = _check_collect(args)
    import shutil

    import gymnasium as gym

    from . import Collector, MultiSyncCollector

    env_id = args.env

    def make_env():
        return gym.make(env_id)

    num_envs = args.envs_per_worker * max(args.workers, 1)
    fpb = args.frames_per_batch or num_envs * 100
    if fpb % num_envs:
        raise UsageError(f"--frames-per-batch {fpb} does not split over {num_envs} envs; use a multiple of {num_envs}")
    num_batches = math.ceil(args.frames / fpb)
    options = {"frames_per_batch": fpb, "total_frames": num_batches * fpb,
               "max_frames_per_traj": args.max_frames_per_traj, "progress": True}
    try:
        if args.workers == 0:
            collector = Collector([make_env] * args.envs_per_worker, None, **options)
        else:
            collector = MultiSyncCollector([[make_env] * args.envs_per_worker] * args.workers, None, **options)
    except (ValueError, TypeError) as exc:
        raise UsageError(str(exc)) from None
    with collector:
        collector.set_seed(args.seed)
        start = time.perf_counter()
        saved = None
        for i, batch in enumerate(collector):
            if saved is None:  # the whole file, laid out on disk once: each batch is written and let go
                steps = batch.shape[-1]
                shutil.rmtree(out)
                saved = batch[..., :1].expand(*batch.shape[:-1], steps * num_batches).memmap_like(prefix=str(out))
            saved[..., i * steps:(i + 1) * steps] = batch
        elapsed = time.perf_counter() - start
        stats = collector.statistics()
    mean = stats.mean_episode_return
    print(f"collected {stats.frames:,} frames of {env_id} from {num_envs} envs "
          f"({args.workers} worker process{'es' if args.workers != 1 else ''}) in {elapsed:.2f} s: "
          f"{stats.frames / elapsed:,.0f} frames/s")
    last = f", mean return of the last {min(stats.completed_trajectories, 100)}: {mean:.2f}" if mean is not None else ""
    print(f"{stats.completed_trajectories:,} episodes finished{last}")
    print(f"saved {tuple(saved.shape)} to {out} (TensorDict.load_memmap({str(out)!r}))")
    return 0


def bench(args: argparse.Namespace) -> int:
    root = Path(__file__).resolve().parents[1] / "benchmarks"
    if not (root / "bench_collect.py").exists():
        raise UsageError("aiocollect bench runs the benchmarks of a source checkout, and there is no "
                         f"benchmarks/ next to this installation ({root}); clone the repository and pip install -e .")
    chosen = [f"bench_{name}.py" for name in args.only] if args.only else list(BENCHMARKS)
    results = args.results.resolve() if args.results else None
    if results is not None:
        if results.exists() and not results.is_dir():
            raise UsageError(f"--results {args.results} is a file; give a directory for the JSON files and the chart.")
        results.mkdir(parents=True, exist_ok=True)
    code = 0
    for script in chosen:
        print(f"\n# {script}", flush=True)
        cmd = [sys.executable, str(root / script)] + (["--quick"] if args.quick else [])
        if results is not None:
            cmd += ["--json", str(results / f"{script[len('bench_'):-3]}.json")]
        code = subprocess.run(cmd, cwd=root, stderr=subprocess.DEVNULL).returncode or code
    if results is not None:
        code = subprocess.run([sys.executable, str(root / "chart.py"), str(results)], cwd=root).returncode or code
    return code


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return collect(args) if args.command == "collect" else bench(args)
    except UsageError as exc:
        print(f"aiocollect: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("aiocollect: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

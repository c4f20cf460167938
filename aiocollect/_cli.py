"""The ``aiocollect`` command.

``aiocollect collect --env CartPole-v1 --workers 2 --frames 20000 --out DIR`` collects with
random actions and a progress bar, saves every frame under ``DIR`` as a memory-mapped
TensorDict (``TensorDict.load_memmap(DIR)`` reads it back: ``[workers, envs, time]``, or
``[envs, time]`` with ``--workers 0``), and prints a summary. The save is written beside
``DIR`` and renamed to it once complete, so ``DIR`` is never half-written, and ``--overwrite``
replaces only an earlier save that its ``aiocollect.json`` proves to be one (see ``_dataset``).

``aiocollect bench`` runs the comparison benchmarks of a source checkout
(``benchmarks/*.py``) and prints their tables; with ``--results DIR`` it also keeps each
one's JSON in ``DIR`` and draws them side by side in ``DIR/benchmarks.png``
(``benchmarks/chart.py``, needs matplotlib).

A bad env id or option, an env module (``--env module:EnvId``) that cannot be imported or raises
on import, an ``--out`` that cannot safely be written, or a size that cannot fit (``--frames`` on
the disk, ``--frames-per-batch`` in memory) ends the command before any worker starts, with one
line on stderr and exit code 2, never a traceback.

``--env module:EnvId`` finds ``module`` in the current directory whether the command runs as
``aiocollect`` or as ``python -m aiocollect`` (``_search_current_directory``).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
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
                   help="a gymnasium env id, e.g. CartPole-v1 (or module:EnvId, importing module first: "
                        "from the current directory, PYTHONPATH or the installed packages)")
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


@dataclass(frozen=True)
class _Plan:
    """What ``aiocollect collect`` will do, worked out and checked before anything starts."""

    target: Path
    """``--out``, resolved: where the save is renamed to once it is complete."""
    num_envs: int
    frames_per_batch: int
    num_batches: int


def _size(nbytes: float) -> str:
    for unit in ("bytes", "kB", "MB", "GB", "TB", "PB"):
        if nbytes < 1000 or unit == "PB":
            return f"{nbytes:,.0f} {unit}" if unit == "bytes" else f"{nbytes:,.1f} {unit}"
        nbytes /= 1000
    raise AssertionError  # unreachable


def _free_disk(path: Path) -> int:
    """Free bytes on the disk that holds ``path`` (or would: its nearest existing ancestor)."""
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def _check_env(args: argparse.Namespace) -> None:
    import importlib

    import gymnasium as gym

    module, _, env_id = args.env.rpartition(":")  # "package.module:Env-v0" registers its envs on import
    if module:
        _search_current_directory()
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise UsageError(f"--env {args.env!r}: cannot import {module!r} ({exc}); it is looked for in the "
                             "current directory, on PYTHONPATH and among the installed packages") from None
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the module's own error, in one line
            raise UsageError(f"--env {args.env!r}: importing {module!r} raised {_one_line(exc)}; fix the module "
                             f"(python -c 'import {module}' shows the traceback)") from None
    try:
        gym.spec(env_id)
    except gym.error.Error as exc:
        raise UsageError(f"--env {args.env!r}: not a registered gymnasium env ({exc}); e.g. CartPole-v1") from None
    try:
        gym.make(args.env).close()
    except Exception as exc:  # noqa: BLE001 - a registered env that cannot be built here (a missing dependency...)
        raise UsageError(f"--env {args.env!r} cannot be built here: {type(exc).__name__}: {exc}") from None


def _search_current_directory() -> None:
    """Let ``--env module:EnvId`` find ``module`` in the current directory, whichever way the
    command was started: ``python -m aiocollect`` has it first on ``sys.path`` (Python's rule
    for ``-m``), the ``aiocollect`` console script not at all (its ``sys.path[0]`` is the
    script's own directory), so it is appended here, after the installed packages, where it
    cannot hide a standard module. Worker processes take this ``sys.path``."""
    cwd = os.getcwd()
    if not any(entry in ("", ".") or os.path.abspath(entry) == cwd for entry in sys.path):
        sys.path.append(cwd)


def _one_line(exc: BaseException) -> str:
    """``TYPE: message`` of ``exc`` on one line (a ``SyntaxError`` with its file and line)."""
    if isinstance(exc, SyntaxError):
        text = f"{exc.msg} ({exc.filename}, line {exc.lineno})"
    else:
        text = str(exc)
    text = " ".join(text.split())
    text = text if len(text) <= 300 else f"{text[:300]}..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _check_out(args: argparse.Namespace) -> Path:
    """``--out`` resolved, once it is sure that writing there loses nothing (see ``_dataset``)."""
    from ._dataset import NotASave, check_replaceable

    given = Path(args.out)
    if given.is_symlink():
        raise UsageError(f"--out {args.out}: is a symbolic link (to {os.readlink(given)}); aiocollect collect "
                         "replaces --out by renaming a new directory onto it, so give a real path: the "
                         "directory the link points to, or a new one")
    target = given.resolve()
    cwd = Path.cwd().resolve()
    if target == cwd or target in cwd.parents:
        which = "the current directory" if target == cwd else "a directory that holds the current directory"
        raise UsageError(f"--out {args.out}: is {which}; the save goes into a directory of its own, "
                         f"e.g. --out {Path(args.out) / 'frames'}")
    if target.exists() and not target.is_dir():
        raise UsageError(f"--out {args.out}: is a file; give a directory (new, empty, or saved by aiocollect collect)")
    if target.is_dir() and any(target.iterdir()):
        if not args.overwrite:
            raise UsageError(f"--out {args.out}: exists and is not an empty directory; pick another or pass "
                             "--overwrite (which replaces only an earlier save of aiocollect collect)")
        try:
            check_replaceable(target)
        except NotASave as exc:
            raise UsageError(f"--out {args.out}: --overwrite replaces only a directory that aiocollect collect "
                             f"saved, and {exc}; delete it yourself if you mean to, or pick another --out") from None
    if target.is_dir() and target.stat().st_dev != target.parent.stat().st_dev:
        raise UsageError(f"--out {args.out}: is a mount point, and the save is renamed into place from beside it; "
                         f"give a new directory inside it, e.g. --out {Path(args.out) / 'frames'}")
    return target


def _frame_bytes(args: argparse.Namespace) -> int:
    """Bytes one frame takes in the save: one frame of one env, collected in this process."""
    import gymnasium as gym

    from ._collectors.collector import Collector

    env_id = args.env
    try:
        with Collector([lambda: gym.make(env_id)], None, frames_per_batch=1, total_frames=1,
                       max_frames_per_traj=args.max_frames_per_traj) as probe:
            batch = next(iter(probe))
    except Exception as exc:  # noqa: BLE001 - the env builds but cannot step here
        raise UsageError(f"--env {args.env!r}: one step of it failed here: {type(exc).__name__}: {exc}") from None
    return batch.bytes() // batch.numel()


def _check_collect(args: argparse.Namespace) -> _Plan:
    """Every mistake of the command line, found before any worker starts or anything is written."""
    _check_env(args)
    if args.workers < 0:
        raise UsageError(f"--workers must be >= 0, got {args.workers}")
    for name in ("envs_per_worker", "frames", "frames_per_batch", "max_frames_per_traj"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    target = _check_out(args)
    num_envs = args.envs_per_worker * max(args.workers, 1)
    fpb = args.frames_per_batch or num_envs * 100
    if fpb % num_envs:
        raise UsageError(f"--frames-per-batch {fpb} does not split over {num_envs} envs; use a multiple of {num_envs}")
    num_batches = math.ceil(args.frames / fpb)
    frame_bytes = _frame_bytes(args)
    # Sizes are checked here, as Python ints: a typo of a few zeros must not start workers that
    # then fail to allocate, or fill the disk (a memory-mapped file that cannot grow kills the process).
    from ._workers.shm import available_memory

    batch_bytes, memory = fpb * frame_bytes, available_memory()
    if memory is not None and 3 * batch_bytes > memory:
        if args.frames_per_batch:
            flag, fix = f"--frames-per-batch {args.frames_per_batch}", "use a smaller --frames-per-batch"
        else:
            flag = (f"--envs-per-worker {args.envs_per_worker} (a default batch is 100 steps of each of "
                    f"{num_envs:,} envs)")
            fix = "use fewer envs, or a smaller --frames-per-batch"
        raise UsageError(f"{flag}: a batch of {fpb:,} frames takes {_size(batch_bytes)} ({frame_bytes} bytes a frame) "
                         f"and the collector holds about three, with {_size(memory)} of memory available; {fix}")
    save_bytes, free = num_batches * batch_bytes, _free_disk(target.parent)
    if save_bytes > free:
        raise UsageError(f"--frames {args.frames}: the save of {num_batches * fpb:,} frames takes {_size(save_bytes)} "
                         f"({frame_bytes} bytes a frame) and the disk of {target.parent} has {_size(free)} free; "
                         "collect fewer frames, or give an --out on a bigger disk")
    return _Plan(target, num_envs, fpb, num_batches)


def collect(args: argparse.Namespace) -> int:
    plan = _check_collect(args)
    import gymnasium as gym

    from ._collectors.collector import Collector
    from ._collectors.multi_sync import MultiSyncCollector
    from ._dataset import CommitError, PartialSave, leftovers

    env_id = args.env

    def make_env():
        return gym.make(env_id)

    for path in leftovers(plan.target):
        if ".replaced-" in path.name:  # killed between the two renames of a replacement
            print(f"aiocollect: note: {path} is the previous save of {plan.target}, set aside by a run that was "
                  f"killed while replacing it; if {plan.target} is missing, move it back: mv {path} {plan.target}",
                  file=sys.stderr)
        else:
            print(f"aiocollect: note: {path} is left from a run of aiocollect collect that was killed (or is still "
                  "running); it is not a save: rm -r it once no run uses it", file=sys.stderr)
    steps = plan.frames_per_batch // plan.num_envs
    try:
        save = PartialSave(plan.target, steps * plan.num_batches,
                           {"env": env_id, "frames": plan.num_batches * plan.frames_per_batch, "seed": args.seed})
    except OSError as exc:
        raise UsageError(f"--out {args.out}: cannot write there ({exc.strerror or exc})") from None
    options = {"frames_per_batch": plan.frames_per_batch, "total_frames": plan.num_batches * plan.frames_per_batch,
               "max_frames_per_traj": args.max_frames_per_traj, "progress": True}
    try:
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
            for i, batch in enumerate(collector):
                save.write(batch, i * steps)
            elapsed = time.perf_counter() - start
            stats = collector.statistics()
    except BaseException:  # Ctrl-C included: no half-written save is left behind
        save.discard()
        raise
    shape = save.shape
    try:
        save.commit()
    except CommitError as exc:
        print(f"aiocollect: error: {exc}", file=sys.stderr)
        return 1
    except BaseException:  # Ctrl-C while the record is written: the frames never reached --out
        save.discard()
        raise
    mean = stats.mean_episode_return
    print(f"collected {stats.frames:,} frames of {env_id} from {plan.num_envs} envs "
          f"({args.workers} worker process{'es' if args.workers != 1 else ''}) in {elapsed:.2f} s: "
          f"{stats.frames / elapsed:,.0f} frames/s")
    last = f", mean return of the last {min(stats.completed_trajectories, 100)}: {mean:.2f}" if mean is not None else ""
    print(f"{stats.completed_trajectories:,} episodes finished{last}")
    print(f"saved {shape} to {Path(args.out)} (TensorDict.load_memmap({str(Path(args.out))!r}))")
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

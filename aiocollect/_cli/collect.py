"""``aiocollect collect``: collect from a gymnasium env, save every frame, print an evaluation.

``aiocollect collect --env CartPole-v1 --workers 2 --frames 20000 --out DIR`` collects with
random actions, or with a trained ``--policy`` (a TorchScript file, a ``torch.export``
program, a state dict with ``--policy-factory module:callable``, or ``module:callable``:
``policy_loading``), with a progress bar, saves every frame under ``DIR`` as a memory-mapped
TensorDict (``TensorDict.load_memmap(DIR)`` reads it back: ``[workers, envs, time]``, or
``[envs, time]`` with ``--workers 0``), and prints a summary: the frames asked and collected,
frames/s on the progress bar's clock (from the first batch asked for to the last; the
start-up before it is reported apart), and an evaluation of the episodes that finished
(return mean and std, lengths: ``episodes``). The save is written beside ``DIR`` and renamed
to it once complete, so ``DIR`` is never half-written, and ``--overwrite`` replaces only an
earlier save that its ``aiocollect.json`` proves to be one (``out_dir``, ``_dataset``).

Everything the command line can get wrong is found by ``check_collect`` before any worker
starts or anything is written (see ``errors``).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .env_loading import check_env, env_factory, env_kwargs
from .episodes import Episodes
from .errors import UsageError
from .out_dir import check_out
from .policy_loading import load_policy
from .policy_options import policy_device, set_policy_threads
from .probes import check_policy_acts, frame_bytes
from .sizes import batch_too_big, free_disk, readable_size


@dataclass(frozen=True)
class Plan:
    """What ``aiocollect collect`` will do, worked out and checked before anything starts."""

    target: Path
    """``--out``, resolved: where the save is renamed to once it is complete."""
    num_envs: int
    frames_per_batch: int
    num_batches: int
    policy: Any
    """What ``--policy`` loaded (``None``: random actions)."""
    policy_what: str
    """The policy, in words, for the summary and the save's record."""
    policy_device: Any


@dataclass(frozen=True)
class _Collected:
    """What a run collected, for the summary."""

    frames: int
    elapsed: float
    """Seconds on the progress bar's clock: from the first batch asked for to the last."""
    startup: float
    """Seconds from building the collector to asking for its first batch."""
    episodes: Episodes


def run(args: argparse.Namespace) -> int:
    """``aiocollect collect``: checked (``check_collect``), collected into a save beside ``--out``
    that is renamed to it once complete (discarded on any error, Ctrl-C included), then summed up.
    Exit code 0, or 1 where the save could not be put in place."""
    plan = check_collect(args)
    from .._dataset import CommitError

    _note_leftovers(plan.target)
    save = _start_save(args, plan)
    try:
        collected = _collect_into(save, args, plan)
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
    _print_summary(args, plan, collected, shape)
    return 0


def check_collect(args: argparse.Namespace) -> Plan:
    """Every mistake of the command line, found before any worker starts or anything is written."""
    check_env(args)
    _check_numbers(args)
    target = check_out(args)
    set_policy_threads(args)
    policy, what = load_policy(args)
    device = policy_device(args)
    num_envs = args.envs_per_worker * max(args.workers, 1)
    fpb = args.frames_per_batch or num_envs * 100
    if fpb % num_envs:
        raise UsageError(f"--frames-per-batch {fpb} does not split over {num_envs} envs; use a multiple of {num_envs}")
    num_batches = math.ceil(args.frames / fpb)
    size = frame_bytes(args)  # (the env alone first: an env that cannot step is not the policy's fault)
    if policy is not None:
        check_policy_acts(args, policy, device, what)
        size = frame_bytes(args, policy, device)
    plan = Plan(target, num_envs, fpb, num_batches, policy, what, device)
    _check_sizes(args, plan, size)
    return plan


def _check_numbers(args: argparse.Namespace) -> None:
    """The counts are positive, and every env's seed (``--seed`` + k) a 64-bit int."""
    if args.workers < 0:
        raise UsageError(f"--workers must be >= 0, got {args.workers}")
    for name in ("envs_per_worker", "frames", "frames_per_batch", "max_frames_per_traj"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    top = 2**63 - 1 - args.envs_per_worker * max(args.workers, 1)  # (env k is seeded with seed + k)
    if not 0 <= args.seed <= top:
        raise UsageError(f"--seed must be in 0..{top} (env k is seeded with seed + k), got {args.seed}")


def _check_sizes(args: argparse.Namespace, plan: Plan, frame_bytes: int) -> None:
    """A batch fits three times in memory, and the save on the disk of ``--out`` (see ``sizes``)."""
    from .._workers.shm import available_memory

    batch_bytes, memory = plan.frames_per_batch * frame_bytes, available_memory()
    if memory is not None and 3 * batch_bytes > memory:
        if args.frames_per_batch:
            flag, fix = f"--frames-per-batch {args.frames_per_batch}", "use a smaller --frames-per-batch"
        else:
            flag = (f"--envs-per-worker {args.envs_per_worker} (a default batch is 100 steps of each of "
                    f"{plan.num_envs:,} envs)")
            fix = "use fewer envs, or a smaller --frames-per-batch"
        raise batch_too_big(flag, plan.frames_per_batch, frame_bytes, memory, fix)
    save_bytes, free = plan.num_batches * batch_bytes, free_disk(plan.target.parent)
    if save_bytes > free:
        raise UsageError(f"--frames {args.frames}: the save of {plan.num_batches * plan.frames_per_batch:,} frames "
                         f"takes {readable_size(save_bytes)} ({frame_bytes} bytes a frame) and the disk of "
                         f"{plan.target.parent} has {readable_size(free)} free; collect fewer frames, or give an "
                         "--out on a bigger disk")


def _note_leftovers(target: Path) -> None:
    """A note on stderr for each directory that a killed run left beside ``target``."""
    from .._dataset import leftovers

    for path in leftovers(target):
        if ".replaced-" in path.name:  # killed between the two renames of a replacement
            print(f"aiocollect: note: {path} is the previous save of {target}, set aside by a run that was "
                  f"killed while replacing it; if {target} is missing, move it back: mv {path} {target}",
                  file=sys.stderr)
        else:
            print(f"aiocollect: note: {path} is left from a run of aiocollect collect that was killed (or is still "
                  "running); it is not a save: rm -r it once no run uses it", file=sys.stderr)


def _start_save(args: argparse.Namespace, plan: Plan) -> Any:
    """The ``PartialSave`` beside ``--out``, with the record of what it holds (env, frames, seed,
    ``--env-kwargs`` and the policy where given)."""
    from .._dataset import PartialSave

    steps = plan.frames_per_batch // plan.num_envs
    about = {"env": args.env, "frames": plan.num_batches * plan.frames_per_batch, "seed": args.seed}
    if args.env_kwargs is not None:
        about["env_kwargs"] = env_kwargs(args)
    if plan.policy is not None:
        about["policy"] = plan.policy_what
    try:
        return PartialSave(plan.target, steps * plan.num_batches, about)
    except OSError as exc:
        raise UsageError(f"--out {args.out}: cannot write there ({exc.strerror or exc})") from None


def _build_collector(args: argparse.Namespace, plan: Plan) -> Any:
    """A ``Collector`` of ``--envs-per-worker`` envs (``--workers 0``), else a ``MultiSyncCollector``
    of ``--workers`` workers of them each; what they refuse is a ``UsageError``."""
    from .._collectors.collector import Collector
    from .._collectors.multi_sync import MultiSyncCollector

    make_env = env_factory(args)
    options = {"frames_per_batch": plan.frames_per_batch, "total_frames": plan.num_batches * plan.frames_per_batch,
               "max_frames_per_traj": args.max_frames_per_traj, "policy_device": plan.policy_device}
    try:
        if args.workers == 0:
            return Collector([make_env] * args.envs_per_worker, plan.policy, **options)
        return MultiSyncCollector([[make_env] * args.envs_per_worker] * args.workers, plan.policy, **options)
    except (ValueError, TypeError) as exc:
        raise UsageError(str(exc)) from None


def _collect_into(save: Any, args: argparse.Namespace, plan: Plan) -> _Collected:
    """Every batch written into ``save`` and added to the evaluation, under a progress bar."""
    from tqdm.auto import tqdm

    steps = plan.frames_per_batch // plan.num_envs
    episodes = Episodes()
    built = time.perf_counter()
    collector = _build_collector(args, plan)
    with collector:
        collector.set_seed(args.seed)
        # One clock for the bar and the summary, the bar's: it starts when the first batch is
        # asked for (the workers are up), and with smoothing=0 its rate is frames / elapsed.
        startup = time.perf_counter() - built
        bar = tqdm(total=plan.num_batches * plan.frames_per_batch, unit="frames", unit_scale=True,
                   desc=type(collector).__name__, dynamic_ncols=True, smoothing=0)
        try:
            for i, batch in enumerate(collector):
                save.write(batch, i * steps)
                episodes.add(batch)
                if episodes.returns:
                    bar.set_postfix(episode_return=f"{episodes.mean:.1f}", episodes=len(episodes.returns),
                                    refresh=False)
                bar.update(batch.numel())
            elapsed = bar.format_dict["elapsed"]
        finally:
            bar.close()
        frames = collector.statistics().frames
    return _Collected(frames, elapsed, startup, episodes)


def _print_summary(args: argparse.Namespace, plan: Plan, collected: _Collected, shape: Any) -> None:
    """What was collected, how fast, with what policy, the evaluation, and where it was saved."""
    frames, elapsed = collected.frames, collected.elapsed
    print(f"collected {frames:,} frames of {args.env} from {plan.num_envs} envs "
          f"({args.workers} worker process{'es' if args.workers != 1 else ''}) in {elapsed:.2f} s: "
          f"{frames / elapsed:,.0f} frames/s (the progress bar's clock, from the first batch asked for; "
          f"the {collected.startup:.2f} s of start-up before it not counted)")
    print(frames_line(args, plan))
    print(f"policy: {plan.policy_what}" + (f", on {plan.policy_device}" if plan.policy_device is not None else ""))
    for line in collected.episodes.summary():
        print(line)
    print(f"saved {shape} to {Path(args.out)} (TensorDict.load_memmap({str(Path(args.out))!r}))")


def frames_line(args: argparse.Namespace, plan: Plan) -> str:
    """The frames asked for and collected: why they differ, when they do."""
    collected = plan.num_batches * plan.frames_per_batch
    if collected == args.frames:
        return f"frames: {collected:,} collected, as asked"
    steps = plan.frames_per_batch // plan.num_envs
    size = ("--frames-per-batch" if args.frames_per_batch else
            f"{steps} steps of each of {plan.num_envs} envs; --frames-per-batch sets it")
    return (f"frames: {collected:,} collected, {args.frames:,} asked: rounded up to {plan.num_batches:,} whole "
            f"batch{'es' if plan.num_batches != 1 else ''} of {plan.frames_per_batch:,} frames ({size})")

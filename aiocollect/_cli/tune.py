"""``aiocollect tune``: which split of workers x envs per worker collects fastest here.

``aiocollect tune --env ID [--policy ...]`` measures a few splits of workers x envs per worker
on this machine (``aiocollect._tune.tune``, with the env and the policy of the command line,
loaded and checked as ``aiocollect collect`` does) and prints the table, the best, and the
``aiocollect collect`` command to use, its policy options included.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from .env_loading import check_env, env_kwargs
from .errors import UsageError
from .policy_loading import load_policy
from .policy_options import policy_device, set_policy_threads
from .probes import check_policy_acts, frame_bytes
from .sizes import batch_too_big


def run(args: argparse.Namespace) -> int:
    """``aiocollect tune``: ``_tune.tune`` on the env and policy of the command line, with the
    ``aiocollect collect`` command of the best split, its policy options included."""
    import dataclasses

    from .._tune import tune as measure

    check_env(args)
    _check_numbers(args)
    set_policy_threads(args)
    policy, what = load_policy(args)
    device = policy_device(args)
    _check_probes(args, policy, device, what)
    try:
        result = measure(args.env, policy, env_kwargs=env_kwargs(args), workers=args.workers,
                         envs_per_worker=args.envs_per_worker or (8, 32), frames_per_batch=args.frames_per_batch,
                         seconds=args.seconds, policy_device=device, progress=True)
    except ValueError as exc:
        raise UsageError(str(exc).removeprefix("tune: ")) from None
    print(dataclasses.replace(result, policy=what, command=collect_command(args, result.best),
                              seconds_flag="--seconds "))
    return 0


def _check_numbers(args: argparse.Namespace) -> None:
    """``--workers``, ``--envs-per-worker``, ``--frames-per-batch`` and ``--seconds`` in range."""
    for name in ("workers", "envs_per_worker"):
        values = getattr(args, name)
        low = 0 if name == "workers" else 1
        if values is not None and min(values) < low:
            raise UsageError(f"--{name.replace('_', '-')} must be >= {low}, got {min(values)}")
    if args.frames_per_batch is not None and args.frames_per_batch < 1:
        raise UsageError(f"--frames-per-batch must be >= 1, got {args.frames_per_batch}")
    if not (args.seconds > 0 and math.isfinite(args.seconds)):  # (nan, inf: a measurement that never ends)
        raise UsageError(f"--seconds must be > 0 and finite, got {args.seconds:g}; give about how long to measure, "
                         "e.g. --seconds 30 (the default)")


def _check_probes(args: argparse.Namespace, policy: Any, device: Any, what: str) -> None:
    """One step of the env, then of the policy, here; and a batch of each ``--envs-per-worker``
    fits three times in memory (a typo of a few zeros must not start workers that cannot allocate)."""
    from .._workers.shm import available_memory

    size = frame_bytes(args)  # (the env alone first: an env that cannot step is not the policy's fault)
    if policy is not None:
        check_policy_acts(args, policy, device, what)
    memory = available_memory()
    if policy is not None and args.envs_per_worker and memory is not None:
        size = frame_bytes(args, policy, device)  # (with what the policy writes)
    for envs in args.envs_per_worker or ():
        frames = max(args.frames_per_batch or envs * 100, envs)  # (a worker's envs, 100 steps each by default)
        if memory is not None and 3 * frames * size > memory:
            raise batch_too_big(f"--envs-per-worker {envs}", frames, size, memory, "try fewer envs")


def collect_command(args: argparse.Namespace, best: Any) -> str:
    """The ``aiocollect collect`` command of the ``best`` trial, with the env and policy options
    of this command line (``--policy-threads`` where it is not the default, for a ``--policy``)."""
    import json
    import shlex

    kwargs = env_kwargs(args)
    command = f"aiocollect collect --env {shlex.quote(args.env)}"
    if kwargs:
        command += f" --env-kwargs {shlex.quote(json.dumps(kwargs))}"
    command += f" --workers {best.workers} --envs-per-worker {best.envs_per_worker}"
    if args.frames_per_batch is not None:
        command += f" --frames-per-batch {args.frames_per_batch}"
    for flag in ("policy", "policy_factory", "policy_device", "policy_threads"):
        value = getattr(args, flag)
        if value is not None and not (flag == "policy_threads" and (value == 1 or args.policy is None)):
            command += f" --{flag.replace('_', '-')} {shlex.quote(str(value))}"
    return command + " --frames FRAMES --out DIR"

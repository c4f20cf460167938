"""``tune()`` and ``aiocollect tune``: how many worker processes, and how many envs in each,
collect fastest here, for this env and this policy, measured rather than guessed.

Each split (``workers`` x ``envs_per_worker``) is a collector built, warmed up for one batch,
timed over whole batches for a few seconds, and shut down; the splits run one after the
other, so they never compete for the cores. The time of each is worked out as it goes, from
what is left of ``seconds`` and what the previous ones took to start, so that the whole stays
near ``seconds``. ``workers=0`` is a ``Collector``: the envs step in this process, which wins
for cheap envs and few cores.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Trial:
    """One measured split."""

    workers: int
    """Worker processes (0: the envs step in this process, in a ``Collector``)."""
    envs_per_worker: int
    """Envs each worker steps (with ``workers=0``: the envs of the ``Collector``)."""
    frames_per_batch: int
    frames_per_second: float
    """Frames of whole batches over the time they took, after one batch of warm-up."""
    startup_seconds: float
    """How long the collector took to build (its workers up and their envs built)."""
    measured_seconds: float
    frames: int

    @property
    def num_envs(self) -> int:
        return self.envs_per_worker * max(self.workers, 1)


@dataclass(frozen=True)
class TuneResult:
    """What ``tune()`` measured: ``print()`` it for the table, the best and how to use it."""

    env: str
    """The env, in words (its id, or the factory's name)."""
    policy: str
    """The policy, in words."""
    cores: int
    """The cores this process may use."""
    trials: tuple[Trial, ...]
    """Every split measured, by workers and then envs per worker (measured the other way
    round: the most workers first)."""
    skipped: tuple[tuple[int, int, str], ...]
    """``(workers, envs_per_worker, why)`` of the splits not measured."""
    best: Trial
    """The trial with the most frames/s."""
    constructor: str
    """The collector that ``best`` measured, as Python."""
    command: str | None = field(default=None)
    """The ``aiocollect collect`` command of ``best``, when the env is an id (``None`` otherwise)."""
    seconds: float | None = field(default=None)
    """The ``seconds`` the measurement was given."""
    seconds_to_measure_all: float | None = field(default=None)
    """Where ``seconds`` ran out before every split was measured, about what ``seconds`` would
    measure them all, worked out from the start-ups measured (``seconds_for_every_split``);
    ``None`` where every split was measured."""
    seconds_flag: str = field(default="seconds=")
    """How ``str()`` names the budget: ``tune()``'s keyword, or ``aiocollect tune``'s ``--seconds``
    (the command sets ``"--seconds "``)."""

    def table(self) -> str:
        lines = [f"{'workers':>7}  {'envs/worker':>11}  {'envs':>5}  {'frames/s':>10}  {'start-up':>8}  "
                 f"{'measured':>8}"]
        for t in self.trials:
            mark = "  <- best" if t is self.best else ""
            lines.append(f"{t.workers:>7}  {t.envs_per_worker:>11}  {t.num_envs:>5}  {t.frames_per_second:>10,.0f}  "
                         f"{t.startup_seconds:>6.1f} s  {t.measured_seconds:>6.1f} s{mark}")
        lines += [f"{w:>7}  {e:>11}  skipped: {why}" for w, e, why in self.skipped]
        return "\n".join(lines)

    def __str__(self) -> str:
        b = self.best
        split = _split_words(b.workers, b.envs_per_worker)
        slowest = min(t.frames_per_second for t in self.trials)
        lines = [f"{self.env}, {self.policy}, on {self.cores} core{'s' if self.cores != 1 else ''}:", self.table(),
                 f"best: {split}, {b.frames_per_second:,.0f} frames/s "
                 f"({b.frames_per_second / slowest:.2f}x the slowest split measured)"]
        if self.command:
            lines.append(f"  command:     {self.command}")
        lines.append(f"  constructor: {self.constructor}")
        budget = self.budget_line()
        if budget:
            lines.append(budget)
        return "\n".join(lines)

    def budget_line(self) -> str | None:
        """Where ``seconds`` ran out: how many splits were left, and what to give to measure
        them, named as the caller names it (``seconds_flag``); ``None`` otherwise."""
        if self.seconds_to_measure_all is None:
            return None
        left = sum(1 for *_, why in self.skipped if why == OUT_OF_TIME)
        startups = sorted(t.startup_seconds for t in self.trials)
        return (f"{left} of {len(self.trials) + left} splits not measured: the {self.seconds_flag}{self.seconds:g} "
                f"given were spent (start-ups here took {startups[0]:.0f}-{startups[-1]:.0f} s a split); "
                f"{self.seconds_flag}{self.seconds_to_measure_all:g} would measure every split")


MIN_WINDOW_S = 0.5
"""The shortest time a split is measured for (after its warm-up batch)."""

OUT_OF_TIME = "out of time: the time given ran out before it started"
"""Why a split was skipped when the time given ran out (``TuneResult.budget_line`` says more)."""


def seconds_for_every_split(spent: float, overhead: dict[int, float], windows: Sequence[float],
                            left: Sequence[tuple[int, int]]) -> float:
    """About what ``seconds`` would have measured every split, from what the measured ones took:
    the ``spent`` seconds, and for each split ``left`` (``(workers, envs_per_worker)``), the
    start-up, warm-up and shutdown (``overhead``) of a split of as many workers (else of the most
    workers measured: the splits run from the most workers down, so more than it has, on the
    safe side) and a window as long as the longest measured (at least ``MIN_WINDOW_S``).
    Rounded up to a whole 10 s."""
    window = max([MIN_WINDOW_S, *windows])
    fallback = overhead[max(overhead)] if overhead else 1.0
    total = spent + sum(overhead.get(w, fallback) + window for w, _ in left)
    return float(math.ceil(total / 10) * 10)


def _split_words(workers: int, envs_per_worker: int) -> str:
    if workers == 0:
        return f"{envs_per_worker} envs in this process"
    return f"{workers} worker{'s' if workers != 1 else ''} x {envs_per_worker} envs"


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _default_workers(cores: int) -> list[int]:
    return sorted({0, 1, max(1, cores // 2), max(1, cores - 1), cores})


def _env_words(env: Any, env_kwargs: dict) -> tuple[str, str]:
    """``env`` in words, and as the Python of a factory in the constructor line."""
    if isinstance(env, str):
        args = "".join(f", {k}={v!r}" for k, v in env_kwargs.items())
        return env, f"lambda: gym.make({env!r}{args})"
    name = getattr(env, "__name__", None) or type(env).__name__
    return name, name


def _policy_words(policy: Any) -> str:
    if policy is None:
        return "random actions"
    return f"policy {getattr(policy, '__name__', None) or type(policy).__name__}"


def tune(
    env: str | Callable[[], Any],
    policy: Any = None,
    *,
    env_kwargs: dict | None = None,
    workers: Sequence[int] | None = None,
    envs_per_worker: Sequence[int] = (8, 32),
    frames_per_batch: int | None = None,
    seconds: float = 30.0,
    policy_device: Any = None,
    progress: bool = False,
) -> TuneResult:
    """Measure how fast a few splits of worker processes x envs per worker collect, here.

    How many workers, and how many envs each, is best depends on the env, the policy and the
    machine: with random actions, one worker per core; with a policy that reads the
    observation, the policy's calls want a core of their own, so often one worker fewer
    with more envs each; a cheap env on few cores is fastest in this process. Rather than
    guess, measure: each split is a [`MultiSyncCollector`][aiocollect.MultiSyncCollector]
    (a [`Collector`][aiocollect.Collector] for ``workers=0``) of ``env`` and ``policy``,
    built, warmed up for one batch and timed over whole batches, one split after the other.

    Examples:
        >>> import aiocollect
        >>> result = aiocollect.tune("CartPole-v1", seconds=20)      # random actions
        >>> print(result)                                             # the table and the best
        >>> result.best.workers, result.best.envs_per_worker, result.best.frames_per_second
        >>> print(aiocollect.tune("CartPole-v1", policy=my_actor))    # the policy you will collect with

        From the shell, ``aiocollect tune --env CartPole-v1 [--policy trained.pt]`` prints the same,
        with the ``aiocollect collect`` command to use.

    Args:
        env: a gymnasium env id (built with ``gymnasium.make(env, **env_kwargs)``) or a
            function that returns an env, as a collector's ``create_env_fn`` entry takes.
        policy: what the collector acts with (any policy a collector takes; ``None``: random
            actions). Measure with the policy you will collect with: its calls take the time
            that decides the best split.
        env_kwargs: keyword arguments of ``gymnasium.make`` (an env id only).
        workers: the worker counts to try (default: 0, 1, half the cores, the cores - 1 and
            the cores, of those this process may use).
        envs_per_worker: the envs per worker to try.
        frames_per_batch: the batch size to measure with, as you will collect (default: 100
            steps of every env, as ``aiocollect collect``); splits whose envs it does not
            divide are skipped.
        seconds: about how long the whole measurement takes, start-ups included: each split
            collects for a share of what is left (at least half a second), and the splits
            not started once it is spent are skipped (``TuneResult.skipped`` says so, and
            ``TuneResult.seconds_to_measure_all`` about what would measure them all); a
            split already started finishes, so workers slow to start may overrun it.
        policy_device: the collectors' ``policy_device``.
        progress: print each split's result as it is measured.

    Returns:
        A [`TuneResult`][aiocollect._tune.TuneResult]: ``trials`` (every split measured, with
        its frames/s and start-up time), ``best``, and ``constructor`` (the Python of the best
        collector) and ``command`` (the ``aiocollect collect`` command, for an env id);
        ``print()`` shows them all.

    Raises:
        ValueError: a bad ``workers``, ``envs_per_worker``, ``frames_per_batch`` or
            ``seconds``, or no split to measure.
    """
    env_kwargs = dict(env_kwargs or {})
    make_env = _make_env(env, env_kwargs)
    cores = _cores()
    workers = list(workers) if workers is not None else _default_workers(cores)
    envs_per_worker = list(envs_per_worker)
    _check_options(workers, envs_per_worker, frames_per_batch, seconds)
    env_name, env_code = _env_words(env, env_kwargs)
    splits, skipped = _splits(workers, envs_per_worker, frames_per_batch)
    if progress:
        print(f"tune: {env_name}, {len(splits)} splits of workers x envs per worker, about {seconds:.0f} s",
              flush=True)
    build = functools.partial(_collector, make_env, policy, policy_device)
    trials, out_of_time, needed = _measure_splits(splits, build, frames_per_batch, seconds, progress)
    trials.sort(key=lambda t: (t.workers, t.envs_per_worker))
    skipped = sorted(skipped + out_of_time)
    best = max(trials, key=lambda t: t.frames_per_second)
    return TuneResult(env_name, _policy_words(policy), cores, tuple(trials), tuple(skipped), best,
                      _constructor(best, env_code, policy, policy_device),
                      _command(env, env_kwargs, best, frames_per_batch, policy),
                      seconds=seconds, seconds_to_measure_all=needed)


# The steps of tune(), in the order it takes them ---------------------------------------------

def _make_env(env: Any, env_kwargs: dict) -> Callable[[], Any]:
    """What builds one env: ``gymnasium.make(env, **env_kwargs)`` for an id, else ``env`` itself."""
    if isinstance(env, str):
        import gymnasium as gym

        return functools.partial(gym.make, env, **env_kwargs)
    if callable(env):
        if env_kwargs:
            raise ValueError("tune: env_kwargs are for an env id; a function that builds the env takes its own")
        return env
    raise TypeError(f"tune: env must be a gymnasium env id or a function that returns an env, "
                    f"got {type(env).__name__}")


def _check_options(workers: list, envs_per_worker: list, frames_per_batch: int | None, seconds: float) -> None:
    """``tune()``'s numbers in range (a ``ValueError`` that names the argument)."""
    if not workers or any(not isinstance(w, int) or w < 0 for w in workers):
        raise ValueError(f"tune: workers must be whole numbers >= 0 (0: envs in this process), got {workers}")
    if not envs_per_worker or any(not isinstance(e, int) or e < 1 for e in envs_per_worker):
        raise ValueError(f"tune: envs_per_worker must be whole numbers >= 1, got {envs_per_worker}")
    if frames_per_batch is not None and frames_per_batch < 1:
        raise ValueError(f"tune: frames_per_batch must be >= 1, got {frames_per_batch}")
    if not (seconds > 0 and math.isfinite(seconds)):  # (nan, inf: a measurement that never ends)
        raise ValueError(f"tune: seconds must be > 0 and finite (about how long to measure), got {seconds}")


def _splits(workers: list[int], envs_per_worker: list[int],
            frames_per_batch: int | None) -> tuple[list[tuple[int, int]], list[tuple[int, int, str]]]:
    """The splits ``(workers, envs_per_worker)`` to measure, the most workers first (their
    start-up, the slowest, is learnt before the budget is shared out), and those skipped, with
    why: ``frames_per_batch`` does not divide their envs."""
    splits, skipped = [], []
    for w in dict.fromkeys(workers):
        for e in dict.fromkeys(envs_per_worker):
            n = e * max(w, 1)
            if frames_per_batch is not None and frames_per_batch % n:
                skipped.append((w, e, f"frames_per_batch={frames_per_batch} does not split over {n} envs"))
            else:
                splits.append((w, e))
    if not splits:
        raise ValueError(f"tune: frames_per_batch={frames_per_batch} splits over none of the splits' env counts; "
                         "give one that is a multiple of them, or none (100 steps of every env)")
    splits.sort(key=lambda split: (-split[0], -split[1]))
    return splits, skipped


def _collector(make_env: Callable[[], Any], policy: Any, policy_device: Any, workers: int, envs_per_worker: int,
               frames_per_batch: int) -> Any:
    """The collector of one split, endless (``total_frames=-1``): a ``Collector`` for ``workers=0``."""
    from ._collectors.collector import Collector
    from ._collectors.multi_sync import MultiSyncCollector

    entries = [make_env] * envs_per_worker
    if workers == 0:
        return Collector(entries, policy, frames_per_batch=frames_per_batch, total_frames=-1,
                         policy_device=policy_device)
    return MultiSyncCollector([entries] * workers, policy, frames_per_batch=frames_per_batch, total_frames=-1,
                              policy_device=policy_device)


def _measure_splits(splits: list[tuple[int, int]], build: Callable[[int, int, int], Any],
                    frames_per_batch: int | None, seconds: float,
                    progress: bool) -> tuple[list[Trial], list[tuple[int, int, str]], float | None]:
    """Each split measured in turn (``_measure``), for its share of what is left of ``seconds``:
    the trials, the splits left out once ``seconds`` is spent (``OUT_OF_TIME``), and about what
    ``seconds`` would have measured them all (``None`` where none was left out)."""
    began_all = time.perf_counter()
    deadline = began_all + seconds
    needed, out_of_time = None, []
    overhead: dict[int, float] = {}  # per worker count: what was not timed collection (start-up, warm-up, shutdown)
    trials: list[Trial] = []
    for k, (w, e) in enumerate(splits):
        if trials and time.perf_counter() >= deadline:  # (slow start-ups spent the budget)
            out_of_time = [(w2, e2, OUT_OF_TIME) for w2, e2 in splits[k:]]
            needed = seconds_for_every_split(time.perf_counter() - began_all, overhead,
                                             [t.measured_seconds for t in trials], splits[k:])
            break
        left = len(splits) - k
        # what a split of as many workers took beyond its measurement, else the last split's
        # (of more workers: a guess on the safe side), else a second
        guess = overhead.get(w, overhead[trials[-1].workers] if trials else 1.0)
        # (at least MIN_WINDOW_S each; where start-ups ate the budget, the table's "measured"
        # column shows which splits got only that: give more seconds to compare them fairly)
        span = max(MIN_WINDOW_S, (deadline - time.perf_counter()) / left - guess)
        trial, overhead[w] = _measure(build, w, e, frames_per_batch or e * max(w, 1) * 100, span)
        trials.append(trial)
        if progress:
            print(f"  {_split_words(w, e)}: {trial.frames_per_second:,.0f} frames/s "
                  f"(start-up {trial.startup_seconds:.1f} s, measured {trial.measured_seconds:.1f} s)", flush=True)
    return trials, out_of_time, needed


def _measure(build: Callable[[int, int, int], Any], workers: int, envs_per_worker: int, frames_per_batch: int,
             span: float) -> tuple[Trial, float]:
    """One split: its collector built, warmed up for one batch, and timed over whole batches
    for at least ``span`` seconds. The trial, and the seconds it took beyond its measurement
    (start-up, warm-up, shutdown)."""
    began = time.perf_counter()
    collector = build(workers, envs_per_worker, frames_per_batch)
    with collector:
        startup = time.perf_counter() - began
        batches = iter(collector)
        next(batches)  # warm-up: first calls, first resets, pages touched
        start, frames = time.perf_counter(), 0
        while True:
            frames += next(batches).numel()
            took = time.perf_counter() - start
            if took >= span:
                break
    trial = Trial(workers, envs_per_worker, frames_per_batch, frames / took, startup, took, frames)
    return trial, time.perf_counter() - began - took


def _constructor(best: Trial, env_code: str, policy: Any, policy_device: Any) -> str:
    """The collector of ``best``, as Python (``TuneResult.constructor``)."""
    fpb_code = f"frames_per_batch={best.frames_per_batch}"
    device_code = f", policy_device={str(policy_device)!r}" if policy_device is not None else ""
    policy_code = "None" if policy is None else "policy"
    if best.workers == 0:
        return (f"Collector([{env_code}] * {best.envs_per_worker}, {policy_code}, {fpb_code}, "
                f"total_frames=...{device_code})")
    return (f"MultiSyncCollector([[{env_code}] * {best.envs_per_worker}] * {best.workers}, {policy_code}, "
            f"{fpb_code}, total_frames=...{device_code})")


def _command(env: Any, env_kwargs: dict, best: Trial, frames_per_batch: int | None, policy: Any) -> str | None:
    """The ``aiocollect collect`` command of ``best``, for an env id (``None`` otherwise);
    ``--policy POLICY`` stands for a policy (``aiocollect tune`` writes its own options)."""
    if not isinstance(env, str):
        return None
    import json
    import shlex

    command = f"aiocollect collect --env {shlex.quote(env)}"
    if env_kwargs:
        command += f" --env-kwargs {shlex.quote(json.dumps(env_kwargs))}"
    command += f" --workers {best.workers} --envs-per-worker {best.envs_per_worker}"
    if frames_per_batch is not None:
        command += f" --frames-per-batch {frames_per_batch}"
    if policy is not None:
        command += " --policy POLICY"
    return command + " --frames FRAMES --out DIR"

"""Collection throughput: aiocollect vs. a plain gymnasium loop vs. TorchRL.

What is measured
----------------
Frames per second (one frame = one env step of one env) of collecting experience from
CartPole-v1 envs living in this process, in two scenarios:

* **A. 8 envs, random policy.** The cost here is almost all per-step overhead, so this
  shows what the collector adds on top of stepping the envs:

  - ``plain``: ``gymnasium.vector.SyncVectorEnv`` stepped with
    ``envs.action_space.sample()`` in a bare loop; nothing is stored. This is the
    floor: a collector cannot do less work than this and still step the envs.
  - ``gym_async``: the same loop over ``AsyncVectorEnv`` (one subprocess per env), as a
    reference point only (on a 2-core machine the pipes cost more than they save).
  - ``aiocollect``: ``aiocollect.Collector`` with ``policy=None`` (a batched random
    policy), iterated with ``for batch in collector`` and with ``async for`` inside
    ``asyncio.run``. Every batch is a ``[num_envs, T]`` TensorDict in TorchRL's layout.
  - ``torchrl``: ``torchrl.collectors.Collector`` over ``SerialEnv(8, GymEnv(...))``,
    the closest TorchRL equivalent (same envs, same process, same batch layout).

* **B. 64 envs, a 2x64 MLP policy** (argmax of the logits): a policy that costs a
  little, called once per step for all envs. The reference is a hand-written loop that
  does the same work (``SyncVectorEnv`` step + one batched forward under
  ``torch.no_grad()``) but stores nothing; aiocollect and TorchRL get the same
  ``TensorDictModule``.

Goals: aiocollect >= 0.8x the plain/hand-written loop and >= 20x TorchRL (scenario A).

Scenario A, last measured 2026-12-03 on the 2-core VM at a 1-min load of 4-5 (other sessions'
tests), as the best batch of ~200 (the least disturbed, ``T`` steps each) against the best
``T`` steps of the plain loop, side by side in one process: ``for`` 0.89 and ``async for`` 0.93
at ``T = 32`` (``--quick``'s batches), 0.97 and 0.94 at ``T = 128``; the engine before random
runs in-process gave 0.79/0.77 and 0.80/0.80 in the same run. One ``--quick --repeats 2`` run
then: 0.79 and 0.79 (0.37 and 0.78 before): its runs last 0.1 s, and the ``for`` face's hand-off
of each batch between threads is what a busy machine delays most. 2026-12-04, after per-batch
delivery went from ~100 to ~42 us a batch (``_engine.batch_plan``), ``--quick --repeats 3``:
``for`` 0.89, ``async for`` 0.98 (load 4.5); the helper's alternated A/B at load 4-8: ``for``
0.86-0.89 -> 0.90-0.98, ``async for`` 0.93-0.97 -> 0.98; scenario B unchanged (0.77-0.83).

How
---
* Every measurement is a function returning frames/s. Construction is not timed, and
  neither is a warm-up: the first batch of a collector (first resets, buffer
  allocation, lazy initialisation) and the first ``warmup`` steps of a loop.
* Each measurement runs ``--repeats`` times (3 by default), round-robin over all
  measurements so that a slow spell of the machine hits all of them alike; the table
  shows the **best** run (the least disturbed one, standard for throughput on a shared
  machine) and the median.
* ``torch.set_num_threads(1)`` for every contender: on a small machine intra-op threads
  only fight the env loop for cores, and this keeps the comparison about the collectors.
* TorchRL gets fewer frames (it is much slower) so that it too runs a few seconds.

Usage::

    python benchmarks/bench_collect.py                # full run (~1.5 min on 2 cores)
    python benchmarks/bench_collect.py --quick        # smoke run for CI (< 30 s)
    python benchmarks/bench_collect.py --smoke        # --quick's rows, each as brief as can be (the tests')
    python benchmarks/bench_collect.py --json out.json
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import json
import logging
import multiprocessing
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

_PROCESS_START = time.perf_counter()  # for the total time, heavy imports included

# TorchRL reads these when imported: no warnings, no INFO lines flooding the table.
os.environ.setdefault("RL_WARNINGS", "0")
os.environ.setdefault("RL_LOGGING_LEVEL", "ERROR")

import gymnasium as gym
import torch
from _common import QUICK_WARNING, environment, parse_args, torchrl_note, verdict
from tensordict.nn import TensorDictModule
from torch import nn

from aiocollect import Collector

ENV_ID = "CartPole-v1"
# Importing torchrl makes "spawn" the global start method, and a spawned worker re-imports
# this script (torch, torchrl...): seconds per AsyncVectorEnv worker on a small machine.
# The workers only need gymnasium, so fork them where possible (start-up is not timed).
FAST_START_METHOD = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
ENVS_A = 8
ENVS_B = 64
HAVE_TORCHRL = importlib.util.find_spec("torchrl") is not None  # its rows are skipped without it


# --------------------------------------------------------------------------- sizes


@dataclass(frozen=True)
class Sizes:
    """Frame counts of one run of each measurement (timed frames, warm-up excluded)."""

    a_steps_per_batch: int  # T in scenario A: frames_per_batch = 8 * T
    a_frames: int  # plain loops and aiocollect
    a_async_vec_frames: int  # AsyncVectorEnv (slow on few cores)
    a_torchrl_frames: int
    b_steps_per_batch: int  # T in scenario B: frames_per_batch = 64 * T
    b_frames: int
    b_torchrl_frames: int
    warmup_steps: int  # untimed steps of the hand-written loops


FULL = Sizes(
    a_steps_per_batch=128,
    a_frames=200_000,
    a_async_vec_frames=50_000,
    a_torchrl_frames=16_384,
    b_steps_per_batch=100,
    b_frames=256_000,
    b_torchrl_frames=12_800,
    warmup_steps=100,
)

QUICK = Sizes(
    a_steps_per_batch=32,
    a_frames=8_192,
    a_async_vec_frames=2_048,
    a_torchrl_frames=512,
    b_steps_per_batch=10,
    b_frames=6_400,
    b_torchrl_frames=640,
    warmup_steps=10,
)

SMOKE = Sizes(
    a_steps_per_batch=16,
    a_frames=1_024,
    a_async_vec_frames=256,
    a_torchrl_frames=128,
    b_steps_per_batch=4,
    b_frames=768,
    b_torchrl_frames=256,
    warmup_steps=5,
)


def whole_batches(frames: int, frames_per_batch: int) -> int:
    """``frames`` rounded up to a whole number of batches (at least one)."""
    return max(1, -(-frames // frames_per_batch)) * frames_per_batch


# --------------------------------------------------------------------------- envs and policy


def make_cartpole() -> gym.Env:
    return gym.make(ENV_ID)


class ArgmaxMLP(nn.Module):
    """A 2x64 tanh MLP on CartPole observations; the action is the argmax of its logits."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.net(observation).argmax(-1)  # int64, shape [num_envs]


def make_mlp() -> ArgmaxMLP:
    """The same weights every time, so every contender sees the same episode lengths."""
    torch.manual_seed(0)
    return ArgmaxMLP()


def make_td_policy() -> TensorDictModule:
    return TensorDictModule(make_mlp(), in_keys=["observation"], out_keys=["action"])


# --------------------------------------------------------------------------- timing helpers


def rate_of_batches(batches: Iterable) -> float:
    """Frames/s over the batches after the first one (the first is the warm-up)."""
    start, frames = None, 0
    for batch in batches:
        if start is None:
            start = time.perf_counter()
            continue
        frames += batch.numel()
    return frames / (time.perf_counter() - start)


async def arate_of_batches(batches) -> float:
    """:func:`rate_of_batches` for ``async for``."""
    start, frames = None, 0
    async for batch in batches:
        if start is None:
            start = time.perf_counter()
            continue
        frames += batch.numel()
    return frames / (time.perf_counter() - start)


# --------------------------------------------------------------------------- gymnasium loops


def gym_random_loop(vector_cls: type, num_envs: int, frames: int, warmup_steps: int, **kwargs) -> float:
    """A bare ``envs.step(envs.action_space.sample())`` loop over a gymnasium vector env."""
    envs = vector_cls([make_cartpole] * num_envs, **kwargs)
    try:
        envs.reset(seed=0)
        for _ in range(warmup_steps):
            envs.step(envs.action_space.sample())
        steps = frames // num_envs
        start = time.perf_counter()
        for _ in range(steps):
            envs.step(envs.action_space.sample())
        return steps * num_envs / (time.perf_counter() - start)
    finally:
        envs.close()


def hand_written_mlp_loop(num_envs: int, frames: int, warmup_steps: int) -> float:
    """SyncVectorEnv step + one batched MLP forward per step; nothing stored."""
    envs = gym.vector.SyncVectorEnv([make_cartpole] * num_envs)
    mlp = make_mlp()
    try:
        obs, _ = envs.reset(seed=0)

        def run(steps: int) -> None:
            nonlocal obs
            with torch.no_grad():
                for _ in range(steps):
                    action = mlp(torch.from_numpy(obs)).numpy()
                    obs, _, _, _, _ = envs.step(action)

        run(warmup_steps)
        steps = frames // num_envs
        start = time.perf_counter()
        run(steps)
        return steps * num_envs / (time.perf_counter() - start)
    finally:
        envs.close()


# --------------------------------------------------------------------------- aiocollect


def make_aiocollect(num_envs: int, policy, steps_per_batch: int, frames: int) -> Collector:
    fpb = num_envs * steps_per_batch
    total = fpb + whole_batches(frames, fpb)  # + the warm-up batch
    return Collector([make_cartpole] * num_envs, policy, frames_per_batch=fpb, total_frames=total)


def aiocollect_for(num_envs: int, policy, steps_per_batch: int, frames: int) -> float:
    """``for batch in collector`` (the sync face: the engine runs on a loop thread)."""
    with make_aiocollect(num_envs, policy, steps_per_batch, frames) as collector:
        return rate_of_batches(collector)


def aiocollect_async_for(num_envs: int, policy, steps_per_batch: int, frames: int) -> float:
    """``async for batch in collector`` inside ``asyncio.run`` (the engine runs on that loop)."""

    async def main() -> float:
        async with make_aiocollect(num_envs, policy, steps_per_batch, frames) as collector:
            return await arate_of_batches(collector)

    return asyncio.run(main())


def mean_episode_length(num_envs: int, policy, steps_per_batch: int, frames: int) -> float:
    """Mean episode length seen by aiocollect (frames / finished trajectories); untimed."""
    with make_aiocollect(num_envs, policy, steps_per_batch, frames) as collector:
        for _ in collector:
            pass
        stats = collector.statistics()
    return stats.frames / max(1, stats.completed_trajectories)


# --------------------------------------------------------------------------- TorchRL


def _torchrl():
    """TorchRL's collector class and env classes (imported on first use)."""
    import torchrl.collectors as collectors
    from torchrl.envs import GymEnv, SerialEnv

    logging.getLogger("torchrl").setLevel(logging.ERROR)
    collector_cls = getattr(collectors, "Collector", None) or collectors.SyncDataCollector
    return collector_cls, SerialEnv, GymEnv


def torchrl_collector(num_envs: int, policy, steps_per_batch: int, frames: int, **gym_kwargs) -> float:
    """TorchRL ``Collector(SerialEnv(num_envs, GymEnv(...)), policy)``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        collector_cls, SerialEnv, GymEnv = _torchrl()
        env = SerialEnv(num_envs, lambda: GymEnv(ENV_ID, **gym_kwargs))
        fpb = num_envs * steps_per_batch
        total = fpb + whole_batches(frames, fpb)
        collector = collector_cls(env, policy, frames_per_batch=fpb, total_frames=total)
        try:
            return rate_of_batches(collector)
        finally:
            collector.shutdown()
            if not env.is_closed:
                env.close()


# --------------------------------------------------------------------------- the benchmark list


@dataclass
class Bench:
    scenario: str
    key: str
    name: str
    run: Callable[[], float]
    frames: int  # timed frames per run
    runs: list[float] = field(default_factory=list)

    @property
    def best(self) -> float:
        return max(self.runs)

    @property
    def median(self) -> float:
        return statistics.median(self.runs)


@dataclass(frozen=True)
class Ratio:
    scenario: str
    num: str
    den: str
    goal: float | None


def make_benches(s: Sizes) -> list[Bench]:
    a, b = ENVS_A, ENVS_B
    w = s.warmup_steps
    ta, tb = s.a_steps_per_batch, s.b_steps_per_batch
    benches = [
        # Scenario A: 8 envs, random actions
        Bench("A", "plain", "plain gymnasium SyncVectorEnv loop",
              lambda: gym_random_loop(gym.vector.SyncVectorEnv, a, s.a_frames, w), s.a_frames),
        Bench("A", "gym_async", "gymnasium AsyncVectorEnv loop (ref.)",
              lambda: gym_random_loop(gym.vector.AsyncVectorEnv, a, s.a_async_vec_frames, w,
                                      context=FAST_START_METHOD),
              s.a_async_vec_frames),
        Bench("A", "aio", "aiocollect Collector, for",
              lambda: aiocollect_for(a, None, ta, s.a_frames), whole_batches(s.a_frames, a * ta)),
        Bench("A", "aio_async", "aiocollect Collector, async for",
              lambda: aiocollect_async_for(a, None, ta, s.a_frames), whole_batches(s.a_frames, a * ta)),
        Bench("A", "torchrl", "TorchRL Collector(SerialEnv)",
              lambda: torchrl_collector(a, None, ta, s.a_torchrl_frames),
              whole_batches(s.a_torchrl_frames, a * ta)),
        # Scenario B: 64 envs, 2x64 MLP
        Bench("B", "hand", "hand-written SyncVectorEnv + MLP loop",
              lambda: hand_written_mlp_loop(b, s.b_frames, w), s.b_frames),
        Bench("B", "aio", "aiocollect Collector, for",
              lambda: aiocollect_for(b, make_td_policy(), tb, s.b_frames), whole_batches(s.b_frames, b * tb)),
        Bench("B", "aio_async", "aiocollect Collector, async for",
              lambda: aiocollect_async_for(b, make_td_policy(), tb, s.b_frames),
              whole_batches(s.b_frames, b * tb)),
        Bench("B", "torchrl", "TorchRL Collector(SerialEnv)",
              lambda: torchrl_collector(b, make_td_policy(), tb, s.b_torchrl_frames,
                                        categorical_action_encoding=True),
              whole_batches(s.b_torchrl_frames, b * tb)),
    ]
    return [bench for bench in benches if HAVE_TORCHRL or bench.key != "torchrl"]


RATIOS = [
    Ratio("A", "aio", "plain", 0.8),
    Ratio("A", "aio_async", "plain", 0.8),
    Ratio("A", "aio", "torchrl", 20.0),
    Ratio("A", "aio_async", "torchrl", 20.0),
    Ratio("B", "aio", "hand", 0.8),
    Ratio("B", "aio_async", "hand", 0.8),
    Ratio("B", "aio", "torchrl", None),
    Ratio("B", "aio_async", "torchrl", None),
]

SCENARIO_TITLES = {
    "A": f"Scenario A: {ENV_ID}, {ENVS_A} in-process envs, random policy",
    "B": f"Scenario B: {ENV_ID}, {ENVS_B} in-process envs, 2x64 MLP policy (argmax)",
}
BASELINE = {"A": "plain", "B": "hand"}


def episode_lengths(s: Sizes) -> dict[str, float]:
    """Mean episode length per scenario (for the autoreset note under each table)."""
    return {
        "A": mean_episode_length(ENVS_A, None, s.a_steps_per_batch, s.a_frames),
        "B": mean_episode_length(ENVS_B, make_td_policy(), s.b_steps_per_batch, s.b_frames),
    }


def run_all(benches: list[Bench], repeats: int) -> None:
    """Run every bench ``repeats`` times, round-robin; progress goes to stderr."""
    for rep in range(1, repeats + 1):
        for bench in benches:
            gc.collect()
            started = time.perf_counter()
            fps = bench.run()
            bench.runs.append(fps)
            print(f"  [{bench.scenario}] run {rep}/{repeats}  {bench.name:<40} {fps:>12,.0f} frames/s"
                  f"  ({time.perf_counter() - started:.1f} s)", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- report


def ratio_value(benches: list[Bench], r: Ratio) -> float | None:
    """``num / den`` of the best runs; ``None`` when one of them was not measured."""
    by_key = {(b.scenario, b.key): b for b in benches}
    num, den = by_key.get((r.scenario, r.num)), by_key.get((r.scenario, r.den))
    return None if num is None or den is None else num.best / den.best


def format_table(benches: list[Bench], repeats: int, ep_lengths: dict[str, float], quick: bool = False) -> str:
    by_key = {(b.scenario, b.key): b for b in benches}
    stat = f"best of {repeats}" if repeats > 1 else "1 run"
    lines = []
    for scenario, title in SCENARIO_TITLES.items():
        base = by_key[(scenario, BASELINE[scenario])]
        header = f"{'name':<40} | {'frames/s (' + stat + ')':>22} | {'median':>10} | {'vs ' + base.key:>9}"
        lines += ["", title, "", header, "-" * len(header)]
        for b in (b for b in benches if b.scenario == scenario):
            lines.append(f"{b.name:<40} | {b.best:>22,.0f} | {b.median:>10,.0f} | {b.best / base.best:>8.2f}x")
        lines.append("")
        for r in (r for r in RATIOS if r.scenario == scenario):
            value = ratio_value(benches, r)
            label = f"{by_key[(scenario, r.num)].name} / {r.den}"
            if value is None:
                lines.append(f"  {label:<52} {'n/a':>7}   ({r.den} not measured)")
                continue
            goal = "" if r.goal is None else verdict(value, r.goal, quick)
            lines.append(f"  {label:<52} {value:>7.2f}   {goal}")
        lines += autoreset_note(benches, scenario, ep_lengths[scenario])
    note = torchrl_note(HAVE_TORCHRL)
    if note:
        lines += ["", note]
    return "\n".join(lines)


def autoreset_note(benches: list[Bench], scenario: str, length: float) -> list[str]:
    """The ratios counting env transitions only (see "Frame accounting" in the README).

    The baseline loop's SyncVectorEnv autoresets: the step after an episode ends only
    resets the env, yet counts as a frame, so an episode of L transitions costs it L + 1
    frames. aiocollect and TorchRL reset explicitly and count transitions only.
    """
    base = BASELINE[scenario]
    factor = (length + 1) / length
    parts = [
        f"{r.num}/{base} {ratio_value(benches, r) * factor:.2f}"
        for r in RATIOS
        if r.scenario == scenario and r.den == base
    ]
    return [
        f"  note: {base} counts one autoreset step per episode as a frame (mean episode length "
        f"{length:.1f});",
        f"        counting env transitions only: {', '.join(parts)}",
    ]


def write_json(path: str, benches: list[Bench], ep_lengths: dict[str, float], sizes: Sizes, args,
               env: dict, wall: float, mode: str) -> None:
    data = {
        "mode": mode,
        "repeats": args.repeats,
        "statistic": "best",
        "sizes": asdict(sizes),
        "environment": env,
        "measuring_seconds": wall,
        "mean_episode_length": ep_lengths,
        "results": [
            {"scenario": b.scenario, "key": b.key, "name": b.name, "timed_frames": b.frames,
             "frames_per_s": b.best, "median_frames_per_s": b.median, "runs": b.runs}
            for b in benches
        ],
        "ratios": [
            {"scenario": r.scenario, "numerator": r.num, "denominator": r.den,
             "value": ratio_value(benches, r), "goal": r.goal}
            for r in RATIOS
        ],
    }
    with open(path, "w") as f:
        json.dump(data, f, indent=2)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__.split("\n\n")[0], "tiny frame counts, one run (CI smoke test)")

    torch.set_num_threads(1)  # same for every contender; see the module docstring
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    sizes = {"smoke": SMOKE, "quick": QUICK, "full": FULL}[mode]
    env = environment()
    print(
        f"aiocollect {env['aiocollect']} | torch {env['torch']} (threads=1) | tensordict {env['tensordict']}"
        f" | torchrl {env['torchrl']} | gymnasium {env['gymnasium']} | numpy {env['numpy']}"
        f" | python {env['python']}\n{env['cpu_count']} CPUs, 1-min load average {env['load_average_1min']:.2f}"
        f" | mode={mode}, {args.repeats} run(s) per measurement, round-robin;"
        " first batch / warm-up steps not timed",
        flush=True,
    )

    started = time.perf_counter()
    benches = make_benches(sizes)
    run_all(benches, args.repeats)
    ep_lengths = episode_lengths(sizes)
    wall = time.perf_counter() - started

    print(format_table(benches, args.repeats, ep_lengths, quick=args.quick))
    load = f", 1-min load average {os.getloadavg()[0]:.2f} at the end" if hasattr(os, "getloadavg") else ""
    total = time.perf_counter() - _PROCESS_START
    print(f"\ntotal time: {total:.1f} s ({wall:.1f} s measuring, the rest imports){load}")
    if args.quick:
        print(QUICK_WARNING)
    if args.json:
        write_json(args.json, benches, ep_lengths, sizes, args, env, wall, mode)
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

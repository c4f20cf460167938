"""Coroutine envs: 256 envs whose step awaits 5-15 ms, against the latency bound and TorchRL.

What is measured
----------------
Each env's step waits a uniform 5-15 ms (mean 10 ms) and computes nothing, as a game
server or a web API would. With 256 envs the **latency bound** is 256 / 10 ms = 25,600
frames/s: no collector can step an env faster than its latency allows.

* ``barrier``: a hand-written asyncio loop that steps all 256 envs together
  (``asyncio.gather``), then runs the policy once on all of them. Every step lasts as long
  as the slowest of 256 envs (~15 ms), which loses about a third of the bound.
* ``aiocollect``: ``Collector([factory] * 256, policy)`` with the coroutine envs; each env
  steps as soon as its action is ready, the policy runs on whichever envs are ready.
  Batches of 100 steps per env (25,600 frames, about a second). Within a batch nobody
  waits; at its end, envs that have their 100 steps wait for the slowest (about 5% of the
  bound at 100 steps, 12% at 40). Goal: >= 0.8 of the bound.
* ``ahead``: the same with ``step_ahead=True``: an env that has its steps of a batch steps on
  into the next one, so nobody waits at a batch's end (the next batch's first steps of the
  fast envs then come from the policy before your update). Goal: >= 0.9 of the bound. Both
  rows are bound by the engine's CPU as much as by the latency: about 35-50 us of
  main-process CPU per frame (the env's own coroutine, a task per step, the loop's timers,
  the bookkeeping and the policy calls), so 25,600 frames/s take most of a core, and on a
  busy machine the rows follow the CPU they get, not the latency.
* ``torchrl``: TorchRL's ``AsyncBatchedCollector`` (threading backend) on the same envs
  wrapped for it: a gymnasium env whose step *sleeps* 5-15 ms (``time.sleep`` releases the
  GIL, so its threads wait concurrently), in ``GymWrapper``. Goal: aiocollect ahead.

Last measured 2026-12-03 on the 2-core VM, 1-min load 3.7-5 (other sessions' tests), ``--quick
--repeats 2``, best of 2, twice: barrier 0.49-0.51 of the bound, aiocollect 0.82-0.84 (0.81 before
this change, same run conditions), ``step_ahead=True`` 0.88-0.92.

Every contender runs the same policy (a 3-32-2 MLP, argmax) and the same episodes (200
steps, then truncated). Frames/s over ``--repeats`` runs after a warm-up; the table shows
the best and the median, ratios use the best.

Usage::

    python benchmarks/bench_coroutines.py            # full run, ~1.5 min on 2 cores
    python benchmarks/bench_coroutines.py --quick    # smoke run, ~25 s
    python benchmarks/bench_coroutines.py --smoke    # --quick's rows, each as brief as can be (the tests')
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
import warnings

os.environ.setdefault("RL_WARNINGS", "0")
os.environ.setdefault("RL_LOGGING_LEVEL", "ERROR")

import gymnasium as gym
import numpy as np
import torch
from _common import environment, finish, missing, parse_args
from gymnasium import spaces
from tensordict.nn import TensorDictModule
from torch import nn

from aiocollect import AsyncEnv, Collector

NUM_ENVS = 256
LOW, HIGH = 0.005, 0.015
LENGTH = 200
BOUND = NUM_ENVS / ((LOW + HIGH) / 2)


class Argmax(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(3, 32), nn.Tanh(), nn.Linear(32, 2))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs).argmax(-1)


def policy() -> TensorDictModule:
    return TensorDictModule(Argmax(), in_keys=["observation"], out_keys=["action"])


class LatencyEnv(AsyncEnv):
    """Awaits a uniform 5-15 ms per step; obs [t, last action, 1]."""

    def __init__(self):
        self.observation_space = spaces.Box(-1e6, 1e6, (3,), np.float32)
        self.action_space = spaces.Discrete(2)

    async def reset(self, *, seed=None, options=None):
        await super().reset(seed=seed)
        self.t = 0
        return np.array([0, 0, 1], np.float32), {}

    async def step(self, action):
        await asyncio.sleep(self.np_random.uniform(LOW, HIGH))
        self.t += 1
        return np.array([self.t, int(action), 1], np.float32), 1.0, False, self.t >= LENGTH, {}


class SleepingEnv(gym.Env):
    """The same env for threads: its step sleeps 5-15 ms (releasing the GIL)."""

    observation_space = spaces.Box(-1e6, 1e6, (3,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0, 0, 1], np.float32), {}

    def step(self, action):
        time.sleep(self.np_random.uniform(LOW, HIGH))
        self.t += 1
        return np.array([self.t, int(action), 1], np.float32), 1.0, False, self.t >= LENGTH, {}


# ---------------------------------------------------------------------------- contenders


def barrier_fps(seconds: float) -> float:
    async def run() -> float:
        envs = [LatencyEnv() for _ in range(NUM_ENVS)]
        module = Argmax()
        obs = np.stack([(await e.reset(seed=i))[0] for i, e in enumerate(envs)])
        steps, start = 0, None
        with torch.no_grad():
            while True:
                action = module(torch.from_numpy(obs)).numpy()
                results = await asyncio.gather(*(e.step(a) for e, a in zip(envs, action)))
                for i, (o, _, term, trunc, _) in enumerate(results):
                    obs[i] = (await envs[i].reset())[0] if term or trunc else o
                steps += 1
                if start is None:
                    if steps == 20:  # warmed up
                        start, steps = time.perf_counter(), 0
                elif time.perf_counter() - start > seconds:
                    return steps * NUM_ENVS / (time.perf_counter() - start)

    return asyncio.run(run())


def aiocollect_fps(batches: int, steps: int, step_ahead: bool = False) -> float:
    """Batches of ``steps`` steps per env (each env waits for the slowest at a batch's end:
    the longer the batch, the less that costs; with ``step_ahead``, it steps on into the next)."""
    with Collector([LatencyEnv] * NUM_ENVS, policy(), frames_per_batch=NUM_ENVS * steps, total_frames=-1,
                   step_ahead=step_ahead) as c:
        it = iter(c)
        next(it)
        frames, start = 0, time.perf_counter()
        for _ in range(batches):
            frames += next(it).numel()
        return frames / (time.perf_counter() - start)


def torchrl_fps(batches: int, steps: int) -> float | None:
    try:
        from torchrl.collectors import AsyncBatchedCollector
        from torchrl.envs import GymWrapper
    except ImportError:
        return None

    def make():
        return GymWrapper(SleepingEnv(), categorical_action_encoding=True)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        collector = AsyncBatchedCollector([make] * NUM_ENVS, policy=policy(), frames_per_batch=NUM_ENVS * steps,
                                          total_frames=-1, backend="threading", max_batch_size=NUM_ENVS)
    it = iter(collector)
    try:
        next(it)
        frames, start = 0, time.perf_counter()
        for _ in range(batches):
            frames += next(it).numel()
        return frames / (time.perf_counter() - start)
    finally:
        it.close()
        collector.shutdown()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, "256 coroutine envs with 5-15 ms latency: aiocollect vs a barrier vs TorchRL.",
                      "smoke run (~25 s)")
    torch.set_num_threads(1)
    env = environment()
    print(f"# environment: {env}", file=sys.stderr)
    # (quick: TorchRL's batches of 2 steps per env, not 10: its warm-up batch and its one timed
    # batch, at about 500 frames/s here, would take 10 s of the smoke run)
    seconds, our_batches, steps, their_batches, their_steps = (
        (0.2, 1, 10, 1, 1) if args.smoke else (1.0, 2, 40, 1, 2) if args.quick else (4.0, 4, 100, 6, 10))
    runs: dict[str, list[float]] = {"barrier": [], "aiocollect": [], "ahead": [], "torchrl": []}
    for r in range(args.repeats):
        for name in runs:
            print(f"{name} (run {r + 1}/{args.repeats}) ...", file=sys.stderr)
            if name == "barrier":
                value = barrier_fps(seconds)
            elif name in ("aiocollect", "ahead"):
                value = aiocollect_fps(our_batches, steps, step_ahead=name == "ahead")
            else:
                value = torchrl_fps(their_batches, their_steps)
            if value is not None:
                runs[name].append(value)

    print(f"\n## {NUM_ENVS} coroutine envs, step awaits U({LOW * 1e3:.0f}, {HIGH * 1e3:.0f}) ms: "
          f"latency bound {BOUND:,.0f} frames/s")
    print(f"{'contender':44} {'best fps':>10} {'median':>10} {'/ bound':>8}")
    rows = {"barrier": "barrier: asyncio.gather over all envs per step",
            "aiocollect": "aiocollect Collector, coroutine envs",
            "ahead": "aiocollect Collector, step_ahead=True",
            "torchrl": "TorchRL AsyncBatchedCollector, threading"}
    results = {"environment": env, "bound": BOUND, "contenders": {}}
    for name, label in rows.items():
        values = runs[name]
        if not values:
            print(f"{label:44} {'n/a':>10}")
            continue
        best, median = max(values), statistics.median(values)
        results["contenders"][name] = {"best": best, "median": median, "runs": values}
        print(f"{label:44} {best:10,.0f} {median:10,.0f} {best / BOUND:8.2f}")
    ours = results["contenders"].get("aiocollect", {}).get("best")
    theirs = results["contenders"].get("torchrl", {}).get("best")
    rough = ", not judged: --quick figures are rough" if args.quick else ""
    print(f"\naiocollect / bound: {ours / BOUND:.2f} (goal >= 0.8{rough})")
    ahead = results["contenders"].get("ahead", {}).get("best")
    if ahead:
        print(f"aiocollect step_ahead=True / bound: {ahead / BOUND:.2f} (goal >= 0.9{rough})")
    if theirs:
        print(f"aiocollect / TorchRL AsyncBatchedCollector: {ours / theirs:.2f} (goal > 1{rough})")
    else:  # (its import failed: torchrl_fps)
        print(f"TorchRL's row is n/a: {missing('torchrl')}")
    return finish(results, args)


if __name__ == "__main__":
    sys.exit(main())

"""RayCollector with 2 actors: aiocollect vs TorchRL's RayCollector, same settings.

What is measured
----------------
Frames/s of collecting CartPole-v1 with a random policy through 2 Ray actors on a local Ray
instance (``num_cpus=2``). Each actor runs one collector over 8 CartPole envs;
``frames_per_batch=1600`` per actor, ``sync=False`` (the first ready batch is yielded), and
the driver just counts frames. The same settings for both:

* ``aiocollect``: ``aiocollect.RayCollector([[make] * 8] * 2, None, collector_class="single")``,
  each actor a ``Collector`` over a list of 8 envs;
* ``torchrl``: ``torchrl.collectors.distributed.RayCollector`` with each actor a TorchRL
  ``Collector`` over ``SerialEnv(8, GymEnv("CartPole-v1"))``.

The first batches (actor start, imports, warm-up) are not timed. Each contender runs
``--repeats`` times; the table shows the best and the median, the ratio uses the best.

Usage::

    python benchmarks/bench_ray.py            # full run, ~1.5 min on 2 cores
    python benchmarks/bench_ray.py --quick    # smoke run
    python benchmarks/bench_ray.py --smoke    # --quick's rows, each as brief as can be (the tests')
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import time
import warnings

os.environ.setdefault("RL_WARNINGS", "0")
os.environ.setdefault("RL_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

import gymnasium as gym
from _common import environment, finish, missing, parse_args, require

import aiocollect

ENV_ID = "CartPole-v1"
ENVS = 8
PER_ACTOR = 1600


def make_cartpole() -> gym.Env:
    return gym.make(ENV_ID)


def timed(collector, batches: int) -> float:
    it = iter(collector)
    for _ in range(2):  # both actors' first batches: start-up and warm-up
        next(it)
    frames, start = 0, time.perf_counter()
    for _ in range(batches):
        frames += next(it).numel()
    return frames / (time.perf_counter() - start)


def aiocollect_fps(batches: int, per_actor: int = PER_ACTOR) -> float:
    c = aiocollect.RayCollector([[make_cartpole] * ENVS] * 2, None, frames_per_batch=per_actor, total_frames=-1,
                                collector_class="single", sync=False)
    try:
        return timed(c, batches)
    finally:
        c.shutdown()


def _torchrl_env():
    from torchrl.envs import GymEnv, SerialEnv

    return SerialEnv(ENVS, lambda: GymEnv(ENV_ID))


def torchrl_fps(batches: int, per_actor: int = PER_ACTOR) -> float | None:
    try:
        from torchrl.collectors import Collector
        from torchrl.collectors.distributed import RayCollector
    except ImportError:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = RayCollector([_torchrl_env] * 2, None, frames_per_batch=per_actor, total_frames=10**9,
                         collector_class=Collector, sync=False, remote_configs={"num_cpus": 1})
    try:
        return timed(c, batches)
    finally:
        c.shutdown(shutdown_ray=False)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, "RayCollector, 2 actors: aiocollect vs TorchRL.", "smoke run")
    require("ray", "RayCollector's benchmark")
    import ray

    env = environment()
    print(f"# environment: {env}", file=sys.stderr)
    logging.getLogger("ray").setLevel(logging.ERROR)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ours_batches, their_batches = (1, 1) if args.smoke else (4, 2) if args.quick else (40, 6)
    per_actor = ENVS * 20 if args.smoke else PER_ACTOR  # frames per actor batch
    runs: dict[str, list[float]] = {"aiocollect": [], "torchrl": []}
    try:
        for r in range(args.repeats):
            for name in runs:
                print(f"{name} (run {r + 1}/{args.repeats}) ...", file=sys.stderr)
                value = (aiocollect_fps(ours_batches, per_actor) if name == "aiocollect"
                         else torchrl_fps(their_batches, per_actor))
                if value is not None:
                    runs[name].append(value)
    finally:
        ray.shutdown()
    print(f"\n## RayCollector, 2 actors x {ENVS} CartPole envs, random policy, {per_actor} frames per actor batch")
    print(f"{'contender':40} {'best fps':>10} {'median':>10}")
    results = {"environment": env, "contenders": {}}
    for name, label in (("aiocollect", "aiocollect RayCollector (Collector)"),
                        ("torchrl", "TorchRL RayCollector (Collector, SerialEnv)")):
        values = runs[name]
        if not values:
            print(f"{label:40} {'n/a':>10}")
            continue
        results["contenders"][name] = {"best": max(values), "median": statistics.median(values), "runs": values}
        print(f"{label:40} {max(values):10,.0f} {statistics.median(values):10,.0f}")
    if runs["torchrl"]:
        ratio = max(runs["aiocollect"]) / max(runs["torchrl"])
        results["ratio"] = ratio
        print(f"\naiocollect / TorchRL: {ratio:.1f}x")
    else:  # (its import failed: torchrl_fps)
        print(f"\nTorchRL's row is n/a: {missing('torchrl')}")
    return finish(results, args)


if __name__ == "__main__":
    sys.exit(main())

"""How close the worker collectors come to what the envs allow, and what the main process spends.

Three sections, in one run, every contender round-robin (``--repeats`` runs each; the table
shows the best and the median, ratios use the best):

* **E. CartPole-v1, W workers x 16 envs, random policy** (``--workers``, default 2). The
  *limit* is one core stepping 16 envs in a bare loop (pre-drawn actions, reset when done,
  nothing stored), times the cores the W workers can use. Rows: aiocollect
  ``MultiSyncCollector`` and ``MultiAsyncCollector`` (random actions: each worker takes runs
  of steps, with no round trip per step), and ``MultiAsyncCollector`` with ``lean_policy``
  (a policy that reads the observation: a round trip and a policy call per step); TorchRL
  ``MultiSyncCollector`` with each worker a ``GymWrapper(SyncVectorEnv(16))``, random and
  with ``lean_policy`` (which each TorchRL worker runs itself on its own envs); PufferLib's
  raw ``Multiprocessing`` vector (W workers x 16 envs, no rollout storage; only where
  ``pufferlib`` is installed: ``pip install --no-deps pufferlib-core``, its pinned torch is
  not needed); gymnasium ``AsyncVectorEnv`` of the W*16 CartPole envs (one process each, as
  users write it).
* **P. A pixel env, 2 workers x 8 envs, random policy**: observations ``4x84x84`` uint8, each
  step spins 200 us of CPU. The limit is one core stepping 8 of them, times 2 (or the cores).
* **L. A policy that waits, as a GPU policy's call does** (each call sleeps 0, 0.5 or 1 ms,
  the core free meanwhile), on the pixel env, ``cores - 1`` workers x 8 envs (at least 1):
  ``MultiSyncCollector`` with each worker stepping its envs in two halves in turn (the
  default for a GPU policy when the engine has a core of its own) and without
  (``AIOCOLLECT_PIPELINE=1``/``0``). The halves hide a wait up to about half a step.
* **M. Main-process CPU per frame** for section E's collectors: the CPU time of every thread
  of this process over the timed batches, divided by the frames. With spinning on (the
  default) that includes the time the engine spins, yielding its core, while it waits for
  the workers; ``AIOCOLLECT_SPIN=0`` rows show the work and the system calls alone.

Goals (on 2 cores): E and P collectors >= 0.7 and >= 0.8 of their limits; M <= 0.5 us.

    python benchmarks/bench_engine.py                # ~2 min on 2 cores
    python benchmarks/bench_engine.py --quick        # smoke run, ~20 s
    python benchmarks/bench_engine.py --workers 2 8  # one section E per worker count
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import logging
import os
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import environment, finish

import aiocollect

HAVE_TORCHRL = importlib.util.find_spec("torchrl") is not None
HAVE_PUFFERLIB = importlib.util.find_spec("pufferlib") is not None
E_ENVS, P_ENVS, P_WORKERS = 16, 8, 2
PIXEL_SHAPE, PIXEL_STEP_S, PIXEL_EPISODE = (4, 84, 84), 200e-6, 500


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def make_cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


class PixelEnv(gym.Env):
    """Atari-shaped observations, a fixed CPU cost per step, episodes of 500 steps."""

    observation_space = gym.spaces.Box(0, 255, PIXEL_SHAPE, np.uint8)
    action_space = gym.spaces.Discrete(6)

    def __init__(self):
        self._obs = np.random.default_rng(0).integers(0, 255, PIXEL_SHAPE, dtype=np.uint8)
        self._t = 0

    def reset(self, *, seed=None, options=None):
        self._t = 0
        return self._obs.copy(), {}

    def step(self, action):
        end = time.perf_counter() + PIXEL_STEP_S
        while time.perf_counter() < end:
            pass
        self._t += 1
        self._obs[0, 0, 0] = self._t % 256
        return self._obs.copy(), 1.0, False, self._t >= PIXEL_EPISODE, {}


def limit(make, envs_per_worker: int, workers: int, frames: int) -> float:
    """One core stepping one worker's envs in a bare loop, frames/s, times the usable cores."""
    envs = [make() for _ in range(envs_per_worker)]
    for i, env in enumerate(envs):
        env.reset(seed=i)
    steps = max(20, frames // envs_per_worker)
    actions = [[env.action_space.sample() for env in envs] for _ in range(steps)]
    start = time.perf_counter()
    for row in actions:
        for env, a in zip(envs, row):
            _, _, terminated, truncated, _ = env.step(a)
            if terminated or truncated:
                env.reset()
    one = steps * envs_per_worker / (time.perf_counter() - start)
    for env in envs:
        env.close()
    return one * min(workers, cores())


def timed(collector, batches: int, cpu: dict | None = None) -> float:
    """Frames/s over ``batches`` batches after one untimed; ``cpu['us']``: this process's CPU per frame."""
    it = iter(collector)
    next(it)
    frames = 0
    t0, p0 = time.perf_counter(), time.process_time()
    for _ in range(batches):
        frames += next(it).numel()
    dt = time.perf_counter() - t0
    if cpu is not None:
        cpu["us"] = (time.process_time() - p0) / frames * 1e6
    return frames / dt


def aio(cls_name: str, make, workers: int, envs: int, steps: int, batches: int, cpu: dict | None = None,
        policy=None, policy_device: str | None = None) -> float:
    cls = getattr(aiocollect, cls_name)
    fpb = envs * steps * (workers if cls_name == "MultiSyncCollector" else 1)
    with cls([[make] * envs] * workers, policy, frames_per_batch=fpb, policy_device=policy_device) as c:
        return timed(c, batches, cpu)


def lean_policy(observation):
    """Push the cart towards the pole's lean: a policy that reads the observation, so (unlike
    random actions, which workers take in runs of steps) every step is a round through the
    main process and one batched policy call."""
    return (observation[..., 2] > 0).long()


class WaitingPolicy(torch.nn.Module):
    """Action 0 for every env, after a wait of ``ms`` (``time.sleep``: the core is free, as
    while a GPU computes; a CUDA sync spins on it, which the engine's own core absorbs)."""

    def __init__(self, ms: float):
        super().__init__()
        self.ms = ms

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        if self.ms:
            time.sleep(self.ms / 1000)
        return torch.zeros(observation.shape[0], dtype=torch.long)


def latency_row(workers: int, ms: float, halves: bool, steps: int, batches: int) -> float:
    """Frames/s of ``MultiSyncCollector`` over the pixel env with ``WaitingPolicy(ms)``,
    workers in halves or not (``AIOCOLLECT_PIPELINE``, read when the collector is built)."""
    from tensordict.nn import TensorDictModule

    policy = TensorDictModule(WaitingPolicy(ms), in_keys=["observation"], out_keys=["action"])
    before = os.environ.get("AIOCOLLECT_PIPELINE")
    os.environ["AIOCOLLECT_PIPELINE"] = "1" if halves else "0"
    try:
        return aio("MultiSyncCollector", PixelEnv, workers, P_ENVS, steps, batches, policy=policy)
    finally:
        if before is None:
            del os.environ["AIOCOLLECT_PIPELINE"]
        else:
            os.environ["AIOCOLLECT_PIPELINE"] = before


def puffer_cartpole(buf=None, seed=0):
    import pufferlib.emulation

    return pufferlib.emulation.GymnasiumPufferEnv(env_creator=make_cartpole, buf=buf, seed=seed)


def pufferlib_multiprocessing(workers: int, steps: int, batches: int) -> float:
    """PufferLib's raw vector (``pufferlib.vector.Multiprocessing``, W workers x 16 envs, one
    batch of every env per ``recv``): workers write into shared buffers that this process
    reads; no rollout storage, no trajectory bookkeeping, no TensorDict. Frames/s over
    ``steps * batches`` rounds after a warm-up."""
    import pufferlib.vector

    n = workers * E_ENVS
    vec = pufferlib.vector.make(puffer_cartpole, backend=pufferlib.vector.Multiprocessing, num_envs=n,
                                num_workers=workers, batch_size=n)
    try:
        rng = np.random.default_rng(0)
        actions = [rng.integers(0, 2, n) for _ in range(64)]
        vec.async_reset(0)
        for i in range(100):
            vec.recv()
            vec.send(actions[i % 64])
        rounds = steps * batches
        start = time.perf_counter()
        for i in range(rounds):
            vec.recv()
            vec.send(actions[i % 64])
        return rounds * n / (time.perf_counter() - start)
    finally:
        vec.close()


def torchrl_vector_cartpole(categorical: bool = False):
    from torchrl.envs import GymWrapper

    vec = gym.vector.SyncVectorEnv([make_cartpole] * E_ENVS, autoreset_mode=gym.vector.AutoresetMode.DISABLED)
    return GymWrapper(vec, categorical_action_encoding=categorical)


def torchrl_multisync(workers: int, steps: int, batches: int, lean: bool = False) -> float:
    """TorchRL's ``MultiSyncCollector``, random actions or (``lean``) ``lean_policy``, which
    each of its workers runs on its own envs (TorchRL's design: no round trip per step)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.getLogger("torchrl").setLevel(logging.ERROR)
        from tensordict.nn import TensorDictModule
        from torchrl.collectors import MultiSyncCollector

        fpb = workers * E_ENVS * steps
        make = functools.partial(torchrl_vector_cartpole, categorical=True) if lean else torchrl_vector_cartpole
        policy = TensorDictModule(lean_policy, in_keys=["observation"], out_keys=["action"]) if lean else None
        c = MultiSyncCollector([make] * workers, policy, frames_per_batch=fpb,
                               total_frames=fpb * (batches + 1))
        try:
            return timed(c, batches)
        finally:
            c.shutdown()


def gym_async(workers: int, steps: int) -> float:
    """gymnasium ``AsyncVectorEnv`` with W*16 CartPole envs (one process each), random actions."""
    venv = gym.vector.AsyncVectorEnv([make_cartpole] * (workers * E_ENVS))
    try:
        venv.reset(seed=0)
        actions = [venv.action_space.sample() for _ in range(steps + 10)]
        for a in actions[:10]:
            venv.step(a)
        t0 = time.perf_counter()
        for a in actions[10:]:
            venv.step(a)
        return steps * workers * E_ENVS / (time.perf_counter() - t0)
    finally:
        venv.close()


def main_cpu_row(cls_name: str, workers: int, steps: int, batches: int, spin: str) -> float:
    """In a subprocess (``AIOCOLLECT_SPIN`` is read at construction): main-process CPU us/frame."""
    code = (f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
            f"import bench_engine as b, torch; torch.set_num_threads(1); cpu = {{}}; "
            f"b.aio({cls_name!r}, b.make_cartpole, {workers}, b.E_ENVS, {steps}, {batches}, cpu); print(cpu['us'])")
    env = dict(os.environ, AIOCOLLECT_SPIN=spin)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return float(out.stdout.strip().splitlines()[-1])


class Row:
    def __init__(self, section: str, name: str, run: Callable[[], float], unit: str = "frames/s"):
        self.section, self.name, self.run, self.unit = section, name, run, unit
        self.runs: list[float] = []
        self.error: str | None = None

    @property
    def best(self) -> float | None:
        if not self.runs:
            return None
        return min(self.runs) if self.unit.startswith("us") else max(self.runs)


def run_rows(rows: list[Row], repeats: int, after: Callable[[], None] | None = None) -> None:
    """Each row ``repeats`` times, round-robin (machine noise hits every row alike); an
    exception is kept as the row's error. ``after()`` runs after each row."""
    for i in range(repeats):
        for r in rows:
            print(f"  [{i + 1}/{repeats}] {r.section} {r.name}", file=sys.stderr, flush=True)
            try:
                r.runs.append(r.run())
            except Exception as exc:  # noqa: BLE001 - reported in the table
                r.error = f"{type(exc).__name__}: {exc}"
            if after is not None:
                after()


def rows_for(args) -> list[Row]:
    quick = args.quick
    e_steps, e_batches = (25, 3) if quick else (100, 40)
    p_steps, p_batches = (10, 2) if quick else (50, 12)
    rows: list[Row] = []
    for w in args.workers:
        s = f"E{w}"
        rows.append(Row(s, "limit", lambda w=w: limit(make_cartpole, E_ENVS, w, 2_000 if quick else 40_000)))
        for cls in ("MultiSyncCollector", "MultiAsyncCollector"):
            rows.append(Row(s, f"aiocollect {cls} {w}x{E_ENVS}",
                            lambda cls=cls, w=w: aio(cls, make_cartpole, w, E_ENVS, e_steps, e_batches)))
        rows.append(Row(s, f"aiocollect MultiAsyncCollector {w}x{E_ENVS}, lean_policy",
                        lambda w=w: aio("MultiAsyncCollector", make_cartpole, w, E_ENVS, e_steps, e_batches,
                                        policy=lean_policy)))
        if HAVE_TORCHRL:
            rows.append(Row(s, f"TorchRL MultiSync {w}x GymWrapper(SyncVec16)",
                            lambda w=w: torchrl_multisync(w, e_steps, max(2, e_batches // 4))))
            rows.append(Row(s, f"TorchRL MultiSync {w}x GymWrapper(SyncVec16), lean_policy",
                            lambda w=w: torchrl_multisync(w, e_steps, max(2, e_batches // 4), lean=True)))
        if HAVE_PUFFERLIB:
            rows.append(Row(s, f"PufferLib Multiprocessing {w}x{E_ENVS} (raw vector)",
                            lambda w=w: pufferlib_multiprocessing(w, e_steps, e_batches)))
        if not quick:  # W * 16 processes to start: too slow for a smoke run
            rows.append(Row(s, f"gymnasium AsyncVectorEnv({w * E_ENVS})", lambda w=w: gym_async(w, 1_000)))
    rows.append(Row("P", "limit", lambda: limit(PixelEnv, P_ENVS, P_WORKERS, 400 if quick else 4_000)))
    for cls in ("MultiSyncCollector", "MultiAsyncCollector"):
        rows.append(Row("P", f"aiocollect {cls} {P_WORKERS}x{P_ENVS}",
                        lambda cls=cls: aio(cls, PixelEnv, P_WORKERS, P_ENVS, p_steps, p_batches)))
    lw = max(1, cores() - 1)
    rows.append(Row("L", "limit", lambda: limit(PixelEnv, P_ENVS, lw, 400 if quick else 4_000)))
    for ms in (0.5,) if quick else (0.0, 0.5, 1.0):
        for halves in (True, False):
            name = f"MultiSyncCollector {lw}x{P_ENVS}, wait {ms:.1f} ms, {'halves' if halves else 'whole'}"
            rows.append(Row("L", name, lambda ms=ms, halves=halves: latency_row(lw, ms, halves, p_steps, p_batches)))
    w = args.workers[0]
    for cls in ("MultiSyncCollector", "MultiAsyncCollector"):
        for spin in ("1",) if quick else ("1", "0"):
            rows.append(Row("M", f"{cls} {w}x{E_ENVS}, AIOCOLLECT_SPIN={spin}",
                            lambda cls=cls, spin=spin: main_cpu_row(cls, w, e_steps, e_batches, spin), "us/frame"))
    return rows


def report(rows: list[Row], args) -> dict:
    titles = {"P": f"P. Pixel env {PIXEL_SHAPE} uint8, {PIXEL_STEP_S * 1e6:.0f} us CPU per step, "
                   f"{P_WORKERS} workers x {P_ENVS} envs, random policy",
              "L": f"L. A policy that waits (as a GPU's call does), pixel env {max(1, cores() - 1)} workers x "
                   f"{P_ENVS} envs, workers in halves or whole",
              "M": "M. Main-process CPU per frame (all its threads), CartPole"}
    results = []
    for section in dict.fromkeys(r.section for r in rows):
        title = titles.get(section) or f"E. CartPole-v1, {section[1:]} workers x {E_ENVS} envs, random policy"
        print(f"\n{title}\n")
        part = [r for r in rows if r.section == section]
        lim = next((r.best for r in part if r.name == "limit"), None)
        print(f"{'name':52s} | {'best':>12s} | {'median':>12s} | {'vs limit':>8s}")
        print("-" * 95)
        for r in part:
            med = statistics.median(r.runs) if r.runs else None
            ratio = f"{r.best / lim:.2f}" if lim and r.best and r.unit == "frames/s" else ""
            if r.error:
                print(f"{r.name:52s} | error: {r.error.splitlines()[-1][:60]}")
            else:
                digits = 2 if r.unit.startswith("us") else 1  # (us per frame: tenths hide what changes)
                print(f"{r.name:52s} | {r.best:12,.{digits}f} | {med:12,.{digits}f} | {ratio:>8s}   {r.unit}")
            results.append({"section": section, "name": r.name, "unit": r.unit, "runs": r.runs,
                            "best": r.best, "limit_ratio": (r.best / lim) if lim and r.best and r.unit == "frames/s"
                            else None, "error": r.error})
    return {"environment": environment(), "cores": cores(), "results": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run, ~20 s")
    parser.add_argument("--repeats", type=int, default=None, help="runs per row (default 3; 1 with --quick)")
    parser.add_argument("--workers", type=int, nargs="+", default=[2], help="worker counts of section E")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    args = parser.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 3)
    torch.set_num_threads(1)
    env = environment()
    print(f"aiocollect {env['aiocollect']} | torch {env['torch']} | torchrl {env['torchrl']} | "
          f"python {env['python']} | {cores()} cores | load {env['load_average_1min']:.2f}")
    rows = rows_for(args)
    run_rows(rows, repeats)
    print()
    return finish(report(rows, args), args)


if __name__ == "__main__":
    sys.exit(main())

"""How close the worker collectors come to what the envs allow, and what the main process spends.

Sections, in one run, every contender round-robin (``--repeats`` runs each; the table shows
the best and the median, ratios use the best):

* **E. CartPole-v1, W workers x 16 envs, an MLP policy that reads the observation** (the
  headline: how everyone trains; ``--workers``, default 2). The policy is a
  ``TensorDictModule`` over a 4-64-2 MLP (``Tanh``, ``argmax``), ``MLPPolicy``. The *limit*
  is one core stepping 16 envs in a bare loop (pre-drawn actions, reset when done, nothing
  stored), times the cores the W workers can use; the *SyncVectorEnv limit* is the same with
  the 16 envs in a gymnasium ``SyncVectorEnv`` (what the goals below were first set against;
  the bare loop is about 1.3x faster, so "vs limit" is the stricter ratio). Rows: aiocollect ``MultiSyncCollector``
  and ``MultiAsyncCollector`` as a user gets them (with as many workers as cores, each
  worker runs its own copy of the policy: ``_policies.actor``), the same with the
  policy in the main process, batched over the workers (``AIOCOLLECT_POLICY_IN_WORKERS=0``,
  "central"), and TorchRL's ``MultiSyncCollector`` (each worker a
  ``GymWrapper(SyncVectorEnv(16))`` running the same MLP on its own envs: TorchRL's design).
  Two *ceilings* say what the MLP itself leaves: W processes stepping 16 envs each in the
  limit's bare loop with the MLP's actions, all at once (no engine, no storage), at their own
  pace or in lockstep, meeting every batch (``ceiling``); each collector's MLP rows are also
  given as a ratio to its ceiling (the sync ones to the lockstep one). Where ``pufferlib`` is
  installed, PufferLib's ``Multiprocessing`` vector with the MLP in this process on each batch
  it returns (all the envs, or one worker's while the others step), as its training loop does.
* **R. The same envs with random actions** (the warm-up, not training): aiocollect's two
  collectors (each worker takes runs of steps, no round trip per step), TorchRL's, PufferLib's
  raw ``Multiprocessing`` vector (no rollout storage; only where ``pufferlib`` is installed:
  ``pip install --no-deps pufferlib-core``), gymnasium ``AsyncVectorEnv`` of the W*16 envs
  (one process each, as users write it; full runs only).
* **V. EnvPool's CartPole-v1** (C++ envs on EnvPool's own threads; only where ``envpool`` is
  installed, a dev dependency on Linux x86-64), W x 16 envs, the same MLP: EnvPool's own loops
  as its users write them, synchronous (the W*16 envs stepped together on W threads, the MLP on
  all of them between steps) and asynchronous (``batch_size=16``: the MLP acts on each 16 envs
  done while the others step), against aiocollect's two collectors over W EnvPools of 16 envs
  on one thread each. The limit is EnvPool's synchronous loop with random actions. The envs
  are not gymnasium's: compare within the section, not with E.
* **P. A pixel env, 2 workers x 8 envs, random policy**: observations ``4x84x84`` uint8, each
  step spins 200 us of CPU. The limit is one core stepping 8 of them, times 2 (or the cores).
* **L. A policy that waits, as a GPU policy's call does** (each call sleeps 0, 0.5 or 1 ms,
  the core free meanwhile), on the pixel env, ``cores - 1`` workers x 8 envs (at least 1):
  ``MultiSyncCollector`` with each worker stepping its envs in two halves in turn (the
  default for a GPU policy when the engine has a core of its own) and without
  (``AIOCOLLECT_PIPELINE=1``/``0``). The halves hide a wait up to about half a step.
* **M. Main-process CPU per frame** at the first W: the CPU time of every thread of this
  process over the timed batches, divided by the frames, with the MLP (as a user gets it,
  and central) and random actions. With spinning on (the default where the engine has a
  core of its own) that includes the time the engine spins, yielding its core, while it
  waits for the workers; ``AIOCOLLECT_SPIN=0`` rows (full runs) show the work alone.
* **C. Engine capacity, the policy central**: zero-cost envs (``ZeroEnv``: a ``(4,)`` observation
  returned as it is, never done) and a zero-cost policy (``zero_policy``: zeros), so all that
  is left is the engine; ``MultiSyncCollector`` with ``AIOCOLLECT_POLICY_IN_WORKERS=0``, the
  main process's CPU per frame (as M), at 1 worker x 256 envs and 15 workers x 16, spinning
  off (the work alone: on 2 cores this says what one engine core serves on 16). Two more
  rows say how much slower this machine runs code that has just woken up, which is what the
  engine does at every round here: ``wake_probe``'s few microseconds of torch and numpy,
  back to back and right after a 1 ms sleep. On the 2-core VM the second is 4-6x the first,
  and the same round costs 45 us of CPU with the engine kept awake (spinning) against 85 us
  after each wait for the worker (2026-12-04): C's figures here carry that penalty.
* **K. The hand-off, 1 worker x 32 CartPole envs, the policy central**: the zero-cost policy
  and the MLP against the limit of one core stepping 32 envs (the engine has the other core).
* **W. Memory of one worker process** (resident set, MiB) at the first W: random actions
  (the lean worker: no torch), the MLP in the workers (each imports torch), and TorchRL's.

Goals (on 2 cores): E's aiocollect rows >= 0.6 of the SyncVectorEnv limit and >= 5x TorchRL; R and P
collectors >= 0.7 and >= 0.8 of their limits; M with the MLP <= 1.5 us; C <= 0.3 us at 1 x 256 and
<= 1.0 us at 15 x 16; K >= 0.85 of the limit with the zero-cost policy, >= 0.7 with the MLP.

Measured for C (issue 54: the futex bell, ``_workers.bell``, and rounds and bookings over lanes at
different columns through index arrays), ``--quick``, the 2-core VM under load 15-17 from other
programs, the code before and after side by side, two runs each: 15 x 16 3.31 and 2.56 before,
2.01 and 2.04 after; 1 x 256 0.81 and 1.00 before, 0.75 and 0.71 after. Six 3-second runs each,
alternating, at load 19: 15 x 16 median 2.13 before, 2.83 after (at such a load the engine's
user time swings 2.5-4.2 us/frame from one run to the next); its system time fell from 0.56-0.97
to 0.34-0.46 us/frame and its involuntary context switches from 0.2 to 0.06 per worker-step in
every run (one futex wake per round instead of a socket ``send`` per worker and step). Neither C
goal is reached; K could not be measured at that load (its limit row moved between 19k and 48k
frames/s from one run to the next). Its hang review, the bell alone against the code without it,
alternating, at load 2-13 from other programs: C in full (3 runs of 40 batches each), three
pairs, 15 x 16 best 1.02, 1.21, 1.03 with the bell against 1.15, 1.20, 1.24 without; 1 x 256
0.30, 0.32, 0.26 against 0.29, 0.30, 0.30. ``--quick``, six pairs: 15 x 16 0.92-1.36 (median
1.00) against 1.00-1.60 (median 1.26), lower in five pairs of six; 1 x 256 the same (medians
0.33 and 0.32); K the same within its noise (zero-cost 0.49-0.69 against 0.28-0.60 of the limit).
Against the code after the per-batch delivery work, two more full pairs at load 7-10: 15 x 16 0.93
and 0.88 against 0.95 and 1.03; 1 x 256 0.34 and 0.34 against 0.30 and 0.31. Over the five full
pairs, 15 x 16 is 8% lower with the bell (from 17% lower to 1% higher), 1 x 256 4% higher (from
13% lower to 13% higher: one worker gains nothing from a round's single wake).

    python benchmarks/bench_engine.py                # a few minutes on 2 cores
    python benchmarks/bench_engine.py --quick        # smoke run, about a minute
    python benchmarks/bench_engine.py --smoke        # --quick, TorchRL's workers forked, ours warm (the tests')
    python benchmarks/bench_engine.py --workers 2 8  # sections E, R and V per worker count
    python benchmarks/bench_engine.py --sections E M # only the headline and the main process's CPU
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import logging
import multiprocessing
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
from _common import add_smoke_argument, environment, envpool_cartpole, finish, start_smoke, torchrl_note

import aiocollect

HAVE_TORCHRL = importlib.util.find_spec("torchrl") is not None
HAVE_PUFFERLIB = importlib.util.find_spec("pufferlib") is not None
HAVE_ENVPOOL = importlib.util.find_spec("envpool") is not None
warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32")  # (EnvPool's spaces)
E_ENVS, P_ENVS, P_WORKERS = 16, 8, 2
PIXEL_SHAPE, PIXEL_STEP_S, PIXEL_EPISODE = (4, 84, 84), 200e-6, 500


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


make_cartpole = functools.partial(gym.make, "CartPole-v1")
"""A CartPole factory that workers unpickle without importing this module (and torch with it)."""


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


ENVPOOL_SYNC, ENVPOOL_ASYNC = "EnvPool's own loop, synchronous, MLP", "EnvPool's own loop, asynchronous (batch 16), MLP"
"""Section V's peer rows: EnvPool's own loops with the MLP (``envpool_mlp``)."""

VECTOR_LIMIT = "limit, the envs in a SyncVectorEnv"
"""The row of ``vector_limit``, the second limit of sections E and R."""


def vector_limit(make, envs_per_worker: int, workers: int, frames: int) -> float:
    """``limit`` with the envs in a gymnasium ``SyncVectorEnv`` stepped in a bare loop (its
    own autoreset, batched actions): what a user's vector env reaches, and the limit the
    speed goals were first set against. The bare loop of ``limit`` is about a third faster."""
    venv = gym.vector.SyncVectorEnv([make] * envs_per_worker)
    venv.reset(seed=0)
    steps = max(20, frames // envs_per_worker)
    actions = [venv.action_space.sample() for _ in range(steps)]
    start = time.perf_counter()
    for a in actions:
        venv.step(a)
    one = steps * envs_per_worker / (time.perf_counter() - start)
    venv.close()
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
        policy=None, policy_device: str | None = None, in_workers: str | None = None) -> float:
    """aiocollect's ``cls_name`` over ``workers`` x ``envs`` envs; ``in_workers``: the
    ``AIOCOLLECT_POLICY_IN_WORKERS`` it is built with (``None``: as the user's environment says)."""
    cls = getattr(aiocollect, cls_name)
    fpb = envs * steps * (workers if cls_name == "MultiSyncCollector" else 1)
    with env_var("AIOCOLLECT_POLICY_IN_WORKERS", in_workers), \
            cls([[make] * envs] * workers, policy, frames_per_batch=fpb, policy_device=policy_device) as c:
        return timed(c, batches, cpu)


class MLP(torch.nn.Module):
    """A 4-64-2 MLP whose action is the argmax of its two outputs: the size of a CartPole
    PPO or DQN network, a policy that reads the observation."""

    def __init__(self):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))
        with torch.no_grad():
            for p in self.net.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.net(observation).argmax(-1)


class ZeroEnv(gym.Env):
    """An env that costs nothing to step (section C): its observation returned as it is, never done."""

    observation_space = gym.spaces.Box(-1, 1, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self._obs = np.zeros(4, np.float32)

    def reset(self, *, seed=None, options=None):
        return self._obs, {}

    def step(self, action):
        return self._obs, 0.0, False, False, {}


def zero_policy(observation: torch.Tensor) -> torch.Tensor:
    """A policy that costs (nearly) nothing (sections C and K): action 0 for every env."""
    return torch.zeros(len(observation), dtype=torch.int64)


def capacity_row(workers: int, envs: int, batches: int) -> float:
    """In a subprocess (``AIOCOLLECT_SPIN`` is read at construction): main-process CPU us/frame
    of ``MultiSyncCollector`` over ``workers`` x ``envs`` ``ZeroEnv``s, ``zero_policy`` central."""
    steps = max(16, 4096 // (workers * envs))
    code = (f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
            f"import bench_engine as b, torch; torch.set_num_threads(1); cpu = {{}}; "
            f"b.aio('MultiSyncCollector', b.ZeroEnv, {workers}, {envs}, {steps}, {batches}, cpu, "
            f"policy=b.zero_policy, in_workers='0'); print(cpu['us'])")
    env = dict(os.environ, AIOCOLLECT_SPIN="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return float(out.stdout.strip().splitlines()[-1])


def wake_probe(after_sleep: bool, calls: int = 2_000) -> float:
    """CPU microseconds of one small step of torch and numpy (what a round does a few dozen
    of: a tensor made, viewed as numpy, reduced), back to back or each right after a 1 ms
    sleep (section C: what waking up costs on this machine)."""
    obs = torch.zeros(256, 4)

    def step() -> None:
        zero_policy(obs).numpy().max()

    for _ in range(100):
        step()
    spent = 0
    for _ in range(calls):
        if after_sleep:
            time.sleep(1e-3)
        t = time.thread_time_ns()
        step()
        spent += time.thread_time_ns() - t
    return spent / calls / 1e3


def mlp_policy():
    """``MLP`` as users hand it over: a ``TensorDictModule`` reading ``"observation"``."""
    from tensordict.nn import TensorDictModule

    return TensorDictModule(MLP(), in_keys=["observation"], out_keys=["action"])


def _bare_mlp_process(barrier, steps: int, batches: int, counts, stop) -> None:
    """One process of ``ceiling``: ``E_ENVS`` CartPoles in ``limit``'s bare loop, each step's
    actions from ``MLP`` on the stacked observations. Once built it meets the others at
    ``barrier``; then, in lockstep (``counts is None``), takes ``batches`` times ``steps``
    steps, meeting them again after each ``steps``; otherwise it steps until ``stop`` is set,
    counting its steps in ``counts``."""
    try:
        torch.set_num_threads(1)
        torch.set_grad_enabled(False)
        envs = [make_cartpole() for _ in range(E_ENVS)]
        obs = [env.reset(seed=i)[0] for i, env in enumerate(envs)]
        mlp = MLP()

        def step() -> None:
            actions = mlp(torch.from_numpy(np.stack(obs))).tolist()
            for i, (env, a) in enumerate(zip(envs, actions)):
                o, _, terminated, truncated, _ = env.step(a)
                obs[i] = env.reset()[0] if terminated or truncated else o

        for _ in range(20):  # (torch's first calls are slow: not in the timed part)
            step()
        barrier.wait()
        if counts is None:
            for _ in range(batches):
                for _ in range(steps):
                    step()
                barrier.wait()
        else:
            while not stop.value:
                step()
                counts.value += 1
    except BaseException:
        barrier.abort()  # (the others, and the caller, stop waiting: a BrokenBarrierError)
        raise


CEILINGS = {True: "ceiling: bare loops + MLP at once, in lockstep",
            False: "ceiling: bare loops + MLP at once, own pace"}
"""The rows of ``ceiling``; ``report`` gives each collector's MLP row as a ratio to its own:
``MultiSyncCollector``'s to the lockstep one, ``MultiAsyncCollector``'s to the other."""


def ceiling(workers: int, steps: int, batches: int, lockstep: bool) -> float:
    """What ``workers`` processes stepping ``E_ENVS`` CartPoles each with the MLP reach *at
    the same time*, frames/s: no engine, no storage, no batch, nothing sent between them.

    ``lockstep``: ``batches`` batches of ``steps`` steps, the processes meeting at a barrier
    after each, as a sync collector's workers must (each env takes its share of a batch, the
    next batch starts when the slowest is done): the ceiling of ``MultiSyncCollector``'s row.
    Otherwise each steps at its own pace, and the steps all of them took in a fixed time
    (about as long as the lockstep batches take) are counted: the ceiling of
    ``MultiAsyncCollector``'s. Unlike the limits (one core measured alone, times the cores),
    this sees what the machine gives W processes at once, and what waiting for the slowest
    costs on it."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(workers + 1)
    counts = None if lockstep else [ctx.Value("q", 0, lock=False) for _ in range(workers)]
    stop = ctx.Value("b", 0, lock=False)
    procs = [ctx.Process(target=_bare_mlp_process, daemon=True,
                         args=(barrier, steps, batches, None if counts is None else counts[i], stop))
             for i in range(workers)]
    for p in procs:
        p.start()
    try:
        barrier.wait(timeout=300)  # every process built its envs and warmed its MLP
        start = time.perf_counter()
        if lockstep:
            for _ in range(batches):
                barrier.wait(timeout=300)
            frames = workers * batches * steps * E_ENVS
        else:
            time.sleep(max(0.5, batches * steps / 2_500))
            frames = sum(c.value for c in counts) * E_ENVS
        elapsed = time.perf_counter() - start
    finally:
        stop.value = 1
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    if any(p.exitcode for p in procs):
        raise RuntimeError(f"ceiling: a process failed (exit codes {[p.exitcode for p in procs]})")
    return frames / elapsed


@contextlib.contextmanager
def env_var(name: str, value: str | None):
    """``os.environ[name]`` set to ``value`` (``None``: left as it is) for the block: the
    engine's switches are read when a collector is built."""
    before = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


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


def pufferlib_multiprocessing(workers: int, steps: int, batches: int, batch: int | None = None,
                              mlp: bool = False) -> float:
    """PufferLib's raw vector (``pufferlib.vector.Multiprocessing``, W workers x 16 envs):
    workers write into shared buffers that this process reads; no rollout storage, no
    trajectory bookkeeping, no TensorDict. Each ``recv`` gives ``batch`` envs (default all of
    them; one worker's while the others step), acted on with pre-drawn random actions or
    (``mlp``) with ``MLP`` here, as PufferLib's training loop does. Frames/s over ``steps *
    batches`` batches of all the envs after a warm-up."""
    import pufferlib.vector

    n = workers * E_ENVS
    batch = batch or n
    vec = pufferlib.vector.make(puffer_cartpole, backend=pufferlib.vector.Multiprocessing, num_envs=n,
                                num_workers=workers, batch_size=batch)
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    drawn = [rng.integers(0, 2, batch) for _ in range(64)]
    policy = MLP() if mlp else None

    def act(i: int, obs: np.ndarray) -> np.ndarray:
        return drawn[i % 64] if policy is None else policy(torch.from_numpy(obs)).numpy()

    try:
        with torch.no_grad():
            vec.async_reset(0)
            for i in range(100):
                vec.send(act(i, vec.recv()[0]))
            frames, total, i = 0, steps * batches * n, 0
            start = time.perf_counter()
            while frames < total:
                obs = vec.recv()[0]
                vec.send(act(i, obs))
                frames += len(obs)
                i += 1
            return frames / (time.perf_counter() - start)
    finally:
        vec.close()


def torchrl_vector_cartpole(categorical: bool = False):
    from torchrl.envs import GymWrapper

    vec = gym.vector.SyncVectorEnv([make_cartpole] * E_ENVS, autoreset_mode=gym.vector.AutoresetMode.DISABLED)
    return GymWrapper(vec, categorical_action_encoding=categorical)


def torchrl_multisync(workers: int, steps: int, batches: int, mlp: bool = False) -> float:
    """TorchRL's ``MultiSyncCollector``, random actions or (``mlp``) ``mlp_policy``, which
    each of its workers runs on its own envs (TorchRL's design: no round trip per step)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.getLogger("torchrl").setLevel(logging.ERROR)
        from torchrl.collectors import MultiSyncCollector

        fpb = workers * E_ENVS * steps
        make = functools.partial(torchrl_vector_cartpole, categorical=True) if mlp else torchrl_vector_cartpole
        c = MultiSyncCollector([make] * workers, mlp_policy() if mlp else None, frames_per_batch=fpb,
                               total_frames=fpb * (batches + 1))
        try:
            return timed(c, batches)
        finally:
            c.shutdown()


def envpool_limit(workers: int, frames: int) -> float:
    """Section V's limit: EnvPool's CartPole-v1, ``workers * E_ENVS`` envs on ``workers``
    threads, synchronous, stepped in a bare loop with pre-drawn random actions (every row
    counted, its autoreset rows too: random episodes last about 20 steps)."""
    n = workers * E_ENVS
    venv = envpool_cartpole(n, workers)
    try:
        venv.reset()
        steps = max(20, frames // n)
        rng = np.random.default_rng(0)
        actions = [rng.integers(0, 2, n) for _ in range(64)]
        start = time.perf_counter()
        for i in range(steps):
            venv.step(actions[i % 64])
        return steps * n / (time.perf_counter() - start)
    finally:
        venv.close()


def envpool_mlp(workers: int, frames: int, batch: int | None = None) -> float:
    """EnvPool's own loop with ``MLP`` on its observations: synchronous (``workers * E_ENVS``
    envs stepped together), or asynchronous (``batch``: EnvPool's ``batch_size``, each
    ``recv`` the first ``batch`` envs done, acted on while the others step), on ``workers``
    threads, the MLP here on one. What EnvPool's users write; no storage, no trajectory ids.
    Frames/s of real transitions: EnvPool resets a finished env at its next step (its
    autoreset), a row that is not a transition and is not counted (aiocollect's batches have
    none)."""
    n = workers * E_ENVS
    venv = envpool_cartpole(n, workers, batch)
    torch.set_num_threads(1)
    mlp = MLP()
    was_done = np.zeros(n, dtype=bool)  # (an env's next row is its autoreset)
    try:
        with torch.no_grad():
            if batch is None:
                obs, _ = venv.reset()

                def step() -> int:
                    nonlocal obs
                    obs, _, terminated, truncated, _ = venv.step(mlp(torch.from_numpy(obs)).numpy())
                    real = n - int(was_done.sum())
                    np.logical_or(terminated, truncated, out=was_done)
                    return real
            else:
                venv.async_reset()

                def step() -> int:
                    obs, _, terminated, truncated, info = venv.recv()
                    ids = info["env_id"]
                    real = len(ids) - int(was_done[ids].sum())
                    was_done[ids] = terminated | truncated
                    venv.send(mlp(torch.from_numpy(obs)).numpy(), ids)
                    return real
            for _ in range(20):
                step()
            done, start = 0, time.perf_counter()
            while done < frames:
                done += step()
            return done / (time.perf_counter() - start)
    finally:
        venv.close()


def aio_envpool(cls_name: str, workers: int, steps: int, batches: int) -> float:
    """aiocollect's ``cls_name`` over ``workers`` EnvPools of ``E_ENVS`` envs on one thread
    each, with ``mlp_policy`` (where the collector's rule puts it: in the workers)."""
    cls = getattr(aiocollect, cls_name)
    fpb = E_ENVS * steps * (workers if cls_name == "MultiSyncCollector" else 1)
    with cls([envpool_cartpole] * workers, mlp_policy(), frames_per_batch=fpb) as c:
        return timed(c, batches)


def rss_mib(pid: int) -> float:
    """Resident memory of process ``pid``, MiB (Linux)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def worker_rss(kind: str, workers: int) -> float:
    """MiB of resident memory of one worker process after a few batches: aiocollect's with
    random actions (``"random"``) or the MLP in the workers (``"mlp"``), or TorchRL's with
    the MLP (``"torchrl"``); the largest of the workers."""
    fpb = workers * E_ENVS * 8
    if kind == "torchrl":
        import psutil  # (torchrl needs it)
        from torchrl.collectors import MultiSyncCollector

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            c = MultiSyncCollector([functools.partial(torchrl_vector_cartpole, categorical=True)] * workers,
                                   mlp_policy(), frames_per_batch=fpb, total_frames=-1)
            try:
                it = iter(c)
                for _ in range(3):
                    next(it)
                kids = psutil.Process().children(recursive=True)
                return max(k.memory_info().rss for k in kids) / 2**20
            finally:
                c.shutdown()
    policy = mlp_policy() if kind == "mlp" else None
    with env_var("AIOCOLLECT_POLICY_IN_WORKERS", "1" if kind == "mlp" else None), \
            aiocollect.MultiSyncCollector([[make_cartpole] * E_ENVS] * workers, policy, frames_per_batch=fpb) as c:
        it = iter(c)
        for _ in range(3):
            next(it)
        return max(rss_mib(w.pid) for w in c.statistics().workers)


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


def main_cpu_row(cls_name: str, workers: int, steps: int, batches: int, spin: str, policy: str | None,
                 in_workers: str | None) -> float:
    """In a subprocess (``AIOCOLLECT_SPIN`` is read at construction): main-process CPU
    us/frame, with random actions or (``policy="mlp"``) ``mlp_policy``."""
    make_policy = "b.mlp_policy()" if policy == "mlp" else "None"
    code = (f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
            f"import bench_engine as b, torch; torch.set_num_threads(1); cpu = {{}}; "
            f"b.aio({cls_name!r}, b.make_cartpole, {workers}, b.E_ENVS, {steps}, {batches}, cpu, "
            f"policy={make_policy}, in_workers={in_workers!r}); print(cpu['us'])")
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
        return min(self.runs) if self.unit in ("us/frame", "us", "MiB") else max(self.runs)


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
    quick = args.quick  # (--smoke keeps --quick's sizes: its rows measure for a fraction of a second
    # already, start-up is the rest, and shorter ones would make the ratios to the limits noisier)
    e_steps, e_batches = (25, 3) if quick else (100, 40)
    limit_frames = 2_000 if quick else 128_000  # (about a second a core: shorter, it catches a fast spell)
    p_steps, p_batches = (10, 2) if quick else (50, 12)
    rows: list[Row] = []
    for w in args.workers:
        s = f"E{w}"
        rows.append(Row(s, "limit", lambda w=w: limit(make_cartpole, E_ENVS, w, limit_frames)))
        rows.append(Row(s, VECTOR_LIMIT, lambda w=w: vector_limit(make_cartpole, E_ENVS, w, limit_frames)))
        for lockstep in (True, False):
            rows.append(Row(s, CEILINGS[lockstep], lambda w=w, lockstep=lockstep:
                            ceiling(w, e_steps, e_batches, lockstep)))
        for cls in ("MultiSyncCollector", "MultiAsyncCollector"):
            rows.append(Row(s, f"aiocollect {cls} {w}x{E_ENVS}, MLP",
                            lambda cls=cls, w=w: aio(cls, make_cartpole, w, E_ENVS, e_steps, e_batches,
                                                     policy=mlp_policy())))
        for cls in ("MultiSyncCollector", "MultiAsyncCollector"):
            rows.append(Row(s, f"aiocollect {cls} {w}x{E_ENVS}, MLP central",
                            lambda cls=cls, w=w: aio(cls, make_cartpole, w, E_ENVS, e_steps, e_batches,
                                                     policy=mlp_policy(), in_workers="0")))
        if HAVE_TORCHRL:
            rows.append(Row(s, f"TorchRL MultiSync {w}x GymWrapper(SyncVec16), MLP",
                            lambda w=w: torchrl_multisync(w, e_steps, max(2, e_batches // 4), mlp=True)))
        if HAVE_PUFFERLIB:
            for batch in (w * E_ENVS, E_ENVS):
                rows.append(Row(s, f"PufferLib Multiprocessing {w}x{E_ENVS}, MLP here, batch {batch}",
                                lambda w=w, batch=batch: pufferlib_multiprocessing(w, e_steps, max(2, e_batches // 4),
                                                                                   batch, mlp=True)))
        s = f"R{w}"
        rows.append(Row(s, "limit", lambda w=w: limit(make_cartpole, E_ENVS, w, limit_frames)))
        rows.append(Row(s, VECTOR_LIMIT, lambda w=w: vector_limit(make_cartpole, E_ENVS, w, limit_frames)))
        for cls in ("MultiSyncCollector", "MultiAsyncCollector"):
            rows.append(Row(s, f"aiocollect {cls} {w}x{E_ENVS}",
                            lambda cls=cls, w=w: aio(cls, make_cartpole, w, E_ENVS, e_steps, e_batches)))
        if HAVE_TORCHRL:
            rows.append(Row(s, f"TorchRL MultiSync {w}x GymWrapper(SyncVec16)",
                            lambda w=w: torchrl_multisync(w, e_steps, max(2, e_batches // 4))))
        if HAVE_PUFFERLIB:
            rows.append(Row(s, f"PufferLib Multiprocessing {w}x{E_ENVS} (raw vector)",
                            lambda w=w: pufferlib_multiprocessing(w, e_steps, e_batches)))
        if not quick:  # W * 16 processes to start: too slow for a smoke run
            rows.append(Row(s, f"gymnasium AsyncVectorEnv({w * E_ENVS})", lambda w=w: gym_async(w, 1_000)))
    if HAVE_ENVPOOL:
        for w in args.workers:
            s = f"V{w}"
            rows.append(Row(s, "limit", lambda w=w: envpool_limit(w, limit_frames)))
            rows.append(Row(s, ENVPOOL_SYNC, lambda w=w: envpool_mlp(w, e_steps * e_batches * w * E_ENVS)))
            rows.append(Row(s, ENVPOOL_ASYNC, lambda w=w: envpool_mlp(w, e_steps * e_batches * w * E_ENVS,
                                                                      batch=E_ENVS)))
            for cls in ("MultiSyncCollector", "MultiAsyncCollector"):
                rows.append(Row(s, f"aiocollect {cls} {w}x EnvPool({E_ENVS}), MLP",
                                lambda cls=cls, w=w: aio_envpool(cls, w, e_steps, e_batches)))
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
    cases = [("MLP", "mlp", None), ("MLP central", "mlp", "0"), ("random", None, None)]
    for cls in ("MultiSyncCollector",) if quick else ("MultiSyncCollector", "MultiAsyncCollector"):
        for label, policy, in_workers in cases[::2] if quick else cases:  # (a smoke run: 2 of them)
            for spin in ("1",) if quick else ("1", "0"):
                rows.append(Row("M", f"{cls} {w}x{E_ENVS}, {label}, AIOCOLLECT_SPIN={spin}",
                                lambda cls=cls, spin=spin, policy=policy, in_workers=in_workers:
                                main_cpu_row(cls, w, e_steps, e_batches, spin, policy, in_workers), "us/frame"))
    c_batches = 5 if quick else 40
    for cw, ce in ((1, 256), (15, 16)):
        rows.append(Row("C", f"MultiSync {cw}x{ce} ZeroEnv, zero-cost policy central, SPIN=0",
                        lambda cw=cw, ce=ce: capacity_row(cw, ce, c_batches), "us/frame"))
    for after_sleep in (False, True):
        when = "after a 1 ms sleep" if after_sleep else "back to back"
        rows.append(Row("C", f"wake probe: a small torch + numpy step, {when}",
                        lambda after_sleep=after_sleep: wake_probe(after_sleep, 200 if quick else 2_000), "us"))
    rows.append(Row("K", "limit", lambda: limit(make_cartpole, 32, 1, limit_frames)))
    for label, make_policy in (("zero-cost policy", lambda: zero_policy), ("MLP", mlp_policy)):
        rows.append(Row("K", f"aiocollect MultiSync 1x32, {label} central",
                        lambda make_policy=make_policy: aio("MultiSyncCollector", make_cartpole, 1, 32, e_steps,
                                                            e_batches, policy=make_policy(), in_workers="0")))
    rows.append(Row("W", "aiocollect worker, MLP in the workers", lambda: worker_rss("mlp", w), "MiB"))
    if not quick:
        rows.append(Row("W", "aiocollect worker, random actions", lambda: worker_rss("random", w), "MiB"))
        if HAVE_TORCHRL:
            rows.append(Row("W", "TorchRL worker, MLP", lambda: worker_rss("torchrl", w), "MiB"))
    return rows


def report(rows: list[Row], args) -> dict:
    titles = {"P": f"P. Pixel env {PIXEL_SHAPE} uint8, {PIXEL_STEP_S * 1e6:.0f} us CPU per step, "
                   f"{P_WORKERS} workers x {P_ENVS} envs, random policy",
              "W": "W. Resident memory of one worker process (the largest), MiB",
              "L": f"L. A policy that waits (as a GPU's call does), pixel env {max(1, cores() - 1)} workers x "
                   f"{P_ENVS} envs, workers in halves or whole",
              "M": "M. Main-process CPU per frame (all its threads), CartPole",
              "C": "C. Engine capacity: main-process CPU per frame, zero-cost envs and policy, the policy central",
              "K": "K. The hand-off: 1 worker x 32 CartPole envs, the policy central (limit: one core, 32 envs)"}
    results = []
    for section in dict.fromkeys(r.section for r in rows):
        w = section[1:]
        title = titles.get(section) or {
            "E": f"E. CartPole-v1, {w} workers x {E_ENVS} envs, an MLP policy that reads the observation "
                 "(peer: TorchRL)",
            "R": f"R. CartPole-v1, {w} workers x {E_ENVS} envs, random actions (the warm-up; peer: TorchRL)",
            "V": f"V. EnvPool's CartPole-v1 (C++ envs on its own threads), {w} x {E_ENVS} envs, the MLP: the limit is "
                 f"EnvPool's synchronous loop with random actions on {w} threads (peer: EnvPool's faster own loop)",
        }[section[0]]
        print(f"\n{title}\n")
        part = [r for r in rows if r.section == section]
        lim = next((r.best for r in part if r.name == "limit"), None)
        vlim = next((r.best for r in part if r.name == VECTOR_LIMIT), None)
        trl = next((r.best for r in part if r.name.startswith("TorchRL") and r.unit == "frames/s"), None)
        envpool = max((r.best for r in part if r.name in (ENVPOOL_SYNC, ENVPOOL_ASYNC) and r.best), default=None)
        peer = envpool if section[0] == "V" else trl
        ceilings = {k: next((r.best for r in part if r.name == name), None) for k, name in CEILINGS.items()}
        print(f"{'name':58s} | {'best':>12s} | {'median':>12s} | {'vs limit':>8s} | {'vs SyncVec':>10s} | "
              f"{'vs peer':>10s} | {'vs ceiling':>10s}")
        print("-" * 140)
        for r in part:
            med = statistics.median(r.runs) if r.runs else None
            frames = bool(r.best) and r.unit == "frames/s"
            ratio = f"{r.best / lim:.2f}" if lim and frames else ""
            vratio = f"{r.best / vlim:.2f}" if vlim and frames else ""
            vs_peer = f"{r.best / peer:.1f}x" if peer and frames and r.name.startswith("aiocollect") else ""
            measured = "MLP" in r.name and frames and r.name not in CEILINGS.values()
            top = ceilings.get("MultiSync" in r.name) if measured else None  # (sync rows: the lockstep one)
            vs_top = f"{r.best / top:.2f}" if top else ""
            if r.error:
                print(f"{r.name:58s} | error: {r.error.splitlines()[-1][:60]}")
            else:
                digits = 2 if r.unit.startswith("us") else 1  # (us per frame: tenths hide what changes)
                print(f"{r.name:58s} | {r.best:12,.{digits}f} | {med:12,.{digits}f} | {ratio:>8s} | {vratio:>10s} | "
                      f"{vs_peer:>10s} | {vs_top:>10s}   {r.unit}")
            results.append({"section": section, "name": r.name, "unit": r.unit, "runs": r.runs,
                            "best": r.best, "limit_ratio": (r.best / lim) if lim and frames else None,
                            "vector_limit_ratio": (r.best / vlim) if vlim and frames else None,
                            "torchrl_ratio": (r.best / trl) if trl and frames and r.name.startswith("aiocollect")
                            else None, "envpool_ratio": (r.best / envpool) if envpool and frames
                            and r.name.startswith("aiocollect") else None,
                            "ceiling_ratio": (r.best / top) if top else None, "error": r.error})
    return {"environment": environment(), "cores": cores(), "results": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run, about a minute")
    add_smoke_argument(parser)
    parser.add_argument("--repeats", type=int, default=None, help="runs per row (default 3; 1 with --quick)")
    parser.add_argument("--workers", type=int, nargs="+", default=[2], help="worker counts of section E")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument("--sections", nargs="+", choices=list("ERVPLMCKW"), default=list("ERVPLMCKW"),
                        help="run only these sections (default: all)")
    args = parser.parse_args(argv)
    start_smoke(args, warm=True)
    repeats = args.repeats or (1 if args.quick else 3)
    torch.set_num_threads(1)
    env = environment()
    print(f"aiocollect {env['aiocollect']} | torch {env['torch']} | torchrl {env['torchrl']} | "
          f"python {env['python']} | {cores()} cores | load {env['load_average_1min']:.2f}")
    rows = [r for r in rows_for(args) if r.section[0] in args.sections]
    run_rows(rows, repeats)
    print()
    results = report(rows, args)
    note = torchrl_note(HAVE_TORCHRL)
    if note:
        print(f"\n{note}")
    return finish(results, args)


if __name__ == "__main__":
    sys.exit(main())

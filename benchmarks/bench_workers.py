"""Multi-process collection: aiocollect's worker collectors vs. one process and vs. TorchRL.

What is measured
----------------
Four things, in one run, printed as one table per section with the ratios:

* **R. Round trip engine -> worker -> engine.** A ``MultiSyncCollector`` with ONE worker
  holding ONE env whose ``step`` does nothing (``NullEnv``: ``Box`` obs of shape ``(1,)``,
  returns zeros), a policy that hands the observation back as the action (random actions
  would go in runs of steps, with no round trip per step), ``frames_per_batch=1000``: the
  wall time per step is an
  upper bound of the round trip (it also contains the engine's per-step bookkeeping, which
  the same env stepped in this process by ``aiocollect.Collector`` shows on its own).
  For reference: a bare ``socketpair`` ping-pong between this process and a bare Python
  child (the floor the OS and the VM allow), and ``AsyncCollector`` on the same env. All
  of it twice: as is (the engine and the worker usually on different cores) and in a
  subprocess started under ``taskset -c 0`` (everything on one core: no cross-core
  wake-up, which is slow and noisy on a small VM). A run's figure is the median over its
  batches of each batch's wall time / 1000 (the ping-pong: the median single ping-pong);
  the CPU time per step of this process and of the worker is printed under the table.
  Goal: median <= 25 us per step.

* **S. A CPU-bound env with stragglers.** ``StragglerEnv``: every step busy-waits a
  lognormal amount of CPU time (mean 1 ms, coefficient of variation 0.5, i.e.
  ``sigma = sqrt(log(1.25))``), ``Box`` obs, episodes of 200 steps; 8 envs in total:

  - ``seq``: the 8 envs stepped one after the other in this process (plain gymnasium
    loop, ``env.action_space.sample()``, reset when an episode ends);
  - ``maio``: ``aiocollect.MultiAsyncCollector``, 2 workers x 4 envs (each
    ``create_env_fn`` entry a list of 4 factories);
  - ``msync``: ``aiocollect.MultiSyncCollector`` at the same split;
  - ``trl_serial``: ``torchrl.collectors.MultiSyncCollector``, 2 workers, each a
    ``SerialEnv`` of 4 ``GymWrapper(StragglerEnv())``;
  - ``trl_vec``: the same with each worker a ``GymWrapper`` around a gymnasium
    ``SyncVectorEnv`` of 4 (see C).

  Goals: MultiAsync / sequential >= 1.8 and MultiAsync / TorchRL MultiSync >= 1.15
  (against the faster of the two TorchRL rows).

* **C. CartPole-v1, 2 workers x 16 envs, random policy.** aiocollect
  ``MultiSyncCollector`` (and ``MultiAsyncCollector`` for reference) vs TorchRL's
  ``MultiSyncCollector`` in its two reasonable configurations for 16 envs per worker:
  ``SerialEnv(16, GymEnv("CartPole-v1"))`` and one ``GymWrapper`` around a gymnasium
  ``SyncVectorEnv`` of 16 (``autoreset_mode=DISABLED``; TorchRL refuses gymnasium's
  default ``NEXT_STEP`` mode). ``GymEnv(..., num_envs=16)`` is not tried: it starts an
  ``AsyncVectorEnv``, 16 more processes per worker on a 2-core machine. The ratio is taken
  against the faster TorchRL row. Goal: aiocollect MultiSync / TorchRL MultiSync >= 15.
  A ``ceiling`` row says what no collector can beat on this machine: the 16 envs stepped
  in a bare Python loop in one process (no collector at all), times the 2 cores.

* **M. Worker memory.** ``VmRSS`` (``/proc/PID/status``) of each worker process of the
  section C collectors, read after a few batches (and ``USS``, the memory only that
  process holds, from psutil when it is installed). An aiocollect worker never imports
  torch; a TorchRL worker is a whole TorchRL collector.

How
---
* Construction is not timed, neither is the first batch of a collector (warm-up) nor
  the first steps of the plain loop.
* Each measurement runs ``--repeats`` times (3 by default; 1 with ``--quick``),
  round-robin over all of them, so that a slow spell of the machine hits all alike. The
  table shows the **median** run (and the best); ratios use the medians.
* ``torch.set_num_threads(1)`` in this process, set again before every measurement
  (TorchRL's ``shutdown()`` raises it); TorchRL's workers use their default
  (``num_sub_threads=1``); aiocollect's workers do not import torch.
* ``StragglerEnv`` spins on the thread's CPU clock, so a step costs ~1 ms of CPU whoever
  else runs on the machine: contention for the 2 cores shows up as lost throughput
  instead of being hidden in wall-clock waits.
* ``--quick`` skips TorchRL's ``SerialEnv`` rows (the slower configuration; its start-up
  alone would double the run time).
* Every collector is shut down at the end of its measurement; at the end the script
  checks that no child process is left and says so.

Usage::

    python benchmarks/bench_workers.py                # full run (a few minutes on 2 cores)
    python benchmarks/bench_workers.py --quick        # smoke run (< 60 s)
    python benchmarks/bench_workers.py --smoke        # --quick's rows, each as brief as can be (the tests')
    python benchmarks/bench_workers.py --json out.json --repeats 5
"""

from __future__ import annotations

import gc
import importlib.util
import json
import logging
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

_PROCESS_START = time.perf_counter()  # for the total time, heavy imports included

# TorchRL reads these when imported: no warnings, no INFO lines flooding the table.
os.environ.setdefault("RL_WARNINGS", "0")
os.environ.setdefault("RL_LOGGING_LEVEL", "ERROR")

import gymnasium as gym
import numpy as np
import torch
from _common import QUICK_WARNING, environment, parse_args, torchrl_note, verdict

import aiocollect

HAVE_TORCHRL = importlib.util.find_spec("torchrl") is not None  # its rows are skipped without it
HAVE_PSUTIL = importlib.util.find_spec("psutil") is not None

ENV_ID = "CartPole-v1"
S_WORKERS, S_ENVS_PER_WORKER = 2, 4
C_WORKERS, C_ENVS_PER_WORKER = 2, 16
RT_FRAMES_PER_BATCH = 1000
PINNED_FLAG = "--_pinned-roundtrip"  # internal: the pinned round-trip child


# --------------------------------------------------------------------------- sizes


@dataclass(frozen=True)
class Sizes:
    """Timed work of one run of each measurement (warm-up excluded)."""

    rt_batches: int  # batches of 1000 steps, round trip
    rt_pingpongs: int  # bare socket ping-pongs
    s_seq_steps: int  # steps of all 8 envs, sequential loop
    s_steps_per_batch: int  # T in section S (per env, per batch)
    s_frames: int  # frames timed, worker collectors
    c_steps_per_batch: int  # T in section C
    c_frames: int  # aiocollect
    c_torchrl_serial_frames: int  # TorchRL SerialEnv(16) (slow)
    c_torchrl_vec_frames: int  # TorchRL GymWrapper(SyncVectorEnv(16))
    warmup_steps: int


FULL = Sizes(rt_batches=20, rt_pingpongs=20_000, s_seq_steps=750, s_steps_per_batch=50, s_frames=12_000,
             c_steps_per_batch=128, c_frames=400_000, c_torchrl_serial_frames=40_960,
             c_torchrl_vec_frames=122_880, warmup_steps=20)
QUICK = Sizes(rt_batches=2, rt_pingpongs=2_000, s_seq_steps=50, s_steps_per_batch=25, s_frames=800,
              c_steps_per_batch=32, c_frames=8_192, c_torchrl_serial_frames=2_048,
              c_torchrl_vec_frames=2_048, warmup_steps=5)
SMOKE = Sizes(rt_batches=1, rt_pingpongs=500, s_seq_steps=10, s_steps_per_batch=10, s_frames=160,
              c_steps_per_batch=16, c_frames=2_048, c_torchrl_serial_frames=512, c_torchrl_vec_frames=512,
              warmup_steps=2)
SIZES = {"full": FULL, "quick": QUICK, "smoke": SMOKE}


def whole_batches(frames: int, frames_per_batch: int) -> int:
    """``frames`` rounded up to a whole number of batches (at least one)."""
    return max(1, -(-frames // frames_per_batch)) * frames_per_batch


# --------------------------------------------------------------------------- envs
# Module level, so that TorchRL's spawned workers find them by name (this script is
# re-imported there as __mp_main__) and cloudpickle ships them by value to aiocollect's.


class NullEnv(gym.Env):
    """An env whose step does nothing: Box obs of shape (1,), always zeros."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self):
        self._obs = np.zeros(1, np.float32)

    def reset(self, *, seed=None, options=None):
        return self._obs, {}

    def step(self, action):
        return self._obs, 0.0, False, False, {}


def echo(observation):
    """The round trip's policy: NullEnv's observation (zeros, in its action space) as the action."""
    return observation


STRAGGLER_MEAN_S = 1e-3
STRAGGLER_CV = 0.5
STRAGGLER_EPISODE = 200


class StragglerEnv(gym.Env):
    """CPU-bound env with stragglers: each step spins for a lognormal amount of CPU time
    (mean ``STRAGGLER_MEAN_S``, coefficient of variation ``STRAGGLER_CV``)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        sigma2 = math.log(1.0 + STRAGGLER_CV**2)
        self._mu = math.log(STRAGGLER_MEAN_S) - sigma2 / 2  # so that the mean is STRAGGLER_MEAN_S
        self._sigma = math.sqrt(sigma2)
        self._rng = np.random.default_rng()
        self._obs = np.zeros(4, np.float32)
        self._t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._t = 0
        self._obs[:] = 0.0
        return self._obs.copy(), {}

    def step(self, action):
        end = time.thread_time() + self._rng.lognormal(self._mu, self._sigma)
        while time.thread_time() < end:
            pass
        self._t += 1
        self._obs[0] = self._t / STRAGGLER_EPISODE
        return self._obs.copy(), 1.0, False, self._t >= STRAGGLER_EPISODE, {}


def make_cartpole() -> gym.Env:
    return gym.make(ENV_ID)


# TorchRL env factories (top level: TorchRL's workers are spawned)


def _torchrl_gym_straggler():
    from torchrl.envs import GymWrapper

    return GymWrapper(StragglerEnv())


def torchrl_straggler_serial():
    from torchrl.envs import SerialEnv

    return SerialEnv(S_ENVS_PER_WORKER, _torchrl_gym_straggler)


def torchrl_straggler_vector():
    from torchrl.envs import GymWrapper

    vec = gym.vector.SyncVectorEnv([StragglerEnv] * S_ENVS_PER_WORKER,
                                   autoreset_mode=gym.vector.AutoresetMode.DISABLED)
    return GymWrapper(vec)


def _torchrl_gym_cartpole():
    from torchrl.envs import GymEnv

    return GymEnv(ENV_ID)


def torchrl_cartpole_serial():
    from torchrl.envs import SerialEnv

    return SerialEnv(C_ENVS_PER_WORKER, _torchrl_gym_cartpole)


def torchrl_cartpole_vector():
    from torchrl.envs import GymWrapper

    vec = gym.vector.SyncVectorEnv([make_cartpole] * C_ENVS_PER_WORKER,
                                   autoreset_mode=gym.vector.AutoresetMode.DISABLED)
    return GymWrapper(vec)


# --------------------------------------------------------------------------- memory


def rss_mib(pid: int) -> float | None:
    """``VmRSS`` of ``pid`` in MiB (``None`` if it cannot be read)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def uss_mib(pid: int) -> float | None:
    """Unique set size (memory only this process holds), via psutil; ``None`` without it."""
    if not HAVE_PSUTIL:
        return None
    import psutil

    try:
        return psutil.Process(pid).memory_full_info().uss / 2**20
    except Exception:  # noqa: BLE001 - best effort
        return None


def child_pids() -> set[int]:
    """Live direct children of this process (psutil, or a /proc scan)."""
    if HAVE_PSUTIL:
        import psutil

        return {p.pid for p in psutil.Process().children() if p.is_running() and p.status() != "zombie"}
    me, out = os.getpid(), set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[1]) == me and fields[0] != "Z":
                    out.add(int(name))
            except (OSError, IndexError, ValueError):
                pass
    return out


@dataclass
class Memory:
    """Per-worker memory samples of one collector kind, over all its runs."""

    rss: list[float] = field(default_factory=list)
    uss: list[float] = field(default_factory=list)

    def sample(self, pids: list[int]) -> None:
        for pid in pids:
            r, u = rss_mib(pid), uss_mib(pid)
            if r is not None:
                self.rss.append(r)
            if u is not None:
                self.uss.append(u)


MEMORY: dict[str, Memory] = {}


# --------------------------------------------------------------------------- timing helpers


def timed_batches(collector, on_batch: Callable[[int], None] | None = None) -> float:
    """Frames/s over the batches after the first (warm-up) one. ``on_batch(i)`` is called
    after batch ``i`` (1 = the first timed one); its own time is not counted."""
    it = iter(collector)
    next(it)
    frames, hook_time = 0, 0.0
    start = time.perf_counter()
    for i, batch in enumerate(it, 1):
        frames += batch.numel()
        if on_batch is not None:
            t = time.perf_counter()
            on_batch(i)
            hook_time += time.perf_counter() - t
    return frames / (time.perf_counter() - start - hook_time)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` (``/proc/PID/stat``), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def per_step_us_of_batches(collector, worker_pids: list[int]) -> tuple[list[float], float, float | None]:
    """Microseconds per step of each batch after the first (warm-up) one, and the CPU time
    per step (us) of this process (all its threads) and of the workers (summed)."""
    out = []
    it = iter(collector)
    next(it)
    steps = 0
    w0 = sum(cpu_seconds(p) for p in worker_pids)
    c0 = time.process_time()
    t = time.perf_counter()
    for batch in it:
        now = time.perf_counter()
        out.append((now - t) / batch.numel() * 1e6)
        steps += batch.numel()
        t = now
    main_cpu = (time.process_time() - c0) / steps * 1e6
    worker_cpu = (sum(cpu_seconds(p) for p in worker_pids) - w0) / steps * 1e6 if worker_pids else None
    return out, main_cpu, worker_cpu


# --------------------------------------------------------------------------- R: round trip


RT_CPU: dict[str, list[tuple[float, float | None]]] = {}
"""Round-trip key -> (CPU us per step of this process, of the worker) per run."""


def rt_collector(cls, entry, batches: int, key: str) -> float:
    """Median us per step over ``batches`` batches of ``RT_FRAMES_PER_BATCH`` steps of one env."""
    fpb = RT_FRAMES_PER_BATCH
    collector = cls(entry, echo, frames_per_batch=fpb, total_frames=fpb * (batches + 1))
    try:
        workers = [w.pid for w in collector.statistics().workers if w.pid is not None]
        per_batch, main_cpu, worker_cpu = per_step_us_of_batches(collector, workers)
        RT_CPU.setdefault(key, []).append((main_cpu, worker_cpu))
        return statistics.median(per_batch)
    finally:
        collector.shutdown()


def rt_multisync(batches: int) -> float:
    return rt_collector(aiocollect.MultiSyncCollector, [NullEnv], batches, "multisync")


def rt_async(batches: int) -> float:
    return rt_collector(aiocollect.AsyncCollector, NullEnv, batches, "async")


def rt_inprocess(batches: int) -> float:
    return rt_collector(aiocollect.Collector, NullEnv, batches, "inproc")


_PONG = (
    "import socket, sys\n"
    "s = socket.socket(fileno=int(sys.argv[1]))\n"
    "b = bytearray(1)\n"
    "while s.recv_into(b):\n"
    "    s.send(b)\n"
)


def rt_socket(n: int) -> float:
    """Median us of one blocking 1-byte ping-pong over a socketpair with a bare Python child."""
    a, b = socket.socketpair()
    proc = subprocess.Popen([sys.executable, "-S", "-c", _PONG, str(b.fileno())], pass_fds=[b.fileno()])
    b.close()
    try:
        buf = bytearray(1)
        for _ in range(max(100, n // 10)):  # warm-up
            a.send(b"s")
            a.recv_into(buf)
        times = np.empty(n)
        clock = time.perf_counter_ns
        for i in range(n):
            t = clock()
            a.send(b"s")
            a.recv_into(buf)
            times[i] = clock() - t
        return float(np.median(times)) / 1e3
    finally:
        a.close()
        proc.wait(10)


RT_FUNCS: dict[str, Callable[[Sizes], float]] = {
    "multisync": lambda s: rt_multisync(s.rt_batches),
    "async": lambda s: rt_async(s.rt_batches),
    "inproc": lambda s: rt_inprocess(s.rt_batches),
    "socket": lambda s: rt_socket(s.rt_pingpongs),
}


def rt_pinned(mode: str) -> dict[str, float]:
    """One run of every R measurement in a subprocess pinned to CPU 0 (``taskset -c 0``),
    at the sizes of ``mode`` (a key of ``SIZES``)."""
    cmd = [sys.executable, os.path.abspath(__file__), PINNED_FLAG] + ([f"--{mode}"] if mode != "full" else [])
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", "0", *cmd]
        preexec = None
    else:  # the same thing by hand: the affinity is inherited by every thread and child
        def preexec():
            os.sched_setaffinity(0, {0})
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300, preexec_fn=preexec)
    if proc.returncode != 0:
        raise RuntimeError(f"pinned round-trip child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def pinned_child_main(mode: str) -> int:
    torch.set_num_threads(1)
    sizes = SIZES[mode]
    out = {"affinity": sorted(os.sched_getaffinity(0))}
    for key, fn in RT_FUNCS.items():
        gc.collect()
        out[key] = fn(sizes)
    out["cpu"] = {k: v[-1] for k, v in RT_CPU.items()}
    print(json.dumps(out))
    return 0


# --------------------------------------------------------------------------- S: stragglers


def s_sequential(steps: int, warmup: int) -> float:
    """The 8 envs stepped one after the other in this process; frames/s."""
    envs = [StragglerEnv() for _ in range(S_WORKERS * S_ENVS_PER_WORKER)]
    try:
        for i, env in enumerate(envs):
            env.reset(seed=i)
            env.action_space.seed(i)

        def run(n: int) -> None:
            for _ in range(n):
                for env in envs:
                    _, _, terminated, truncated, _ = env.step(env.action_space.sample())
                    if terminated or truncated:
                        env.reset()

        run(warmup)
        start = time.perf_counter()
        run(steps)
        return steps * len(envs) / (time.perf_counter() - start)
    finally:
        for env in envs:
            env.close()


def s_aiocollect(cls_name: str, s: Sizes) -> float:
    cls = getattr(aiocollect, cls_name)
    per_worker = S_ENVS_PER_WORKER * s.s_steps_per_batch
    fpb = per_worker * (S_WORKERS if cls_name == "MultiSyncCollector" else 1)
    total = fpb + whole_batches(s.s_frames, fpb)
    collector = cls([[StragglerEnv] * S_ENVS_PER_WORKER] * S_WORKERS, None, frames_per_batch=fpb,
                    total_frames=total)
    try:
        return timed_batches(collector)
    finally:
        collector.shutdown()


def torchrl_multi(cls_name: str, make_env, workers: int, frames_per_batch: int, frames: int,
                  memory_key: str | None = None) -> float:
    """TorchRL ``MultiSyncCollector`` / ``MultiAsyncCollector`` over ``[make_env] * workers``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchRL is chatty
        logging.getLogger("torchrl").setLevel(logging.ERROR)
        from torchrl import collectors

        cls = getattr(collectors, cls_name)
        total = frames_per_batch + whole_batches(frames, frames_per_batch)
        collector = cls([make_env] * workers, None, frames_per_batch=frames_per_batch, total_frames=total)
        try:
            hook = None
            if memory_key is not None:
                def hook(i: int) -> None:
                    if i == 3 or (i == 1 and frames <= 2 * frames_per_batch):
                        pids = [p.pid for p in collector.procs]
                        children = child_pids()
                        missing = [pid for pid in pids if pid not in children]
                        if missing:
                            print(f"  warning: TorchRL worker pid(s) {missing} are not children of this process",
                                  file=sys.stderr)
                        MEMORY.setdefault(memory_key, Memory()).sample(pids)
            return timed_batches(collector, hook)
        finally:
            collector.shutdown()


def s_torchrl(make_env, s: Sizes) -> float:
    fpb = S_WORKERS * S_ENVS_PER_WORKER * s.s_steps_per_batch
    return torchrl_multi("MultiSyncCollector", make_env, S_WORKERS, fpb, s.s_frames)


# --------------------------------------------------------------------------- C: CartPole 2 x 16


def c_ceiling(frames: int) -> float:
    """What no collector can beat here: the 16 envs of one worker stepped in a bare loop
    (pre-drawn random actions, reset when done, results discarded) in this process,
    frames/s, times the cores the 2 workers can use. Every collector pays this env cost."""
    envs = [make_cartpole() for _ in range(C_ENVS_PER_WORKER)]
    try:
        for i, env in enumerate(envs):
            env.reset(seed=i)
        steps = max(1, frames // len(envs))
        actions = np.random.default_rng(0).integers(0, 2, size=(steps + 50, len(envs))).tolist()

        def run(rows) -> None:
            for row in rows:
                for env, a in zip(envs, row):
                    _, _, terminated, truncated, _ = env.step(a)
                    if terminated or truncated:
                        env.reset()

        run(actions[:50])
        start = time.perf_counter()
        run(actions[50:])
        one_core = steps * len(envs) / (time.perf_counter() - start)
        return one_core * min(C_WORKERS, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                              else os.cpu_count() or 1)
    finally:
        for env in envs:
            env.close()


def c_aiocollect(cls_name: str, s: Sizes, memory_key: str | None = None) -> float:
    cls = getattr(aiocollect, cls_name)
    per_worker = C_ENVS_PER_WORKER * s.c_steps_per_batch
    fpb = per_worker * (C_WORKERS if cls_name == "MultiSyncCollector" else 1)
    total = fpb + whole_batches(s.c_frames, fpb)
    collector = cls([[make_cartpole] * C_ENVS_PER_WORKER] * C_WORKERS, None, frames_per_batch=fpb,
                    total_frames=total)
    try:
        hook = None
        if memory_key is not None:
            def hook(i: int) -> None:
                if i == 3 or (i == 1 and s.c_frames <= 2 * fpb):
                    MEMORY.setdefault(memory_key, Memory()).sample([w.pid for w in collector.statistics().workers])
        return timed_batches(collector, hook)
    finally:
        collector.shutdown()


def c_torchrl(make_env, frames: int, s: Sizes, memory_key: str) -> float:
    fpb = C_WORKERS * C_ENVS_PER_WORKER * s.c_steps_per_batch
    return torchrl_multi("MultiSyncCollector", make_env, C_WORKERS, fpb, frames, memory_key)


# --------------------------------------------------------------------------- the benchmark list


@dataclass
class Bench:
    section: str
    key: str
    name: str
    run: Callable[[], float]
    unit: str  # "frames/s" or "us/step"
    runs: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def median(self) -> float | None:
        return statistics.median(self.runs) if self.runs else None

    @property
    def best(self) -> float | None:
        if not self.runs:
            return None
        return min(self.runs) if self.unit == "us/step" else max(self.runs)


class PinnedRoundTrip:
    """The pinned child runs every R measurement once per call; its results feed 4 benches."""

    def __init__(self, mode: str):
        self.mode = mode
        self.benches: dict[str, Bench] = {}
        self.affinity: list[int] | None = None

    def run(self) -> float:
        out = rt_pinned(self.mode)
        self.affinity = out.pop("affinity")
        for key, cpu in out.pop("cpu").items():
            RT_CPU.setdefault(f"p_{key}", []).append(tuple(cpu))
        for key, value in out.items():
            if key != "multisync" and key in self.benches:
                self.benches[key].runs.append(value)
        return out["multisync"]


def make_benches(mode: str) -> list[Bench]:
    s, quick = SIZES[mode], mode != "full"
    w = s.warmup_steps
    pinned = PinnedRoundTrip(mode)
    benches = [
        Bench("R", "multisync", "MultiSyncCollector, 1 worker x 1 NullEnv", lambda: RT_FUNCS["multisync"](s),
              "us/step"),
        Bench("R", "async", "AsyncCollector, 1 worker x 1 NullEnv (ref.)", lambda: RT_FUNCS["async"](s), "us/step"),
        Bench("R", "inproc", "Collector, NullEnv in this process", lambda: RT_FUNCS["inproc"](s), "us/step"),
        Bench("R", "socket", "bare socketpair ping-pong (OS floor)", lambda: RT_FUNCS["socket"](s), "us/step"),
        Bench("R", "p_multisync", "pinned: MultiSyncCollector, 1 x 1", pinned.run, "us/step"),
        Bench("R", "p_async", "pinned: AsyncCollector, 1 x 1 (ref.)", lambda: None, "us/step"),
        Bench("R", "p_inproc", "pinned: Collector, in this process", lambda: None, "us/step"),
        Bench("R", "p_socket", "pinned: bare socketpair ping-pong", lambda: None, "us/step"),
        Bench("S", "seq", "8 envs sequential, one process", lambda: s_sequential(s.s_seq_steps, w), "frames/s"),
        Bench("S", "maio", "aiocollect MultiAsyncCollector 2x4",
              lambda: s_aiocollect("MultiAsyncCollector", s), "frames/s"),
        Bench("S", "msync", "aiocollect MultiSyncCollector 2x4",
              lambda: s_aiocollect("MultiSyncCollector", s), "frames/s"),
        Bench("S", "trl_serial", "TorchRL MultiSync 2x SerialEnv(4)",
              lambda: s_torchrl(torchrl_straggler_serial, s), "frames/s"),
        Bench("S", "trl_vec", "TorchRL MultiSync 2x GymWrapper(SyncVec4)",
              lambda: s_torchrl(torchrl_straggler_vector, s), "frames/s"),
        Bench("C", "ceiling", "the envs alone, bare loop, x 2 cores (ceiling)",
              lambda: c_ceiling(s.c_frames // 8), "frames/s"),
        Bench("C", "msync", "aiocollect MultiSyncCollector 2x16",
              lambda: c_aiocollect("MultiSyncCollector", s, "aiocollect"), "frames/s"),
        Bench("C", "maio", "aiocollect MultiAsyncCollector 2x16 (ref.)",
              lambda: c_aiocollect("MultiAsyncCollector", s), "frames/s"),
        Bench("C", "trl_serial", "TorchRL MultiSync 2x SerialEnv(16)",
              lambda: c_torchrl(torchrl_cartpole_serial, s.c_torchrl_serial_frames, s, "torchrl_serial"), "frames/s"),
        Bench("C", "trl_vec", "TorchRL MultiSync 2x GymWrapper(SyncVec16)",
              lambda: c_torchrl(torchrl_cartpole_vector, s.c_torchrl_vec_frames, s, "torchrl_vec"), "frames/s"),
    ]
    for b in benches:
        if b.key.startswith("p_") and b.key != "p_multisync":
            pinned.benches[b.key[2:]] = b
    if quick:  # TorchRL's slower configuration only costs start-up time in a smoke run
        benches = [b for b in benches if b.key != "trl_serial"]
    if not hasattr(os, "sched_setaffinity"):
        benches = [b for b in benches if not b.key.startswith("p_")]
    return [b for b in benches if HAVE_TORCHRL or not b.key.startswith("trl")]


def run_all(benches: list[Bench], repeats: int) -> None:
    """Run every bench ``repeats`` times, round-robin; progress goes to stderr."""
    for rep in range(1, repeats + 1):
        for bench in benches:
            if bench.section == "R" and bench.key.startswith("p_") and bench.key != "p_multisync":
                continue  # filled in by the pinned child
            gc.collect()
            # TorchRL's shutdown() raises this process's torch threads again (to 2 here)
            torch.set_num_threads(1)
            started = time.perf_counter()
            try:
                value = bench.run()
            except Exception as exc:  # noqa: BLE001 - reported in the table, the others go on
                bench.error = f"{type(exc).__name__}: {exc}"
                print(f"  [{bench.section}] run {rep}/{repeats}  {bench.name:<44} FAILED: {bench.error[:300]}",
                      file=sys.stderr, flush=True)
                continue
            bench.runs.append(value)
            print(f"  [{bench.section}] run {rep}/{repeats}  {bench.name:<44} {value:>12,.1f} {bench.unit}"
                  f"  ({time.perf_counter() - started:.1f} s)", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- report


@dataclass(frozen=True)
class Ratio:
    section: str
    label: str
    value: Callable[[dict[str, Bench]], float | None]
    goal: float | None
    higher_is_better: bool = True


def _div(a: Bench | None, b: Bench | None) -> float | None:
    if a is None or b is None or a.median is None or b.median is None:
        return None
    return a.median / b.median


def _sub(a: Bench, b: Bench) -> float | None:
    return None if a.median is None or b.median is None else a.median - b.median


def _best_torchrl(by: dict[str, Bench], section: str) -> Bench | None:
    """The faster of the two TorchRL configurations of ``section`` (by median)."""
    rows = [by[k] for k in (f"{section}.trl_serial", f"{section}.trl_vec") if k in by and by[k].median is not None]
    return max(rows, key=lambda b: b.median) if rows else None


RATIOS = [
    Ratio("R", "MultiSync round trip, median us/step (goal <= 25)", lambda by: by["R.multisync"].median, 25.0,
          higher_is_better=False),
    Ratio("R", "pinned: MultiSync round trip, median us/step", lambda by: by["R.p_multisync"].median, None,
          higher_is_better=False),
    Ratio("R", "MultiSync - in-process (the worker hop), us/step",
          lambda by: _sub(by["R.multisync"], by["R.inproc"]), None),
    Ratio("R", "pinned: MultiSync - in-process, us/step",
          lambda by: _sub(by["R.p_multisync"], by["R.p_inproc"]), None),
    Ratio("S", "aiocollect MultiAsync / sequential", lambda by: _div(by["S.maio"], by["S.seq"]), 1.8),
    Ratio("S", "aiocollect MultiAsync / TorchRL MultiSync (faster row)",
          lambda by: _div(by["S.maio"], _best_torchrl(by, "S")), 1.15),
    Ratio("S", "aiocollect MultiAsync / TorchRL MultiSync SerialEnv(4)",
          lambda by: _div(by["S.maio"], by.get("S.trl_serial")), None),
    Ratio("S", "aiocollect MultiSync / sequential", lambda by: _div(by["S.msync"], by["S.seq"]), None),
    Ratio("S", "aiocollect MultiSync / TorchRL MultiSync (faster row)",
          lambda by: _div(by["S.msync"], _best_torchrl(by, "S")), None),
    Ratio("C", "aiocollect MultiSync / TorchRL MultiSync (faster row)",
          lambda by: _div(by["C.msync"], _best_torchrl(by, "C")), 15.0),
    Ratio("C", "aiocollect MultiSync / TorchRL MultiSync SerialEnv(16)",
          lambda by: _div(by["C.msync"], by.get("C.trl_serial")), None),
    Ratio("C", "aiocollect MultiAsync / TorchRL MultiSync (faster row)",
          lambda by: _div(by["C.maio"], _best_torchrl(by, "C")), None),
    Ratio("C", "TorchRL GymWrapper(SyncVec16) / SerialEnv(16)",
          lambda by: _div(by.get("C.trl_vec"), by.get("C.trl_serial")), None),
    Ratio("C", "aiocollect MultiSync / the envs' own ceiling",
          lambda by: _div(by["C.msync"], by.get("C.ceiling")), None),
    Ratio("C", "the envs' own ceiling / TorchRL MultiSync (faster row)",
          lambda by: _div(by.get("C.ceiling"), _best_torchrl(by, "C")), None),
]

SECTION_TITLES = {
    "R": "R. Round trip engine -> worker -> engine, one env whose step does nothing (lower is better)",
    "S": (f"S. CPU-bound StragglerEnv (lognormal CPU spin, mean 1 ms, CV 0.5), "
          f"{S_WORKERS * S_ENVS_PER_WORKER} envs, random actions"),
    "C": f"C. {ENV_ID}, {C_WORKERS} workers x {C_ENVS_PER_WORKER} envs, random policy",
}
BASELINE = {"S": "seq", "C": None, "R": None}


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.1f}" if unit == "us/step" else f"{value:,.0f}"


def format_table(benches: list[Bench], repeats: int, quick: bool = False) -> str:
    by = {f"{b.section}.{b.key}": b for b in benches}
    stat = f"median of {repeats}" if repeats > 1 else "1 run"
    lines = []
    for section, title in SECTION_TITLES.items():
        rows = [b for b in benches if b.section == section]
        if not rows:
            continue
        unit = rows[0].unit
        base = by.get(f"{section}.{BASELINE[section]}") if BASELINE[section] else None
        if section == "C":
            base = _best_torchrl(by, "C")
        base_label = f"vs {base.key}" if base is not None else ""
        header = (f"{'name':<46} | {unit + ' (' + stat + ')':>24} | {'best':>10} | {base_label:>12}")
        lines += ["", title, "", header, "-" * len(header)]
        for b in rows:
            if b.median is None:
                lines.append(f"{b.name:<46} | {'FAILED' if b.error else 'n/a':>24} | {'':>10} | {'':>12}")
                continue
            rel = ""
            if base is not None and base.median:
                rel = f"{b.median / base.median:.2f}x"
            lines.append(f"{b.name:<46} | {_fmt(b.median, unit):>24} | {_fmt(b.best, unit):>10} | {rel:>12}")
        lines.append("")
        for r in (r for r in RATIOS if r.section == section):
            try:
                value = r.value(by)
            except (KeyError, AttributeError, TypeError):
                value = None
            if value is None:
                lines.append(f"  {r.label:<58} {'n/a':>8}")
                continue
            goal = "" if r.goal is None else verdict(value, r.goal, quick, r.higher_is_better)
            lines.append(f"  {r.label:<58} {value:>8.3f}   {goal}")
        if section == "R":
            lines += rt_cpu_notes(by)
            if "R.p_multisync" in by:
                lines.append("  (pinned = a subprocess under `taskset -c 0`: engine and worker share one core)")
        if section in ("S", "C"):
            best = _best_torchrl(by, section)
            if best is not None:
                lines.append(f"  (TorchRL row used for the ratios: {best.name})")
    lines += memory_table()
    note = torchrl_note(HAVE_TORCHRL)
    if note:
        lines += ["", note]
    return "\n".join(lines)


def rt_cpu_notes(by: dict[str, Bench]) -> list[str]:
    """CPU time per step of the main process and of the worker (medians over the runs)."""
    lines = []
    for key in ("multisync", "async", "inproc", "p_multisync", "p_async", "p_inproc"):
        runs = RT_CPU.get(key)
        bench = by.get(f"R.{key}")
        if not runs or bench is None or bench.median is None:
            continue
        main = statistics.median(r[0] for r in runs)
        workers = [r[1] for r in runs if r[1] is not None]
        text = f"this process {main:5.1f}"
        if workers:
            worker = statistics.median(workers)
            text += f" + worker {worker:5.1f} = {main + worker:5.1f}"
        lines.append(f"  CPU us/step, {key + ':':<13} {text}   (wall {bench.median:.1f})")
    return lines


MEMORY_ROWS = {
    "aiocollect": "aiocollect worker (16 CartPole envs)",
    "torchrl_serial": "TorchRL worker, SerialEnv(16)",
    "torchrl_vec": "TorchRL worker, GymWrapper(SyncVec16)",
}


def memory_table() -> list[str]:
    if not MEMORY:
        return []
    header = f"{'process':<46} | {'VmRSS MiB (median)':>18} | {'min..max':>15} | {'USS MiB':>8} | {'samples':>7}"
    lines = ["", "M. Worker memory, one worker process, read after 3 timed batches of section C (1 in a short run)",
             "", header, "-" * len(header)]
    for key, name in MEMORY_ROWS.items():
        m = MEMORY.get(key)
        if m is None or not m.rss:
            continue
        uss = f"{statistics.median(m.uss):.1f}" if m.uss else "n/a"
        lines.append(f"{name:<46} | {statistics.median(m.rss):>18.1f} | "
                     f"{min(m.rss):>6.1f}..{max(m.rss):<6.1f} | {uss:>8} | {len(m.rss):>7}")
    aio = MEMORY.get("aiocollect")
    trl = [MEMORY[k] for k in ("torchrl_vec", "torchrl_serial") if k in MEMORY and MEMORY[k].rss]
    if aio and aio.rss and trl:
        ratio = min(statistics.median(m.rss) for m in trl) / statistics.median(aio.rss)
        lines += ["", f"  TorchRL worker RSS / aiocollect worker RSS (smaller TorchRL row) {ratio:>8.2f}"]
    return lines


def leftover_children(wait_s: float = 5.0) -> list[str]:
    """Children of this process still alive after ``wait_s`` (TorchRL's resource tracker aside)."""
    deadline = time.monotonic() + wait_s
    while True:
        left = []
        for pid in sorted(child_pids()):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            if "resource_tracker" in cmd:
                continue
            left.append(f"{pid}: {cmd[:120]}")
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def write_json(path: str, benches: list[Bench], mode: str, args, env: dict, wall: float,
               leftovers: list[str]) -> None:
    by = {f"{b.section}.{b.key}": b for b in benches}
    ratios = []
    for r in RATIOS:
        try:
            value = r.value(by)
        except (KeyError, AttributeError, TypeError):
            value = None
        ratios.append({"section": r.section, "label": r.label, "value": value, "goal": r.goal,
                       "higher_is_better": r.higher_is_better})
    data = {
        "mode": mode,
        "repeats": args.repeats,
        "statistic": "median",
        "sizes": asdict(SIZES[mode]),
        "environment": env,
        "measuring_seconds": wall,
        "results": [
            {"section": b.section, "key": b.key, "name": b.name, "unit": b.unit, "median": b.median,
             "best": b.best, "runs": b.runs, "error": b.error}
            for b in benches
        ],
        "ratios": ratios,
        "memory_mib": {k: {"rss": m.rss, "uss": m.uss} for k, m in MEMORY.items()},
        "round_trip_cpu_us_per_step": {k: [list(r) for r in v] for k, v in RT_CPU.items()},
        "leftover_processes": leftovers,
    }
    with open(path, "w") as f:
        json.dump(data, f, indent=2)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if PINNED_FLAG in argv:
        return pinned_child_main("smoke" if "--smoke" in argv else "quick" if "--quick" in argv else "full")
    args = parse_args(argv, __doc__.split("\n\n")[0], "tiny sizes, one run (smoke test, < 60 s)")

    torch.set_num_threads(1)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    env = environment()
    print(
        f"aiocollect {env['aiocollect']} | torch {env['torch']} (threads=1) | tensordict {env['tensordict']}"
        f" | torchrl {env['torchrl']} | gymnasium {env['gymnasium']} | uvloop {env['uvloop']}"
        f" | python {env['python']}\n{env['cpu_count']} CPUs, 1-min load average {env['load_average_1min']:.2f}"
        f" | mode={mode}, {args.repeats} run(s) per measurement, round-robin;"
        " construction and first batch not timed",
        flush=True,
    )

    started = time.perf_counter()
    benches = make_benches(mode)
    run_all(benches, args.repeats)
    wall = time.perf_counter() - started
    leftovers = leftover_children()

    print(format_table(benches, args.repeats, quick=args.quick))
    load = f", 1-min load average {os.getloadavg()[0]:.2f} at the end" if hasattr(os, "getloadavg") else ""
    total = time.perf_counter() - _PROCESS_START
    print(f"\ntotal time: {total:.1f} s ({wall:.1f} s measuring, the rest imports){load}")
    if args.quick:
        print(QUICK_WARNING)
    failed = [b for b in benches if b.error]
    for b in failed:
        print(f"FAILED: [{b.section}] {b.name}: {b.error}")
    if leftovers:
        print("LEFTOVER child processes after shutdown:\n  " + "\n  ".join(leftovers))
    else:
        print("no child process left after the collectors' shutdown")
    if args.json:
        write_json(args.json, benches, mode, args, env, wall, leftovers)
        print(f"results written to {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

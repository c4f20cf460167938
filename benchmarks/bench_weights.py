"""Weight updates and JAX policies: what they cost collection.

What is measured
----------------
* **U. The update call.** ``collector.update_policy_weights_(trainer)`` for a policy of
  986,754 parameters (an MLP 64-1024-896-2, 3.9 MB of float32), called while the
  collector is idle and while it collects in another thread (whose Python code then
  competes for the GIL): median, 90th percentile and worst of 200 calls, in microseconds.
  The call snapshots the weights (one copy into a recycled buffer) and returns; the engine
  loads them between two policy calls. The same for a
  :class:`~aiocollect.jax.JaxPolicy` with the same parameter count (its snapshot is a
  device copy of the params pytree). Goal: < 1 ms.
* **F. Collection with an update after every batch** vs without, on the same collector
  (the two modes alternate every 2 batches, so machine noise hits both alike): frames/s
  and the ratio. Two settings: ``Collector`` with 16 CartPole envs and
  a 2x64 MLP (batches of 1,600 frames), and ``MultiSyncCollector`` with 2 workers x 8
  CartPole envs and the 1M-parameter MLP (batches of 800 frames), where each update
  copies 3.9 MB twice. Goal: ratio >= 0.95.
* **J. A JAX MLP vs the same torch MLP** (64-64-64-2 tanh, argmax, identical weights):
  frames/s of ``Collector`` over 64 CartPole envs, and of ``MultiSyncCollector`` and
  ``MultiAsyncCollector`` with 2 workers x 16 envs, each policy placed as the collector
  chooses (``policy_placement="auto"``: on 2 cores, in the workers, the torch MLP as a copy
  and the JAX one as a ``JaxPolicy`` rebuilt in each worker, ``_policies.jax_worker``);
  ``--jax-central`` adds the worker rows with the JAX policy kept here
  (``policy_placement="central"``, as before JAX could act in the workers). Goal: JAX / torch
  >= 0.8.

How: as ``bench_collect.py``: construction and the first batch are not timed; each
measurement runs ``--repeats`` times round-robin; the table shows the best run and the
median, ratios use the best runs; ``torch.set_num_threads(1)`` and XLA on one thread
(``XLA_FLAGS``) so the policy does not fight the envs for the 2 cores.

Usage::

    python benchmarks/bench_weights.py            # full run, ~1.5 min on 2 cores
    python benchmarks/bench_weights.py --quick    # smoke run, ~20 s
    python benchmarks/bench_weights.py --smoke    # --quick's rows, each as brief as can be (the tests')
    python benchmarks/bench_weights.py --jax-sync-dispatch   # J with jax_cpu_enable_async_dispatch=False
    python benchmarks/bench_weights.py --jax-central         # J's worker rows with JAX central too

JAX dispatches CPU computations to another thread by default; for a small policy the
thread handoff costs as much as the computation (measured: 88 us per call for the J
policy at 64 envs, 45 us with ``jax_cpu_enable_async_dispatch=False``). That flag is
global and read when JAX's CPU backend starts, so aiocollect does not set it in the main
process; J reports JAX's default there unless ``--jax-sync-dispatch`` is given (a worker's
copy always dispatches synchronously: the worker's JAX is aiocollect's own).
"""

from __future__ import annotations

import itertools
import os

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import statistics
import sys
import threading
import time
from collections.abc import Callable

import gymnasium as gym
import torch
from _common import environment, finish, parse_args, require
from tensordict.nn import TensorDictModule
from torch import nn

from aiocollect import Collector, MultiAsyncCollector, MultiSyncCollector

ENV_ID = "CartPole-v1"
BIG = (64, 1024, 896, 2)  # 986,754 parameters
SMALL = (4, 64, 64, 2)


def make_cartpole() -> gym.Env:
    return gym.make(ENV_ID)


class PadObs(nn.Module):
    """CartPole gives 4 numbers; the big MLP takes 64: zero-pad them."""

    def __init__(self, width: int):
        super().__init__()
        self.width = width

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return nn.functional.pad(obs, (0, self.width - obs.shape[-1]))


class ArgmaxMLP(nn.Module):
    def __init__(self, sizes: tuple[int, ...], seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        layers: list[nn.Module] = [PadObs(sizes[0])] if sizes[0] != 4 else []
        for i, (a, b) in enumerate(itertools.pairwise(sizes)):
            layers.append(nn.Linear(a, b))
            if i < len(sizes) - 2:
                layers.append(nn.Tanh())
        self.net = nn.Sequential(*layers)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs).argmax(-1)


def torch_policy(sizes: tuple[int, ...]) -> TensorDictModule:
    return TensorDictModule(ArgmaxMLP(sizes), in_keys=["observation"], out_keys=["action"])


def jax_policy_like(module: ArgmaxMLP):
    """A JaxPolicy computing exactly what ``module`` computes, from its weights."""
    import jax.numpy as jnp

    from aiocollect.jax import JaxPolicy

    linears = [m for m in module.net if isinstance(m, nn.Linear)]
    params = [{"w": jnp.asarray(m.weight.detach().numpy().T), "b": jnp.asarray(m.bias.detach().numpy())}
              for m in linears]
    width = linears[0].in_features

    def apply(params, obs):
        x = jnp.pad(obs, ((0, 0), (0, width - obs.shape[-1])))
        for i, layer in enumerate(params):
            x = x @ layer["w"] + layer["b"]
            if i < len(params) - 1:
                x = jnp.tanh(x)
        return jnp.argmax(x, axis=-1)

    return JaxPolicy(apply, params)


# ---------------------------------------------------------------------------- measurements


def fps(collector, batches: int, update: Callable[[], None] | None = None) -> float:
    """Frames/s over ``batches`` batches after a first, untimed one."""
    it = iter(collector)
    next(it)
    frames, start = 0, time.perf_counter()
    for _ in range(batches):
        batch = next(it)
        frames += batch.numel()
        if update is not None:
            update()
    return frames / (time.perf_counter() - start)


def update_latencies(kind: str, calls: int, collecting: bool) -> list[float]:
    """Seconds per ``update_policy_weights_`` call, while the collector collects in
    another thread (its engine then competes for the GIL) or while it is idle."""
    if kind == "torch":
        policy = torch_policy(BIG)
        trainer = torch_policy(BIG)
        send = trainer
    else:
        import jax

        policy = jax_policy_like(ArgmaxMLP(BIG))
        send = jax.tree.map(lambda x: x + 1, policy.params)
    collector = Collector([make_cartpole] * 4, policy, frames_per_batch=400, total_frames=-1)
    stop = threading.Event()

    def consume():
        for _ in collector:
            if stop.is_set():
                return

    thread = threading.Thread(target=consume, daemon=True)
    out = []
    try:
        collector.update_policy_weights_(send)  # first call allocates the snapshot buffers
        if collecting:
            thread.start()
            time.sleep(0.2)
        for _ in range(calls):
            start = time.perf_counter()
            collector.update_policy_weights_(send)
            out.append(time.perf_counter() - start)
            time.sleep(0.002)
        if kind == "jax":
            jax.block_until_ready(collector.policy.params)
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()
        collector.shutdown()
    return out


def update_cost(kind: str, calls: int, collecting: bool) -> dict:
    lat = sorted(update_latencies(kind, calls, collecting))
    return {"median_us": lat[len(lat) // 2] * 1e6, "p90_us": lat[int(len(lat) * 0.9)] * 1e6,
            "max_us": lat[-1] * 1e6}


def updating_fps(setting: str, batches: int, steps: int = 100) -> tuple[float, float]:
    """Frames/s without and with an update after every batch (of ``steps`` steps of every
    env), on one collector; ``batches`` (at least 2) of each.

    The two modes alternate every 2 batches on the same collector (same envs, same policy,
    same weights sent: episode lengths do not change), so that machine noise, which moves
    separate runs by 10-15% on a small VM, hits both alike.
    """
    if setting == "collector-16-small":
        policy, trainer = torch_policy(SMALL), torch_policy(SMALL)
        collector = Collector([make_cartpole] * 16, policy, frames_per_batch=16 * steps, total_frames=-1)
    else:
        policy, trainer = torch_policy(BIG), torch_policy(BIG)
        collector = MultiSyncCollector([[make_cartpole] * 8] * 2, policy, frames_per_batch=8 * steps,
                                       total_frames=-1)
    frames, seconds = [0, 0], [0.0, 0.0]
    try:
        it = iter(collector)
        next(it)
        for i in range(2 * batches):
            mode = (i // 2) % 2
            start = time.perf_counter()
            batch = next(it)
            if mode:
                collector.update_policy_weights_(trainer)
            seconds[mode] += time.perf_counter() - start
            frames[mode] += batch.numel()
    finally:
        collector.shutdown()
    return frames[0] / seconds[0], frames[1] / seconds[1]


def jax_vs_torch_fps(setting: str, kind: str, batches: int, steps: int = 100) -> float:
    """Frames/s of ``setting`` with the torch MLP (``kind="torch"``) or the same MLP in JAX
    (``"jax"``; ``"jax-central"``: kept in the main process)."""
    module = ArgmaxMLP((4, 64, 64, 2))
    policy = (TensorDictModule(module, in_keys=["observation"], out_keys=["action"]) if kind == "torch"
              else jax_policy_like(module))
    where = "central" if kind == "jax-central" else "auto"
    if setting == "collector-64":
        collector = Collector([make_cartpole] * 64, policy, frames_per_batch=64 * steps, total_frames=-1)
    elif setting == "multisync-2x16":
        collector = MultiSyncCollector([[make_cartpole] * 16] * 2, policy, frames_per_batch=32 * steps,
                                       total_frames=-1, policy_placement=where)
    else:
        collector = MultiAsyncCollector([[make_cartpole] * 16] * 2, policy, frames_per_batch=16 * steps,
                                        total_frames=-1, policy_placement=where)
    try:
        return fps(collector, batches)
    finally:
        collector.shutdown()


# ---------------------------------------------------------------------------- driver


def main(argv: list[str] | None = None) -> int:
    sync_dispatch = "--jax-sync-dispatch" in (argv if argv is not None else sys.argv[1:])
    if sync_dispatch:  # must happen before JAX's CPU backend starts
        import jax

        jax.config.update("jax_cpu_enable_async_dispatch", False)
        argv = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--jax-sync-dispatch"]
    jax_central = "--jax-central" in (argv if argv is not None else sys.argv[1:])
    if jax_central:
        argv = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--jax-central"]
    args = parse_args(argv, "Weight updates and JAX policies: cost to collection.", "smoke run (~20 s)")
    require("jax", "the weights benchmark (its JAX rows)")
    torch.set_num_threads(1)
    env = environment()
    print(f"# environment: {env}", file=sys.stderr)
    quick, repeats = args.quick, args.repeats
    # batches (F: of each mode, at least 2), update calls (U), steps of every env per batch (F, J)
    b_small, b_big, b_jax = (2, 2, 1) if args.smoke else (3, 3, 2) if quick else (20, 12, 12)
    calls, steps = (10, 10) if args.smoke else (40 if quick else 200, 100)

    results: dict = {"environment": env, "update_call": {}, "with_updates": {}, "jax": {}}
    for kind in ("torch", "jax"):
        for when in ("idle", "collecting"):
            print(f"U {kind} {when} ...", file=sys.stderr)
            results["update_call"][f"{kind}, {when}"] = update_cost(kind, calls, when == "collecting")

    runs: dict[tuple, list[float]] = {}
    cases = [("F", s, None) for s in ("collector-16-small", "multisync-2x8-1M")]
    j_settings = ("collector-64", "multisync-2x16", "multiasync-2x16")
    cases += [("J", s, k) for s in j_settings for k in ("torch", "jax")]
    if jax_central:
        cases += [("J", s, "jax-central") for s in j_settings[1:]]
    for r in range(repeats):
        for case in cases:
            section, setting, variant = case
            print(f"{section} {setting} {variant or ''} (run {r + 1}/{repeats}) ...", file=sys.stderr)
            if section == "F":
                without, with_updates = updating_fps(setting, b_small if "small" in setting else b_big, steps)
                runs.setdefault(("F", setting, False), []).append(without)
                runs.setdefault(("F", setting, True), []).append(with_updates)
            else:
                runs.setdefault(case, []).append(jax_vs_torch_fps(setting, variant, b_jax, steps))

    def summary(case):
        v = runs[case]
        return {"best": max(v), "median": statistics.median(v), "runs": v}

    print("\n## U. update_policy_weights_ call, 986,754-parameter policy (goal < 1000 us)")
    print(f"{'policy, collector':20} {'median us':>10} {'p90 us':>10} {'max us':>10}")
    for kind, cost in results["update_call"].items():
        print(f"{kind:20} {cost['median_us']:10.0f} {cost['p90_us']:10.0f} {cost['max_us']:10.0f}")

    print("\n## F. frames/s with an update after every batch vs without (goal ratio >= 0.95)")
    print(f"{'setting':22} {'no updates':>12} {'updates':>12} {'ratio':>7}   (best; medians in brackets)")
    for setting in ("collector-16-small", "multisync-2x8-1M"):
        a, b = summary(("F", setting, False)), summary(("F", setting, True))
        results["with_updates"][setting] = {"without": a, "with": b, "ratio": b["best"] / a["best"]}
        print(f"{setting:22} {a['best']:12,.0f} {b['best']:12,.0f} {b['best'] / a['best']:7.2f}"
              f"   ({a['median']:,.0f} / {b['median']:,.0f})")

    mode = "sync dispatch" if sync_dispatch else "JAX's default async dispatch"
    print(f"\n## J. JAX MLP vs the same torch MLP, frames/s (goal ratio >= 0.8; {mode})")
    print(f"{'setting':22} {'torch':>12} {'jax':>12} {'ratio':>7}   (best; medians in brackets)")
    for setting in j_settings:
        for kind in ("jax", "jax-central"):
            if ("J", setting, kind) not in runs:
                continue
            a, b = summary(("J", setting, "torch")), summary(("J", setting, kind))
            name = setting if kind == "jax" else f"{setting}, central"
            results["jax"][name] = {"torch": a, "jax": b, "ratio": b["best"] / a["best"]}
            print(f"{name:22} {a['best']:12,.0f} {b['best']:12,.0f} {b['best'] / a['best']:7.2f}"
                  f"   ({a['median']:,.0f} / {b['median']:,.0f})")
    print()
    return finish(results, args)


if __name__ == "__main__":
    sys.exit(main())

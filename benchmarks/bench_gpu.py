"""A policy and its batches on a GPU: throughput against TorchRL, and what weight updates cost.

Four sections, in one run, every row round-robin (``--repeats`` runs each; the tables show
the best and the median, ratios use the best):

* **G. The pixel env, W workers x 8 envs, a Nature-CNN** (``--workers``, default 12; the env
  is ``bench_engine.py``'s: 4x84x84 uint8 frames, 200 us of CPU per step; the network is the
  DQN paper's).
  aiocollect batches the CNN over every ready worker in this process, with the policy on the
  GPU (``policy_device``) and with the batches there too (``device``); the batches-by-hand row
  stores on the host and calls ``batch.to(device)`` after each batch, as a user would without
  ``storing_device``. TorchRL's ``MultiSyncCollector`` runs the same CNN in each worker on the
  GPU. The limit is W cores stepping 8 envs each in a bare loop.
* **J. The same, with the CNN written in JAX** (``JaxPolicy``, params on the GPU, batches
  stored on the GPU and handed to JAX by ``to_jax`` after each one), against the torch CNN in
  the same collector and TorchRL's.
* **C. CUDA graphs** (``cudagraph_policy``): CartPole, whose steps cost microseconds, with a
  small MLP (4-64-64-2, argmax) on the GPU, so each policy call's kernel launches are much of
  a round's cost: ``Collector`` over 32 envs and ``MultiSyncCollector`` over W x 16, each
  without and with ``cudagraph_policy=True``, and TorchRL's ``Collector`` over a
  ``SyncVectorEnv`` of 32, without and with its ``cudagraph_policy=True``. The table gives
  each graph row's ratio to the same collector without graphs.
* **U. The update call for a CUDA module** (the Nature-CNN, 1.7M parameters) while the
  collector collects in another thread: median, 90th percentile and worst of
  ``update_policy_weights_`` in milliseconds, in ``Collector``, ``MultiSyncCollector`` and
  ``MultiAsyncCollector``, and in TorchRL's ``MultiSyncCollector``. Goal: < 1 ms median.

Goals (16 cores and a GPU): G >= 0.8 of the limit and >= 3x TorchRL.

    python benchmarks/bench_gpu.py                     # on a CUDA machine, ~4 min
    python benchmarks/bench_gpu.py --quick             # smoke run
    python benchmarks/bench_gpu.py --device cpu --quick --workers 2   # the script itself, anywhere
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import statistics
import sys
import threading
import time
import warnings

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch shares the GPU

import gymnasium as gym
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_engine as eng
from _common import environment, finish

import aiocollect

HAVE_TORCHRL = importlib.util.find_spec("torchrl") is not None
HAVE_JAX = importlib.util.find_spec("jax") is not None
ENVS = eng.P_ENVS


# ---------------------------------------------------------------------------- the CNN in torch

class NatureCNN(torch.nn.Module):
    """The DQN paper's network on 4x84x84 uint8 frames, argmax over the pixel env's 6 actions."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.net = nn.Sequential(
            nn.Conv2d(4, 32, 8, 4), nn.ReLU(), nn.Conv2d(32, 64, 4, 2), nn.ReLU(), nn.Conv2d(64, 64, 3, 1),
            nn.ReLU(), nn.Flatten(), nn.Linear(3136, 512), nn.ReLU(), nn.Linear(512, 6),
        )

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs.float() / 255).argmax(-1)


def cnn_policy():
    from tensordict.nn import TensorDictModule

    torch.manual_seed(0)
    return TensorDictModule(NatureCNN(), in_keys=["observation"], out_keys=["action"])


def torchrl_pixel_env():
    """A TorchRL worker's env: the pixel env's ``SyncVectorEnv`` of 8, wrapped."""
    from torchrl.envs import GymWrapper

    vec = gym.vector.SyncVectorEnv([eng.PixelEnv] * ENVS, autoreset_mode=gym.vector.AutoresetMode.DISABLED)
    return GymWrapper(vec, categorical_action_encoding=True)  # the CNN's argmax, not one-hot


def torchrl_multisync(workers: int, device: str, frames_per_batch: int, total_frames: int):
    """TorchRL's MultiSyncCollector over the pixel env, each worker running the CNN on ``device``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.getLogger("torchrl").setLevel(logging.ERROR)
        from torchrl.collectors import MultiSyncCollector

        return MultiSyncCollector([torchrl_pixel_env] * workers, cnn_policy(), frames_per_batch=frames_per_batch,
                                  total_frames=total_frames, policy_device=device)


def torchrl_cnn(workers: int, device: str, steps: int, batches: int) -> float:
    """Frames/s of ``torchrl_multisync``."""
    fpb = workers * ENVS * steps
    c = torchrl_multisync(workers, device, fpb, fpb * (batches + 1))
    try:
        return eng.timed(c, batches)
    finally:
        c.shutdown()



# ---------------------------------------------------------------------------- C: CUDA graphs

GRAPH_ENVS = 32
"""CartPole envs of section C's ``Collector`` rows (W x 16 for ``MultiSyncCollector``)."""


def mlp_policy():
    """A small MLP on CartPole (4-64-64-2, argmax): a dozen kernel launches per call."""
    from tensordict.nn import TensorDictModule

    torch.manual_seed(0)
    nn = torch.nn
    net = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))
    return TensorDictModule(_Argmax(net), in_keys=["observation"], out_keys=["action"])


class _Argmax(torch.nn.Module):
    def __init__(self, net: torch.nn.Module):
        super().__init__()
        self.net = net

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs).argmax(-1)


def aio_mlp(cls_name: str, workers: int, steps: int, batches: int, device: str, graphs: bool) -> float:
    """Frames/s of an aiocollect collector over CartPole with ``mlp_policy`` on ``device``."""
    cls = getattr(aiocollect, cls_name)
    if cls_name == "Collector":
        envs, fpb = [eng.make_cartpole] * GRAPH_ENVS, GRAPH_ENVS * steps
    else:
        envs, fpb = [[eng.make_cartpole] * 16] * workers, workers * 16 * steps
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (``--device cpu``: "CUDA graphs need a CUDA device")
        c = cls(envs, mlp_policy(), frames_per_batch=fpb, policy_device=device, cudagraph_policy=graphs)
    with c:
        return eng.timed(c, batches)


def torchrl_mlp(device: str, steps: int, batches: int, graphs: bool) -> float:
    """Frames/s of TorchRL's ``Collector`` over a ``SyncVectorEnv`` of 32 CartPoles, ``mlp_policy`` on ``device``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.getLogger("torchrl").setLevel(logging.ERROR)
        from torchrl.collectors import Collector
        from torchrl.envs import GymWrapper

        vec = gym.vector.SyncVectorEnv([eng.make_cartpole] * GRAPH_ENVS,
                                       autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        env = GymWrapper(vec, categorical_action_encoding=True)
        fpb = GRAPH_ENVS * steps
        c = Collector(env, mlp_policy(), frames_per_batch=fpb, total_frames=fpb * (batches + 1),
                      policy_device=device, cudagraph_policy=graphs)
    try:
        return eng.timed(c, batches)
    finally:
        c.shutdown()


# ---------------------------------------------------------------------------- the CNN in JAX

def jax_cnn_params(seed: int = 0) -> dict:
    """The Nature-CNN's shapes, initialised like torch's defaults (uniform, fan-in scaled)."""
    import jax
    import jax.numpy as jnp

    shapes = {"c1": (32, 4, 8, 8), "c2": (64, 32, 4, 4), "c3": (64, 64, 3, 3), "l1": (3136, 512), "l2": (512, 6)}
    keys = jax.random.split(jax.random.key(seed), 2 * len(shapes))
    params = {}
    for i, (name, shape) in enumerate(shapes.items()):
        fan_in = shape[0] if name.startswith("l") else shape[1] * shape[2] * shape[3]
        bound = 1 / fan_in ** 0.5
        bias = shape[1] if name.startswith("l") else shape[0]
        params[name] = jax.random.uniform(keys[2 * i], shape, jnp.float32, -bound, bound)
        params[name + "_b"] = jax.random.uniform(keys[2 * i + 1], (bias,), jnp.float32, -bound, bound)
    return params


def jax_cnn_apply(params, obs):
    import jax
    import jax.numpy as jnp

    x = obs.astype(jnp.float32) / 255
    for name, stride in (("c1", 4), ("c2", 2), ("c3", 1)):
        x = jax.lax.conv_general_dilated(x, params[name], (stride, stride), "VALID",
                                         dimension_numbers=("NCHW", "OIHW", "NCHW"))
        x = jax.nn.relu(x + params[name + "_b"][None, :, None, None])
    x = x.reshape(x.shape[0], -1)
    x = jax.nn.relu(x @ params["l1"] + params["l1_b"])
    return jnp.argmax(x @ params["l2"] + params["l2_b"], axis=-1)


# ---------------------------------------------------------------------------- rows

def aio_cnn(cls_name: str, workers: int, steps: int, batches: int, policy, by_hand: str | None = None,
            jax_learner: bool = False, **devices) -> float:
    """Frames/s of an aiocollect collector over the pixel env with ``policy``."""
    cls = getattr(aiocollect, cls_name)
    fpb = ENVS * steps * (workers if cls_name == "MultiSyncCollector" else 1)
    with cls([[eng.PixelEnv] * ENVS] * workers, policy, frames_per_batch=fpb, **devices) as c:
        it = iter(c)
        next(it)
        next(it)  # (the first batch sizes the pinned staging block; the second uses it)
        frames = 0
        t0 = time.perf_counter()
        for _ in range(batches):
            batch = next(it)
            if by_hand is not None:
                batch = batch.to(by_hand)
            if jax_learner:
                from aiocollect.jax import to_jax

                to_jax(batch)
            frames += batch.numel()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return frames / (time.perf_counter() - t0)


class _Updates:
    """Times ``update_policy_weights_`` from a trainer thread while the main thread collects."""

    def __init__(self, collector, trainer: torch.nn.Module, calls: int):
        self.collector, self.trainer, self.calls = collector, trainer, calls
        self.times: list[float] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            while len(self.times) < self.calls:
                t0 = time.perf_counter()
                self.collector.update_policy_weights_(self.trainer)
                self.times.append(time.perf_counter() - t0)
                time.sleep(0.005)
        except BaseException as exc:  # noqa: BLE001 - reported in the table
            self.error = exc

    def run(self) -> list[float]:
        self.thread.start()
        for _ in self.collector:
            if not self.thread.is_alive():
                break
        self.thread.join()
        if self.error is not None:
            raise self.error
        return sorted(self.times)


def update_ms(kind: str, device: str, workers: int, calls: int) -> list[float]:
    """Sorted update-call times (ms) of a CUDA Nature-CNN during collection."""
    trainer = cnn_policy().to(device)
    steps = 10
    if kind == "TorchRL":
        c = torchrl_multisync(workers, device, workers * ENVS * steps, -1)
        try:
            times = _Updates(c, trainer, calls).run()
        finally:
            c.shutdown()
    else:
        cls = getattr(aiocollect, kind)
        envs = [eng.PixelEnv] * ENVS if kind == "Collector" else [[eng.PixelEnv] * ENVS] * workers
        fpb = ENVS * steps * (workers if kind == "MultiSyncCollector" else 1)
        with cls(envs, cnn_policy(), frames_per_batch=fpb, policy_device=device) as c:
            times = _Updates(c, trainer, calls).run()
    return [t * 1e3 for t in times]


def rows_for(args) -> list[eng.Row]:
    w, dev, quick = args.workers, args.device, args.quick
    steps, batches = (10, 2) if quick else (50, 12)
    rows: list[eng.Row] = [eng.Row("G", "limit", lambda: eng.limit(eng.PixelEnv, ENVS, w, 400 if quick else 4_000))]
    for cls in ("MultiSyncCollector", "MultiAsyncCollector"):
        rows.append(eng.Row("G", f"aiocollect {cls} {w}x{ENVS}, CNN on {dev}",
                            lambda cls=cls: aio_cnn(cls, w, steps, batches, cnn_policy(), policy_device=dev)))
    rows.append(eng.Row("G", f"aiocollect MultiSyncCollector {w}x{ENVS}, CNN and batches on {dev}",
                        lambda: aio_cnn("MultiSyncCollector", w, steps, batches, cnn_policy(), device=dev)))
    rows.append(eng.Row("G", f"aiocollect MultiSyncCollector {w}x{ENVS}, CNN on {dev}, batch.to({dev!r}) by hand",
                        lambda: aio_cnn("MultiSyncCollector", w, steps, batches, cnn_policy(), by_hand=dev,
                                        policy_device=dev)))
    if HAVE_TORCHRL:
        rows.append(eng.Row("G", f"TorchRL MultiSync {w}x GymWrapper(SyncVec{ENVS}), CNN on {dev}",
                            lambda: torchrl_cnn(w, dev, steps, max(2, batches // 2))))
    if HAVE_JAX:
        from aiocollect.jax import JaxPolicy

        rows.append(eng.Row("J", "limit", lambda: eng.limit(eng.PixelEnv, ENVS, w, 400 if quick else 4_000)))
        rows.append(eng.Row("J", f"aiocollect MultiSyncCollector {w}x{ENVS}, JAX CNN, batches on {dev}, to_jax",
                            lambda: aio_cnn("MultiSyncCollector", w, steps, batches,
                                            JaxPolicy(jax_cnn_apply, jax_cnn_params()), jax_learner=True,
                                            storing_device=dev)))
        rows.append(eng.Row("J", f"aiocollect MultiSyncCollector {w}x{ENVS}, torch CNN, batches on {dev}",
                            lambda: aio_cnn("MultiSyncCollector", w, steps, batches, cnn_policy(), device=dev)))
        if HAVE_TORCHRL:
            rows.append(eng.Row("J", f"TorchRL MultiSync {w}x GymWrapper(SyncVec{ENVS}), torch CNN on {dev}",
                                lambda: torchrl_cnn(w, dev, steps, max(2, batches // 2))))
    graph_steps, graph_batches = (20, 2) if quick else (200, 10)
    for graphs in (False, True):
        suffix = " + cudagraph_policy" if graphs else ""
        rows.append(eng.Row("C", f"aiocollect Collector {GRAPH_ENVS} envs, MLP on {dev}{suffix}",
                            lambda graphs=graphs: aio_mlp("Collector", w, graph_steps, graph_batches, dev, graphs)))
    for graphs in (False, True):
        suffix = " + cudagraph_policy" if graphs else ""
        rows.append(eng.Row("C", f"aiocollect MultiSyncCollector {w}x16, MLP on {dev}{suffix}",
                            lambda graphs=graphs: aio_mlp("MultiSyncCollector", w, graph_steps, graph_batches, dev,
                                                          graphs)))
    if HAVE_TORCHRL:
        for graphs in (False, True):
            suffix = " + cudagraph_policy" if graphs else ""
            rows.append(eng.Row("C", f"TorchRL Collector GymWrapper(SyncVec{GRAPH_ENVS}), MLP on {dev}{suffix}",
                                lambda graphs=graphs: torchrl_mlp(dev, graph_steps, graph_batches, graphs)))
    calls = 20 if quick else 100
    kinds = ["Collector", "MultiSyncCollector", "MultiAsyncCollector"] + (["TorchRL"] if HAVE_TORCHRL else [])
    for kind in kinds:
        rows.append(eng.Row("U", kind, lambda kind=kind: update_ms(kind, dev, min(w, 4), calls), "ms"))
    return rows


def report(rows: list[eng.Row], args) -> dict:
    titles = {"G": f"G. Pixel env, {args.workers} workers x {ENVS} envs, a Nature-CNN policy on {args.device}",
              "J": f"J. The same with the CNN in JAX ({args.workers} x {ENVS})",
              "C": f"C. CUDA graphs: CartPole, a small MLP on {args.device}, without and with cudagraph_policy",
              "U": f"U. update_policy_weights_ of a Nature-CNN on {args.device} during collection (ms)"}
    results = []
    for section in dict.fromkeys(r.section for r in rows):
        print(f"\n{titles[section]}\n")
        part = [r for r in rows if r.section == section]
        if section == "U":
            print(f"{'collector':28s} | {'median':>8s} | {'p90':>8s} | {'worst':>8s}   (all runs pooled)")
            print("-" * 64)
            for r in part:
                if r.error:
                    print(f"{r.name:28s} | error: {r.error.splitlines()[-1][:60]}")
                    continue
                times = sorted(t for run in r.runs for t in run)
                med, p90 = statistics.median(times), times[int(0.9 * (len(times) - 1))]
                print(f"{r.name:28s} | {med:8.3f} | {p90:8.3f} | {times[-1]:8.3f}")
                results.append({"section": section, "name": r.name, "unit": "ms", "median": med, "p90": p90,
                                "worst": times[-1], "calls": len(times)})
            continue
        lim = next((r.best for r in part if r.name == "limit"), None)
        print(f"{'name':76s} | {'best':>10s} | {'median':>10s} | {'vs limit':>8s}")
        print("-" * 115)
        for r in part:
            if r.error:
                print(f"{r.name:76s} | error: {r.error.splitlines()[-1][:60]}")
                results.append({"section": section, "name": r.name, "error": r.error})
                continue
            med = statistics.median(r.runs)
            ratio = f"{r.best / lim:.2f}" if lim else ""
            print(f"{r.name:76s} | {r.best:10,.0f} | {med:10,.0f} | {ratio:>8s}")
            results.append({"section": section, "name": r.name, "unit": "frames/s", "runs": r.runs,
                            "best": r.best, "limit_ratio": r.best / lim if lim else None})
        if section == "C":
            for r in part:
                eager = next((e for e in part if e.name + " + cudagraph_policy" == r.name and e.runs), None)
                if eager is not None and r.runs:
                    print(f"  {r.name}: {r.best / eager.best:.2f}x without graphs")
            continue
        torchrl = next((r.best for r in part if r.name.startswith("TorchRL") and r.runs), None)
        if torchrl:
            for r in part:
                if r.name.startswith("aiocollect") and r.runs:
                    print(f"  {r.name}: {r.best / torchrl:.2f}x TorchRL")
    return {"environment": environment(), "cores": eng.cores(), "device": args.device,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None, "results": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run")
    parser.add_argument("--repeats", type=int, default=None, help="runs per row (default 3; 1 with --quick)")
    parser.add_argument("--workers", type=int, default=12, help="worker processes of G and J (default 12)")
    parser.add_argument("--device", default="cuda", help="the policy's and the batches' device (default cuda)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("no CUDA device here: run on a GPU machine, or give --device cpu to try the script")
    repeats = args.repeats or (1 if args.quick else 3)
    torch.set_num_threads(1)
    env = environment()
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    print(f"aiocollect {env['aiocollect']} | torch {env['torch']} | torchrl {env['torchrl']} | "
          f"python {env['python']} | {eng.cores()} cores | {gpu} | load {env['load_average_1min']:.2f}")
    rows = rows_for(args)

    def keep() -> None:  # the runs so far, should the run be cut short
        if args.json:
            with open(args.json + ".partial", "w") as f:
                json.dump([{"section": r.section, "name": r.name, "runs": r.runs, "error": r.error} for r in rows], f)

    eng.run_rows(rows, repeats, keep)
    print()
    return finish(report(rows, args), args)


if __name__ == "__main__":
    sys.exit(main())

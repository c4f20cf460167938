"""What one ``update_policy_weights_`` costs the caller, with the policy central or in the workers.

A ``MultiSyncCollector`` over 2 workers x 4 CartPole envs, acting with an MLP of about 4.2M
parameters (4-2048-2048-2, a ``TensorDictModule``), built once with
``policy_placement="central"`` and once with ``"workers"``; each collects a few batches,
then the update call is timed ``--calls`` times while the collector is idle (median and 90th
percentile, in ms). The update should copy the weights once whatever the placement.

Usage::

    python benchmarks/update_by_placement.py [--calls 50]
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym
import torch
from tensordict.nn import TensorDictModule
from torch import nn

from aiocollect import MultiSyncCollector


def make_cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


class Argmax(nn.Module):
    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.net(observation).argmax(-1)


def policy() -> TensorDictModule:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 2048), nn.Tanh(), nn.Linear(2048, 2048), nn.Tanh(), nn.Linear(2048, 2))
    return TensorDictModule(Argmax(net), in_keys=["observation"], out_keys=["action"])


def timings(placement: str, calls: int) -> list[float]:
    trainer = policy()
    collector = MultiSyncCollector([[make_cartpole] * 4] * 2, trainer, frames_per_batch=64, total_frames=-1,
                                   policy_placement=placement)
    try:
        it = iter(collector)
        for _ in range(3):
            next(it)
        assert collector.policy_in_workers == (placement == "workers")
        out = []
        for _ in range(calls):
            with torch.no_grad():
                for p in trainer.parameters():
                    p.add_(1e-4)
            t0 = time.perf_counter()
            collector.update_policy_weights_(trainer)
            out.append(time.perf_counter() - t0)
            next(it)  # (the workers load each version before the next batch's steps)
    finally:
        collector.shutdown()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    params = sum(p.numel() for p in policy().parameters())
    print(f"MLP of {params:,} parameters; update_policy_weights_ in ms, {args.calls} calls")
    for placement in ("central", "workers"):
        times = sorted(timings(placement, args.calls))
        p90 = times[int(0.9 * (len(times) - 1))]
        print(f"  {placement:8s} median {statistics.median(times) * 1e3:6.2f}  p90 {p90 * 1e3:6.2f}")


if __name__ == "__main__":
    main()

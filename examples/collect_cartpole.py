"""Collect CartPole-v1 with aiocollect and print the throughput.

The main job of the README: 8 CartPole envs stepped in this process, a random policy
(``policy=None``), batches of 1,000 frames in TorchRL's layout, a progress bar, and the
frames per second at the end.

    python examples/collect_cartpole.py --envs 8 --frames 200000
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
from tqdm import tqdm

from aiocollect import Collector


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=8, help="CartPole envs stepped together")
    parser.add_argument("--frames", type=int, default=200_000, help="total frames to collect")
    parser.add_argument("--frames-per-batch", type=int, default=1_000, help="frames per batch")
    args = parser.parse_args()

    make_env = lambda: gym.make("CartPole-v1")  # lambdas are fine factories
    with Collector([make_env] * args.envs, None, frames_per_batch=args.frames_per_batch,
                   total_frames=args.frames) as collector:
        collector.set_seed(0)
        start = time.perf_counter()
        with tqdm(total=args.frames, unit="frames", unit_scale=True) as bar:
            for batch in collector:
                bar.update(batch.numel())
        elapsed = time.perf_counter() - start
        stats = collector.statistics()
    print(f"batch shape {tuple(batch.shape)}, {stats.completed_trajectories} trajectories finished")
    print(f"{stats.frames} frames in {elapsed:.2f} s: {stats.frames / elapsed:,.0f} frames/s")


if __name__ == "__main__":
    main()

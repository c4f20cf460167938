"""Coroutine envs playing a game server over TCP, collected by aiocollect.

The game server (``game_server.py``, beside this file: a few lines of asyncio streams) is
started here on loopback as a program of its own, as a real server would be: it does not
share this process's GIL, nor import what this one imports. Each env is
an ``aiocollect.AsyncEnv`` that holds its own TCP connection, and each of its steps is a
request and a reply. The server answers every request after a random 5-15 ms, standing in
for a real server's latency. The collector runs a few hundred of them concurrently on one
event loop. The policy is batched over whichever envs have their reply.

    python examples/coroutine_game.py --envs 256 --frames 100000
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from aiocollect import AsyncEnv, Collector

# ------------------------------------------------------------------------ the game server

SERVER = Path(__file__).with_name("game_server.py")


def start_server() -> tuple[subprocess.Popen, int]:
    """``game_server.py`` in a process of its own, as a real server would be; returns it and its port."""
    proc = subprocess.Popen([sys.executable, str(SERVER)], stdout=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline())


# ------------------------------------------------------------------------ the env


class GameEnv(AsyncEnv):
    """Plays the game over its own TCP connection, opened at the first reset."""

    def __init__(self, port: int):
        self.port = port
        self.observation_space = gym.spaces.Box(-10, 10, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(3)
        self.reader = self.writer = None

    async def _ask(self, line: str) -> list[int]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writer.write(line.encode())
        await self.writer.drain()
        return [int(v) for v in (await self.reader.readline()).split()]

    async def reset(self, *, seed=None, options=None):
        x, _, _ = await self._ask(f"RESET {'-' if seed is None else seed}\n")
        return np.array([x], np.float32), {}

    async def step(self, action):
        x, reward, done = await self._ask(f"STEP {int(action)}\n")
        return np.array([x], np.float32), float(reward), bool(done), False, {}

    async def close(self):
        if self.writer is not None:
            self.writer.close()
            await self.writer.wait_closed()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=256, help="coroutine envs, one TCP connection each")
    parser.add_argument("--frames", type=int, default=100_000, help="total frames to collect")
    args = parser.parse_args()

    server, port = start_server()

    def act(obs: torch.Tensor) -> torch.Tensor:
        """Move right (2) with probability 0.6, else left or stay."""
        n = obs.shape[0]
        return torch.where(torch.rand(n) < 0.6, 2, torch.randint(0, 2, (n,)))

    frames_per_batch = args.envs * 50
    total = max(frames_per_batch, args.frames // frames_per_batch * frames_per_batch)
    try:
        with Collector([lambda: GameEnv(port)] * args.envs, act, frames_per_batch=frames_per_batch,
                       total_frames=total) as collector:
            collector.set_seed(0)
            start, returns = time.perf_counter(), []
            for batch in collector:
                done = batch["next", "done"][..., 0]
                returns += batch["next", "reward"][..., 0][done].tolist()
            elapsed = time.perf_counter() - start
    finally:
        server.kill()
        server.wait()
    print(f"{total} frames from {args.envs} TCP envs in {elapsed:.2f} s: {total / elapsed:,.0f} frames/s "
          f"(latency bound {args.envs / 0.010:,.0f})")
    print(f"{len(returns)} episodes, mean return {np.mean(returns):+.2f}")


if __name__ == "__main__":
    main()

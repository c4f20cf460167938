"""Coroutine envs playing a game server over TCP, collected by aiocollect.

The game server is a few lines of asyncio streams, started here on loopback in a process
of its own (as a real server would be: it does not share this process's GIL). Each env is
an ``aiocollect.AsyncEnv`` that holds its own TCP connection, and each of its steps is a
request and a reply. The server answers every request after a random 5-15 ms, standing in
for a real server's latency. The collector runs a few hundred of them concurrently on one
event loop. The policy is batched over whichever envs have their reply.

    python examples/coroutine_game.py --envs 256 --frames 100000
"""

from __future__ import annotations

import argparse
import asyncio
import random
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
import torch

from aiocollect import AsyncEnv, Collector

# ------------------------------------------------------------------------ the game server


async def play(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A walker on a line: ``RESET seed`` starts it in [-3, 3], ``STEP a`` moves it by a - 1;
    the episode ends at |x| >= 5 (reward 1 at +5, -1 at -5). Replies come after 5-15 ms."""
    x = 0
    try:
        while line := await reader.readline():
            cmd, arg = line.decode().split()
            await asyncio.sleep(random.uniform(0.005, 0.015))
            if cmd == "RESET":
                x = random.Random(None if arg == "-" else int(arg)).randint(-3, 3)
                writer.write(f"{x} 0 0\n".encode())
            else:
                x += int(arg) - 1
                done = abs(x) >= 5
                writer.write(f"{x} {int(done) * (1 if x > 0 else -1)} {int(done)}\n".encode())
            await writer.drain()
    except ConnectionError:  # the client left with a step in flight (its collector shut down)
        pass
    finally:
        writer.close()


async def serve() -> None:
    """Serve the game on a free loopback port, print the port, run until killed."""
    server = await asyncio.start_server(play, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()


def start_server() -> tuple[subprocess.Popen, int]:
    """The game server in a process of its own, as a real one would be; returns it and its port."""
    proc = subprocess.Popen([sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True)
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
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the server process
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve())
        return

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

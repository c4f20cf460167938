"""Coroutine envs for the tests: awaited latency, and a game played over a real TCP socket."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
from gymnasium import spaces

from aiocollect import AsyncEnv


class LatencyEnv(AsyncEnv):
    """Obs ``[id, t, last action]``; each step awaits a latency drawn from ``[low, high]``.

    Records its step times (loop time), the envs it saw cancelled, and whether it was closed.
    Every instance is kept in ``LatencyEnv.made`` (tests clear it).
    """

    made: list = []

    def __init__(self, env_id: int = 0, low: float = 0.001, high: float = 0.003, length: int = 25,
                 hang_at: int | None = None, fail_at: int | None = None):
        self.observation_space = spaces.Box(-1e9, 1e9, (3,), np.float32)
        self.action_space = spaces.Discrete(3)
        self.env_id, self.low, self.high, self.length = env_id, low, high, length
        self.hang_at, self.fail_at = hang_at, fail_at
        self.step_times: list[float] = []
        self.steps = 0
        self.cancelled = 0
        self.closed = False
        self.loop_ids: set[int] = set()
        self.seeds: list = []
        """The seed of each reset."""
        LatencyEnv.made.append(self)

    async def reset(self, *, seed=None, options=None):
        await super().reset(seed=seed)
        self.seeds.append(seed)
        await asyncio.sleep(self.np_random.uniform(self.low, self.high))
        self.t = 0
        return np.array([self.env_id, 0, -1], np.float32), {}

    async def step(self, action):
        self.loop_ids.add(id(asyncio.get_running_loop()))
        self.steps += 1
        if self.fail_at is not None and self.steps == self.fail_at:
            raise RuntimeError(f"env {self.env_id} broke at step {self.steps}")
        try:
            if self.hang_at is not None and self.steps >= self.hang_at:
                await asyncio.sleep(3600)
            await asyncio.sleep(self.np_random.uniform(self.low, self.high))
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.step_times.append(asyncio.get_running_loop().time())
        self.t += 1
        obs = np.array([self.env_id, self.t, int(action)], np.float32)
        return obs, float(self.t), False, self.t >= self.length, {}

    async def close(self):
        self.closed = True


# ----------------------------------------------------------------------------- a TCP game


async def _serve_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The game: a walker on a line. ``RESET seed`` puts it at a seeded start in [-3, 3];
    ``STEP a`` moves it by ``a - 1``; the episode ends (terminated) at |x| >= 5."""
    x = 0
    try:
        while line := await reader.readline():
            cmd, arg = line.decode().split()
            if cmd == "RESET":
                x = int(np.random.default_rng(int(arg)).integers(-3, 4)) if arg != "-" else 0
                writer.write(f"{x} 0 0\n".encode())
            elif cmd == "STEP":
                x += int(arg) - 1
                done = int(abs(x) >= 5)
                writer.write(f"{x} {1 if done else 0} {done}\n".encode())
            await writer.drain()
    finally:
        writer.close()


class GameServer:
    """The game on loopback, served by its own event loop in a thread (so sync tests can use it too)."""

    def __init__(self):
        self.port: int | None = None
        self.clients = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> GameServer:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()

        async def handle(reader, writer):
            self.clients += 1
            await _serve_one(reader, writer)

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()


class SocketGameEnv(AsyncEnv):
    """Plays the game over a real TCP connection (asyncio streams), opened at the first reset."""

    def __init__(self, port: int):
        self.port = port
        self.observation_space = spaces.Box(-10, 10, (1,), np.float32)
        self.action_space = spaces.Discrete(3)
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.closed = False

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
        self.closed = True
        if self.writer is not None:
            self.writer.close()
            await self.writer.wait_closed()


class PlainCounterEnv:
    """A gymnasium env with LatencyEnv's spaces and obs layout (no latency), for mixing."""

    def __new__(cls, env_id: int = 99, length: int = 25):
        import gymnasium as gym

        class _Env(gym.Env):
            observation_space = spaces.Box(-1e9, 1e9, (3,), np.float32)
            action_space = spaces.Discrete(3)

            def reset(self, *, seed=None, options=None):
                super().reset(seed=seed)
                self.t = 0
                return np.array([env_id, 0, -1], np.float32), {}

            def step(self, action):
                self.t += 1
                return np.array([env_id, self.t, int(action)], np.float32), float(self.t), False, self.t >= length, {}

        return _Env()


class AwaitingEnv(AsyncEnv):
    """A gymnasium env behind ``async`` ``reset``/``step``: each call yields to the loop once,
    then runs the env. The contract suite's coroutine variants step the same envs as the
    others this way, so their batches can be compared."""

    def __init__(self, env):
        self.env = env
        self.observation_space, self.action_space = env.observation_space, env.action_space

    async def reset(self, *, seed=None, options=None):
        await asyncio.sleep(0)
        return self.env.reset(seed=seed, options=options)

    async def step(self, action):
        await asyncio.sleep(0)
        return self.env.step(action)

    async def close(self):
        self.env.close()


class HangingEnv(AsyncEnv):
    """A coroutine env whose ``hang_at``-th step never answers."""

    def __init__(self, hang_at: int = 3):
        self.observation_space = spaces.Box(-1e6, 1e6, (3,), np.float32)  # CounterEnv's
        self.action_space = spaces.Discrete(3)
        self.hang_at, self.steps = hang_at, 0

    async def reset(self, *, seed=None, options=None):
        return np.zeros(3, np.float32), {}

    async def step(self, action):
        self.steps += 1
        if self.steps >= self.hang_at:
            await asyncio.Event().wait()
        return np.full(3, self.steps, np.float32), 0.0, False, False, {}


class AsCoroutine:
    """A picklable factory: ``AsCoroutine(make_env)()`` is ``AwaitingEnv(make_env())`` (a coroutine
    env made by ``make_env`` is left as it is)."""

    def __init__(self, make_env):
        self.make_env = make_env

    def __call__(self):
        env = self.make_env()
        return env if isinstance(env, AsyncEnv) else AwaitingEnv(env)

"""Coroutine envs: envs whose ``reset`` and ``step`` await I/O.

A coroutine env waits rather than computes: a simulator or game server behind a socket, a
web API, a tool an agent calls, a robot. Hundreds of them share one event loop, and the
scheduler steps each one as soon as its action is ready (``_workers.coroutine_lanes``).

The protocol, [`AsyncEnv`][aiocollect.AsyncEnv], is gymnasium's with ``async``; its class
docstring says what users see. ``is_async_env`` recognises one, ``check_async_env``
checks that it is complete.

Coroutine envs in the other layers: ``_envs.coroutine_group`` (``CoroutineGroup``, whose
envs step one at a time; gymnasium envs in it step inline or in a thread, ``ThreadEnv``),
``_workers.coroutine_lanes`` (a ``Collector``'s coroutine envs, each a lane of the
scheduler) and ``_workers.coroutine_worker`` (an entry of coroutine envs in a worker
collector's ``create_env_fn``, stepped on the engine loop beside the worker processes).
"""

from __future__ import annotations

import inspect
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.utils import seeding


class AsyncEnv:
    """Base class of coroutine envs: gymnasium's ``Env`` with ``async def reset`` and ``step``.

    A coroutine env waits rather than computes: a simulator or game server behind a
    socket, a web API, a tool an agent calls, a robot. A [`Collector`][aiocollect.Collector]
    steps hundreds of them on one event loop, each as soon as its action is ready, and runs
    the policy batched over whichever are ready (``max_batch_size``, ``min_batch_size``,
    ``batch_timeout``; with ``step_timeout``, an env that does not answer in time fails the
    collection with [`StepTimeoutError`][aiocollect.StepTimeoutError]). The multi-process collectors take
    them too: an entry of coroutine envs runs on their engine loop, in the main process,
    instead of in a worker process.

    Subclassing is a convenience, not a requirement: any object of this shape works.

    ```python
    class MyEnv:                      # any object of this shape works
        observation_space: gym.Space
        action_space: gym.Space
        async def reset(self, *, seed=None, options=None) -> tuple[obs, dict]: ...
        async def step(self, action) -> tuple[obs, float, bool, bool, dict]: ...
        async def close(self) -> None: ...          # optional
    ```

    ``reset``, ``step`` and ``close`` (if any) must be coroutine functions, and
    ``observation_space`` and ``action_space`` gymnasium spaces; a collector checks both at
    construction. A subclass gets ``np_random``, seeded by ``reset(seed=...)`` as
    gymnasium's ``Env`` seeds it (its ``reset`` calls ``await super().reset(seed=seed)``
    first), and a ``close`` that does nothing. Connections belong to
    the loop that opened them, so a collector runs its coroutine envs on one event loop of
    its own for their whole life.

    Examples:
        ```python
        class GameEnv(aiocollect.AsyncEnv):
            def __init__(self, port):
                self.observation_space = gym.spaces.Box(-10, 10, (1,), np.float32)
                self.action_space = gym.spaces.Discrete(3)
                self.port, self.writer = port, None

            async def reset(self, *, seed=None, options=None):
                await super().reset(seed=seed)      # seeds self.np_random
                if self.writer is None:
                    self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
                ...
                return obs, {}

            async def step(self, action):
                self.writer.write(f"STEP {int(action)}\\n".encode())
                line = await self.reader.readline()
                ...
                return obs, reward, terminated, truncated, {}

        collector = Collector([lambda: GameEnv(port)] * 256, policy, frames_per_batch=256 * 100)
        for batch in collector:                     # [256, 100]
            ...
        ```
    """

    observation_space: gym.Space
    """The space of one observation (set it in ``__init__``)."""
    action_space: gym.Space
    """The space of one action (set it in ``__init__``)."""
    _np_random: np.random.Generator | None = None

    @property
    def np_random(self) -> np.random.Generator:
        """The env's random generator: seeded by ``reset(seed=...)``, from fresh entropy until then."""
        if self._np_random is None:
            self._np_random, _ = seeding.np_random()
        return self._np_random

    async def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        """Start a new episode; subclasses override it and call ``await super().reset(seed=seed)`` first.

        This base version only (re)seeds ``np_random`` when ``seed`` is given.

        Args:
            seed: the seed of the new episode, from ``collector.set_seed()``, or ``None``.
            options: gymnasium's reset options (collectors pass none).

        Returns:
            ``(observation, info)``; here ``(None, {})``.
        """
        if seed is not None:
            self._np_random, _ = seeding.np_random(seed)
        return None, {}

    async def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        """Take one step with ``action``; subclasses must implement it.

        Args:
            action: one env's action, a sample of ``action_space`` (a numpy array, or a
                numpy integer for a ``Discrete`` space).

        Returns:
            ``(observation, reward, terminated, truncated, info)``, as gymnasium's ``step``.

        Raises:
            NotImplementedError: in this base class.
        """
        raise NotImplementedError

    async def close(self) -> None:
        """Release what the env holds (connections...); awaited once, at the collector's ``shutdown()``."""


def is_async_env(env: Any) -> bool:
    """Whether ``env`` follows the [`AsyncEnv`][aiocollect.AsyncEnv] protocol (coroutine ``step`` and ``reset``)."""
    if isinstance(env, AsyncEnv):
        return True
    return (inspect.iscoroutinefunction(getattr(env, "step", None))
            and inspect.iscoroutinefunction(getattr(env, "reset", None)))


def check_async_env(env: Any, where: str) -> None:
    """Raise a clear error if ``env`` is not a complete coroutine env."""
    for name in ("observation_space", "action_space"):
        if not isinstance(getattr(env, name, None), gym.Space):
            raise TypeError(
                f"{where}: the coroutine env {type(env).__qualname__} has no gymnasium {name}; "
                f"set self.{name} in its __init__."
            )
    close = getattr(env, "close", None)
    if close is not None and not inspect.iscoroutinefunction(close):
        raise TypeError(
            f"{where}: {type(env).__qualname__}.close must be a coroutine function (async def close), "
            "as reset and step are."
        )

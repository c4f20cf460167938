"""Coroutine envs: envs whose ``reset`` and ``step`` await I/O.

A coroutine env waits rather than computes: a simulator or game server behind a socket, a
web API, a tool an agent calls, a robot. Hundreds of them share one event loop, and the
engine steps each one as soon as its action is ready (:mod:`.._engine.coroutines`).

The protocol, :class:`AsyncEnv`, is gymnasium's with ``async``::

    class MyEnv:                      # any object of this shape works
        observation_space: gym.Space
        action_space: gym.Space
        async def reset(self, *, seed=None, options=None) -> tuple[obs, dict]: ...
        async def step(self, action) -> tuple[obs, float, bool, bool, dict]: ...
        async def close(self) -> None: ...          # optional

Subclassing :class:`AsyncEnv` is a convenience, not a requirement: it gives ``np_random``
seeded by ``reset(seed=...)`` (as gymnasium's ``Env`` does) and a ``close`` that does
nothing.
"""

from __future__ import annotations

import inspect
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.utils import seeding


class AsyncEnv:
    """Base class of coroutine envs (optional: any object of this shape works).

    Subclasses set ``observation_space`` and ``action_space`` and implement ``reset`` and
    ``step`` as coroutines. Call ``super().reset(seed=seed)`` at the start of ``reset``
    to (re)seed ``self.np_random``.
    """

    observation_space: gym.Space
    action_space: gym.Space
    _np_random: np.random.Generator | None = None

    @property
    def np_random(self) -> np.random.Generator:
        if self._np_random is None:
            self._np_random, _ = seeding.np_random()
        return self._np_random

    async def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        if seed is not None:
            self._np_random, _ = seeding.np_random(seed)
        return None, {}

    async def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        raise NotImplementedError

    async def close(self) -> None:
        """Release what the env holds (connections...); called once by ``shutdown()``."""


def is_async_env(env: Any) -> bool:
    """Whether ``env`` follows the :class:`AsyncEnv` protocol (``step`` and ``reset`` are coroutines)."""
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

"""``CoroutineGroup``: coroutine envs on the engine's event loop, stepped one at a time.

Unlike the other groups, whose envs all step together, each env of a coroutine group is
stepped on its own (``await group.step_one(i, action)``) as soon as its action is ready;
``_workers.coroutine_lanes`` and the scheduler drive them. The result arrays are those of every group
(``obs``, ``reward``, ``terminated``, ``truncated``, one row per env); ``step_one`` fills
row ``i``.

Ordinary gymnasium envs may sit in the same group: ``SyncEnvAdapter`` calls their
``step`` inline (they block the loop while they compute), [`ThreadEnv`][aiocollect.ThreadEnv] in a worker
thread (for envs that release the GIL: native physics, a blocking client).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from typing import Any

import anyio
import gymnasium as gym

from .._errors import StepTimeoutError
from .async_env import AsyncEnv, check_async_env, is_async_env
from .group import (
    EnvCloseError,
    _blame,
    _GroupBase,
    check_same_spaces,
    check_step_types,
    reset_result,
    scalar,
    step_result,
)

logger = logging.getLogger("aiocollect")

_timeout = getattr(asyncio, "timeout", None)  # Python >= 3.11


async def timed(coro: Any, timeout: float | None, env: Any, index: int, what: str) -> Any:
    """``await coro``, failing with [`StepTimeoutError`][aiocollect.StepTimeoutError] after
    ``timeout`` seconds; ``index`` is the env's within its group (the caller names the worker)."""
    if timeout is None:
        return await coro
    try:
        if _timeout is not None:
            async with _timeout(timeout):
                return await coro
        return await asyncio.wait_for(coro, timeout)  # Python 3.10
    except TimeoutError:
        raise StepTimeoutError.late(env=index, env_type=type(env).__qualname__, call=what,
                                    timeout=timeout) from None


class SyncEnvAdapter(AsyncEnv):
    """A gymnasium env seen as a coroutine env: ``step`` runs inline, on the loop."""

    def __init__(self, env: gym.Env):
        self.env = env
        self.observation_space, self.action_space = env.observation_space, env.action_space

    async def reset(self, *, seed=None, options=None):
        return self.env.reset(seed=seed, options=options)

    async def step(self, action):
        return self.env.step(action)

    async def close(self) -> None:
        self.env.close()


class ThreadEnv(AsyncEnv):
    """Run a gymnasium env's ``reset`` and ``step`` in a worker thread (``anyio.to_thread``).

    For envs that spend their step outside Python (native physics, a blocking network
    client): while one waits in its thread, the loop steps the others. An env whose step
    is Python code gains nothing (the GIL serialises it) and pays a thread hand-off.

    Args:
        env: a gymnasium env, or a callable returning one.
        limiter: an ``anyio.CapacityLimiter`` shared by envs that should not all run at
            once (default: anyio's default limiter, 40 threads).

    Raises:
        TypeError: ``env`` is not a gymnasium env or a factory of one.

    Examples:
        >>> Collector([lambda: ThreadEnv(gym.make("Ant-v5"))] * 8, policy, frames_per_batch=800)
    """

    def __init__(self, env: gym.Env | Any, limiter: anyio.CapacityLimiter | None = None):
        if not isinstance(env, gym.Env) and callable(env):
            env = env()
        if not isinstance(env, gym.Env):
            raise TypeError(f"ThreadEnv: expected a gymnasium env or a factory of one, got {type(env).__name__}.")
        self.env, self.limiter = env, limiter
        self.observation_space, self.action_space = env.observation_space, env.action_space

    async def reset(self, *, seed=None, options=None):
        """The env's ``reset(seed=seed, options=options)``, run in a worker thread."""
        return await anyio.to_thread.run_sync(lambda: self.env.reset(seed=seed, options=options),
                                              limiter=self.limiter)

    async def step(self, action):
        """The env's ``step(action)``, run in a worker thread."""
        return await anyio.to_thread.run_sync(self.env.step, action, limiter=self.limiter)

    async def close(self) -> None:
        """The env's ``close()``, run in a worker thread."""
        await anyio.to_thread.run_sync(self.env.close, limiter=self.limiter)

    def __repr__(self) -> str:
        return f"ThreadEnv({self.env})"


def as_coroutine_env(env: Any, where: str) -> Any:
    """``env`` if it is a coroutine env, a gymnasium env adapted, else an error."""
    if is_async_env(env):
        check_async_env(env, where)
        return env
    if isinstance(env, gym.Env):
        return SyncEnvAdapter(env)
    raise TypeError(f"{where}: expected a gymnasium env or a coroutine env (aiocollect.AsyncEnv), "
                    f"got {type(env).__name__}.")


class CoroutineGroup(_GroupBase):
    """Coroutine envs stepped one at a time on the loop; see the module docstring."""

    def __init__(self, envs: Sequence[Any], device=None):
        check_same_spaces(envs)
        super().__init__(envs[0].observation_space, envs[0].action_space, len(envs), device)
        self.envs = list(envs)

    async def step_one(self, i: int, action: Any) -> None:
        try:
            obs, reward, terminated, truncated, _ = step_result(await self.envs[i].step(action))
            check_step_types(reward, terminated, truncated)  # (every step: a coroutine's step costs far more)
            self._writer.write_one(i, obs)
        except Exception as exc:
            _blame(exc, i)
            raise
        self.reward[i] = scalar(reward)
        self.terminated[i] = scalar(terminated)
        self.truncated[i] = scalar(truncated)

    async def reset_one(self, i: int, seed: int | None) -> None:
        try:
            obs, _ = reset_result(await self.envs[i].reset(seed=seed))
            self._writer.write_one(i, obs)
        except Exception as exc:
            _blame(exc, i)
            raise

    async def aclose(self, where: str = "") -> None:
        """Close every env (those with a ``close``), concurrently; those whose ``close()``
        raised are logged together, in one error naming each (``where``: whose envs, e.g.
        ``"worker 1"``)."""
        failures = await self._close_all()
        if failures:
            logger.error("aiocollect: closing the coroutine envs%s: %s", f" of {where}" if where else "",
                         EnvCloseError(failures, len(self.envs)))

    async def _close_all(self) -> list[tuple[int, str, BaseException]]:
        failures: list[tuple[int, str, BaseException]] = []

        async def close_one(i: int, env: Any) -> None:
            close = getattr(env, "close", None)
            if close is None:
                return
            try:
                await close()
            except Exception as exc:  # noqa: BLE001 - the others still close; reported together
                failures.append((i, type(env).__qualname__, exc))

        async with anyio.create_task_group() as tg:
            for i, env in enumerate(self.envs):
                tg.start_soon(close_one, i, env)
        return sorted(failures, key=lambda f: f[0])

    def close_unstarted(self, timeout: float = 5.0) -> None:
        """Close envs that were never started, from outside any event loop (those a worker
        collector builds in this process to read the spaces): on an event loop of their own,
        in a thread, for at most ``timeout`` seconds. Raises ``EnvCloseError`` if some
        ``close()`` raised, ``TimeoutError`` if they took longer."""
        failures: list[tuple[int, str, BaseException]] = []

        def run() -> None:
            failures.extend(anyio.run(self._close_all))

        thread = threading.Thread(target=run, name="aiocollect-close-probe", daemon=True)
        thread.start()
        thread.join(timeout)
        if thread.is_alive():
            raise TimeoutError(f"closing {self.num_envs} coroutine env(s) took over {timeout} s; their close() "
                               "must return promptly.")
        if failures:
            raise EnvCloseError(failures, len(self.envs))

    def close(self, catch: type[BaseException] = Exception) -> None:
        """Coroutine envs are closed by ``aclose()``, on their loop."""

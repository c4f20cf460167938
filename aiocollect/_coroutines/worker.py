"""``CoroutineWorker``: a worker entry of coroutine envs, run on the engine loop, not in a process.

Coroutine envs wait on I/O; a process of their own would only add a hop. When an entry of
a multi-process collector's ``create_env_fn`` builds coroutine envs
([`AsyncEnv`][aiocollect.AsyncEnv]), the pool gives it a ``CoroutineWorker`` instead of a
process. To the scheduler it is a worker like any other (``post`` a command, learn of its
completion through ``on_reply``, ``completed()``); its envs read their actions from and
write their results to the same rows of the rollout storage a process would use
(``_workers.rows``), so the scheduler, the batches and every option are the same. A
command runs as a task on the engine loop: a step awaits every env of the entry
concurrently, then resets the ones that finished (their next episode's first observation
going to the next column, as a process worker does).

An env that raises fails the worker with an [`EnvError`][aiocollect.EnvError] whose
``__cause__`` is the env's exception, as in every collector; a step over ``step_timeout`` with
a [`StepTimeoutError`][aiocollect.StepTimeoutError].
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from functools import partial
from typing import Any

import cloudpickle

from .._envs.build import make_group
from .._errors import WorkerError, env_failure
from .._workers import protocol
from .._workers.lane import LaneOwner, LaneWorker, no_reply
from .._workers.plan import WorkerSpec
from .._workers.rows import WorkerRows
from .._workers.shm import SharedArrays
from .group import CoroutineGroup, timed


class CoroutineWorker(LaneWorker):
    """A worker entry of coroutine envs on the engine loop, one lane; see the module docstring."""

    in_process = True
    takes_runs = False
    acts_locally = False
    synchronous = False
    process = None
    pid = None

    def __init__(self, spec: WorkerSpec, step_timeout: float | None = None):
        self.spec = spec
        self.index = spec.index
        self.lo, self.hi = spec.lo, spec.hi
        self.num_envs = spec.num_envs
        self.error: WorkerError | None = None
        self.env_steps = 0
        self.on_reply: Callable[[LaneOwner], None] = no_reply
        self.group: CoroutineGroup | None = None
        self._posted = 0
        self._done = 0
        self._seen = 0
        self._task: asyncio.Task | None = None
        self._closed = False
        self.step_timeout = step_timeout

    @property
    def alive(self) -> bool:
        return self.error is None and self.group is not None and not self._closed

    def build(self, shared: SharedArrays, create_env_kwargs: dict, reset_when_done: bool,
              max_frames_per_traj: int | None) -> None:
        """Build the entry's envs here and bind their results to this worker's rows."""
        group, _ = make_group(cloudpickle.loads(self.spec.entry), create_env_kwargs)
        if not isinstance(group, CoroutineGroup):  # pragma: no cover - the plan said so
            raise TypeError(f"create_env_fn[{self.index}] no longer builds coroutine envs")
        self.group = group
        self.rows = WorkerRows(shared, self.lo, self.hi, [leaf.key for leaf in group.obs_leaves],
                               max_frames_per_traj=max_frames_per_traj, reset_when_done=reset_when_done)

    # ------------------------------------------------------------------ the worker interface

    def post(self, code: int, slot: int, col: int, count: int = 1, local: bool = False) -> None:
        self._posted += 1
        self._task = asyncio.get_running_loop().create_task(self._run(code, slot, col))

    def completed(self) -> bool:
        if self._seen != self._done and self._done == self._posted:
            self._seen = self._done
            return True
        return False

    def fail(self, error: WorkerError) -> None:
        if self.error is None:
            self.error = error
            self.on_reply(self)

    async def _run(self, code: int, s: int, t: int) -> None:
        try:
            if code == protocol.STEP_CODE:
                await self._step(s, t)
            else:
                await self._reset(s, t)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported as this worker's failure
            self.fail(env_failure(exc, self.index, os.getpid()))
            return
        self._done = self._posted
        self.on_reply(self)

    async def _step(self, s: int, t: int) -> None:
        group, rows = self.group, self.rows
        action = rows.action[t]
        rows.bind(group, s, t, True)
        await asyncio.gather(*(self._timed(partial(group.step_one, i, action[i]), i, "step")
                               for i in range(self.num_envs)))
        finished = rows.stepped(s, t)
        if finished is not None:
            rows.bind(group, s, t + 1, False)
            await asyncio.gather(*(self._timed(partial(group.reset_one, int(i), None), int(i), "reset")
                                   for i in finished))
            rows.were_reset(finished)

    async def _reset(self, s: int, t: int) -> None:
        rows = self.rows
        idx, seeds = rows.resets()
        rows.bind(self.group, s, t, False)
        await asyncio.gather(*(self._timed(partial(self.group.reset_one, int(i), None if seeds is None else seeds[i]),
                                           int(i), "reset") for i in idx))
        rows.were_reset(idx)

    async def _timed(self, call: Callable[[], Any], i: int, what: str) -> None:
        # The env's coroutine is created here, in the gathered task, not by the caller: a task
        # cancelled before it starts would otherwise leave it never awaited (a RuntimeWarning).
        try:
            await timed(call(), self.step_timeout, self.group.envs[i], i, what)
        except Exception as exc:
            if getattr(exc, "env_index", None) is None:
                exc.env_index = i
            raise

    async def aclose(self) -> None:
        """Cancel the command under way and close the envs."""
        self._closed = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self.group is not None:
            await self.group.aclose(f"worker {self.index} (this process)")

"""``CoroutineEnvs``: a ``Collector``'s coroutine envs, each its own lane of the scheduler.

Coroutine envs ([`AsyncEnv`][aiocollect.AsyncEnv]) wait on I/O for most of a step, each
for its own time. Stepping them together would make every step as slow as the slowest
env, so each env is a lane of its own (an ``EnvLane``, a ``_workers.lane.LaneWorker`` for
one row of the storage): the scheduler posts it a ``STEP`` as soon as the policy has its
action, and the policy runs batched on whichever envs are ready (per-env rounds,
``_engine.rounds.EnvQueueRounds``, with EnvPool's knobs: ``Batching``).

A command is a task on the collector's loop: a step awaits the env, writes its results
at the env's row and column of the rollout storage, and, if the episode ended, resets the
env at once (the next episode's first observation goes to the next column, as a worker
process does); a ``RESET`` resets it with the seed the storage holds for it. When the task
is done the lane reports to the scheduler (``on_reply``), which books the step with the
others that landed in the same loop pass.

An env that raises fails its lane with an [`EnvError`][aiocollect.EnvError] (worker 0, the
env's index), a step over ``step_timeout`` with a
[`StepTimeoutError`][aiocollect.StepTimeoutError]; ``cancel()`` cancels every pending
command (those envs restart from a reset: the scheduler's ``abandon``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

import numpy as np

from .._envs.coroutine_group import CoroutineGroup, timed
from .._errors import WorkerError, env_failure
from . import protocol
from .lane import LaneOwner, LaneWorker, no_reply
from .shm import SharedArrays


class EnvLane(LaneWorker):
    """One coroutine env as a lane of the scheduler (row ``lo`` of the storage)."""

    in_process = True
    takes_runs = False
    acts_locally = False
    synchronous = False
    process = None

    def __init__(self, envs: CoroutineEnvs, row: int):
        self.envs = envs
        self.index = 0  # errors name the Collector's one worker, 0, and this env
        self.pid = os.getpid()
        self.lo, self.hi, self.num_envs = row, row + 1, 1
        self.env_steps = 0
        self.error: WorkerError | None = None
        self.on_reply: Callable[[LaneOwner], None] = no_reply
        self.task: asyncio.Task | None = None
        self.done = False

    def post(self, code: int, slot: int, col: int, count: int = 1, local: bool = False) -> None:
        self.done = False
        self.task = asyncio.get_running_loop().create_task(self.envs.run(self, code, slot, col))

    def completed(self) -> bool:
        if self.done:
            self.done = False
            return True
        return False


class CoroutineEnvs:
    """The coroutine envs of a ``Collector`` over ``shared`` storage; see the module docstring."""

    def __init__(self, group: CoroutineGroup, shared: SharedArrays, *, max_frames_per_traj: int | None,
                 step_timeout: float | None):
        self.group = group
        self.step_timeout = step_timeout
        self.max_steps = max_frames_per_traj
        a = shared.arrays
        self.obs, self.next_obs = shared.obs("obs"), shared.obs("next_obs")
        self.results = list(group.obs.values())  # the group's rows: where an env's step lands first
        self.reward, self.terminated, self.truncated = a["reward"], a["terminated"], a["truncated"]
        self.action, self.seed, self.seed_set = a["action"], a["seed"], a["seed_set"]
        self.step_count = np.zeros(group.num_envs, dtype=np.int64)
        self._action_rows = self.action.ndim > 2
        """An env's action is an array (a view of the storage, copied), not a numpy scalar."""
        # (ignore: lane.py's LaneWorker.steps_done and cut_run, bodies that raise, read as abstract)
        self.lanes = [EnvLane(self, i) for i in range(group.num_envs)]  # type: ignore[abstract]

    async def run(self, lane: EnvLane, code: int, s: int, t: int) -> None:
        i = lane.lo
        try:
            if code == protocol.STEP_CODE:
                await self._step(i, s, t)
            else:
                seed = int(self.seed[i]) if self.seed_set[i] else None
                await self._reset(i, seed, s, t)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported as the lane's failure
            lane.error = env_failure(exc, 0, lane.pid)
            lane.on_reply(lane)
            return
        lane.done = True
        lane.on_reply(lane)

    async def _step(self, i: int, s: int, t: int) -> None:
        group = self.group
        action = self.action[t, i]
        if self._action_rows:
            action = action.copy()  # the env may keep it: the storage is rewritten at a later batch
        if self.step_timeout is None:  # (a coroutine frame less per step)
            await group.step_one(i, action)
        else:
            await timed(group.step_one(i, action), self.step_timeout, group.envs[i], i, "step")
        for dst, src in zip(self.next_obs, self.results):
            dst[s, t, i] = src[i]
        self.reward[s, t, i] = group.reward[i]
        terminated = self.terminated[s, t, i] = group.terminated[i]
        truncated = group.truncated[i]
        if self.max_steps is not None:
            self.step_count[i] += 1
            truncated = truncated or self.step_count[i] >= self.max_steps
        self.truncated[s, t, i] = truncated
        if terminated or truncated:
            await self._reset(i, None, s, t + 1)
        else:
            for dst, src in zip(self.obs, self.results):
                dst[s, t + 1, i] = src[i]

    async def _reset(self, i: int, seed: int | None, s: int, t: int) -> None:
        group = self.group
        await timed(group.reset_one(i, seed), self.step_timeout, group.envs[i], i, "reset")
        for dst, src in zip(self.obs, self.results):
            dst[s, t, i] = src[i]
        self.step_count[i] = 0

    def cancel(self) -> list[EnvLane]:
        """Cancel every pending command; returns the lanes that had one."""
        cut = [(lane, lane.task) for lane in self.lanes if lane.task is not None and not lane.task.done()]
        for _, task in cut:
            task.cancel()
        return [lane for lane, _ in cut]

    async def aclose(self) -> None:
        """Cancel what is pending and close the envs."""
        self.cancel()
        await self.group.aclose("worker 0 (this process)")

"""The coroutine engine: every env steps as soon as its action is ready, no barrier.

Coroutine envs (``_envs.async_env``) wait on I/O for most of a step, each for its
own time. Stepping them in lockstep would make every step as slow as the slowest env; this
engine instead keeps each env on its own timeline:

* an env whose step (or reset) lands joins the **ready** set;
* a **round** runs the policy once on the ready envs (batched; see ``Batching``),
  writes their column ``t[i]`` (observations, ids, outputs, policy version) and starts
  each one's next step as a task;
* landed steps are written to the buffer together at the next round, with whole-array
  operations (fancy indexing over the landed envs), so the per-env cost of a step is the
  task that awaits it and little else.

A batch is ``[num_envs, T]`` like the lockstep engine's: each env takes ``T`` steps per
batch, and an env that has its ``T`` waits for the others (its next step is taken in the
next batch). Finished envs are reset at once, by a reset task of their own, so the next
episode's first observation is usually there before it is needed.

Rounds run in the loop's callbacks: a landing schedules one with ``call_soon``, so steps
that land in the same loop pass share a policy call. ``Batching`` adds EnvPool's knobs on
top: a cap on the envs per call, and a minimum batch that a round waits for (up to a
timeout) while other envs are still stepping.

``step_timeout``: a step or reset that takes longer fails the collection with an error
naming the env. Any failure, or the collection being cancelled, cancels every pending step.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._envs.coroutine_group import CoroutineGroup, timed
from .._policies.runner import PolicyRunner
from .buffer import OutputSpec, RolloutBuffer
from .timelines import IdPool


@dataclass(frozen=True)
class Batching:
    """How a coroutine engine groups ready envs into policy calls."""

    max_batch_size: int | None = None
    """At most this many envs per policy call (``None``: every ready env)."""
    min_batch_size: int = 1
    """A round waits for this many ready envs while others are still stepping..."""
    batch_timeout: float = 0.005
    """...but no longer than this many seconds after the first of them became ready."""
    step_timeout: float | None = None
    """A step or reset that takes longer fails the collection, naming the env (``None``: no limit)."""


class TrajectoryBook:
    """What every engine keeps per env between steps and batches: trajectory ids, step
    counts, which envs need a reset, the seeds for those resets, and counters.

    Engines that share an ``IdPool`` never hand out the same trajectory id.
    """

    def __init__(self, num_envs: int, ids: IdPool | None):
        self.num_envs = num_envs
        self.ids = ids if ids is not None else IdPool()
        self.traj_ids = self.ids.take(num_envs)
        self.step_count = np.zeros(num_envs, dtype=np.int64)
        self.needs_reset = np.ones(num_envs, dtype=bool)
        self._seeds: list[int | None] | None = None
        self.completed_trajectories = 0
        self.env_steps = 0

    def _reset_requested(self) -> None:
        """Hook: every env was just marked for a reset."""

    def request_reset(self, seeds: list[int] | None = None) -> None:
        """Reset every env before its next step (with these per-env seeds, if given).

        Envs in the middle of a trajectory start a new one (with a new id).
        """
        midway = np.flatnonzero(~self.needs_reset)
        if len(midway):
            self._new_trajectories(midway, completed=False)
        self.needs_reset[:] = True
        self._reset_requested()
        if seeds is not None:
            self._seeds = list(seeds)

    def state_dict(self) -> dict[str, Any]:
        return {"next_traj_id": self.ids.next, "completed_trajectories": self.completed_trajectories}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # trajectory ids must never be reused: continue after the saved counter
        self.ids.next = max(self.ids.next, int(state["next_traj_id"]))
        self.completed_trajectories = int(state["completed_trajectories"])
        self.needs_reset[:] = True
        self._reset_requested()
        self._new_trajectories(np.arange(self.num_envs), completed=False)

    def _new_trajectories(self, idx: np.ndarray, *, completed: bool = True) -> None:
        self.traj_ids[idx] = self.ids.take(len(idx))
        self.step_count[idx] = 0
        if completed:
            self.completed_trajectories += len(idx)


class CoroutineEngine(TrajectoryBook):
    """Steps a ``CoroutineGroup`` without a barrier; see the module docstring."""

    def __init__(self, group: CoroutineGroup, *, max_frames_per_traj: int | None, batching: Batching,
                 ids: IdPool | None = None):
        super().__init__(group.num_envs, ids)
        self.group = group
        self.batching = batching
        self.max_frames_per_traj = max_frames_per_traj
        self._track_steps = max_frames_per_traj is not None
        self._obs = list(group.obs.values())
        self._keys = list(group.obs)
        self._tasks: dict[int, asyncio.Task] = {}
        """Pending step or reset of each env (at most one per env)."""
        self._resetting: set[int] = set()
        self._reset_requests = 0  # request_reset() calls so far: a reset started before one is stale
        self._batch: _Batch | None = None
        self._error: BaseException | None = None  # a reset that failed between two batches

    # ------------------------------------------------------------------ control

    def _reset_requested(self) -> None:
        self._reset_requests += 1

    def cancel_pending(self) -> None:
        """Cancel every pending step and reset; those envs restart from a reset."""
        for i, task in list(self._tasks.items()):
            task.cancel()
            if not self.needs_reset[i]:
                self._new_trajectories(np.array([i]), completed=False)
            self.needs_reset[i] = True
        self._tasks.clear()
        self._resetting.clear()

    # ------------------------------------------------------------------ one batch

    async def rollout(self, frames: int, runner: PolicyRunner, *, interruptor: Any = None,
                      buffer: RolloutBuffer | None = None, set_truncated: bool = False
                      ) -> tuple[RolloutBuffer, np.ndarray]:
        """Collect ``frames`` steps of every env; returns the buffer and the steps each env
        took (fewer than ``frames`` only when ``interruptor.collection_stopped()``)."""
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        loop = asyncio.get_running_loop()
        batch = _Batch(self, loop, frames, runner, interruptor, buffer)
        self._batch = batch
        try:
            batch.start()
            await batch.done
        except BaseException:
            self.cancel_pending()
            raise
        finally:
            self._batch = None
            if batch.timer is not None:
                batch.timer.cancel()
        buffer = batch.buffer
        valid = batch.t.copy()
        self._finish(buffer, valid, set_truncated)
        return buffer, valid

    def _finish(self, buffer: RolloutBuffer, valid: np.ndarray, set_truncated: bool) -> None:
        if set_truncated:
            rows = np.flatnonzero(valid > 0)
            last = valid[rows] - 1
            ongoing = rows[~(buffer.terminated[rows, last] | buffer.truncated[rows, last])]
            buffer.truncated[rows, last] = True
            if len(ongoing):
                self._new_trajectories(ongoing)
                self.needs_reset[ongoing] = True
                for i in ongoing:
                    self._start_reset(int(i))
        buffer.finish_rows(valid)

    # ------------------------------------------------------------------ tasks

    def _start_reset(self, i: int) -> None:
        seed = None
        if self._seeds is not None:
            seed = self._seeds[i]
            self._seeds[i] = None
            if all(s is None for s in self._seeds):
                self._seeds = None
        self._resetting.add(i)
        self._tasks[i] = asyncio.get_running_loop().create_task(self._reset_task(i, seed, self._reset_requests))

    async def _reset_task(self, i: int, seed: int | None, request: int) -> None:
        try:
            await self._timed(self.group.reset_one(i, seed), i, "reset")
        except BaseException as exc:  # noqa: BLE001 - handed to the batch
            self._tasks.pop(i, None)
            self._fail(exc)
            return
        self._tasks.pop(i, None)
        if request != self._reset_requests:  # reset() or set_seed() since it started: again
            self._start_reset(i)
            return
        self._resetting.discard(i)
        self.needs_reset[i] = False
        if self._batch is not None:
            self._batch.reset_landed(i)

    async def _step_task(self, i: int, action: Any) -> None:
        try:
            await self._timed(self.group.step_one(i, action), i, "step")
        except BaseException as exc:  # noqa: BLE001 - handed to the batch
            self._tasks.pop(i, None)
            self._fail(exc)
            return
        self._tasks.pop(i, None)
        if self._batch is not None:  # (None: the batch failed and was abandoned meanwhile)
            self._batch.step_landed(i)

    async def _timed(self, coro: Any, i: int, what: str) -> None:
        await timed(coro, self.batching.step_timeout, self.group.envs[i], i, what)

    def _fail(self, exc: BaseException) -> None:
        if isinstance(exc, asyncio.CancelledError):
            return
        if self._batch is not None:
            self._batch.fail(exc)
        elif self._error is None:
            self._error = exc


class _Batch:
    """The state of one ``rollout`` call: who is ready, who steps, column per env."""

    def __init__(self, engine: CoroutineEngine, loop: asyncio.AbstractEventLoop, frames: int,
                 runner: PolicyRunner, interruptor: Any, buffer: RolloutBuffer | None):
        self.engine, self.loop, self.frames = engine, loop, frames
        self.runner, self.interruptor = runner, interruptor
        self.reuse = buffer
        self.buffer: RolloutBuffer | None = None
        n = engine.num_envs
        self.t = np.zeros(n, dtype=np.int64)
        self.ready: list[int] = []
        self.landed: list[int] = []
        self.stepping = 0
        self.done: asyncio.Future = loop.create_future()
        self.round_soon = False
        self.timer: asyncio.TimerHandle | None = None
        self.first_ready_at: float | None = None
        self.stopped = False
        group = engine.group
        self.check = runner.kind != "random"
        self.check_action = group.check_action

    def start(self) -> None:
        eng = self.engine
        for i in range(eng.num_envs):
            if i in eng._tasks:
                continue  # a reset still on its way: it lands here
            if eng.needs_reset[i]:
                eng._start_reset(i)
            else:
                self.ready.append(i)
        self.poke()

    # ------------------------------------------------------------------ events

    def step_landed(self, i: int) -> None:
        self.stepping -= 1
        self.landed.append(i)
        self.poke()

    def reset_landed(self, i: int) -> None:
        if self.t[i] < self.frames:
            self.ready.append(i)
            self.poke()

    def fail(self, exc: BaseException) -> None:
        if not self.done.done():
            self.done.set_exception(exc)

    def poke(self) -> None:
        if not self.round_soon and not self.done.done():
            self.round_soon = True
            self.loop.call_soon(self.round)

    def _on_timer(self) -> None:
        self.timer = None
        self.poke()

    # ------------------------------------------------------------------ a round

    def round(self) -> None:
        self.round_soon = False
        if self.done.done():
            return
        try:
            if self.landed:
                self._take_landed()
            if (not self.stopped and self.interruptor is not None and self.buffer is not None
                    and self.interruptor.collection_stopped()):
                self.stopped = True  # (after a first step, so that the batch has a buffer)
            if self.ready and not self.stopped and self._may_act():
                self._act()
            if self.stepping == 0 and (self.stopped or (self.t >= self.frames).all()):
                self.done.set_result(None)
        except BaseException as exc:  # noqa: BLE001 - raised by rollout()
            self.fail(exc)

    def _may_act(self) -> bool:
        """Whether to call the policy now, or wait for more envs to become ready."""
        b = self.engine.batching
        if len(self.ready) >= b.min_batch_size:
            return True
        in_flight = self.stepping + len(self.engine._resetting)
        if in_flight == 0:
            return True  # nobody else is coming
        now = time.perf_counter()
        if self.first_ready_at is None:
            self.first_ready_at = now
        waited = now - self.first_ready_at
        if waited >= b.batch_timeout:
            return True
        if self.timer is None:
            self.timer = self.loop.call_later(b.batch_timeout - waited, self._on_timer)
        return False

    def _act(self) -> None:
        eng, cap = self.engine, self.engine.batching.max_batch_size
        take = self.ready if cap is None else self.ready[:cap]
        self.ready = [] if cap is None else self.ready[cap:]
        self.first_ready_at = None if not self.ready else time.perf_counter()
        rows = np.fromiter(take, dtype=np.int64, count=len(take))
        obs = [a[rows] for a in eng._obs]  # fancy indexing: a copy of just these envs
        out = self.runner({k: torch.from_numpy(v) for k, v in zip(eng._keys, obs)}, len(rows))
        action = out["action"]
        if not isinstance(action, np.ndarray):
            action = action.numpy(force=True)
        if self.check:
            self.check_action(action, len(rows))
        buffer = self.buffer
        if buffer is None:
            buffer = self.reuse
            if not (buffer is not None and buffer.frames == self.frames
                    and buffer.outputs == {k: OutputSpec.of(v) for k, v in out.items()}):
                specs = {k: OutputSpec.of(v) for k, v in out.items()}
                buffer = RolloutBuffer(eng.group.obs_leaves, specs, eng.num_envs, self.frames,
                                       step_count=eng._track_steps, mask=self.interruptor is not None)
            self.buffer = buffer
        cols = self.t[rows]
        for dst, src in zip(buffer.root_obs, obs):
            dst[rows, cols] = src
        buffer.traj_ids[rows, cols] = eng.traj_ids[rows]
        if eng._track_steps:
            buffer.step_count[rows, cols] = eng.step_count[rows]
        buffer.write_outputs_at(rows, cols, out, self.runner.version)
        create_task, step = self.loop.create_task, eng._step_task
        for j, i in enumerate(take):
            eng._tasks[i] = create_task(step(i, action[j]))
        self.stepping += len(take)

    def _take_landed(self) -> None:
        eng, buffer, group = self.engine, self.buffer, self.engine.group
        rows = np.fromiter(self.landed, dtype=np.int64, count=len(self.landed))
        self.landed = []
        cols = self.t[rows]
        for dst, src in zip(buffer.next_obs, eng._obs):
            dst[rows, cols] = src[rows]
        buffer.reward[rows, cols] = group.reward[rows]
        term = group.terminated[rows]
        trunc = group.truncated[rows]
        if eng._track_steps:
            eng.step_count[rows] += 1
            counts = eng.step_count[rows]
            buffer.next_step_count[rows, cols] = counts
            trunc = trunc | (counts >= eng.max_frames_per_traj)
        buffer.terminated[rows, cols] = term
        buffer.truncated[rows, cols] = trunc
        eng.env_steps += len(rows)
        self.t[rows] = cols + 1
        finished = term | trunc
        if finished.any():
            ended = rows[finished]
            eng._new_trajectories(ended)
            eng.needs_reset[ended] = True
            for i in ended.tolist():
                eng._start_reset(i)
            rows = rows[~finished]
        frames = self.frames
        self.ready.extend(i for i in rows.tolist() if self.t[i] < frames)

"""The engine: envs step, the policy runs once per step for all of them, frames are stored.

One ``Engine`` drives one env group. ``await engine.rollout(T)`` collects ``T``
steps of every env into a fresh ``RolloutBuffer`` and returns it. Per step it

1. resets the envs that finished at the previous step (the first observation of the new
   trajectory becomes the current one: no fake "reset step" transition ever),
2. writes the current observations, trajectory ids and step counts into column ``t``,
3. calls the policy **once**, batched over every env, and stores its outputs,
4. steps the envs with the actions and stores what they return in ``("next", ...)``,
5. gives finished envs a new trajectory id and schedules their reset.

Everything else, ``("next", "done")`` and the root done flags, is derived per batch with
whole-array operations. The engine yields to the event loop about every millisecond,
which keeps it cancellable without paying a loop round trip per step.

The engine's state between batches (current trajectory ids, step counts, which envs need
a reset, pending seeds) is what lets trajectories continue across batch boundaries.

``rollout`` is the *lockstep* schedule of ``Collector``: one group in this process, every
env stepped at every step, a private ``RolloutBuffer``. The worker collectors have their
own schedule over shared rollout storage (``_engine.scheduler``, with ``_engine.timelines``
for the bookkeeping); bringing ``Collector`` and the coroutine engine onto that one
scheduler is the next step of the engine's second version.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import numpy as np
import torch

from .._policies.runner import PolicyRunner
from .buffer import OutputSpec, RolloutBuffer

_YIELD_EVERY_S = 0.001


class IdPool:
    """Trajectory ids, handed out in increasing order; shared by engines that must not clash."""

    def __init__(self, start: int = 0):
        self.next = start

    def take(self, k: int) -> np.ndarray:
        ids = np.arange(self.next, self.next + k, dtype=np.int64)
        self.next += k
        return ids


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


class Engine(TrajectoryBook):
    """Steps one env group with one policy; see the module docstring.

    Args:
        group: the envs (anything with the result arrays of an env group).
        max_frames_per_traj: truncate a trajectory after this many steps (``None``: never).
        reset_when_done: reset an env as soon as it is done (TorchRL's default); when
            false, finished envs keep being stepped and the root done flags carry over.
        ids: where trajectory ids come from (a private pool by default).
    """

    def __init__(self, group: Any, *, max_frames_per_traj: int | None, reset_when_done: bool,
                 ids: IdPool | None = None):
        super().__init__(group.num_envs, ids)
        self.group = group
        self.max_frames_per_traj = max_frames_per_traj
        self.reset_when_done = reset_when_done
        n = group.num_envs
        self.any_reset = True
        # root done/terminated/truncated of the current step; only ever true when
        # reset_when_done=False (a finished env that is not reset stays done)
        self._root_flags = np.zeros((3, n), dtype=bool)
        self._obs_arrays = list(group.obs.values())
        self.obs_tensors = {k: torch.from_numpy(v) for k, v in group.obs.items()}
        self._track_steps = max_frames_per_traj is not None

    # ------------------------------------------------------------------ resets

    def _reset_requested(self) -> None:
        self.any_reset = True

    @property
    def has_seeds(self) -> bool:
        """Seeds are waiting for the next reset (``set_seed``)."""
        return self._seeds is not None

    def take_resets(self) -> tuple[np.ndarray, list[int] | None]:
        """The envs to reset before the next step, and their seeds (``None``: unseeded)."""
        seeds, self._seeds = self._seeds, None
        return np.flatnonzero(self.needs_reset), seeds

    def resets_done(self, idx: np.ndarray) -> None:
        """The group has reset envs ``idx``: their ``obs`` rows start new episodes."""
        self.needs_reset[idx] = False
        self._root_flags[:, idx] = False
        self.any_reset = bool(np.count_nonzero(self.needs_reset))

    async def _reset(self) -> None:
        idx, seeds = self.take_resets()
        await self.group.reset(idx, seeds)
        self.resets_done(idx)

    # ------------------------------------------------------------------ one step

    def new_buffer(self, out: dict, frames: int, mask: bool) -> RolloutBuffer:
        """A buffer for ``frames`` steps of the outputs in ``out`` (a dict of specs or values)."""
        specs = {k: v if isinstance(v, OutputSpec) else OutputSpec.of(v) for k, v in out.items()}
        return RolloutBuffer(self.group.obs_leaves, specs, self.num_envs, frames,
                             step_count=self._track_steps, mask=mask)

    def fits(self, buffer: RolloutBuffer | None, out: dict, frames: int) -> bool:
        return (buffer is not None and buffer.frames == frames
                and buffer.outputs == {k: OutputSpec.of(v) for k, v in out.items()})

    def write_before(self, buffer: RolloutBuffer, t: int) -> None:
        """Column ``t`` before the step: current observations, trajectory ids, step counts."""
        for dst, src in zip(buffer.root_obs, self._obs_arrays):
            dst[:, t] = src
        buffer.traj_ids[:, t] = self.traj_ids
        if self._track_steps:
            buffer.step_count[:, t] = self.step_count

    def write_after(self, buffer: RolloutBuffer, t: int) -> np.ndarray | None:
        """Column ``t`` after the step: what the group returned; finished envs get new ids
        and are marked for reset. Returns their indices (``None`` when none finished)."""
        group = self.group
        self.env_steps += self.num_envs
        for dst, src in zip(buffer.next_obs, self._obs_arrays):
            dst[:, t] = src
        buffer.reward[:, t] = group.reward
        term_t = buffer.terminated[:, t]
        trunc_t = buffer.truncated[:, t]
        term_t[:] = group.terminated
        trunc_t[:] = group.truncated
        if self._track_steps:
            step_count = self.step_count
            step_count += 1
            buffer.next_step_count[:, t] = step_count
            trunc_t |= step_count >= self.max_frames_per_traj
        if not self.reset_when_done:
            self._root_flags[0] = term_t | trunc_t
            self._root_flags[1] = term_t
            self._root_flags[2] = trunc_t
        elif np.count_nonzero(term_t) or np.count_nonzero(trunc_t):  # cheaper than .any()
            finished = np.flatnonzero(term_t | trunc_t)
            self._new_trajectories(finished)
            self.needs_reset[finished] = True
            self.any_reset = True
            return finished
        return None

    def start_flags(self) -> np.ndarray:
        """The root done flags the next batch starts with (see ``finish()``)."""
        return self._root_flags.copy()

    def finish(self, buffer: RolloutBuffer, valid: int, start_flags: np.ndarray, set_truncated: bool) -> None:
        """Close a batch whose first ``valid`` columns were written."""
        if set_truncated and valid:
            self._truncate_last(buffer, valid - 1)
        buffer.finish(valid)
        if not self.reset_when_done and valid:
            # root flags of step t are the "next" flags of step t-1
            following = (buffer.next_done, buffer.terminated, buffer.truncated)
            for root, start, nxt in zip(buffer.root_flags, start_flags, following):
                root[:, 0] = start
                root[:, 1:valid] = nxt[:, : valid - 1]

    def _truncate_last(self, buffer: RolloutBuffer, last: int) -> None:
        """``set_truncated``: the batch's last step ends every trajectory."""
        ongoing = ~(buffer.terminated[:, last] | buffer.truncated[:, last])
        buffer.truncated[:, last] = True
        if self.reset_when_done:
            idx = np.flatnonzero(ongoing)
            self._new_trajectories(idx)
            self.needs_reset[idx] = True
            self.any_reset = True
        else:
            self._root_flags[0] = True
            self._root_flags[2] = True

    # ------------------------------------------------------------------ lockstep schedule

    async def rollout(
        self,
        frames: int,
        runner: PolicyRunner,
        *,
        interruptor: Any = None,
        buffer: RolloutBuffer | None = None,
        set_truncated: bool = False,
    ) -> tuple[RolloutBuffer, int]:
        """Collect ``frames`` steps of every env; returns the buffer and the steps filled.

        ``buffer`` is reused when its layout still fits (``return_same_td``). The number of
        steps is smaller than ``frames`` only when ``interruptor.collection_stopped()``.
        """
        group, n = self.group, self.num_envs
        obs_tensors = self.obs_tensors
        check_action = group.check_action
        check = runner.kind != "random"  # our own random actions fit by construction
        write_before, write_after = self.write_before, self.write_after
        last_yield = time.perf_counter()
        valid = frames
        start_flags = self.start_flags()
        for t in range(frames):
            if self.any_reset:
                await self._reset()
            out = runner(obs_tensors, n)
            if t == 0 and not self.fits(buffer, out, frames):
                buffer = self.new_buffer(out, frames, mask=interruptor is not None)
            write_before(buffer, t)
            action = out["action"]
            if not isinstance(action, np.ndarray):
                action = action.numpy(force=True)
            if check:
                check_action(action, n)
            buffer.write_outputs(t, out, runner.version)
            await group.step(action)
            write_after(buffer, t)
            if interruptor is not None and interruptor.collection_stopped():
                valid = t + 1
                break
            now = time.perf_counter()
            if now - last_yield > _YIELD_EVERY_S:
                await anyio.lowlevel.checkpoint()
                last_yield = time.perf_counter()
        self.finish(buffer, valid, start_flags, set_truncated)
        return buffer, valid

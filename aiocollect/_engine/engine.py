"""The engine: envs step, the policy runs once per step for all of them, frames are stored.

One :class:`Engine` drives one env group. ``await engine.rollout(T)`` collects ``T``
steps of every env into a fresh :class:`RolloutBuffer` and returns it. Per step it

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
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import numpy as np
import torch

from .._envs.group import EnvGroup
from .._policies.runner import PolicyRunner
from .buffer import OutputSpec, RolloutBuffer

_YIELD_EVERY_S = 0.001


class Engine:
    """Steps one env group with one policy; see the module docstring.

    Args:
        group: the envs.
        max_frames_per_traj: truncate a trajectory after this many steps (``None``: never).
        reset_when_done: reset an env as soon as it is done (TorchRL's default); when
            false, finished envs keep being stepped and the root done flags carry over.
    """

    def __init__(self, group: EnvGroup, *, max_frames_per_traj: int | None, reset_when_done: bool):
        self.group = group
        self.max_frames_per_traj = max_frames_per_traj
        self.reset_when_done = reset_when_done
        n = group.num_envs
        self.num_envs = n
        self.traj_ids = np.arange(n, dtype=np.int64)
        self.next_traj_id = n
        self.step_count = np.zeros(n, dtype=np.int64)
        self.needs_reset = np.ones(n, dtype=bool)
        self._any_reset = True
        self._seeds: list[int] | None = None
        # root done/terminated/truncated of the current step; only ever true when
        # reset_when_done=False (a finished env that is not reset stays done)
        self._root_flags = np.zeros((3, n), dtype=bool)
        self.obs_tensors = {k: torch.from_numpy(v) for k, v in group.obs.items()}
        self.completed_trajectories = 0
        self.env_steps = 0

    # ------------------------------------------------------------------ control

    def request_reset(self, seeds: list[int] | None = None) -> None:
        """Reset every env before the next step (with these per-env seeds, if given).

        Envs in the middle of a trajectory start a new one (with a new id).
        """
        midway = np.flatnonzero(~self.needs_reset)
        if len(midway):
            self._new_trajectories(midway, completed=False)
        self.needs_reset[:] = True
        self._any_reset = True
        if seeds is not None:
            self._seeds = list(seeds)

    def state_dict(self) -> dict[str, Any]:
        return {"next_traj_id": self.next_traj_id, "completed_trajectories": self.completed_trajectories}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # trajectory ids must never be reused: continue after the saved counter
        self.next_traj_id = max(self.next_traj_id, int(state["next_traj_id"]))
        self.completed_trajectories = int(state["completed_trajectories"])
        self.needs_reset[:] = True
        self._any_reset = True
        self._new_trajectories(np.arange(self.num_envs), completed=False)

    # ------------------------------------------------------------------ stepping

    def _new_trajectories(self, idx: np.ndarray, *, completed: bool = True) -> None:
        k = len(idx)
        self.traj_ids[idx] = np.arange(self.next_traj_id, self.next_traj_id + k)
        self.next_traj_id += k
        self.step_count[idx] = 0
        if completed:
            self.completed_trajectories += k

    async def _reset(self) -> None:
        idx = np.flatnonzero(self.needs_reset)
        await self.group.reset(idx, self._seeds)
        self._seeds = None
        self.needs_reset[idx] = False
        self._root_flags[:, idx] = False
        self._any_reset = False

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
        obs_arrays = list(group.obs.values())
        obs_tensors = self.obs_tensors
        check_action = group.check_action
        check = runner.kind != "random"  # our own random actions fit by construction
        max_steps = self.max_frames_per_traj
        step_count = self.step_count
        track_steps = max_steps is not None
        last_yield = time.perf_counter()
        valid = frames
        start_flags = self._root_flags.copy()
        for t in range(frames):
            if self._any_reset:
                await self._reset()
            out = runner(obs_tensors, n)
            if t == 0:
                specs = {k: OutputSpec.of(v) for k, v in out.items()}
                if buffer is None or buffer.outputs != specs or buffer.frames != frames:
                    buffer = RolloutBuffer(
                        group.obs_leaves, specs, n, frames,
                        step_count=track_steps, mask=interruptor is not None,
                    )
                root_obs, next_obs = buffer.root_obs, buffer.next_obs
                reward, terminated, truncated = buffer.reward, buffer.terminated, buffer.truncated
                traj_ids = buffer.traj_ids
            for dst, src in zip(root_obs, obs_arrays):
                dst[:, t] = src
            traj_ids[:, t] = self.traj_ids
            if track_steps:
                buffer.step_count[:, t] = step_count
            action = out["action"]
            if not isinstance(action, np.ndarray):
                action = action.numpy(force=True)
            if check:
                check_action(action, n)
            buffer.write_outputs(t, out)

            await group.step(action)
            self.env_steps += n

            for dst, src in zip(next_obs, obs_arrays):
                dst[:, t] = src
            reward[:, t] = group.reward
            term_t = terminated[:, t]
            trunc_t = truncated[:, t]
            term_t[:] = group.terminated
            trunc_t[:] = group.truncated
            if track_steps:
                step_count += 1
                buffer.next_step_count[:, t] = step_count
                trunc_t |= step_count >= max_steps
            done = term_t | trunc_t
            if self.reset_when_done and done.any():
                finished = np.flatnonzero(done)
                self._new_trajectories(finished)
                self.needs_reset[finished] = True
                self._any_reset = True
            elif not self.reset_when_done:
                self._root_flags[0] = done
                self._root_flags[1] = term_t
                self._root_flags[2] = trunc_t

            if interruptor is not None and interruptor.collection_stopped():
                valid = t + 1
                break
            now = time.perf_counter()
            if now - last_yield > _YIELD_EVERY_S:
                await anyio.lowlevel.checkpoint()
                last_yield = time.perf_counter()

        if set_truncated:
            self._truncate_last(buffer, valid - 1)
        buffer.finish(valid)
        if not self.reset_when_done:
            # root flags of step t are the "next" flags of step t-1
            following = (buffer.next_done, buffer.terminated, buffer.truncated)
            for root, start, nxt in zip(buffer.root_flags, start_flags, following):
                root[:, 0] = start
                root[:, 1:valid] = nxt[:, : valid - 1]
        return buffer, valid

    def _truncate_last(self, buffer: RolloutBuffer, last: int) -> None:
        """``set_truncated``: the batch's last step ends every trajectory."""
        ongoing = ~(buffer.terminated[:, last] | buffer.truncated[:, last])
        buffer.truncated[:, last] = True
        if self.reset_when_done:
            idx = np.flatnonzero(ongoing)
            self._new_trajectories(idx)
            self.needs_reset[idx] = True
            self._any_reset = True
        else:
            self._root_flags[0] = True
            self._root_flags[2] = True

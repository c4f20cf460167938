"""Timelines: what the main process keeps per env between steps and batches.

Pure bookkeeping, no loop, no process, no storage: trajectory ids, step counts, which
envs need a reset (and with which seeds), the root done flags of ``reset_when_done=False``,
and counters. The scheduler calls it once per completed command with the rows of that
worker (``lo:hi``), every operation vectorised over those rows.

Finished envs need no reset from here: their worker resets them on its own right after
the step (``_workers.rows``), so a finished env only gets a new trajectory id. A reset
*is* needed after ``reset()``, ``set_seed()`` and ``load_state_dict()`` (the worker did not
end those trajectories); ``take_resets`` hands those out.

**When an id changes.** Only when a step ends an episode (``stepped``, ``ran``) or when a
reset is *done* (``resets_done``), never when one is asked for: a reset may be asked for
while a worker is in the middle of a command (``MultiAsyncCollector`` collects on while
you call ``reset()``), and the steps of that command belong to the trajectory they were
taken in. So ``request_reset`` only marks the envs (``renew``); the reset, once done, gives
each marked env a new id and records the one it ended as *cut* (``take_cut``): a
trajectory that no episode end closed, which ``trajs_per_batch`` must never deliver.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np


class IdPool:
    """Trajectory ids, handed out in increasing order; shared by engines that must not clash."""

    def __init__(self, start: int = 0):
        self.next = start

    def take(self, k: int) -> np.ndarray:
        ids = np.arange(self.next, self.next + k, dtype=np.int64)
        self.next += k
        return ids


class Timelines:
    """Per-env trajectory ids, step counts and pending resets of ``num_envs`` envs."""

    def __init__(self, num_envs: int, *, reset_when_done: bool, ids: IdPool | None = None,
                 count_steps: bool = True, keep_cut: bool = False):
        self.num_envs = num_envs
        self.reset_when_done = reset_when_done
        self.count_steps = count_steps
        """Keep ``step_count`` (batches carry step counts only with ``max_frames_per_traj``)."""
        self.ids = ids if ids is not None else IdPool()
        self.traj_ids = self.ids.take(num_envs)
        self.step_count = np.zeros(num_envs, dtype=np.int64)
        self.needs_reset = np.ones(num_envs, dtype=bool)
        self.any_reset = True
        """Some env needs a reset (a quick test before looking at rows)."""
        self.seed = np.zeros(num_envs, dtype=np.int64)
        self.seed_set = np.zeros(num_envs, dtype=bool)
        self.root_flags = np.zeros((3, num_envs), dtype=bool)
        """Done, terminated, truncated of each env's current step: only ever set when
        ``reset_when_done`` is off (a finished env that is not reset stays done)."""
        self.renew = np.zeros(num_envs, dtype=bool)
        """Envs whose reset, when done, starts a new trajectory although no episode ended:
        the one under way is cut (see the module docstring)."""
        self.keep_cut = keep_cut
        """Record the ids of cut trajectories for ``take_cut`` (``trajs_per_batch`` needs them)."""
        self.cut: deque[np.ndarray] = deque()
        """Ids of the trajectories cut by resets done since the last ``take_cut`` (a deque:
        ``take_cut`` may run in another thread than the resets)."""
        self.completed_trajectories = 0
        self.env_steps = 0

    # ------------------------------------------------------------------ steps

    def stepped(self, lo: int, hi: int, terminated: np.ndarray, truncated: np.ndarray,
                next_step_count: np.ndarray | None = None) -> None:
        """Envs ``lo:hi`` took a step that ended with these flags (their worker already
        reset the finished ones). ``next_step_count`` receives their step counts."""
        if self.count_steps:
            count = self.step_count[lo:hi]
            count += 1
            if next_step_count is not None:
                next_step_count[...] = count
        self.env_steps += hi - lo
        if not self.reset_when_done:
            flags = self.root_flags[:, lo:hi]
            np.logical_or(terminated, truncated, out=flags[0])
            flags[1] = terminated
            flags[2] = truncated
        elif np.count_nonzero(terminated) or np.count_nonzero(truncated):  # cheaper than .any()
            self._new_trajectories(lo, hi, terminated | truncated)

    def stepped_rows(self, rows: np.ndarray, terminated: np.ndarray, truncated: np.ndarray) -> np.ndarray | None:
        """``stepped`` for the envs ``rows`` (an index array in increasing order: the rows of
        several lanes, each at its own column), all at once: new ids go in row order, as
        ``stepped`` over each lane in turn hands them out. Returns their step counts after
        the step (``None`` when steps are not counted)."""
        counts = None
        if self.count_steps:
            counts = self.step_count[rows] + 1
            self.step_count[rows] = counts
        self.env_steps += len(rows)
        if not self.reset_when_done:
            self.root_flags[0, rows] = terminated | truncated
            self.root_flags[1, rows] = terminated
            self.root_flags[2, rows] = truncated
        elif np.count_nonzero(terminated) or np.count_nonzero(truncated):
            ended = rows[terminated | truncated]
            self.traj_ids[ended] = self.ids.take(len(ended))
            self.step_count[ended] = 0
            self.completed_trajectories += len(ended)
        return counts

    def ran(self, lo: int, hi: int, terminated: np.ndarray, truncated: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Envs ``lo:hi`` took ``k = len(terminated)`` steps in a row (a ``RUN``: their
        worker reset each env that finished, as after any step); ``terminated`` and
        ``truncated`` are ``[k, envs]``. The same bookkeeping as ``k`` calls of ``stepped``,
        in a few array operations: new ids are handed out column by column, env by env
        within a column, as those calls would.

        Only with ``reset_when_done`` (without it, a finished env waits for a reset).

        Returns:
            ``(ids, counts)``, each ``[k + 1, envs]``: row ``j`` holds each env's trajectory
            id and step count before step ``j`` (row ``k``: after the run). ``counts`` is
            zeros when steps are not counted.
        """
        k, n = terminated.shape
        done = terminated | truncated
        where = np.flatnonzero(done)  # row-major: the order ``stepped`` hands out new ids
        current = self.traj_ids[lo:hi]
        if len(where):
            first = int(self.ids.take(len(where))[0])  # (the new ids are consecutive)
            # since[j, e]: which new id env e has from step j on (-1: none yet)
            since = np.full((k + 1, n), -1, dtype=np.int64)
            since[1:].reshape(-1)[where] = np.arange(first, first + len(where))
            np.maximum.accumulate(since, axis=0, out=since)
            ids = np.where(since >= 0, since, current)
            self.completed_trajectories += len(where)
        else:
            ids = np.broadcast_to(current, (k + 1, n)).copy()
        current[:] = ids[-1]
        self.env_steps += k * n
        counts = np.zeros((k + 1, n), dtype=np.int64)
        if self.count_steps:
            rows = np.arange(k + 1)[:, None]
            # restart[j, e]: 1 + the last step before j that ended env e's episode (0: none)
            restart = np.zeros((k + 1, n), dtype=np.int64)
            restart[1:][done] = np.broadcast_to(rows[1:], (k, n))[done]
            np.maximum.accumulate(restart, axis=0, out=restart)
            np.copyto(counts, np.where(restart > 0, rows - restart, self.step_count[lo:hi] + rows))
            self.step_count[lo:hi] = counts[-1]
        elif len(where):
            self.step_count[lo:hi][done.any(axis=0)] = 0  # as ``_new_trajectories`` does
        return ids, counts

    # ------------------------------------------------------------------ resets

    def request_reset(self, seeds: list[int] | None = None, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Reset envs ``lo:hi`` (all by default) before their next step, with these
        seeds (one per env of ``lo:hi``) if given. Envs midway through a trajectory start
        a new one once the reset is done, with a new id, not counted as completed (steps
        booked before then keep the id they were taken with). Returns the ids of the
        trajectories under way now, which the reset will cut (or which end before it)."""
        hi = self.num_envs if hi is None else hi
        midway = ~self.needs_reset[lo:hi]
        cut = self.traj_ids[lo:hi][midway]  # (a copy: a mask indexes by copying)
        self.renew[lo:hi] |= midway
        self._mark(np.arange(lo, hi))
        if seeds is not None:
            self.seed[lo:hi] = seeds
            self.seed_set[lo:hi] = True
        return cut

    def wants_reset(self, lo: int, hi: int) -> bool:
        return self.any_reset and bool(self.needs_reset[lo:hi].any())

    def take_resets(self, lo: int, hi: int) -> tuple[np.ndarray, list[int | None] | None]:
        """Envs of ``lo:hi`` to reset now (indices from ``lo``) and their seeds (one per
        env of ``lo:hi``, ``None`` for no seed; ``None`` for none at all): each seed is used once."""
        idx = np.flatnonzero(self.needs_reset[lo:hi])
        seeds = None
        if self.seed_set[lo:hi].any():
            seeds = [int(v) if f else None for v, f in zip(self.seed[lo:hi], self.seed_set[lo:hi])]
            self.seed_set[lo:hi] = False
        return idx, seeds

    def resets_done(self, lo: int, idx: np.ndarray) -> None:
        """Envs ``lo + idx`` were reset: they start new episodes (with new ids for those
        whose trajectory the reset cut)."""
        rows = idx + lo
        renewed = rows[self.renew[rows]]
        if len(renewed):
            if self.keep_cut:
                self.cut.append(self.traj_ids[renewed])  # (a copy: fancy indexing)
            self.traj_ids[renewed] = self.ids.take(len(renewed))
            self.renew[renewed] = False
        self.needs_reset[rows] = False
        self.step_count[rows] = 0
        self.root_flags[:, rows] = False
        self.any_reset = bool(np.count_nonzero(self.needs_reset))

    def take_cut(self) -> np.ndarray:
        """The ids of the trajectories cut by the resets done since the last call."""
        cut = []
        while self.cut:
            cut.append(self.cut.popleft())
        return np.concatenate(cut) if cut else np.zeros(0, dtype=np.int64)

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        return {"next_traj_id": self.ids.next, "completed_trajectories": self.completed_trajectories}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # trajectory ids must never be reused: continue after the saved counter
        self.ids.next = max(self.ids.next, int(state["next_traj_id"]))
        self.completed_trajectories = int(state["completed_trajectories"])
        # every env restarts from a reset, and takes an id after the saved counter then
        # (the ids under way now may have been used by the collector that saved the state)
        self._mark(np.arange(self.num_envs))
        self.renew[:] = True

    # ------------------------------------------------------------------ internals

    def _mark(self, rows: np.ndarray) -> None:
        self.needs_reset[rows] = True
        self.any_reset = True

    def _new_trajectories(self, lo: int, hi: int, which: np.ndarray, *, completed: bool = True) -> None:
        """New ids, in row order, for the envs ``which`` (a mask over ``lo:hi``), their step
        counts back to 0 (a mask on the rows' view: no index arrays, it runs per step)."""
        k = int(np.count_nonzero(which))
        self.traj_ids[lo:hi][which] = self.ids.take(k)
        self.step_count[lo:hi][which] = 0
        if completed:
            self.completed_trajectories += k

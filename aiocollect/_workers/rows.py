"""A worker's rows of the rollout storage: where its envs' results go, and what a step
does to them besides stepping (step counts, ``max_frames_per_traj``, carrying the
observations over to the next column).

Process workers (``_workers.child``) and coroutine entries (``_workers.coroutine_worker``)
both use it, so a step leaves the storage the same way whoever took it.
"""

from __future__ import annotations

import numpy as np

from .shm import SharedArrays


class WorkerRows:
    """Rows ``lo:hi`` of every storage field, and the per-env step counts of those envs."""

    def __init__(self, shared: SharedArrays, lo: int, hi: int, keys: list, *, max_frames_per_traj: int | None,
                 reset_when_done: bool):
        arrays = shared.arrays
        self.keys = keys
        self.obs = [a[:, :, lo:hi] for a in shared.obs("obs")]
        self.next_obs = [a[:, :, lo:hi] for a in shared.obs("next_obs")]
        self.reward = arrays["reward"][:, :, lo:hi]
        self.terminated = arrays["terminated"][:, :, lo:hi]
        self.truncated = arrays["truncated"][:, :, lo:hi]
        self.action = arrays["action"][lo:hi]
        self.reset_mask = arrays["reset_mask"][lo:hi]
        self.seed = arrays["seed"][lo:hi]
        self.seed_set = arrays["seed_set"][lo:hi]
        self.max_steps = max_frames_per_traj
        self.autoreset = reset_when_done
        self.step_count = np.zeros(hi - lo, dtype=np.int64)
        self._views: dict[tuple[int, int, bool], tuple] = {}
        n = hi - lo
        self._scratch = (np.zeros(n, np.float32), np.zeros(n, bool), np.zeros(n, bool))  # resets write no flags

    def bind(self, group, s: int, t: int, results: bool) -> None:
        """Make ``group`` write at column ``t`` of slot ``s``: a step's results
        (``results``), or the observations a step starts from."""
        key = (s, t, results)
        views = self._views.get(key)
        if views is None:
            if results:
                views = ({k: a[s, t] for k, a in zip(self.keys, self.next_obs)},
                         self.reward[s, t], self.terminated[s, t], self.truncated[s, t])
            else:
                views = ({k: a[s, t] for k, a in zip(self.keys, self.obs)}, *self._scratch)
            self._views[key] = views
        group.bind(*views)

    def stepped(self, s: int, t: int) -> np.ndarray | None:
        """After the envs stepped into column ``t``: count the step, truncate at
        ``max_frames_per_traj``, carry the observations to ``t + 1``. Returns the envs
        to reset now (``None``: none, or ``reset_when_done`` is off)."""
        terminated, truncated = self.terminated[s, t], self.truncated[s, t]
        count = self.step_count
        count += 1
        if self.max_steps is not None:
            truncated |= count >= self.max_steps
        for dst, src in zip(self.obs, self.next_obs):
            dst[s, t + 1] = src[s, t]
        # count_nonzero: a third of the cost of .any() on small arrays
        if self.autoreset and (np.count_nonzero(terminated) or np.count_nonzero(truncated)):
            return np.flatnonzero(terminated | truncated)
        return None

    def resets(self) -> tuple[np.ndarray, list[int | None] | None]:
        """The envs a ``RESET`` command resets, and their seeds (``None``: unseeded)."""
        idx = np.flatnonzero(self.reset_mask)
        seeds = None
        if self.seed_set[idx].any():
            seeds = [int(v) if f else None for v, f in zip(self.seed, self.seed_set)]
        return idx, seeds

    def were_reset(self, idx: np.ndarray) -> None:
        self.step_count[idx] = 0

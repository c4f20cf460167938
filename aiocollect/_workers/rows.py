"""A worker's rows of the rollout storage: where its envs' results go, and what a step
does to them besides stepping (step counts, ``max_frames_per_traj``, carrying the
observations over to the next column).

Process workers (``_workers.child``), the in-process envs of a ``Collector``
(``_workers.inline_worker``) and coroutine entries (``_workers.coroutine_worker``) all use
it, so a step leaves the storage the same way whoever took it. ``step``/``reset`` (and
``run``, steps in a row, for process workers) are the whole commands for a group that steps
synchronously; a coroutine entry awaits its envs
between the same calls.
"""

from __future__ import annotations

import numpy as np

from .._envs.spaces import ObsWriter
from .shm import SharedArrays


class WorkerRows:
    """Rows ``lo:hi`` of every storage field, and the per-env step counts of those envs
    (kept only for ``max_frames_per_traj``, their one use here)."""

    def __init__(self, shared: SharedArrays, lo: int, hi: int, keys: list, *, max_frames_per_traj: int | None,
                 reset_when_done: bool):
        arrays = shared.arrays
        self.keys = keys
        self.obs = [a[:, :, lo:hi] for a in shared.obs("obs")]
        self.next_obs = [a[:, :, lo:hi] for a in shared.obs("next_obs")]
        self.reward = arrays["reward"][:, :, lo:hi]
        self.terminated = arrays["terminated"][:, :, lo:hi]
        self.truncated = arrays["truncated"][:, :, lo:hi]
        self.action = arrays["action"][:, lo:hi]
        self.reset_mask = arrays["reset_mask"][lo:hi]
        self.seed = arrays["seed"][lo:hi]
        self.seed_set = arrays["seed_set"][lo:hi]
        self.max_steps = max_frames_per_traj
        self.autoreset = reset_when_done
        self.step_count = np.zeros(hi - lo, dtype=np.int64)
        self._views: dict[tuple[int, int, bool], tuple] = {}
        n = hi - lo
        self._scratch = (np.zeros(n, np.float32), np.zeros(n, np.uint8), np.zeros(n, np.uint8))  # resets write no flags

    def bind(self, group, s: int, t: int, results: bool) -> None:
        """Make ``group`` write at column ``t`` of slot ``s``: a step's results
        (``results``), or the observations a step starts from."""
        key = (s, t, results)
        views = self._views.get(key)
        if views is None:
            views = self._make_views(group, s, t, results)
        group.bind(*views[0])

    def _make_views(self, group, s: int, t: int, results: bool) -> tuple:
        # (made once per column: indexing costs about a microsecond a view)
        # ((group.bind's arguments), the observations carried over to t + 1 as
        # (destination, source) pairs)
        if results:
            obs = {k: a[s, t] for k, a in zip(self.keys, self.next_obs)}
            carry = [(dst[s, t + 1], src[s, t]) for dst, src in zip(self.obs, self.next_obs)]
            # the flags are written as bytes: numpy stores any string as True in a boolean
            # array, but refuses one (and None) in a byte array; another number stays
            # visible there (``_engine.storage.check_values``)
            flags = (self.reward[s, t], self.terminated[s, t].view(np.uint8), self.truncated[s, t].view(np.uint8))
        else:
            obs = {k: a[s, t] for k, a in zip(self.keys, self.obs)}
            carry, flags = [], self._scratch
        views = ((obs, *flags, ObsWriter(group.obs_leaves, obs)), carry)
        self._views[(s, t, results)] = views
        return views

    def stepped(self, s: int, t: int) -> np.ndarray | None:
        """After the envs stepped into column ``t``: count the step, truncate at
        ``max_frames_per_traj``, carry the observations to ``t + 1``. Returns the envs
        to reset now (``None``: none, or ``reset_when_done`` is off)."""
        (_, _, terminated, truncated, _), carry = self._views[(s, t, True)]
        if self.max_steps is not None:
            count = self.step_count
            count += 1
            truncated |= count >= self.max_steps
        for dst, src in carry:
            np.copyto(dst, src)
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

    def step(self, group, s: int, t: int) -> None:
        """``STEP``: ``group`` (stepped synchronously) takes the actions of column ``t`` in
        the storage and writes its results at column ``t`` of slot ``s``; the envs that
        finished are reset at once, their first observations going to ``t + 1``."""
        self.bind(group, s, t, True)
        group.step_now(self.action[t])
        finished = self.stepped(s, t)
        if finished is not None:
            self.bind(group, s, t + 1, False)
            group.reset_now(finished, None)
            self.were_reset(finished)

    def run(self, group, s: int, t: int, control: np.ndarray, word: int, act=None) -> None:
        """``RUN``: ``step`` at columns ``t`` to ``t + control[COUNT] - 1``, writing the
        steps done to ``control[AT]`` after each; stops early once ``control[CMD]`` is no
        longer ``word`` (the engine gave the run up and posted another command) or
        ``control[COUNT]`` is down to the steps done (the engine cut the run short). A run
        cut before it began (``COUNT`` 0) still takes its first step, so that ``AT``, which
        the engine books, is this run's. ``act(s, t)``: writes column ``t``'s actions
        before its step (the worker's own policy), if given."""
        from .protocol import AT, CMD, COUNT

        for i in range(max(1, int(control[COUNT]))):
            if act is not None:
                act(s, t + i)
            self.step(group, s, t + i)
            control[AT] = i + 1
            if control[CMD] != word or control[COUNT] <= i + 1:
                return

    def reset(self, group, s: int, t: int) -> None:
        """``RESET``: the envs the storage marks, with their seeds; the observations go to column ``t``."""
        idx, seeds = self.resets()
        self.bind(group, s, t, False)
        group.reset_now(idx, seeds)
        self.were_reset(idx)

"""A lane as the scheduler sees it (``Lane``), and a lane's finished batch (``Sealed``).

A ``Lane`` wraps one ``_workers.lane.LaneWorker`` (a worker process's part, a coroutine
worker, one coroutine env, or a ``Collector``'s inline group) with what the scheduler keeps
of it: its rows ``lo:hi`` of the rollout storage, the slot and column its next step writes,
its batch (``frames``, ``keys``, the ``start_flags``), and its state:

* ``READY``: the observations its next step starts from are in the storage; it wants
  actions (or a reset) in the next round, unless it is ``held`` or its batch is ``full``;
* ``STEPPING`` or ``RESETTING``: its worker is on a command; the scheduler takes its
  completion in (``Scheduler.take``) and the lane is ``READY`` again.

The states are compared with ``is``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .._workers.lane import LaneWorker
    from .storage import RolloutStorage

READY, STEPPING, RESETTING = "ready", "stepping", "resetting"


class Lane:
    """One lane as the scheduler sees it; see the module docstring."""

    def __init__(self, worker: LaneWorker):
        self.worker = worker
        self.index = worker.index
        self.lo, self.hi = worker.lo, worker.hi
        self.num_envs = worker.num_envs
        self.rows = np.arange(self.lo, self.hi)
        """Its rows as an index array: rounds over lanes at different columns gather and write
        the rows of all of them with one fancy index per field (``rounds.WorkerRounds._act_rows``)."""
        self.state = READY
        self.held = True
        """No new steps while held (between batches, or while its batches wait)."""
        self.slot = 0
        self.t = 0
        """The column of the next step; the observations it starts from are at ``t``."""
        self.frames = 0
        self.mask = False
        self.keys: tuple | None = None
        """The policy outputs of this batch (known after its first step)."""
        self.carry: list = []
        """Those the next step starts from (``RolloutStorage.carried``): a recurrent state."""
        self.start_flags: np.ndarray | None = None
        """Without ``reset_when_done``: the root done flags of the batch's first column."""
        self.fresh: list[tuple[int, np.ndarray]] = []
        """Without ``reset_when_done``: ``(column, envs)`` of the resets done later in the
        batch; the observations there begin episodes, so their root flags are false."""
        self.completed_trajectories = 0
        self.reserved: list[int] = []
        """Slots holding this lane's sealed batches, not yet released."""
        self.queued = False
        """In the queue of ready lanes (per-env rounds only: ``rounds.EnvQueueRounds``)."""
        self._resetting: np.ndarray | None = None
        self.runs = worker.takes_runs
        """Its worker takes runs of steps (``rounds.RunRounds``)."""
        self.run = 0
        """The steps of the run under way (0: none)."""
        self.run_steps = 1
        """How many steps the next run may take (the run's ``span_s`` at the last runs' pace)."""
        self.run_posted = 0.0
        self.run_span = 0.0
        """About how long the run under way was meant to last (``_policies.actor.Runs.span_s``)."""

    @property
    def full(self) -> bool:
        return self.t >= self.frames

    @property
    def in_flight(self) -> bool:
        return self.state is not READY


@dataclass
class Sealed:
    """A lane's finished (or cut) batch, still in the storage until ``Scheduler.release``."""

    lane: Lane
    slot: int
    frames: int
    valid: int
    keys: tuple
    start_flags: np.ndarray | None
    mask: bool
    fresh: tuple = ()
    """``Lane.fresh`` when it was sealed."""
    truncated: bool = False
    """``set_truncated``: its last step is marked truncated (an env's own flags per group too,
    as the batch is copied out: ``Scheduler.batch``)."""

    def oldest_version(self, storage: RolloutStorage) -> int:
        if not self.valid:
            return 1 << 62
        return int(storage.policy_version[self.slot, : self.valid, self.lane.lo : self.lane.hi].min())


def rows_and_columns(lanes: list[Lane]) -> tuple[np.ndarray, np.ndarray]:
    """The rows of ``lanes`` (in their order) and, for each, its lane's column: index arrays
    that gather or write the rows of lanes at different columns in one operation per field."""
    n = lanes[0].num_envs
    cols = np.array([lane.t for lane in lanes])
    if len(lanes) > 1:
        rows = np.concatenate([lane.rows for lane in lanes])
        if all(lane.num_envs == n for lane in lanes):
            return rows, np.repeat(cols, n)
        return rows, np.repeat(cols, [lane.num_envs for lane in lanes])
    return lanes[0].rows, np.repeat(cols, n)

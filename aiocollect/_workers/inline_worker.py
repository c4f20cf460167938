"""``InlineWorker``: the envs of a ``Collector``, stepped right here, inside ``post``.

To the scheduler (``_engine.scheduler``) it is a lane like the others
(``_workers.lane.LaneWorker``: ``post`` a command, ``completed()``), so ``Collector``
shares the storage, the bookkeeping and the rounds of the multi-process collectors. Its
rows of the storage are the whole (private, unshared) storage, and a command is carried
out before ``post`` returns (it is ``synchronous``), with the same ``WorkerRows`` calls a
process worker makes, so a round needs no event-loop callback at all:
``Scheduler.run_inline`` runs round after round in one loop (the synchronous fast path,
``_engine.rounds.InlineRounds``) and gives the event loop a turn about every millisecond
(a run is sized to last about that long at the fastest recent pace, or at the last run's
own pace where that run took over 4 ms: ``InlineRounds.sized``).

It ``takes_runs``: random actions (``policy=None``) go in a ``RUN`` of several steps whose
actions were all drawn before it (``_engine.rounds``), the steps taken right here one after
the other with nothing of the engine between them, and booked as a whole afterwards. A run
stops early once it took ``RUN_LIMIT_S`` (the env slowed down): it books the steps it took.

An env's exception propagates out of ``post`` (and out of the round), as a plain call's
would; the collector wraps it in an [`EnvError`][aiocollect.EnvError]. A command that an
exception (or Ctrl-C) cut short counts as undone: the scheduler resets those envs before
their next step, so no trajectory continues from a half-taken step. (The steps a ``RUN``
took before it are the batch's, as steps posted one by one would be: ``steps_done``.)
"""

from __future__ import annotations

import os
import time
from typing import Any

from . import protocol
from .lane import LaneWorker, no_reply
from .rows import WorkerRows
from .shm import SharedArrays

RUN_LIMIT_S = 0.004
"""A ``RUN`` stops after the step that takes it past this many seconds (the rest of its
steps left to the next run): an env that slowed down mid-run does not hold the event loop
for the whole run. ``_engine.rounds``' ``OVERSHOOT * SLICE_S``: the next run is sized at
this one's own pace."""


class InlineWorker(LaneWorker):
    """An in-process env group as a scheduler's lane; see the module docstring."""

    in_process = True
    takes_runs = True
    acts_locally = False
    synchronous = True
    process = None
    error = None
    """Never set: an env's exception propagates out of ``post``."""

    def __init__(self, group: Any, shared: SharedArrays, *, max_frames_per_traj: int | None,
                 reset_when_done: bool):
        self.group = group
        self.index = 0
        self.pid = os.getpid()
        self.lo, self.hi = 0, group.num_envs
        self.num_envs = group.num_envs
        self.env_steps = 0
        self.on_reply = no_reply  # (never called: a command is done when ``post`` returns)
        self.rows = WorkerRows(shared, 0, group.num_envs, [leaf.key for leaf in group.obs_leaves],
                               max_frames_per_traj=max_frames_per_traj, reset_when_done=reset_when_done)
        self._done = False
        self._at = 0
        """The steps of the last ``RUN`` taken so far (all of them once it completed)."""

    def post(self, code: int, slot: int, col: int, count: int = 1, local: bool = False) -> None:
        """Carry out the command now (see the module docstring)."""
        if code == protocol.STEP_CODE:
            self.rows.step(self.group, slot, col)
        elif code == protocol.RUN_CODE:
            self._at = 0
            step, group, clock = self.rows.step, self.group, time.perf_counter
            deadline = clock() + RUN_LIMIT_S
            for i in range(count):
                step(group, slot, col + i)
                self._at = i + 1
                if clock() > deadline:
                    break
        else:
            self.rows.reset(self.group, slot, col)
        self._done = True

    def steps_done(self) -> int:
        return self._at

    def cut_run(self) -> None:
        """Nothing to cut: a run is over when ``post`` returns."""

    def completed(self) -> bool:
        """True once per command carried out; then the steps of the last ``RUN`` are
        forgotten (a run an exception cut before it began took none)."""
        if self._done:
            self._done = False
            self._at = 0
            return True
        return False

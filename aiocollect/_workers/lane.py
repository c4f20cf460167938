"""What a lane owes the scheduler: the ``LaneWorker`` protocol, and what the watchdog reads.

A *lane* is a block of rows ``lo:hi`` of the rollout storage that steps as one: the
scheduler (``_engine.scheduler``) posts it a command (``STEP``, ``RESET``, or a ``RUN`` of
steps, see ``_workers.protocol``) with the slot and column to work at, and learns that the
command is done with ``completed()``. The envs read their actions from the storage and write
their observations, rewards and flags there themselves, so nothing else crosses. Four kinds
of lane implement the protocol, each declaring it (``class Port(LaneWorker)``):

* ``pool.Port``: a part of a worker process's envs, commanded over its control line in
  shared memory (a ``ProcessLane``). Not ``in_process``; ``takes_runs``; ``acts_locally``
  when its worker was given a copy of the policy; its process reports for it (``owner``: the
  ``pool.Worker``, whose one doorbell serves all its parts).
* ``CoroutineWorker``: a worker entry of coroutine envs, run as tasks on the engine loop.
* ``EnvLane``: one coroutine env of a ``Collector`` (``_coroutines.lanes``), a lane of one row.
* ``InlineWorker``: a ``Collector``'s envs, stepped right inside ``post`` (``synchronous``).

The capabilities are declared, never probed: the scheduler gives runs of steps to lanes
that ``takes_runs`` (runs acted by the worker's own copy of the policy only to lanes that
``acts_locally``), runs ``run_inline`` (no callbacks at all) over a lane that is
``synchronous``, and flags on the control line of each lane that is not ``in_process`` (a
``ProcessLane``) whether it spins or sleeps (``E_ASLEEP``), so that its worker knows when
to ring. A fifth kind of lane implements every member below and says which capabilities
it has.

Completions and failures are reported with ``on_reply(owner)``, where ``owner`` is a
``LaneOwner``: the lane itself, or for a worker process's ports the process
(``ProcessWorker``, whose one doorbell serves all its lanes; the scheduler then looks at
those lanes only). The step watchdog (``_workers.watchdog``) reads process workers and
their lanes through ``ProcessWorker`` and ``ProcessLane``, so it depends on this module, not
on the pool that implements them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

    from .._errors import WorkerError
    from .process import WorkerProcess


def no_reply(owner: LaneOwner) -> None:
    """``on_reply`` until the scheduler sets its own: nobody listens yet."""


@runtime_checkable
class LaneOwner(Protocol):
    """What a lane's completions and failures are reported under (``on_reply(owner)``)."""

    index: int
    """The worker index of the lane's envs (errors name it; a ``Collector``'s is 0)."""
    pid: int | None
    """The process the envs step in (``None`` for a coroutine worker, which has none of its own)."""
    process: WorkerProcess | None
    """That process's handle, to wait for its exit status (``None``: the envs step in this process)."""
    error: WorkerError | None
    """Set when the lane (or its process) failed; ``on_reply`` is called once it is."""


@runtime_checkable
class LaneWorker(LaneOwner, Protocol):
    """A block of envs the scheduler drives as one lane; see the module docstring."""

    lo: int
    """The first row of the storage the lane owns."""
    hi: int
    """One past its last row."""
    num_envs: int
    """``hi - lo``."""
    env_steps: int
    """Env steps taken (the scheduler adds each completed command's; ``statistics()`` reads them)."""
    on_reply: Callable[[LaneOwner], None]
    """Set by the scheduler; called on the engine loop with ``owner`` when a command of the
    lane completed or the lane failed (a ``synchronous`` lane never calls it)."""

    in_process: bool
    """The envs step in this process (so errors name this process's pid). A lane that is
    not in this process is a ``ProcessLane``, with a control line in shared memory."""
    takes_runs: bool
    """It takes ``RUN_CODE`` (``post(..., count)``: that many steps, with actions drawn in
    advance), answers ``steps_done()`` and ``cut_run()``. Random actions go in runs."""
    synchronous: bool
    """A command is carried out before ``post`` returns (``completed()`` is then true), so
    ``Scheduler.run_inline`` can drive it round after round with no callback."""
    acts_locally: bool
    """Its envs' worker acts with its own copy of the policy: it takes ``local`` runs
    (``post(RUN_CODE, ..., local=True)``; ``_policies.actor``)."""

    @property
    def owner(self) -> LaneOwner:
        """What ``on_reply`` is called with: the lane itself (by default), or the worker
        process whose doorbell reports for several lanes."""
        return self

    def post(self, code: int, slot: int, col: int, count: int = 1, local: bool = False) -> None:
        """Start ``protocol.STEP_CODE`` or ``RESET_CODE`` (or ``RUN_CODE``: ``count`` steps,
        ``takes_runs`` lanes only) at ``slot``, column ``col`` of the storage. The actions
        (and for a reset the seeds and which envs) are in the storage already, unless
        ``local``: then the worker's own copy of the policy computes each step's actions
        (``acts_locally`` lanes only)."""
        ...

    def completed(self) -> bool:
        """Whether the last posted command is done; true once per command (the scheduler
        then books it)."""
        ...

    def steps_done(self) -> int:
        """The steps of the last ``RUN``, once it completed (fewer than asked if cut)."""
        raise NotImplementedError(f"{type(self).__name__} takes no runs")

    def cut_run(self) -> None:
        """Ask the ``RUN`` under way to stop after the step it is taking."""
        raise NotImplementedError(f"{type(self).__name__} takes no runs")


@runtime_checkable
class ProcessLane(LaneWorker, Protocol):
    """A lane whose envs step in a worker process, commanded over a control line."""

    control: np.ndarray
    """Its line of the control block in shared memory (``_workers.protocol``): the command,
    its slot and column, and what the worker says back (``DONE``, ``AT``); the engine's
    ``E_ASLEEP`` flag too."""
    worker: ProcessWorker
    """The process it is a part of (its ``owner``)."""

    @property
    def posted(self) -> int:
        """The sequence number of the last command posted (``DONE`` says the last done)."""
        ...


@runtime_checkable
class ProcessWorker(LaneOwner, Protocol):
    """A worker process as the step watchdog sees it: its lanes, its stack dumps, its fate."""

    lo: int
    """The first row of its envs (an env's index in errors counts from it)."""
    dump_fd: int
    """The read end of the pipe it writes its threads' stacks to on ``SIGUSR1`` (-1: none)."""

    ports: Sequence[ProcessLane]
    """Its lanes, one per part of its envs."""

    def fail(self, error: WorkerError) -> None:
        """Record ``error`` (the first one wins) and report it (``on_reply``)."""
        ...

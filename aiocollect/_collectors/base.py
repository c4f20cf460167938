"""``DataCollectorBase``: iteration, lifecycle and the sync face, shared by every collector.

A variant implements one coroutine, ``_collect() -> (batch, frames)``, that collects the
next raw batch. Everything around it lives here:

* **the async face**: ``async for batch in collector`` awaits ``_collect`` on the caller's
  loop; ``async with collector:`` shuts it down on exit;
* **the sync face**: ``for batch in collector`` (and ``rollout()``, ``start()``...) runs
  the same coroutines on a private loop thread (``_collectors.loop_thread``). The thread exists
  while a sync iteration or background collection needs it and is stopped afterwards;
* **frame accounting**: ``total_frames``, ``__len__``, ``statistics()``;
* **weight updates**: ``update_policy_weights_`` (returns at once) and its async twin
  ``await update_policy_weights`` (returns once the weights are in effect), both through
  the policy's versioned channel (``_policies.weights``); the policy lag of every
  delivered batch is measured;
* **batch post-processing**: ``split_trajs``, then ``postproc``, then ``replay_buffer``;
* **background collection** into the replay buffer: ``start()``, ``pause()``,
  ``is_running()``, ``async_shutdown()``;
* **cleanup**: ``shutdown()`` is idempotent and also runs when the collector is garbage
  collected or the interpreter exits.

A collector yields one batch at a time: iterating it from two places at once raises.
An ``async for`` abandoned in the middle of a batch (its event loop stopped by a Ctrl-C
raised out of ``run_until_complete``, its task left pending) is not a second place: the
next iteration cancels it and resumes its batch (``_guarded_collect``, ``_take_over``),
and it never goes on by itself (``_AsyncBatches``).
After an env or the policy raised, the collector is *failed*: the original exception
surfaced from the iterator, and later calls say so instead of collecting from envs in an
unknown state.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import logging
import sys
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import torch
from tensordict import TensorDict, TensorDictBase

from .._engine.staging import DeviceStaging
from .._engine.storage import RolloutStorage
from .._engine.trajectories import TrajectoryAssembler, split_trajectories
from .._envs.spaces import nest
from .._errors import CollectorBusyError, CollectorClosedError, CollectorError, CollectorFailedError
from .._policies.random import SpecRandomPolicy
from .._policies.setup import PolicySetup
from .checkpoint import Checkpoint, counters_state, read_checkpoint
from .loop_thread import LoopThread
from .options import CollectorOptions, validate_timeout
from .progress import EpisodeReturns, ProgressBar, flat_numpy
from .torchrl_compat import weights_given

logger = logging.getLogger("aiocollect")

_DONE = object()
_NOTHING = object()

_BACKGROUND = contextvars.ContextVar("aiocollect_background", default=False)
"""True inside ``start()``'s collection task: the one caller allowed while it runs."""


def _loop_run() -> Any:
    """What tells this run of the thread's running event loop from its other runs.

    asyncio and uvloop install their async-generator hooks, fresh bound methods, each time
    ``run_forever`` starts, and put the previous ones back when it returns: the ``firstiter``
    hook in place is one object during a run and another once the loop was stopped and
    started again (a ``KeyboardInterrupt`` raised out of ``run_until_complete``, then the next
    ``run_until_complete``). ``None`` where no hook is installed (no run can be told apart)."""
    return sys.get_asyncgen_hooks().firstiter


class _Consumer:
    """A task that collects (``DataCollectorBase._busy``) or iterates (``_AsyncBatches``), and
    the run of its event loop at that time (``_loop_run``), both held weakly: a consumer
    abandoned by its loop is neither kept alive nor mistaken for a new one."""

    __slots__ = ("run", "task")

    def __init__(self) -> None:
        try:
            task = asyncio.current_task()
        except RuntimeError:  # not on an asyncio loop (trio): never taken over
            task = None
        self.task = None if task is None else weakref.ref(task)
        try:
            self.run = weakref.ref(_loop_run())
        except TypeError:  # no hook, or one that cannot be referenced weakly
            self.run = None

    def in_this_run(self) -> bool:
        """Whether the loop has run without a stop since (called on that loop; true where it
        cannot be told). A stopped run's hook is freed once it is replaced, and the weak
        reference then reads ``None``."""
        return self.run is None or self.run() is _loop_run()

    def same_task(self, other: _Consumer | None) -> bool:
        return other is not None and self.task is not None and other.task is not None and self.task() is other.task()


_OVER = ("this `async for` was left in the middle of a batch when its event loop stopped (Ctrl-C?), and it "
         "does not go on when the loop runs again: the next `async for` resumes the batch")


_UNCHECKED = getattr(TensorDict, "_new_unsafe", None)


def batch_tensordict(nested: dict, shape: torch.Size, device: torch.device | None) -> TensorDictBase:
    """A TensorDict of the tensors the collector built (``nested``: ``nest``'s dicts), every
    one already of ``shape`` and on ``device``, the last dim named ``"time"``.

    tensordict's own unchecked constructor (``_new_unsafe``, which TorchRL's collectors
    use too) takes them as they are: the public one checks every tensor's shape and
    device again, which cost several times more than the rest of building the batch's
    TensorDict. Without it (another tensordict), the public constructor does the same.
    """
    names = [None] * (len(shape) - 1) + ["time"]
    if _UNCHECKED is None:
        return TensorDict(nested, batch_size=shape, device=device, names=names)
    fields = {key: batch_tensordict(value, shape, device) if isinstance(value, dict) else value
              for key, value in nested.items()}
    return _UNCHECKED(fields, batch_size=shape, device=device, names=names, nested=False)


@dataclass(frozen=True)
class WorkerStatistics:
    """One worker of a collector, as seen from the main process.

    An entry of [`CollectorStatistics.workers`][aiocollect.CollectorStatistics.workers]: one
    per entry of ``create_env_fn`` for the multi-process collectors
    ([`MultiSyncCollector`][aiocollect.MultiSyncCollector],
    [`MultiAsyncCollector`][aiocollect.MultiAsyncCollector],
    [`AsyncCollector`][aiocollect.AsyncCollector]), one per remote collector for
    [`RayCollector`][aiocollect.RayCollector] and [`RPCCollector`][aiocollect.RPCCollector].

    Examples:
        >>> dead = [w.index for w in collector.statistics().workers if not w.alive]
    """

    index: int
    """Its position in ``create_env_fn`` (the remote collector's index for the distributed collectors)."""
    pid: int | None
    """Its process id; ``None`` for an entry of coroutine envs, which runs on the engine loop
    in the main process instead of in a process of its own."""
    num_envs: int
    """How many envs it steps."""
    env_steps: int
    """Env steps it took (summed over its envs); for a remote collector of the distributed
    collectors, the valid frames of the batches it delivered."""
    alive: bool
    """Whether it still works: false once it failed or died, or the collector shut down."""


@dataclass(frozen=True)
class CollectorStatistics:
    """A frozen snapshot of a collector's counters.

    [`statistics()`][aiocollect.DataCollectorBase.statistics] returns a new one at each call;
    its fields never change afterwards. Frames are counted when a batch is delivered (by
    iteration or background collection); [`rollout()`][aiocollect.DataCollectorBase.rollout]
    adds to ``env_steps`` and ``collect_seconds`` only.

    Examples:
        >>> stats = collector.statistics()
        >>> print(f"{stats.frames} frames in {stats.batches} batches, {stats.frames_per_second:.0f} frames/s")
        >>> stats.latest_policy_version - stats.policy_version   # published, not in effect yet
    """

    frames: int
    """Frames delivered so far (masked-out frames not counted)."""
    batches: int
    """Batches delivered so far."""
    env_steps: int
    """Env steps taken, including those of batches cut short or cancelled (for the
    distributed collectors: the valid frames of the batches they delivered)."""
    completed_trajectories: int
    """Trajectories that ended (terminated, truncated or ``max_frames_per_traj``; for the
    distributed collectors: the ``("next", "done")`` flags of the delivered batches)."""
    collect_seconds: float
    """Time spent collecting (not waiting for the consumer)."""
    frames_per_second: float
    """``frames / collect_seconds``."""
    running_in_background: bool
    """Whether ``start()`` collection is going on."""
    workers: tuple[WorkerStatistics, ...] = ()
    """One [`WorkerStatistics`][aiocollect.WorkerStatistics] per worker (multi-process
    collectors) or remote collector (distributed collectors); empty for
    [`Collector`][aiocollect.Collector]."""
    policy_version: int = 0
    """The policy version in effect (0: the weights at construction; each update adds one).
    For the distributed collectors: the newest version that every remote collector has
    received (each puts it in effect before its next policy call)."""
    latest_policy_version: int = 0
    """The newest version published by ``update_policy_weights_`` (in effect from the next policy call)."""
    max_policy_lag: int = 0
    """The largest lag seen in a delivered batch: the newest version at delivery minus the
    version that produced the batch's oldest frame."""
    stale_frames_dropped: int = 0
    """Frames collected again because they broke ``max_policy_lag`` (MultiAsync)."""
    mean_episode_return: float | None = None
    """The mean return of the last 100 episodes that finished in delivered batches (``None``
    before the first). Rewards are summed per trajectory id, so an episode that spans
    batches, or workers, counts once and whole; one cut by ``max_frames_per_traj`` counts."""


class _Resources:
    """What a collector must release, reachable without the collector itself.

    The garbage-collection finalizer holds this object, not the collector, so an
    abandoned collector can be collected and still cleaned up.
    """

    def __init__(self) -> None:
        self.loop: LoopThread | None = None
        self.join_timeout = 10.0
        """How long ``stop_loop`` waits for the loop thread (worker collectors: their
        workers' whole stop sequence, and a margin)."""
        self.closers: list[Callable[[], None]] = []
        self.env_closers: list[Callable[[], None]] = []
        """Close envs of this process; skipped by ``shutdown(close_env=False)``."""
        self.aclosers: list[Callable[[], Any]] = []
        """Coroutine functions run on the loop before it stops (closing coroutine envs)."""

    def stop_loop(self) -> None:
        loop = self.loop
        if loop is not None:
            loop.stop(self.join_timeout)
            self.loop = None  # (only once it stopped: an interrupted stop is retried)

    def close(self, close_env: bool = True) -> None:
        """Release everything, last registered first.

        Each step leaves its list only once it ran, so a ``close()`` interrupted by Ctrl-C
        goes on where it stopped when it is called again (a second ``shutdown()``, or the
        finalizer at exit); a step that raised an ``Exception`` is logged and not retried.
        """
        loop = self.loop
        if self.aclosers and loop is not None and loop.usable:
            if loop.in_this_thread():
                logger.warning("aiocollect: shut down from its own loop; coroutine envs are not closed")
                self.aclosers.clear()
            else:
                try:
                    loop.call(_run_aclosers, self.aclosers)
                except Exception:  # cleanup goes on
                    logger.exception("aiocollect: error while closing coroutine envs")
                    self.aclosers.clear()
        self.stop_loop()
        if not close_env:
            self.env_closers.clear()
        for pending in (self.closers, self.env_closers):
            while pending:
                close = pending[-1]
                try:
                    close()
                except Exception:  # cleanup goes on; the failure is logged
                    logger.exception("aiocollect: error while closing %r", close)
                pending.pop()


async def _run_aclosers(aclosers: list[Callable[[], Any]]) -> None:
    """Run ``aclosers``, last first, each leaving the list once it ran (or gave up)."""
    with anyio.move_on_after(_ACLOSE_TIMEOUT_S):
        while aclosers:
            aclose = aclosers[-1]
            try:
                await aclose()
            except Exception:  # the others still run
                logger.exception("aiocollect: error while closing %r", aclose)
            aclosers.pop()
    aclosers.clear()  # what the time limit cut short is not retried


_ACLOSE_TIMEOUT_S = 5.0

_TAKE_OVER_TIMEOUT_S = 20.0
"""How long a new iteration waits for an abandoned one, once cancelled, to let go of its batch
(its collection on the loop thread unwinds within ``loop_thread._UNWIND_TIMEOUT_S``)."""


class DataCollectorBase:
    """Base class of every collector: iteration, lifecycle, weight updates and counters.

    You never create one directly: create a [`Collector`][aiocollect.Collector],
    [`MultiSyncCollector`][aiocollect.MultiSyncCollector],
    [`MultiAsyncCollector`][aiocollect.MultiAsyncCollector],
    [`AsyncCollector`][aiocollect.AsyncCollector], [`RayCollector`][aiocollect.RayCollector]
    or [`RPCCollector`][aiocollect.RPCCollector]. What is documented here works the same on
    each of them, which makes this the class for type hints and ``isinstance`` checks (it has
    the name of TorchRL's base class).

    Every collector works three ways, all driving the same async implementation:

    * ``for batch in collector``: in a script, a thread or a Jupyter cell. The collection
      runs on a private event-loop thread (uvloop where installed), so it also works where
      the calling thread already runs a loop.
    * ``async for batch in collector``: inside your own event loop.
    * [`start()`][aiocollect.DataCollectorBase.start]: in the background, into the
      ``replay_buffer``, until [`async_shutdown()`][aiocollect.DataCollectorBase.async_shutdown].

    Each delivered batch goes through ``split_trajs``, then ``postproc``, then
    ``replay_buffer.extend`` (iteration then yields ``None``, as in TorchRL); these options,
    and the others every collector takes, are described on
    [`CollectorOptions`][aiocollect.CollectorOptions]. Iteration ends once ``total_frames``
    frames were delivered (never with ``total_frames=-1``).

    A collector yields one batch at a time: iterating it from two places at once, or
    while ``start()`` runs, raises [`CollectorBusyError`][aiocollect.CollectorBusyError].
    An ``async for`` interrupted by Ctrl-C in the middle of a batch is resumed by the next
    iteration, on either face, as ``for`` is: where the ``KeyboardInterrupt`` stopped your
    event loop and left the iteration's task pending (``loop.run_until_complete`` in a REPL
    or terminal IPython), the next iteration cancels that task and resumes its batch, and
    the interrupted ``async for`` does not go on if the loop runs it again (it ends with
    ``CancelledError``, leaving its batch to the next iteration).
    After a fault (an env raised: [`EnvError`][aiocollect.EnvError]; or the policy raised)
    the collector is *failed*: the fault came out of the iterator, and every later call
    raises [`CollectorFailedError`][aiocollect.CollectorFailedError] saying so, instead of
    collecting from envs in an unknown state. Every fault aiocollect raises is a
    [`CollectorError`][aiocollect.CollectorError]. [`shutdown()`][aiocollect.DataCollectorBase.shutdown]
    releases everything; it also runs on leaving ``with`` / ``async with``, when the
    collector is garbage collected, and
    when the interpreter exits.

    Examples:
        >>> with MultiSyncCollector([make_env] * 4, policy, frames_per_batch=400,
        ...                         total_frames=40_000) as collector:
        ...     for batch in collector:                # [4, 100]: [workers, time]
        ...         train(batch)
        ...         collector.update_policy_weights_()  # returns at once
        ...     print(collector.statistics().frames_per_second)

        The same collection inside an event loop:

        >>> async with MultiSyncCollector([make_env] * 4, policy, frames_per_batch=400,
        ...                               total_frames=40_000) as collector:
        ...     async for batch in collector:
        ...         train(batch)
    """

    _persistent_loop = False
    """Keep the loop thread from the first use to ``shutdown()`` (collectors whose worker
    processes belong to that loop), rather than only while a sync call needs it."""

    def __init__(self, options: CollectorOptions):
        self.options = options
        """The validated options (see [`CollectorOptions`][aiocollect.CollectorOptions])."""
        self._frames = 0
        self._batches = 0
        self._collect_seconds = 0.0
        self._closed = False
        """Set first thing by ``shutdown()``: no new use."""
        self._shut_down = False
        """Set once ``shutdown()`` released everything (an interrupted one has not)."""
        self._shutting_down = threading.Lock()
        self._failed: BaseException | None = None
        self._busy: _Consumer | None = None
        """Who is collecting a batch (see ``_guarded_collect``); ``None`` between batches."""
        self._left_pending: set[asyncio.Task] = set()
        """Tasks of abandoned iterations, cancelled on a loop that is stopped (see ``_take_over``)."""
        self._resources = _Resources()
        self._finalizer = weakref.finalize(self, self._resources.close)
        self._background: concurrent.futures.Future | None = None
        self._pause_requested = threading.Event()
        self._parked = threading.Event()
        self._policy: PolicySetup | None = None  # set by the variant
        self._max_lag = 0
        self._stale_dropped = 0
        self._progress: ProgressBar | None = None
        self._returns = EpisodeReturns()
        self._staging: DeviceStaging | None = None
        """Set by ``_stage_batches`` for a GPU storing device."""
        self._reuse_td = False
        """``return_same_td`` (``Collector``): each batch is written into the first one."""
        self._same_td: TensorDictBase | None = None
        self._assembler = TrajectoryAssembler()
        """``trajs_per_batch``'s trajectories, complete and under way (see ``_next_trajectories``)."""
        self._kept: tuple[TensorDictBase, int] | None = None
        """A raw batch collected on the loop thread for a caller that was cancelled; see ``_across``."""
        self._undelivered: Any = _NOTHING
        """The batch collected for ``for batch in collector`` and not yet handed over; see
        ``_sync_batches``."""

    # ------------------------------------------------------------------ to implement

    async def _collect(self) -> tuple[TensorDictBase, int]:
        """Collect the next raw batch; returns it and the number of valid frames in it."""
        raise NotImplementedError

    def _counters(self) -> tuple[int, int]:
        """``(env_steps, completed_trajectories)`` for ``statistics()``."""
        return 0, 0

    def _counters_state(self) -> dict[str, Any]:
        """A checkpoint's counters (``frames``, ``iter``, ``aiocollect_format``) and, with
        ``trajs_per_batch``, the complete trajectories not delivered yet (``trajectories``):
        see ``_collectors.checkpoint``."""
        assembler = self._assembler
        state = counters_state(self._frames - assembler.pending_frames, self._batches)
        held = assembler.state_dict()
        if held is not None:
            state["trajectories"] = held
        return state

    def _restore_counters(self, saved: Checkpoint) -> None:
        """Restore what ``_counters_state`` saved (on the engine's thread). Trajectories
        saved by a collector with ``trajs_per_batch`` are not counted by one without it
        (it never delivers them)."""
        frames, held = saved.frames, saved.trajectories
        if self.options.trajs_per_batch is None:
            frames -= sum(len(t) for t in held)
            held = []
        self._frames, self._batches = frames, saved.batches
        self._assembler.restore(held)

    def _take_cut(self) -> Any:
        """The ids of the trajectories that resets cut since the last call (``trajs_per_batch``
        drops them: see ``_engine.timelines``)."""
        return ()

    def _worker_statistics(self) -> tuple[WorkerStatistics, ...]:
        return ()

    def _stage_batches(self, storage: RolloutStorage) -> None:
        """With a GPU ``storing_device``, batches are built in pinned blocks and reach the
        device in one non-blocking copy each (``_engine.staging``); call once the storage exists."""
        device = self.storing_device
        if device is not None and device.type != "cpu":
            self._staging = storage.staging = DeviceStaging(device)

    def _tensordict(self, tensors: dict, shape: list[int]) -> TensorDictBase:
        """A batch's tensors (flat keys) as a TensorDict of ``shape``, last dim named ``"time"``
        (on the host while a staging has it: ``_next_raw`` moves it to the device)."""
        device = self.storing_device if self._staging is None else None
        return batch_tensordict(nest(tensors), torch.Size(shape), device)

    # ------------------------------------------------------------------ core

    @property
    def frames_per_batch(self) -> int:
        """Frames in each batch, summed over its envs (the ``frames_per_batch`` argument)."""
        return self.options.frames_per_batch

    @property
    def total_frames(self) -> int:
        """Frames over the collector's life (``-1``: endless); iteration ends once they are delivered."""
        return self.options.total_frames

    @property
    def replay_buffer(self) -> Any:
        """The ``replay_buffer`` given at construction, or ``None``.

        With one, every batch is passed to its ``extend`` and iteration yields ``None``.
        """
        return self.options.replay_buffer

    def _check_usable(self) -> None:
        if self._closed:
            raise self._closed_error()
        if self._failed is not None:
            raise CollectorFailedError(
                f"{type(self).__name__} failed earlier ({type(self._failed).__name__}: {self._failed}); "
                "its envs are in an unknown state: shut it down and create a new collector."
            ) from self._failed

    async def _guarded_collect(self) -> tuple[TensorDictBase, int]:
        """``_collect()``, one at a time, marking the collector failed if it raises.

        A second caller while a batch is collected gets ``CollectorBusyError``, unless the
        consumer collecting it was abandoned (``_take_over``): its event loop was stopped in
        the middle of the batch and its task left pending (Ctrl-C raised out of
        ``run_until_complete``). That consumer's task is then cancelled and this caller
        resumes the batch. The abandoned task may run again before anyone takes over (the
        loop runs again): its collection then ends with ``CancelledError`` and keeps the
        batch for the next caller, so an interrupted ``async for`` never goes on.
        """
        self._check_usable()
        if self.is_running() and not _BACKGROUND.get():
            raise CollectorBusyError(
                f"{type(self).__name__} is already collecting in the background (start()) into its "
                "replay buffer: sample from the buffer, or call async_shutdown() before iterating."
            )
        while self._busy is not None:
            await self._take_over(self._busy)
        self._busy = claim = _Consumer()
        started = time.perf_counter()
        try:
            collected = await self._collect_next()
            if not claim.in_this_run():  # its loop was stopped meanwhile: an abandoned iteration
                self._kept = collected  # (not counted yet: the next collection delivers it)
                raise asyncio.CancelledError(_OVER)
            return collected
        except asyncio.CancelledError:
            if self._closed and self._cancelled_by_shutdown():
                raise self._closed_error() from None
            raise
        except Exception as exc:
            self._failed = exc
            raise
        finally:
            if self._busy is claim:  # (not if it was taken over meanwhile)
                self._busy = None
            self._collect_seconds += time.perf_counter() - started

    @staticmethod
    def _cancelled_by_shutdown() -> bool:
        """A cancellation nobody asked this task for: ``shutdown()`` from another thread
        stopped the collection (a task of a loop that is gone, closed by the garbage
        collector, has nothing to say: ``False``)."""
        try:
            task = asyncio.current_task()
        except RuntimeError:
            return False
        return task is not None and not getattr(task, "cancelling", lambda: 1)()

    async def _take_over(self, holder: _Consumer) -> None:
        """Raise ``CollectorBusyError`` if ``holder``, the consumer collecting a batch, is alive;
        otherwise end its part, so that the caller resumes the batch.

        ``holder`` was abandoned if its task is gone or done, or if its event loop is no longer
        running the run in which it started the batch: stopped by a ``KeyboardInterrupt``
        raised inside it (in a REPL or terminal IPython, where each cell is a
        ``run_until_complete``) and either started again (this caller's loop), stopped, or
        closed. A task of this loop is cancelled and waited for (it unwinds as a cancelled
        ``async for`` does: the batch under way stays to be resumed); one of a stopped loop
        is cancelled and ends when that loop runs again; one of a closed loop never runs
        again: its coroutine is closed here.
        """
        task = None if holder.task is None else holder.task()
        if holder.task is not None and (task is None or task.done()):
            self._busy = None  # (its coroutine let go of the batch, or is about to)
            return
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        loop = None if task is None else task.get_loop()
        if task is None or here is None or (loop is here and holder.in_this_run()) or (
                loop is not here and loop.is_running()):
            raise CollectorBusyError(
                f"{type(self).__name__} is already collecting a batch: a collector yields one batch "
                "at a time; don't iterate it from two places (or while start() runs) at once."
            )
        logger.info("aiocollect: %s takes over the batch of an `async for` whose event loop stopped "
                    "in the middle of it (Ctrl-C?); that iteration is cancelled", type(self).__name__)
        if loop.is_closed():
            try:
                task.get_coro().close()  # GeneratorExit: it unwinds now, in this thread
            except Exception:  # its own cleanup failed: logged, the batch is resumed anyway
                logger.exception("aiocollect: error while closing an abandoned iteration")
        elif loop is not here:
            # it ends when its loop runs again; until then it is kept from the garbage
            # collector, which would unwind it at any moment, maybe in the middle of a step
            task.cancel(_OVER)
            self._left_pending.add(task)
            task.add_done_callback(self._left_pending.discard)
        else:
            task.cancel(_OVER)
            deadline = time.monotonic() + _TAKE_OVER_TIMEOUT_S
            while self._busy is holder and not task.done():
                if time.monotonic() > deadline:
                    raise CollectorBusyError(
                        f"{type(self).__name__}: the `async for` interrupted in the middle of a batch did not "
                        f"let go of it within {_TAKE_OVER_TIMEOUT_S:.0f} s of being cancelled."
                    )
                await asyncio.sleep(0.001)
        if self._busy is holder:
            self._busy = None

    async def _collect_next(self) -> tuple[TensorDictBase, int]:
        """The batch kept for a caller that was cancelled (see ``_across``) if there is one,
        else ``_collect()``. On the collector's own loop thread, collections take turns
        (``LoopThread.serial``): the one of a caller that could not wait for it to unwind
        (see ``LoopThread.acall``) ends first, and the batch it kept comes next."""
        loop = self._resources.loop
        if self._kept is None:
            if loop is None or not loop.in_this_thread():
                return await self._collect()
            async with loop.serial:
                if self._kept is None:
                    return await self._collect()
        kept, self._kept = self._kept, None
        return kept

    async def _across(self, loop: LoopThread, collect: Callable[[], Any]) -> tuple[TensorDictBase, int]:
        """``await collect()`` on the collector's loop thread, for a caller on another loop
        (the async face). The batch is kept as soon as it is collected, so a caller
        cancelled once it was (too late to stop the collection) does not lose it: the next
        collection returns it first. Collections take turns there (``LoopThread.serial``),
        and one that finds a batch kept by an earlier caller's returns that one."""
        claim = self._busy

        async def keep() -> None:
            async with loop.serial:
                if self._kept is None:
                    self._kept = await collect()

        await loop.acall(keep)
        if claim is not None and self._busy is not claim:  # taken over meanwhile: the batch is the new caller's
            raise asyncio.CancelledError(_OVER)
        kept, self._kept = self._kept, None
        return kept

    async def _next_batch(self) -> Any:
        """The next delivered batch (``None`` with a replay buffer), or ``_DONE``."""
        opts = self.options
        if opts.trajs_per_batch is not None:
            return await self._next_trajectories()
        batch = await self._next_raw()
        if batch is _DONE:
            return _DONE
        if opts.split_trajs:
            batch = split_trajectories(batch)
        return self._deliver(batch)

    async def _next_raw(self) -> Any:
        """The next collected batch, counted, measured and shown, or ``_DONE``."""
        self._check_usable()
        total = self.options.total_frames
        if total > 0 and self._frames >= total:
            return _DONE
        batch, frames = await self._guarded_collect()
        self._frames += frames
        self._batches += 1
        self._measure_lag(batch)  # (both read the host's copy of the batch)
        self._returns.add(batch, self.options.set_truncated)
        batch = self._finish(batch)
        if self.options.progress:
            if self._progress is None:
                self._progress = ProgressBar(self.options.total_frames, type(self).__name__, self._returns)
                self._resources.closers.append(self._progress.close)
            self._progress.update(frames)
        return batch

    def _finish(self, batch: TensorDictBase) -> TensorDictBase:
        """A collected batch as it is handed out: on the storing device (one copy, see
        ``_stage_batches``), with TorchRL's version keys if asked for, written into the first
        batch with ``return_same_td``."""
        if self._staging is not None:
            batch = self._staging.upload(batch)
        if self.options.track_policy_version:
            with_torchrl_versions(batch)
        if self._reuse_td:
            batch = self._reuse(batch)
        return batch

    def _reuse(self, batch: TensorDictBase) -> TensorDictBase:
        """``return_same_td``: the batch written into the first batch delivered (whose keys it has)."""
        same = self._same_td
        if same is not None and set(batch.keys(True, True)) <= set(same.keys(True, True)):
            return same.update_(batch)
        self._same_td = batch
        return batch

    async def _next_trajectories(self) -> Any:
        """``trajs_per_batch``: collect until that many trajectories are complete (with a replay
        buffer: write those that ended in one collection); ``_DONE`` once ``total_frames``
        are collected (trajectories still incomplete then are never delivered, as in TorchRL).
        ``postproc`` applies to each collected batch before assembly, as in TorchRL."""
        opts, assembler = self.options, self._assembler
        while True:
            if opts.replay_buffer is None and assembler.ready >= opts.trajs_per_batch:
                return assembler.take(opts.trajs_per_batch, opts.traj_format)
            batch = await self._next_raw()
            if batch is _DONE:
                return _DONE
            if opts.postproc is not None:  # on each collected batch, before assembly, as in TorchRL
                batch = opts.postproc(batch)
            assembler.cut(self._take_cut())
            assembler.add(batch)
            if opts.reset_at_each_iter:
                assembler.drop_partial()  # their envs restart: those trajectories never end
            if opts.replay_buffer is not None:
                for trajs in assembler.take_each(opts.trajs_per_write):
                    opts.replay_buffer.extend(frames_for_buffer(trajs, opts.replay_buffer))
                return None

    def _deliver(self, batch: TensorDictBase) -> Any:
        """``postproc``, then the replay buffer (``None`` is delivered) or the batch itself."""
        opts = self.options
        if opts.postproc is not None:
            batch = opts.postproc(batch)
        if opts.replay_buffer is not None:
            opts.replay_buffer.extend(frames_for_buffer(batch, opts.replay_buffer))
            return None
        return batch

    def _versions(self) -> tuple[int, int] | None:
        """``(version in effect, newest version published)``, or ``None`` without weights."""
        policy = self._policy
        if policy is None or policy.weights is None:
            return None
        return policy.version, policy.latest

    def _measure_lag(self, batch: TensorDictBase) -> None:
        versions = self._versions()
        if versions is None or batch is None:
            return
        tagged = batch.get(("collector", "policy_version"), None)
        if tagged is None:
            return
        tagged = flat_numpy(tagged)  # (numpy: see EpisodeReturns.add)
        tagged = tagged[tagged >= 0]  # -1: masked-out frames
        if tagged.size:
            self._max_lag = max(self._max_lag, versions[1] - int(tagged.min()))

    # ------------------------------------------------------------------ weights

    def _check_worker_ids(self, worker_ids: Any) -> None:
        """Raise if ``worker_ids`` names no worker of this collector."""

    def update_policy_weights_(self, policy_or_weights: Any = None, *, worker_ids: Any = None, weights: Any = None,
                               policy: Any = None, model_id: str | None = None,
                               weights_dict: dict | None = None) -> int:
        """Send new weights to the collector's policy; returns without waiting.

        The worker collectors run their own copy of the policy, so your optimiser steps reach
        it only through this call; the weights are copied before the call returns, so you may
        go on changing yours at once. A ``Collector`` acts with your module itself (as
        TorchRL's does): there this call loads the given weights into your module, or, with
        none, only makes a new version. They take effect between two policy calls, all at once: no
        action is computed from a mix of two versions. Every frame carries the version that
        computed its action in ``("collector", "policy_version")``. A policy without weights
        (``None``, a [`RandomPolicy`][aiocollect.RandomPolicy], a plain function) has nothing
        to update: called without weights, this returns the current version.

        Args:
            policy_or_weights: a module (its parameters and buffers are copied), a
                TensorDict of parameters (``TensorDict.from_module(module)``), a state dict,
                a params pytree for a [`JaxPolicy`][aiocollect.jax.JaxPolicy], or ``None``:
                the weights of the policy object given at construction (the usual call after
                an optimiser step).
            worker_ids: the workers to update: an int, a list of ints, or ``None`` for all.
                It is checked here; it matters where weights live outside this process (the
                distributed collectors). A local collector runs one copy of the policy, in
                this process, for all its workers.
            weights: TorchRL's keyword spelling of ``policy_or_weights`` (weights).
            policy: TorchRL's keyword spelling of ``policy_or_weights`` (a module).
            model_id: the model to update: only ``"policy"`` (a collector has one model).
            weights_dict: TorchRL's ``{"policy": weights}`` spelling.

        Returns:
            The new policy version: 0 is the weights at construction and each update adds one.

        Raises:
            KeyError: the weights lack an entry of the policy's, or have one it does not.
            ValueError: an entry has another shape than the policy's, ``worker_ids``
                names no worker of this collector, or the weights were given twice (or for
                another ``model_id``).
            TypeError: the weights are of a type the policy cannot load, or the policy has
                no weights and some were given.
        """
        if self._closed:
            raise self._closed_error()
        self._check_worker_ids(worker_ids)
        return self._policy.publish(weights_given(policy_or_weights, weights, policy, model_id, weights_dict))

    async def update_policy_weights(self, policy_or_weights: Any = None, *, worker_ids: Any = None, weights: Any = None,
                                    policy: Any = None, model_id: str | None = None,
                                    weights_dict: dict | None = None) -> int:
        """Send new weights, then wait until they are in effect.

        The same as [`update_policy_weights_`][aiocollect.DataCollectorBase.update_policy_weights_],
        but it returns only once the new weights (or newer ones) are in effect: at once if
        no policy call is under way (it loads them itself), otherwise soon after the call
        under way ends.

        Args:
            policy_or_weights: as for ``update_policy_weights_``.
            worker_ids: as for ``update_policy_weights_``.
            weights: as for ``update_policy_weights_``.
            policy: as for ``update_policy_weights_``.
            model_id: as for ``update_policy_weights_``.
            weights_dict: as for ``update_policy_weights_``.

        Returns:
            The new policy version.
        """
        version = self.update_policy_weights_(policy_or_weights, worker_ids=worker_ids, weights=weights, policy=policy,
                                              model_id=model_id, weights_dict=weights_dict)
        await self._policy.wait_applied(version)
        return version

    def _checked_and_weights_loaded(self, state_dict: dict, strict: bool) -> Checkpoint:
        """What every local ``load_state_dict`` does first: the whole state checked
        (``_collectors.checkpoint``, which raises before anything changes), then the
        policy's weights loaded (checked before they are published); returns the rest of
        the state, for the collector to restore."""
        saved = read_checkpoint(state_dict, type(self).__name__)
        if self._closed:
            raise self._closed_error()
        self._policy.load_state_dict(state_dict, strict)
        return saved

    # ------------------------------------------------------------------ TorchRL's accessors

    @property
    def policy_version(self) -> int:
        """The newest policy version: TorchRL's ``collector.policy_version``.

        0 is the weights at construction; each
        [`update_policy_weights_`][aiocollect.DataCollectorBase.update_policy_weights_] (or
        [`increment_version`][aiocollect.DataCollectorBase.increment_version]) adds one, and
        it is in effect from the next policy call on (the one in effect now is
        ``statistics().policy_version``). For a ``Collector``, an optimiser step on your
        module becomes a version when the next policy call finds it. TorchRL gives ``None``
        unless ``track_policy_version=True``; aiocollect versions every frame anyway, so this
        is always an int (0 for a policy without weights, which keeps its one version).
        """
        versions = self._versions()
        return 0 if versions is None else versions[1]

    def get_policy_version(self) -> int:
        """[`policy_version`][aiocollect.DataCollectorBase.policy_version], as a method (TorchRL's
        spelling for remote calls, where properties cannot be read).

        Returns:
            The newest policy version.
        """
        return self.policy_version

    def increment_version(self) -> int:
        """Make a new policy version: TorchRL's ``increment_version()``.

        In aiocollect a version is a set of weights, so this is
        ``update_policy_weights_()`` with no argument: the weights of the policy object given
        at construction become the new version, in effect from the next policy call. A
        ``Collector`` acts with your module itself: nothing is copied, the version is only
        counted. The worker collectors copy your module's weights into theirs (TorchRL's
        multi-process collectors count the version and leave the weights alone). A policy
        without weights (``None``, a plain function) has one version, 0, and this changes
        nothing.

        Returns:
            The new version (TorchRL returns ``None``).
        """
        return self.update_policy_weights_()

    def getattr_policy(self, attr: str) -> Any:
        """An attribute of the collector's policy: TorchRL's ``getattr_policy(attr)``.

        Every local collector runs its policy in this process, so the attribute is read
        here, from the policy the collector runs (``collector.policy``: for a ``Collector``
        your module itself, or its copy on ``policy_device``; for the worker collectors the
        one copy that acts for every worker, where TorchRL asks its first worker's), and
        then from the object you gave (first from it for a TorchRL ``RandomPolicy``, which
        the collector runs through a stand-in).

        Args:
            attr: the attribute's name.

        Returns:
            Its value (the object itself, not a copy).

        Raises:
            AttributeError: neither policy object has it.
            NotImplementedError: the collector has no policy in this process (a distributed
                collector: each remote collector runs its own).
        """
        setup = self._policy
        if setup is None:
            raise NotImplementedError(
                f"getattr_policy: {type(self).__name__} runs its policy in its remote collectors, not in "
                "this process; read the attribute from the policy object you built."
            )
        order = (setup.policy, setup.user_policy)
        if isinstance(setup.policy, SpecRandomPolicy):  # a stand-in for the TorchRL RandomPolicy given
            order = order[::-1]
        for policy in order:
            if policy is not None and hasattr(policy, attr):
                return getattr(policy, attr)
        raise AttributeError(f"getattr_policy: the collector's policy ({type(setup.policy).__name__}) has no "
                             f"attribute {attr!r}")

    @property
    def env(self) -> Any:
        """The env this collector steps in this process: TorchRL's ``collector.env``.

        For a [`Collector`][aiocollect.Collector]: the env as built from ``create_env_fn``
        (a TorchRL env as the TorchRL env; a ``VectorEnv`` as it is), or the list of envs
        for a list of factories. Use it to read the env, not to step or reset it: the
        collector owns its state between batches. The worker collectors have their envs in
        their worker processes, and no ``env`` (``AttributeError``, so ``hasattr`` is false).
        """
        raise AttributeError(  # (Collector, whose envs are here, overrides this)
            f"{type(self).__name__} has no env in this process: its envs are its workers' (worker "
            "processes, or remote collectors), which step envs and answer nothing else; build one with "
            "your env factory to look at it."
        )

    def getattr_env(self, attr: str) -> Any:
        """An attribute of the collector's env: TorchRL's ``getattr_env(attr)``.

        A [`Collector`][aiocollect.Collector] answers from its env in this process
        ([`env`][aiocollect.DataCollectorBase.env]; for a list of envs, from the first, as
        TorchRL's multi-process collectors answer from their first worker's). The worker
        collectors refuse: their envs live in worker processes that step envs and answer
        nothing else, and an answer from a copy built here could silently differ from the
        live env's (its state, its seed); build one with your env factory to read a static
        attribute such as a spec.

        Args:
            attr: the attribute's name.

        Returns:
            Its value.

        Raises:
            AttributeError: the env has no such attribute.
            NotImplementedError: the collector's envs are not in this process.
        """
        try:
            env = self.env
        except AttributeError as exc:
            raise NotImplementedError(f"getattr_env({attr!r}): {exc}") from None
        if isinstance(env, list):
            env = env[0]
        return getattr(env, attr)

    def getattr_rb(self, attr: str) -> Any:
        """An attribute of the ``replay_buffer``: TorchRL's ``getattr_rb(attr)``.

        Args:
            attr: the attribute's name.

        Returns:
            ``getattr(collector.replay_buffer, attr)``.

        Raises:
            AttributeError: the collector has no replay buffer, or it has no such attribute.
        """
        if self.options.replay_buffer is None:
            raise AttributeError(f"getattr_rb({attr!r}): {type(self).__name__} has no replay_buffer.")
        return getattr(self.options.replay_buffer, attr)

    @property
    def n_env(self) -> int:
        """How many envs the collector steps: TorchRL's ``n_env`` (``num_envs``, over every worker)."""
        num = getattr(self, "num_envs", None)
        if num is None:
            raise AttributeError(f"{type(self).__name__} has no n_env: its envs live in its remote collectors.")
        return num

    @property
    def requested_frames_per_batch(self) -> int:
        """Frames in each batch, summed over its envs: TorchRL's ``requested_frames_per_batch``.

        ``frames_per_batch`` as the collector uses it: rounded up (with a warning) to split
        evenly over the envs, as TorchRL's ``Collector`` does.
        """
        return self.options.frames_per_batch

    def enable_profile(self, **profile_options: Any) -> None:
        """TorchRL's worker profiler: not available here (``NotImplementedError``).

        TorchRL profiles the rollouts of its workers, where its policy and envs run.
        aiocollect's workers step envs only, and the policy runs in this process: profile
        the main process with ``torch.profiler.profile()`` around your loop instead.

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError(
            "enable_profile: aiocollect does not profile collection itself. The policy runs in this "
            "process: wrap your loop in torch.profiler.profile() to see it; worker processes only step envs."
        )

    def init_updater(self, *args: Any, **kwargs: Any) -> None:
        """TorchRL's ``init_updater(...)``: nothing to do here.

        TorchRL passes the arguments to its ``weight_updater``, and does nothing without
        one. An aiocollect collector never has one (``weight_updater=None``): weights reach
        the policy through ``update_policy_weights_``. So this does nothing.
        """

    def register_scheme_receiver(self, weight_recv_schemes: dict, *, synchronize_weights: bool = True) -> None:
        """TorchRL's ``register_scheme_receiver``: not available for a scheme (``NotImplementedError``).

        In TorchRL it makes a collector receive weights from a parent collector through
        weight-sync schemes. No collector sends weights to an aiocollect collector that
        way: send them with ``update_policy_weights_``. An empty dict registers nothing.

        Args:
            weight_recv_schemes: ``{model_id: scheme}``.
            synchronize_weights: TorchRL's; unused.

        Raises:
            NotImplementedError: ``weight_recv_schemes`` names a scheme.
        """
        if weight_recv_schemes:
            raise NotImplementedError(
                f"register_scheme_receiver({sorted(weight_recv_schemes)}): an aiocollect collector receives "
                "weights only through update_policy_weights_(weights); call it with the weights instead."
            )

    # ------------------------------------------------------------------ async face

    def __aiter__(self) -> AsyncIterator[Any]:
        return _AsyncBatches(self)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Shut the collector down from ``async`` code (what ``async with`` calls on exit).

        It calls [`shutdown()`][aiocollect.DataCollectorBase.shutdown], which blocks the
        event loop while it runs (for a multi-process collector, until its workers are gone).
        """
        self.shutdown()

    async def arollout(self) -> TensorDictBase:
        """Collect one batch and return it as collected: the async twin of ``rollout()``.

        See [`rollout`][aiocollect.DataCollectorBase.rollout].

        Returns:
            The batch, without ``split_trajs``, ``postproc`` or the replay buffer.
        """
        self._after_caller_stream()
        batch, _ = await self._guarded_collect()
        return self._finish(batch)

    # ------------------------------------------------------------------ sync face

    def _check_sync_allowed(self, what: str) -> None:
        loop = self._resources.loop
        if loop is not None and loop.in_this_thread():
            raise CollectorBusyError(
                f"{what} was called from the collector's own event loop (from a policy, postproc "
                "or replay-buffer callback?), where blocking would deadlock; use the async face "
                "there: `async for batch in collector` or `await collector.arollout()`."
            )

    @contextlib.contextmanager
    def _loop_thread(self, what: str) -> Iterator[LoopThread]:
        """The loop thread, started for the duration of the block if none runs."""
        self._check_sync_allowed(what)
        self._check_usable()
        res = self._resources
        if res.loop is not None and not res.loop.usable:
            res.stop_loop()  # a stop that a second Ctrl-C cut short: finish it, start afresh
        owner = res.loop is None
        if owner:
            res.loop = LoopThread()
        try:
            yield res.loop
        finally:
            if owner and not self.is_running() and not self._persistent_loop:
                res.stop_loop()

    def _run_sync(self, what: str, fn: Callable, *args: Any) -> Any:
        with self._loop_thread(what) as loop, self._closed_meanwhile():
            return loop.call(fn, *args)

    def _after_caller_stream(self) -> None:
        """Before a batch is asked for: the policy's next calls wait for what this thread
        queued on its current CUDA stream, where that matters (a ``Collector`` acting with
        the user's module on a GPU, changed on a stream of the user's own:
        ``PolicySetup.follow_caller``); the reverse of ``_on_caller_stream``."""
        policy = getattr(self, "_policy", None)
        if policy is not None:
            policy.follow_caller()

    def _on_caller_stream(self, batch: Any) -> Any:
        """A GPU batch handed over by the loop thread, made ready on this thread's current
        stream: its upload was waited for by the loop thread's (the default stream), so a
        stream of the caller's own (``with torch.cuda.stream(s): for batch in collector``)
        waits for the default stream too, on the GPU, and is recorded as a user of the
        batch's memory. Nothing to do on the default stream, or off CUDA."""
        staging = self._staging
        if staging is None or not staging.cuda or not isinstance(batch, TensorDictBase):
            return batch
        here = torch.cuda.current_stream(staging.device)
        default = torch.cuda.default_stream(staging.device)
        if here != default:
            here.wait_stream(default)
            for tensor in batch.values(True, True):
                tensor.record_stream(here)
        return batch

    @contextlib.contextmanager
    def _closed_meanwhile(self) -> Iterator[None]:
        """A call that ``shutdown()`` (from another thread) cut short raises
        [`CollectorClosedError`][aiocollect.CollectorClosedError], not a bare cancellation."""
        try:
            yield
        except (concurrent.futures.CancelledError, asyncio.CancelledError, RuntimeError) as exc:
            if self._closed and not isinstance(exc, CollectorError):
                raise self._closed_error() from None
            raise

    def _closed_error(self) -> CollectorClosedError:
        return CollectorClosedError(f"{type(self).__name__} is shut down; create a new collector.")

    def __iter__(self) -> Iterator[Any]:
        return self._sync_batches()

    def iterator(self) -> Iterator[Any]:
        """Return ``iter(collector)``: TorchRL's spelling of the sync iteration.

        Returns:
            An iterator over the batches (``None`` for each batch stored in a replay buffer).
        """
        return iter(self)

    def _sync_batches(self) -> Iterator[Any]:
        """``for batch in collector``: each batch collected on the loop thread.

        The loop thread leaves each batch in ``_undelivered`` before it reports back, and
        this thread takes it from there. So a batch whose collection ended just as the
        waiting thread was interrupted (Ctrl-C), too late for the cancellation to stop it,
        is kept, already counted, and is the first one the next iteration yields: an
        interruption never loses a batch. ``shutdown()`` called from the loop's body ends
        the iteration (``shutdown()`` from another thread while a batch is collected
        raises [`CollectorClosedError`][aiocollect.CollectorClosedError] instead).
        """
        with self._loop_thread("for batch in collector") as loop:
            while True:
                if self._undelivered is _NOTHING:
                    self._after_caller_stream()
                    with self._closed_meanwhile():
                        loop.call(self._next_batch_kept)
                batch, self._undelivered = self._undelivered, _NOTHING
                if batch is _DONE:
                    return
                yield self._on_caller_stream(batch)
                if self._closed:
                    return  # shut down by the loop's body: the iteration is over

    async def _next_batch_kept(self) -> None:
        self._undelivered = await self._next_batch()

    def next(self) -> Any:
        """The next batch of the collection: TorchRL's ``collector.next()``.

        The batch ``for batch in collector`` would give next, counted towards
        ``total_frames`` (with ``postproc``, ``split_trajs``, ``trajs_per_batch`` and the
        replay buffer applied), so calls to ``next()`` and iterations share one collection.
        As in TorchRL, ``None`` once ``total_frames`` are collected (and, with a replay
        buffer, for every batch, which went to the buffer).

        Returns:
            The next batch, or ``None``.

        Raises:
            CollectorBusyError: called from the collector's own event loop; use
                ``async for`` or ``await collector.arollout()`` there.
        """
        with self._loop_thread("next()") as loop:
            if self._undelivered is _NOTHING:  # (a batch an interrupted iteration kept comes first)
                self._after_caller_stream()
                with self._closed_meanwhile():
                    loop.call(self._next_batch_kept)
            batch, self._undelivered = self._undelivered, _NOTHING
        return None if batch is _DONE else self._on_caller_stream(batch)

    def rollout(self) -> TensorDictBase:
        """Collect one batch and return it as collected.

        Unlike iteration, it applies neither ``split_trajs`` nor ``postproc``, does not
        extend the replay buffer, and does not count towards ``total_frames`` or the
        ``frames`` and ``batches`` of [`statistics()`][aiocollect.DataCollectorBase.statistics].
        The envs go on from where they were, as for the next batch of an iteration.

        Returns:
            The batch, laid out as the collector's batches are.

        Raises:
            CollectorBusyError: called from the collector's own event loop (a policy, ``postproc``
                or replay-buffer callback); use ``await collector.arollout()`` there.
        """
        self._after_caller_stream()
        return self._on_caller_stream(self._run_sync("rollout()", self.arollout))

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.shutdown()

    def _on_engine(self, fn: Callable, *args: Any) -> Any:
        """Run ``fn`` where it cannot interleave with a step: on the loop thread if one runs.

        What goes through here changes the collection (seeds, resets, a loaded state), so
        a shut-down collector refuses it rather than accept it silently."""
        if self._closed:
            raise self._closed_error()
        loop = self._resources.loop
        if loop is not None and not loop.in_this_thread():
            return loop.portal.call(fn, *args)
        return fn(*args)

    # ------------------------------------------------------------------ background

    def start(self) -> None:
        """Collect in the background into ``replay_buffer`` until ``async_shutdown()``.

        Collection runs on the collector's loop thread; the training loop samples from the
        replay buffer meanwhile. It stops by itself after ``total_frames`` frames. An error
        in the background is logged at once and raised again by ``async_shutdown()`` and
        ``pause()``.

        Raises:
            CollectorError: the collector has no ``replay_buffer``, already runs in the
                background, is shut down or failed, or this is called from its own loop.

        Examples:
            >>> collector = MultiSyncCollector([make_env] * 4, policy, frames_per_batch=400,
            ...                                total_frames=-1, replay_buffer=buffer)
            >>> collector.start()
            >>> for step in range(10_000):
            ...     with collector.pause():     # only if a sample must not see new frames
            ...         sample = buffer.sample(256)
            ...     train(sample)
            ...     collector.update_policy_weights_()
            >>> collector.async_shutdown()
        """
        self._check_usable()
        if self.options.replay_buffer is None:
            raise CollectorError(
                "start() collects into a replay buffer: pass replay_buffer=... to the collector."
            )
        if self.is_running():
            raise CollectorBusyError(f"{type(self).__name__} is already running in the background.")
        self._check_sync_allowed("start()")
        res = self._resources
        if res.loop is None:
            res.loop = LoopThread()
        self._background = res.loop.start_soon(self._run_background)
        self._background.add_done_callback(self._background_done)

    async def _run_background(self) -> None:
        _BACKGROUND.set(True)  # this task's context only
        while True:
            # Let the loop run other callbacks between two batches: a batch of in-process envs
            # may never suspend, and a cancellation (async_shutdown) is delivered only here.
            await anyio.lowlevel.checkpoint()
            while self._pause_requested.is_set():
                self._parked.set()
                await anyio.sleep(0.002)
            self._parked.clear()
            if await self._next_batch() is _DONE:
                return

    def _background_done(self, future: concurrent.futures.Future) -> None:
        if not future.cancelled() and future.exception() is not None:
            logger.error("aiocollect: background collection failed", exc_info=future.exception())

    def _raise_background_error(self) -> None:
        bg = self._background
        if bg is not None and bg.done() and not bg.cancelled() and bg.exception() is not None:
            raise bg.exception()

    def is_running(self) -> bool:
        """Whether background collection ([`start()`][aiocollect.DataCollectorBase.start]) is going on.

        Returns:
            ``True`` from ``start()`` until the collection ends: ``total_frames`` reached, an
            error, ``async_shutdown()`` or ``shutdown()``.
        """
        return self._background is not None and not self._background.done()

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """``with collector.pause():`` background collection stops between two batches.

        The block starts once the batch in progress is stored, so the replay buffer does
        not change while it runs; collection resumes when it ends. Without background
        collection the block just runs.

        Raises:
            Exception: the error that ended the background collection, if one did.
        """
        self._pause_requested.set()
        try:
            while self.is_running() and not self._parked.wait(0.01):
                pass
            self._raise_background_error()
            yield
        finally:
            self._pause_requested.clear()

    def async_shutdown(self, timeout: float | None = None, close_env: bool = True) -> None:
        """Stop background collection, then shut the collector down.

        TorchRL's name for the end of ``start()``; it also works on a collector that never
        started.

        Args:
            timeout: seconds to wait for the background collection to stop once it is
                cancelled (``None``: as long as it takes).
            close_env: passed to [`shutdown()`][aiocollect.DataCollectorBase.shutdown].

        Raises:
            TypeError: ``timeout`` is not a number (checked before anything is stopped).
            ValueError: ``timeout`` is negative, ``nan`` or infinite (likewise).
            Exception: the error that ended the background collection, if one did.
        """
        timeout = validate_timeout(timeout)
        bg = self._background
        if bg is not None and not bg.done():
            bg.cancel()
            concurrent.futures.wait([bg], timeout=timeout)
        self.shutdown(close_env=close_env)
        self._raise_background_error()

    # ------------------------------------------------------------------ lifecycle

    def shutdown(self, timeout: float | None = None, close_env: bool = True) -> None:
        """Stop everything and release every resource. Idempotent; safe from any thread.

        Background collection is cancelled, the loop thread stopped and the envs closed
        (coroutine envs are awaited, for at most 5 s). A shut-down collector cannot be used
        again.

        Args:
            timeout: not used here; the multi-process collectors give it to their workers as
                a grace period.
            close_env: ``False`` leaves the envs open (for envs passed as instances that
                the caller goes on using).

        Raises:
            TypeError: ``timeout`` is not a number; checked first, as by every collector,
                so a refused call changes nothing and ``shutdown()`` still works.
            ValueError: ``timeout`` is negative, ``nan`` or infinite (likewise).
        """
        validate_timeout(timeout)
        if not self._shutting_down.acquire(blocking=False):
            return  # another thread is shutting it down
        try:
            if self._shut_down:
                return
            self._closed = True
            bg = self._background
            if bg is not None and not bg.done():
                bg.cancel()
            self._resources.close(close_env)
            self._finalizer.detach()
            self._shut_down = True
        finally:
            self._shutting_down.release()

    # ------------------------------------------------------------------ accounting

    def __len__(self) -> int:
        total = self.options.total_frames
        if total < 0:
            raise TypeError(f"{type(self).__name__} is endless (total_frames=-1) and has no length.")
        return -(-total // self.options.frames_per_batch)  # noqa: PLE0303 - total > 0 here

    def statistics(self) -> CollectorStatistics:
        """A frozen snapshot of the collector's counters.

        Returns:
            A new [`CollectorStatistics`][aiocollect.CollectorStatistics]: frames, batches,
            env steps, frames/s, policy versions and lag, and one entry per worker.
        """
        env_steps, completed = self._counters()
        in_effect, latest = self._versions() or (0, 0)
        secs = self._collect_seconds
        return CollectorStatistics(
            frames=self._frames,
            batches=self._batches,
            env_steps=env_steps,
            completed_trajectories=completed,
            collect_seconds=secs,
            frames_per_second=self._frames / secs if secs > 0 else 0.0,
            running_in_background=self.is_running(),
            workers=self._worker_statistics(),
            policy_version=in_effect,
            latest_policy_version=latest,
            max_policy_lag=self._max_lag,
            stale_frames_dropped=self._stale_dropped,
            mean_episode_return=self._returns.mean,
        )


class _AsyncBatches:
    """The async iterator ``async for`` uses: one awaited batch per ``__anext__``.

    An iteration does not outlive the run of its event loop in which its task left off: a
    task left pending when its loop stopped (Ctrl-C raised out of ``run_until_complete``)
    that asks for a batch once the loop runs again gets ``CancelledError`` instead, so an
    interrupted cell does not go on consuming batches behind the user's back. (Another
    task may go on with the same iterator: ``loop.run_until_complete(anext(batches))``
    in turns works.) The batch it was collecting is the next iteration's (``_guarded_collect``).
    """

    def __init__(self, collector: DataCollectorBase):
        self._collector = collector
        self._last: _Consumer | None = None
        """The task of the last ``__anext__``, and the run of its loop then."""

    def __aiter__(self):
        return self

    async def __anext__(self) -> Any:
        here = _Consumer()
        if here.same_task(self._last) and not self._last.in_this_run():
            raise asyncio.CancelledError(_OVER)
        self._last = here
        self._collector._after_caller_stream()
        batch = await self._collector._next_batch()
        if batch is _DONE:
            raise StopAsyncIteration
        return batch


_MASK = ("collector", "mask")
_VERSION = ("collector", "policy_version")


def with_torchrl_versions(batch: TensorDictBase) -> None:
    """Add TorchRL's ``track_policy_version=True`` keys to ``batch``: ``"policy_version"`` and
    ``("next", "policy_version")``, int64, one per frame (the batch's shape, as TorchRL's),
    each a copy of ``("collector", "policy_version")``: the version that computed the
    frame's action (-1 for masked-out frames). TorchRL writes them through an env transform,
    so its root entry holds the version of the step before (the first frame after an update
    still has the old one); here both hold the frame's own version. A batch without
    ``("collector", "policy_version")`` is left as it is."""
    version = batch.get(_VERSION, None)
    if version is None:
        return
    batch.set("policy_version", version.clone())
    batch.set(("next", "policy_version"), version.clone())


def frames_for_buffer(batch: Any, buffer: Any) -> Any:
    """What ``replay_buffer.extend`` receives for a delivered ``batch``.

    A TorchRL buffer (one with a ``storage``) gets the batch's **frames, one per item**,
    as TorchRL's collectors give them (its multi-process workers extend the buffer with
    their own ``[T]`` batches), so that a sampled item is one transition whatever the
    collector: a batch ``[envs, T]`` (``[workers, envs, T]`` for ``MultiSyncCollector``,
    ``[trajectories, L]`` with ``split_trajs``) becomes ``[frames]``, each row's frames in
    order, one row after the other, so a trajectory stays contiguous (as TorchRL's
    ``SliceSampler`` wants it). Frames masked out in ``("collector", "mask")`` (the
    padding of split trajectories, what a preempted or interrupted batch did not collect)
    hold no transition and are left out, the mask with them: every frame that goes in is
    a real one, and the items have one layout whether a batch was cut or not.

    Left as they are: batches for a storage with more than one batch dim
    (``LazyTensorStorage(..., ndim=2)`` asks for ``[envs, T]``), for a buffer of your own
    without a ``storage`` (it decides what to keep, mask included), and whatever a
    ``postproc`` returned that is not a TensorDict.
    """
    storage = getattr(buffer, "storage", None)
    if storage is None or getattr(storage, "ndim", 1) > 1 or not isinstance(batch, TensorDictBase):
        return batch
    frames = batch
    if batch.ndim != 1:
        frames = batch.clone(recurse=False)  # a shallow copy: the names go, not the batch's
        frames.names = None
        frames = frames.reshape(-1)
    mask = frames.get(_MASK, None)
    if mask is None:
        return frames
    frames = frames.exclude(_MASK)
    return frames if bool(mask.all()) else frames[mask.reshape(-1)]

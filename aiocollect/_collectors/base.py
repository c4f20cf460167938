"""``DataCollectorBase``: what every collector shares, and where each part of it lives.

A variant implements one coroutine, ``_collect() -> (batch, frames)``, that collects the
next raw batch (``Collector``, ``MultiSyncCollector``... each in its own module). The base
class is that contract plus the parts every collector has, one module each:

* ``_collectors.consumers``: one consumer at a time; an ``async for`` abandoned by a Ctrl-C
  is taken over by the next iteration;
* ``_collectors.delivery``: from a collected batch to what the user gets (counting,
  ``split_trajs``, ``postproc``, the replay buffer, ``trajs_per_batch``);
* ``_collectors.faces``: ``async for`` on the caller's loop and ``for`` (``next()``,
  ``rollout()``) through the private loop thread;
* ``_collectors.background``: ``start()`` into the replay buffer, ``pause()``;
* ``_collectors.torchrl_compat``: TorchRL's keywords and accessors (``policy_version``, ``env``...);
* ``_collectors.statistics`` and ``_collectors.resources``: the counters' snapshots, and
  what ``shutdown()`` releases.

Here: construction, the variants' hooks, weight updates (``update_policy_weights_``
returns at once, ``await update_policy_weights`` once the weights are in effect, both
through the policy's versioned channel, ``_policies.weights``), checkpoints' shared part,
``shutdown()`` (idempotent; it also runs when the collector is garbage collected or the
interpreter exits) and ``statistics()``.

After an env or the policy raised, the collector is *failed*: the original exception
surfaced from the iterator, and later calls say so instead of collecting from envs in an
unknown state.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDictBase

from .._engine.profile import Profile
from .._engine.staging import DeviceStaging
from .._engine.trajectories import TrajectoryAssembler
from .._errors import CollectorClosedError, CollectorFailedError
from .._policies.setup import PolicySetup
from .background import Background
from .checkpoint import Checkpoint, counters_state, policy_state_error, read_checkpoint
from .consumers import Consumer, Consumers
from .delivery import NOTHING, Delivery, flat_batch_tensordict
from .faces import Faces
from .options import CollectorOptions, validate_timeout
from .progress import EpisodeReturns, ProgressBar
from .resources import Resources
from .statistics import CollectorStatistics, WorkerStatistics
from .torchrl_compat import TorchRLAccessors, weights_given

if TYPE_CHECKING:
    from .._engine.scheduler import Scheduler


def batch_device(options: CollectorOptions) -> torch.device | None:
    """The device a batch says it is on, by TorchRL's rule: ``storing_device`` (``device``
    when that is not given), else the env's and the policy's when both are given and the same,
    else none (``None``: the tensors are on the CPU, and a replay buffer's storage takes them
    there). TorchRL 0.14's collectors say ``None`` unless told a device; aiocollect's said
    ``cpu`` before."""
    if options.storing_device is not None:
        return options.storing_device
    env, policy = options.env_device, options.policy_device
    return env if env is not None and env == policy else None


class DataCollectorBase(Faces, Consumers, Delivery, Background, TorchRLAccessors):
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
        self._busy: Consumer | None = None
        """Who is collecting a batch (see ``_guarded_collect``); ``None`` between batches."""
        self._cancelled_for_shutdown: weakref.WeakSet[asyncio.Task] = weakref.WeakSet()
        """Tasks ``shutdown()`` cancelled (``_stop_collecting_caller``): they raise
        ``CollectorClosedError``, not the cancellation."""
        self._left_pending: set[asyncio.Task] = set()
        """Tasks of abandoned iterations, cancelled on a loop that is stopped (see ``_take_over``)."""
        self._resources = Resources()
        self._warned_loop_blocked = False
        """Whether ``for batch in collector`` inside an ``async def`` was warned about (once)."""
        self._finalizer = weakref.finalize(self, self._resources.close)
        self._background: concurrent.futures.Future | None = None
        self._pause_requested = threading.Event()
        self._parked = threading.Event()
        self._pauses = 0
        """``pause()`` blocks open (they may nest or overlap: collection resumes after the last)."""
        self._pause_lock = threading.Lock()
        """Guards ``_pauses`` and ``_pause_requested``, and the background loop's look at them
        with the ``_parked`` flag it sets or clears (no ``pause()`` sees a stale ``_parked``)."""
        self._policy: PolicySetup | None = None  # set by the variant
        self._max_lag = 0
        self._stale_dropped = 0
        self._progress: ProgressBar | None = None
        self._returns = EpisodeReturns()
        self._staging: DeviceStaging | None = None
        """The pinned staging of a GPU storing device, built with the engine (``_collectors.assembly``)."""
        self._reuse_td = False
        """``return_same_td`` (``Collector``): each batch is written into the first one."""
        self._same_td: TensorDictBase | None = None
        self._scheduler: Scheduler | None = None
        """The engine of a local collector (``_engine.scheduler``), set by the variant;
        ``None`` for the distributed collectors, whose engines are remote."""
        self._profile: Profile | None = None
        """Set by ``enable_profile()`` (``_engine.profile``)."""
        self._assembler = TrajectoryAssembler()
        """``trajs_per_batch``'s trajectories, complete and under way (see ``_next_trajectories``)."""
        self._kept: tuple[TensorDictBase, int] | None = None
        """A raw batch collected on the loop thread for a caller that was cancelled; see ``_across``."""
        self._undelivered: Any = NOTHING
        """The batch collected for ``for batch in collector`` and not yet handed over; see
        ``_sync_batches``."""


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
        return () if self._scheduler is None else self._scheduler.timelines.take_cut()

    def _worker_statistics(self) -> tuple[WorkerStatistics, ...]:
        return ()

    @contextlib.contextmanager
    def _shut_down_on_error(self):
        """Around the construction of parts: one that fails to build shuts the collector
        down (releasing the envs, processes and memory built before it), then its error goes on."""
        try:
            yield
        except BaseException:
            self.shutdown()
            raise

    def _published(self) -> None:
        """Called once new weights are published (``update_policy_weights_``, ``load_state_dict``),
        in the caller's thread: a variant whose workers act with copies of the policy hands
        them on at once."""

    def _tensordict(self, tensors: dict, shape: list[int]) -> TensorDictBase:
        """A batch's tensors (flat keys) as a TensorDict of ``shape``, last dim named ``"time"``
        (on the host while a staging has it: ``_next_raw`` moves it to the device). Its device
        is the one TorchRL's collectors give their batches (``batch_device``)."""
        device = batch_device(self.options) if self._staging is None else None
        storage = None if self._scheduler is None else self._scheduler.storage
        groups = None if storage is None else storage.group_shapes
        if storage is not None and len(storage.env_batch) > 1:  # a TorchRL env of batch [5, 2]: rows back to dims
            tensors, shape = _env_dims(tensors, shape, storage.env_batch)
        return flat_batch_tensordict(tensors, torch.Size(shape), device, groups)


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
            CollectorClosedError: the collector is shut down.
            CollectorFailedError: the collector failed earlier (an env or the policy raised):
                it collects nothing more, so no weights are taken.
        """
        self._check_usable()
        self._check_worker_ids(worker_ids)
        given = weights_given(policy_or_weights, weights, policy, model_id, weights_dict)
        version = self._local_policy().publish(given)
        self._published()
        return version

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
        await self._local_policy().wait_applied(version)
        return version

    def _checked_and_weights_loaded(self, state_dict: dict, strict: bool) -> Checkpoint:
        """What every local ``load_state_dict`` does first: the whole state checked
        (``_collectors.checkpoint``, which raises before anything changes), then the
        policy's weights loaded (checked before they are published); returns the rest of
        the state, for the collector to restore."""
        saved = read_checkpoint(state_dict, type(self).__name__)
        if self._closed:
            raise self._closed_error()
        try:
            self._local_policy().load_state_dict(state_dict, strict, saved.policy_version)
            self._published()
        except (KeyError, ValueError, TypeError) as exc:  # named for load_state_dict, the call made
            error = policy_state_error(exc, type(self).__name__)
            if error is exc:
                raise
            raise error from None
        return saved


    def _local_policy(self) -> PolicySetup:
        """The policy of a local collector (the distributed ones override what calls this)."""
        assert self._policy is not None, "set by the variant's constructor"
        return self._policy

    def _closed_error(self) -> CollectorClosedError:
        return CollectorClosedError(f"{type(self).__name__} is shut down; create a new collector.")


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
            self._stop_collecting_caller()
            self._resources.close(close_env)
            self._finalizer.detach()
            self._shut_down = True
        finally:
            self._shutting_down.release()


    _STOP_CALLER_TIMEOUT_S = 10.0
    """How long ``shutdown()`` waits for a batch that an ``async for`` on another thread's
    event loop is collecting to stop (its in-flight env steps end first)."""

    def _stop_collecting_caller(self) -> None:
        """A batch collected by a task of an event loop running in another thread (the
        ``async for`` of a ``Collector``, whose envs step on the caller's loop): cancel it
        there and wait for it to let go (bounded), so that no env is closed while it steps
        and nothing is stored after ``shutdown()`` returns. On this thread's own loop the
        task is cancelled; it is suspended, so nothing steps meanwhile."""
        if self._persistent_loop:  # (worker collectors: their engine runs on their own loop thread)
            return
        busy = self._busy
        task = None if busy is None or busy.task is None else busy.task()
        if task is None or task.done():
            return
        loop = task.get_loop()
        self._cancelled_for_shutdown.add(task)
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if loop is here:
            task.cancel()
            return
        if loop.is_closed() or not loop.is_running():
            return
        loop.call_soon_threadsafe(task.cancel)
        deadline = time.monotonic() + self._STOP_CALLER_TIMEOUT_S
        while self._busy is busy and not task.done() and time.monotonic() < deadline:
            time.sleep(0.002)

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


def _env_dims(tensors: dict, shape: list[int], env_batch: tuple[int, ...]) -> tuple[dict, list[int]]:
    """A batch's tensors with their envs dim (``shape[-2]``: ``k`` envs of ``env_batch``'s
    ``prod``) as the env's own dims, ``[..., k * env_batch[0], *env_batch[1:], time]``: TorchRL's
    batch of an env with several batch dims (``[5, 2, time]``, and ``[workers * 5, 2, time]``
    for worker batches joined along their first dim)."""
    if len(shape) < 2 or shape[-2] % math.prod(env_batch):
        return tensors, shape
    new = [*shape[:-2], shape[-2] // math.prod(env_batch) * env_batch[0], *env_batch[1:], shape[-1]]
    return {k: v.reshape(*new, *v.shape[len(shape):]) for k, v in tensors.items()}, new

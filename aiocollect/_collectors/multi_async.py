"""``MultiAsyncCollector``: envs in worker processes, each batch from whichever worker is done.

The collection runs as one task on the engine loop (the *pump*): a worker whose batch is
full seals it (it stays in the storage) and puts it in the outbox, and starts the next
one in its other storage slot while fewer than two of its batches wait there;
``_collect_here`` takes the oldest batch from the outbox, copies it out (which frees its
slot), and enforces ``max_policy_lag`` both while batches fill and when they are delivered. The class
docstring says what users see.
"""

from __future__ import annotations

import asyncio
import math
import warnings
import weakref
from collections import deque

import anyio
from tensordict import TensorDictBase

from .._engine.scheduler import Lane, Sealed
from .._workers.plan import WorkerPlan
from .options import CollectorOptions, WorkerOptions, as_int, fit_to_envs
from .worker_collectors import WorkerCollectorBase


class MultiAsyncCollector(WorkerCollectorBase):
    """Collects from envs in worker processes without a barrier: each batch is one worker's.

    TorchRL's ``MultiAsyncCollector``; it is also exported as ``MultiaSyncDataCollector``,
    TorchRL's seed-era name. Each entry of ``create_env_fn`` is one worker process; the
    policy runs in this process on whichever workers are ready (EnvPool-style partial
    batches), or, where that costs more than the policy itself (a small policy on the
    CPU), each worker acts with its own copy (``policy_in_workers``). A batch is one
    worker's ``frames_per_batch`` frames, delivered as soon as that worker has them, so a
    slow worker never holds back a fast one. Collection goes
    on in the background, on the engine loop, while you train on a batch: each worker
    fills its next batch while fewer than two of its finished batches wait for you, which
    bounds how stale the data can get.

    **When to use it.** Off-policy training (SAC, TD3, DQN), envs whose step time varies
    (stragglers), or a training step worth overlapping with collection. With 8 envs whose
    step spins a lognormal ~1 ms of CPU, 2 workers collect 1.90x as fast as one process on
    2 cores (``benchmarks/``), a little more than
    [`MultiSyncCollector`][aiocollect.MultiSyncCollector] (1.85x), which is the choice for
    on-policy data. With a single worker, [`AsyncCollector`][aiocollect.AsyncCollector] takes
    its envs directly.

    **Batches.** One worker's frames: ``[T]`` for a worker of one env, ``T =
    frames_per_batch``; ``[envs, T]`` for a worker with a list of factories or a
    ``VectorEnv``, ``T = frames_per_batch // envs``. ``frames_per_batch`` is rounded up
    (with a warning) to split evenly over every worker's envs: to a multiple of the least
    common multiple of their env counts. Batches come in the order workers fill them, so consecutive
    batches may come from different workers (``("collector", "traj_ids")`` never repeats
    across them).

    **Staleness.** ``max_policy_lag=k`` bounds it in policy versions: no delivered frame was
    produced by a policy more than ``k`` versions older than the newest published when the
    batch is delivered. When a worker's batch is full, the steps at its front that break
    the bound are dropped and the batch keeps filling; a finished batch that went stale
    while it waited is dropped whole, and collected anew. Dropped frames leave a gap in their envs'
    trajectories between two batches (each batch stays consistent on its own) and are
    counted in ``statistics().stale_frames_dropped``. ``k=0`` with an update after every
    batch and several workers can drop most of the data: give the bound some slack
    (``k`` at least the number of workers keeps drops rare). A bound that cannot be met
    (weights published more than ``k`` times in the time a worker fills a batch) would
    drop every frame and deliver nothing: once more than ``4 * workers`` batches' worth of
    frames are dropped with no batch delivered in between, a ``RuntimeWarning`` says so
    and what to change (once per collector).

    Args:
        create_env_fn: one entry per worker, as for
            [`MultiSyncCollector`][aiocollect.MultiSyncCollector].
        policy: as for [`MultiSyncCollector`][aiocollect.MultiSyncCollector]: in this
            process, batched over every ready worker's envs, or as a copy in each worker.
        max_policy_lag: the bound described above, an int >= 0 (``None``: no bound).
        step_timeout: as for [`MultiSyncCollector`][aiocollect.MultiSyncCollector].
        start_timeout: as for [`MultiSyncCollector`][aiocollect.MultiSyncCollector]: past
            it (default 300 s), the constructor raises a
            [`StartTimeoutError`][aiocollect.StartTimeoutError] naming the workers not up.
        max_batch_size: not accepted, nor ``min_batch_size`` and ``batch_timeout``: see
            [`MultiSyncCollector`][aiocollect.MultiSyncCollector].
        cat_results: checked for TorchRL compatibility; no effect (a batch is one worker's).
        preemptive_threshold: not accepted (``ValueError``): no batch waits for a slow
            worker anyway.
        update_at_each_batch: accepted for TorchRL compatibility; no effect here (call
            ``update_policy_weights_()`` yourself).
        num_threads: accepted for TorchRL compatibility; no effect (a worker runs torch
            only for its copy of the policy, on one thread).
        num_sub_threads: as ``num_threads``.

    The other arguments are the options every collector shares: see
    [`CollectorOptions`][aiocollect.CollectorOptions], but for ``interruptor``: a batch is
    one worker's, delivered as soon as it is full, so there is nothing to cut.

    Raises:
        ValueError: the workers' spaces differ, ``preemptive_threshold`` or ``interruptor``
            is given, or ``max_policy_lag`` with ``trajs_per_batch``.
        TypeError: ``create_env_fn`` is not a list, or an entry is an env instance or
            cannot be pickled.

    Examples:
        >>> from aiocollect import MultiAsyncCollector, GymEnv
        >>> collector = MultiAsyncCollector([lambda: GymEnv("Pendulum-v1")] * 4, policy,
        ...                                 frames_per_batch=200, total_frames=20_000,
        ...                                 max_policy_lag=4)
        >>> for data in collector:          # data.shape == (200,): one worker's frames
        ...     train(data)
        ...     collector.update_policy_weights_()
        >>> collector.statistics().stale_frames_dropped
    """

    def _check_plan(self, plan: WorkerPlan, options, worker_options: WorkerOptions) -> CollectorOptions:
        counts = sorted({w.num_envs for w in plan.workers})
        # each batch is one worker's: it must split evenly over any worker's envs
        options = fit_to_envs(options, math.lcm(*counts), f"a worker's envs ({counts})", stacklevel=4)
        if options.interruptor is not None:
            raise ValueError(
                f"interruptor: a {type(self).__name__} delivers each worker's batch as soon as it is "
                "full, so there is no batch to cut short; use MultiSyncCollector(interruptor=...) "
                "or Collector(interruptor=...), or remove the argument."
            )
        if worker_options.max_policy_lag is not None and options.trajs_per_batch is not None:
            raise ValueError(
                "max_policy_lag with trajs_per_batch: max_policy_lag drops stale frames from the middle "
                "of trajectories, so no trajectory could be delivered whole; use one or the other."
            )
        if worker_options.preemptive_threshold is not None:
            raise ValueError(
                "preemptive_threshold: only MultiSyncCollector cuts batches early; a "
                f"{type(self).__name__} never waits for a slow worker anyway. Remove the argument."
            )
        self._outbox: deque[list[Sealed]] = deque()
        self._pump: asyncio.Task | None = None
        self._pump_error: BaseException | None = None
        self._arrived: anyio.Event | None = None
        self._dropped_since_batch = 0
        """Frames dropped for ``max_policy_lag`` since the last batch delivered (see ``_dropped``)."""
        self._lag_warned = False
        return options

    def _steps_per_env(self, num_envs: int) -> int:
        return self.options.frames_per_batch // num_envs

    def frames_per_batch_worker(self, *, worker_idx: int | None = None) -> int:
        """Frames in a worker's batch: TorchRL's ``frames_per_batch_worker()``.

        Each batch is one worker's, so this is ``frames_per_batch`` whichever worker it is.

        Args:
            worker_idx: the worker (checked); ``None``: any.

        Returns:
            ``frames_per_batch``.

        Raises:
            ValueError: ``worker_idx`` names no worker.
        """
        n = len(self._plan.workers)
        if worker_idx is not None and (as_int(worker_idx) is None or not 0 <= worker_idx < n):
            raise ValueError(f"frames_per_batch_worker: worker_idx={worker_idx!r} names no worker (0..{n - 1}).")
        return self.options.frames_per_batch

    def _begin(self, lanes: list[Lane]) -> None:
        """Start a worker's next batch: on each of its lanes (the parts of its envs)."""
        sched = self._scheduler
        steps = self._steps_per_env(self._plan.workers[lanes[0].index].num_envs)
        for lane in lanes:
            if self.options.reset_at_each_iter:
                sched.timelines.request_reset(None, lane.lo, lane.hi)
            sched.begin(lane, steps, False)

    def _stale_before(self) -> int | None:
        """The oldest policy version a delivered frame may come from (``None``: no bound)."""
        lag = self.worker_options.max_policy_lag
        return None if lag is None else self._policy.latest - lag

    def _on_full(self, lane: Lane) -> None:
        lanes = self._worker_lanes[lane.index]
        if not all(other.full for other in lanes):
            return  # a worker's batch is all its parts: the others are still stepping
        sched = self._scheduler
        oldest = self._stale_before()
        if oldest is not None:
            dropped = sum(sched.drop_older_than(other, oldest) for other in lanes)
            if dropped:
                self._dropped(dropped)
                return  # not full any more: it goes on stepping
        self._outbox.append([sched.seal(other, self.options.set_truncated) for other in lanes])
        self._signal()
        if len(lane.reserved) < 2:  # fill the next one while this one waits
            self._begin(lanes)

    def _signal(self) -> None:
        if self._arrived is not None:
            self._arrived.set()

    def _pump_failed(self, exc: BaseException) -> None:
        self._pump_error = exc
        self._signal()

    async def _collect_here(self) -> tuple[TensorDictBase, int]:
        if self._pump is None:
            self._pump = asyncio.get_running_loop().create_task(_run_pump(weakref.ref(self)))
        sched = self._scheduler
        while True:
            while not self._outbox:
                if self._pump_error is not None:
                    raise self._pump_error
                self._arrived = anyio.Event()
                await self._arrived.wait()
            sealed = self._outbox.popleft()
            lanes = [b.lane for b in sealed]
            oldest = self._stale_before()
            stale = oldest is not None and min(b.oldest_version(sched.storage) for b in sealed) < oldest
            frames = sum(b.valid * b.lane.num_envs for b in sealed)
            td = None
            if not stale:
                tensors = sched.batch_all(sealed)
                spec = self._plan.workers[lanes[0].index]
                steps = sealed[0].frames
                if not spec.batched:
                    tensors = {k: v[0] for k, v in tensors.items()}
                td = self._tensordict(tensors, [spec.num_envs, steps] if spec.batched else [steps])
            for b in sealed:
                sched.release(b)
            if all(lane.held and not lane.in_flight and lane.full for lane in lanes) and len(lanes[0].reserved) < 2:
                self._begin(lanes)  # it was waiting for room
                sched.poke()
            if stale:
                self._dropped(frames)  # went stale while it waited: collect anew
                continue
            self._dropped_since_batch = 0
            return td, frames

    LAG_WARNING_BATCHES = 4
    """Batches' worth of frames, per worker, that ``max_policy_lag`` may drop with no batch
    delivered before a ``RuntimeWarning`` says the bound is likely never met."""

    def _dropped(self, frames: int) -> None:
        """Count ``frames`` dropped for ``max_policy_lag``; warn, once per collector, when
        so many were dropped since the last batch delivered that the bound is likely never
        met (the weights change faster than a worker fills a batch): the caller would wait
        for a batch forever, with no word."""
        self._stale_dropped += frames
        self._dropped_since_batch += frames
        fpb = self.options.frames_per_batch
        workers = len(self._plan.workers)
        if self._lag_warned or self._dropped_since_batch <= self.LAG_WARNING_BATCHES * workers * fpb:
            return
        self._lag_warned = True
        lag = self.worker_options.max_policy_lag
        since = "since the last batch was delivered" if self._batches else "and no batch was delivered yet"
        warnings.warn(
            f"max_policy_lag={lag}: {self._dropped_since_batch} frames ({self._dropped_since_batch // fpb} batches' "
            f"worth) were dropped as stale {since}: new weights are likely published more than {lag} time(s) "
            f"while a worker fills a batch (frames_per_batch={fpb}), so no batch's frames all come from recent "
            "enough policies and none may ever be delivered. Raise max_policy_lag, call update_policy_weights_() "
            "less often than a batch takes to collect, or use a smaller frames_per_batch. "
            "statistics().stale_frames_dropped counts the frames dropped. (Said once per collector.)",
            RuntimeWarning, stacklevel=2,
        )


async def _run_pump(ref: weakref.ref) -> None:
    """The pump task: fill every worker's batches into the outbox until the collector is gone.

    It holds the collector only weakly, through ``ref``: the engine loop's thread keeps the
    task alive, and a strong reference would keep an abandoned collector (and its worker
    processes) alive with it, out of reach of garbage collection and its cleanup."""
    collector = ref()
    if collector is None:  # (gone before its pump began)
        return
    sched = collector._scheduler
    runner, on_full = weakref.WeakMethod(collector._runner), weakref.WeakMethod(collector._on_full)
    for lanes in collector._worker_lanes:
        collector._begin(lanes)
    del collector

    def call(method: weakref.WeakMethod, *args):
        bound = method()
        if bound is None:
            raise asyncio.CancelledError  # the collector was garbage collected: stop
        return bound(*args)

    try:
        await sched.pump(lambda: call(runner), lambda: False, lambda lane: call(on_full, lane))
    except BaseException as exc:
        collector = ref()
        if collector is not None:
            collector._pump_failed(exc)
        if isinstance(exc, Exception):
            return  # raised again by _collect_here
        raise


MultiaSyncDataCollector = MultiAsyncCollector

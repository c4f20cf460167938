"""``MultiAsyncCollector``: envs in worker processes, each batch from whichever worker is done.

>>> from aiocollect import MultiAsyncCollector, GymEnv
>>> collector = MultiAsyncCollector([lambda: GymEnv("Pendulum-v1")] * 4, policy,
...                                 frames_per_batch=200, total_frames=20_000)
>>> for data in collector:          # data.shape == (200,): one worker's frames
...     ...

There is no barrier: the policy runs on whichever workers are ready (EnvPool-style
partial batches) and a batch is one worker's ``frames_per_batch`` frames, delivered as
soon as that worker has them, so a slow worker never holds back a fast one. Collection
goes on in the background on the engine loop while you train on a batch; each worker
keeps at most one finished batch waiting for you (and fills the next one meanwhile), which
bounds how stale the data can get. Suits off-policy training (SAC, TD3, DQN).

``max_policy_lag=k`` bounds it in policy versions: no delivered frame was produced by a
policy more than ``k`` versions older than the newest published when the batch is
delivered. Steps that break the bound while a batch fills are dropped and collected
again (the batch keeps filling); a finished batch that went stale while it waited is
dropped whole. Dropped frames leave a gap in their envs' trajectories between two
batches (each batch stays consistent on its own) and are counted in
``statistics().stale_frames_dropped``. ``k=0`` with an update after every batch and
several workers can drop most of the data: give the bound some slack (``k`` >= the
number of workers keeps drops rare).
"""

from __future__ import annotations

import asyncio
from collections import deque

import anyio
from tensordict import TensorDictBase

from .._engine.scheduler import Slot
from .._workers.plan import WorkerPlan
from .options import WorkerOptions
from .workers import WorkerCollectorBase


class MultiAsyncCollector(WorkerCollectorBase):
    """Asynchronous multi-process collector (TorchRL's ``MultiAsyncCollector``); see the module docstring."""

    def _check_plan(self, plan: WorkerPlan, options, worker_options: WorkerOptions) -> None:
        fpb = options.frames_per_batch
        bad = sorted({w.num_envs for w in plan.workers if fpb % w.num_envs})
        if bad:
            raise ValueError(
                f"frames_per_batch={fpb}: each batch is one worker's, so it must split evenly over "
                f"that worker's envs, and some workers have {bad} envs; use a multiple of every "
                "worker's env count."
            )
        if worker_options.preemptive_threshold is not None:
            raise ValueError(
                "preemptive_threshold: only MultiSyncCollector cuts batches early; a "
                "MultiAsyncCollector never waits for a slow worker anyway. Remove the argument."
            )
        self._outbox: deque[tuple[int, TensorDictBase, int]] = deque()
        self._pending = [0] * len(plan.workers)  # finished batches waiting, per worker
        self._pump: asyncio.Task | None = None
        self._pump_error: BaseException | None = None
        self._arrived: anyio.Event | None = None

    def _steps_per_env(self, slot: Slot) -> int:
        return self.options.frames_per_batch // slot.num_envs

    def _begin(self, slot: Slot) -> None:
        if self.options.reset_at_each_iter:
            slot.engine.request_reset()
        slot.begin(self._steps_per_env(slot), self.options.interruptor is not None)

    def _stale_before(self) -> int | None:
        """The oldest policy version a delivered frame may come from (``None``: no bound)."""
        lag = self.worker_options.max_policy_lag
        return None if lag is None else self._policy.latest - lag

    def _on_full(self, slot: Slot) -> None:
        oldest = self._stale_before()
        if oldest is not None:
            dropped = slot.drop_older_than(oldest)
            if dropped:
                self._stale_dropped += dropped
                return  # not full any more: it goes on stepping
        td, frames = self._slot_batch(slot)
        self._outbox.append((slot.index, td, frames))
        self._pending[slot.index] += 1
        self._signal()
        if self._pending[slot.index] < 2:  # fill the next one while this one waits
            self._begin(slot)

    def _signal(self) -> None:
        if self._arrived is not None:
            self._arrived.set()

    async def _run_pump(self) -> None:
        sched = self._scheduler
        try:
            for slot in sched.slots:
                self._begin(slot)
            await sched.pump(self._runner, lambda: False, self._on_full)
        except BaseException as exc:
            self._pump_error = exc
            self._signal()
            if isinstance(exc, Exception):
                return  # raised again by _collect_here
            raise

    async def _collect_here(self) -> tuple[TensorDictBase, int]:
        if self._pump is None:
            self._pump = asyncio.get_running_loop().create_task(self._run_pump())
        while True:
            while not self._outbox:
                if self._pump_error is not None:
                    raise self._pump_error
                self._arrived = anyio.Event()
                await self._arrived.wait()
            index, td, frames = self._outbox.popleft()
            self._pending[index] -= 1
            slot = self._scheduler.slots[index]
            if slot.held and slot.buffer is None and not slot.in_flight and self._pending[index] < 2:
                self._begin(slot)  # it was waiting for room
                self._scheduler.poke()
            oldest = self._stale_before()
            if oldest is not None and _oldest_version(td) < oldest:
                self._stale_dropped += frames  # went stale while it waited: collect anew
                continue
            return td, frames


def _oldest_version(td: TensorDictBase) -> int:
    versions = td.get(("collector", "policy_version"))
    versions = versions[versions >= 0]
    return int(versions.min()) if versions.numel() else 1 << 62


MultiaSyncDataCollector = MultiAsyncCollector

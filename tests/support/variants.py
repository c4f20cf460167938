"""Every collector variant, built the same way: what the contract suite runs each case over.

A variant builds a collector over ``num_envs`` envs from a list of per-env factories (one
factory repeated, or a list that differs env by env, to plant a failing env at a known
place). ``locate(k)`` says where env ``k`` lands: ``(worker, env within the worker)``, as a
[`WorkerError`][aiocollect.WorkerError] names it; ``rows(batch)`` lays any batch out as
``[rows, time]`` for the batch checks.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from aiocollect import AsyncCollector, Collector, MultiAsyncCollector, MultiSyncCollector
from support.coroutine_envs import AsCoroutine


@dataclass(frozen=True)
class Variant:
    name: str
    cls: type
    envs: str
    """How its envs run: "inline" (this process), "vector" (a gymnasium SyncVectorEnv),
    "coroutine" (coroutine envs on the collector's loop) or "process" (worker processes)."""
    num_envs: int
    workers: int
    """Entries of ``create_env_fn`` for the worker collectors; 1 for a ``Collector``."""
    _layout: Callable[[list], Any]
    in_workers: bool = False
    """A torch policy runs in its workers (``AIOCOLLECT_POLICY_IN_WORKERS=1``: the choice on a
    machine with no core left for the engine), not in the main process, unless the test or the
    run sets the placement itself. (``MultiAsync-process``: so the whole contract holds in
    both places on any machine.)"""
    warm: bool = True
    """Its worker processes are forked from the warm launcher (``AIOCOLLECT_WARM_START``, set by
    ``tests/conftest.py``'s ``_warm_start``), not started as fresh interpreters, unless the run
    sets the switch itself. (``MultiSync-process`` starts them fresh, as users get them by
    default: so the whole contract holds both ways.)"""

    def __repr__(self) -> str:
        return self.name

    @property
    def coroutine(self) -> bool:
        return self.envs == "coroutine"

    @property
    def processes(self) -> bool:
        return self.envs == "process"

    @property
    def collects_ahead(self) -> bool:
        """MultiAsync and AsyncCollector fill batches before they are asked for."""
        return issubclass(self.cls, MultiAsyncCollector)

    def __call__(self, make_env: Any = None, policy: Any = None, **kwargs: Any):
        """The collector over ``make_env`` (one factory, or a list of ``num_envs``)."""
        from support.envs import CounterEnv

        make_env = CounterEnv if make_env is None else make_env
        fns = list(make_env) if isinstance(make_env, (list, tuple)) else [make_env] * self.num_envs
        assert len(fns) == self.num_envs
        if self.coroutine:
            fns = [AsCoroutine(f) for f in fns]
        if not self.processes or "AIOCOLLECT_POLICY_IN_WORKERS" in os.environ:
            return self.cls(self._layout(fns), policy, **kwargs)
        os.environ["AIOCOLLECT_POLICY_IN_WORKERS"] = "1" if self.in_workers else "0"  # (read as it is built)
        try:
            return self.cls(self._layout(fns), policy, **kwargs)
        finally:
            del os.environ["AIOCOLLECT_POLICY_IN_WORKERS"]

    def locate(self, k: int) -> tuple[int, int | None]:
        """``(worker, env within it)`` of env ``k`` (a VectorEnv does not say which of its envs raised)."""
        per = self.num_envs // self.workers
        if self.envs == "vector":
            return 0, None
        return (0, k) if self.cls is Collector else (k // per, k % per)

    def batch_shape(self, frames_per_batch: int) -> tuple[int, ...]:
        if self.cls is MultiSyncCollector:
            per = self.num_envs // self.workers
            return (self.workers, per, frames_per_batch // self.num_envs)
        if self.collects_ahead:  # one worker's batch
            per = self.num_envs // self.workers
            return (per, frames_per_batch // per)
        return (self.num_envs, frames_per_batch // self.num_envs)


def _chunks(n: int) -> Callable[[list], list]:
    return lambda fns: [fns[i:i + len(fns) // n] for i in range(0, len(fns), len(fns) // n)]


VARIANTS = [
    Variant("Collector-inline", Collector, "inline", 4, 1, list),
    Variant("Collector-vector", Collector, "vector", 4, 1, lambda fns: (lambda: gym.vector.SyncVectorEnv(fns))),
    Variant("Collector-coroutine", Collector, "coroutine", 4, 1, list),
    Variant("MultiSync-process", MultiSyncCollector, "process", 4, 2, _chunks(2), warm=False),
    Variant("MultiSync-coroutine", MultiSyncCollector, "coroutine", 4, 2, _chunks(2)),
    Variant("MultiAsync-process", MultiAsyncCollector, "process", 4, 2, _chunks(2), in_workers=True),
    Variant("AsyncCollector-process", AsyncCollector, "process", 2, 1, list),
    Variant("AsyncCollector-coroutine", AsyncCollector, "coroutine", 2, 1, list),
]
"""Every local variant; the distributed collectors have their own cases (``contract/test_distributed.py``)."""

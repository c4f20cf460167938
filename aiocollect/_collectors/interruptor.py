"""``Interruptor``: cut a batch short from outside the collector."""

from __future__ import annotations

import threading


class Interruptor:
    """A thread-safe switch that cuts a batch short from outside the collector.

    Pass it as ``interruptor=`` to a [`Collector`][aiocollect.Collector] or a
    [`MultiSyncCollector`][aiocollect.MultiSyncCollector] (a
    [`MultiAsyncCollector`][aiocollect.MultiAsyncCollector] has no batch to cut, and
    rejects one). A ``Collector`` checks it after every step, a ``MultiSyncCollector`` at
    every round of policy calls: once it is stopped, the batch being collected ends at the
    current step; the frames not collected are zeros, their trajectory id and policy
    version -1, and they are marked ``False`` in ``("collector", "mask")``. With an
    interruptor every batch has that mask. The collector never restarts it: until you call
    [`start_collection`][aiocollect.Interruptor.start_collection], every batch ends after
    its first step (as in TorchRL).

    Any object with a ``collection_stopped()`` method can play this role (TorchRL's
    ``_Interruptor`` included).

    Examples:
        >>> interruptor = Interruptor()
        >>> collector = Collector(make_env, policy, frames_per_batch=1000, interruptor=interruptor)
        >>> interruptor.stop_collection()   # from another thread or a callback: cut the batch
        >>> batch = collector.rollout()     # mask marks the frames collected
        >>> interruptor.start_collection()  # the next batch is whole again
    """

    def __init__(self) -> None:
        self._stopped = threading.Event()

    def start_collection(self) -> None:
        """Let batches run to their full length again (the state of a new interruptor)."""
        self._stopped.clear()

    def stop_collection(self) -> None:
        """Cut the batch being collected at its current step, and every batch until ``start_collection()``."""
        self._stopped.set()

    def collection_stopped(self) -> bool:
        """Whether collection is stopped: what the collector asks after every step.

        Returns:
            ``True`` between ``stop_collection()`` and the next ``start_collection()``.
        """
        return self._stopped.is_set()

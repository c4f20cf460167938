"""``Interruptor``: cut a batch short from outside the collector."""

from __future__ import annotations

import threading


class Interruptor:
    """A thread-safe switch a collector checks after every step.

    While stopped, the batch being collected ends at the current step; the frames not
    collected are zeroed and marked ``False`` in ``("collector", "mask")``. Any object
    with a ``collection_stopped()`` method can play this role (TorchRL's ``_Interruptor``
    included).

    >>> interruptor = Interruptor()
    >>> collector = Collector(make_env, policy, frames_per_batch=1000, interruptor=interruptor)
    >>> interruptor.stop_collection()   # from another thread or a callback
    """

    def __init__(self) -> None:
        self._stopped = threading.Event()

    def start_collection(self) -> None:
        self._stopped.clear()

    def stop_collection(self) -> None:
        self._stopped.set()

    def collection_stopped(self) -> bool:
        return self._stopped.is_set()

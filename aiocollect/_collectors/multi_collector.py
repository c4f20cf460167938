"""TorchRL 0.14's names for what the worker collectors share: ``MultiCollector``, and
``BaseCollector`` (``DataCollectorBase``, every collector's base).

TorchRL 0.14 exports ``MultiCollector``, the base of its ``MultiSyncCollector``,
``MultiAsyncCollector`` and ``AsyncCollector``, and builds one of the first two when called
with ``sync=True``/``sync=False``; a program that annotates or checks with it
(``isinstance(collector, MultiCollector)``), or builds with it, runs here as it is. Here it
is an abstract class that aiocollect's worker collectors are registered with (their own base,
``WorkerCollectorBase``, stays private), so ``isinstance`` and ``issubclass`` answer as
TorchRL's do, and calling it builds the class ``sync`` names.
"""

from __future__ import annotations

import abc
from typing import Any

from .base import DataCollectorBase
from .worker_collectors import WorkerCollectorBase

BaseCollector = DataCollectorBase
"""TorchRL 0.14's name for the base of every collector."""


class MultiCollector(abc.ABC):  # noqa: B024 - only registered classes: nothing to implement
    """The worker collectors, as TorchRL 0.14 names them together (a ``MultiSyncCollector``,
    ``MultiAsyncCollector`` or ``AsyncCollector`` is an instance of it), and
    ``MultiCollector(create_env_fn, policy, sync=True, ...)`` builds a
    [`MultiSyncCollector`][aiocollect.MultiSyncCollector] (``sync=False``: a
    [`MultiAsyncCollector`][aiocollect.MultiAsyncCollector]) with the other arguments.

    Raises:
        TypeError: ``sync`` is not given (TorchRL's ``MultiCollector`` is abstract then too),
            or is not a bool.
    """

    def __new__(cls, *args: Any, sync: bool | None = None, **kwargs: Any) -> Any:
        if not isinstance(sync, bool):
            raise TypeError(f"MultiCollector(..., sync=...): sync must be True (a MultiSyncCollector) or False (a "
                            f"MultiAsyncCollector), got {sync!r}; or build the one you want by its name.")
        from .multi_async import MultiAsyncCollector
        from .multi_sync import MultiSyncCollector

        return (MultiSyncCollector if sync else MultiAsyncCollector)(*args, **kwargs)


MultiCollector.register(WorkerCollectorBase)

"""aiocollect: fast RL experience collection on asyncio, in TorchRL's batch layout.

Envs step in this process (or, soon, in subprocess workers and as coroutines); one
event loop schedules the steps and runs **one batched policy call per step** for all of
them; batches come out as ``tensordict.TensorDict`` laid out exactly like TorchRL's, so
TorchRL's losses, GAE and replay buffers take them as they are.

Every collector works three ways::

    for batch in collector: ...          # a script, a thread, a Jupyter cell
    async for batch in collector: ...    # inside your own event loop
    collector.start()                    # in the background, into replay_buffer

and is a context manager (``with`` / ``async with``) that always cleans up.
"""

from ._collectors.base import CollectorStatistics as CollectorStatistics
from ._collectors.base import DataCollectorBase as DataCollectorBase
from ._collectors.collector import Collector as Collector
from ._collectors.collector import SyncDataCollector as SyncDataCollector
from ._collectors.interruptor import Interruptor as Interruptor
from ._collectors.options import CollectorOptions as CollectorOptions
from ._engine.trajectories import split_trajectories as split_trajectories
from ._envs.gym import GymEnv as GymEnv
from ._policies.random import RandomPolicy as RandomPolicy

__version__ = "0.1.0"

__all__ = [
    "Collector",
    "CollectorOptions",
    "CollectorStatistics",
    "DataCollectorBase",
    "GymEnv",
    "Interruptor",
    "RandomPolicy",
    "SyncDataCollector",
    "split_trajectories",
]

"""aiocollect: fast RL experience collection on asyncio, in TorchRL's batch layout.

Envs step in this process, in subprocess workers, or as coroutines on the event loop; one
event loop schedules the steps and runs **one batched policy call per step** over every
ready env (or, for the worker collectors, a copy of a small CPU policy in each worker where
that is cheaper: ``policy_in_workers``); batches come out as ``tensordict.TensorDict`` laid
out exactly like TorchRL's, so TorchRL's losses, GAE and replay buffers take them as they are. The class names and
constructor arguments are TorchRL's.

Every collector works three ways:

```python
for batch in collector: ...          # a script, a thread, a Jupyter cell
async for batch in collector: ...    # inside your own event loop
collector.start()                    # in the background, into replay_buffer
```

and is a context manager (``with`` / ``async with``) that always cleans up.

Which collector:

* [`Collector`][aiocollect.Collector]: envs in this process; cheap envs, a ``VectorEnv``,
  or hundreds of coroutine envs ([`AsyncEnv`][aiocollect.AsyncEnv]) that wait on I/O.
* [`MultiSyncCollector`][aiocollect.MultiSyncCollector]: envs in worker processes, each
  batch from all workers, collected when you ask for it (on-policy).
* [`MultiAsyncCollector`][aiocollect.MultiAsyncCollector]: envs in worker processes, each
  batch from whichever worker is done, collected ahead while you train (off-policy).
* [`AsyncCollector`][aiocollect.AsyncCollector]: one worker process, collected ahead.
* [`RayCollector`][aiocollect.RayCollector], [`RPCCollector`][aiocollect.RPCCollector]:
  collectors in other processes or machines, on Ray or ``torch.distributed.rpc``.

The options every collector shares are described on
[`CollectorOptions`][aiocollect.CollectorOptions], the methods on
[`DataCollectorBase`][aiocollect.DataCollectorBase]. JAX policies and zero-copy batches
for JAX learners are in [`aiocollect.jax`][aiocollect.jax].

The names below are imported on first use (PEP 562), so that ``import aiocollect`` stays
light and an env worker process, which unpickles env factories that may reference
[`GymEnv`][aiocollect.GymEnv], imports torch only to run a copy of the policy.
"""

import importlib as _importlib
import typing as _typing

__version__ = "0.1.0"

# public name -> private module that defines it
_EXPORTS = {
    "AsyncCollector": "._collectors.async_collector",
    "AsyncEnv": "._envs.async_env",
    "BaseCollector": "._collectors.multi_collector",
    "Collector": "._collectors.collector",
    "CollectorBusyError": "._errors",
    "CollectorClosedError": "._errors",
    "CollectorError": "._errors",
    "CollectorFailedError": "._errors",
    "CollectorOptions": "._collectors.options",
    "CollectorStatistics": "._collectors.statistics",
    "DataCollectorBase": "._collectors.base",
    "EnvError": "._errors",
    "GymEnv": "._envs.gym",
    "Interruptor": "._collectors.interruptor",
    "MultiAsyncCollector": "._collectors.multi_async",
    "MultiCollector": "._collectors.multi_collector",
    "MultiSyncCollector": "._collectors.multi_sync",
    "MultiSyncDataCollector": "._collectors.multi_sync",
    "MultiaSyncDataCollector": "._collectors.multi_async",
    "PolicyError": "._errors",
    "ProfileReport": "._engine.profile",
    "RPCCollector": "._distributed.rpc_collector",
    "RandomPolicy": "._policies.random",
    "RayCollector": "._distributed.ray_collector",
    "RemoteCollectorError": "._errors",
    "StartTimeoutError": "._errors",
    "StepTimeoutError": "._errors",
    "SyncDataCollector": "._collectors.collector",
    "ThreadEnv": "._envs.coroutine_group",
    "WorkerError": "._errors",
    "WorkerStatistics": "._collectors.statistics",
    "aSyncDataCollector": "._collectors.async_collector",
    "split_trajectories": "._engine.trajectories",
    "tune": "._tune",
}

__all__ = sorted(_EXPORTS)  # noqa: PLE0605 - lazy exports, one list


def __getattr__(name: str) -> _typing.Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'aiocollect' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module, __name__), name)
    globals()[name] = value  # the next lookup is a plain attribute access
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


if _typing.TYPE_CHECKING:  # static tools see ordinary imports
    from ._collectors.async_collector import AsyncCollector as AsyncCollector
    from ._collectors.async_collector import aSyncDataCollector as aSyncDataCollector
    from ._collectors.base import DataCollectorBase as DataCollectorBase
    from ._collectors.collector import Collector as Collector
    from ._collectors.collector import SyncDataCollector as SyncDataCollector
    from ._collectors.interruptor import Interruptor as Interruptor
    from ._collectors.multi_async import MultiAsyncCollector as MultiAsyncCollector
    from ._collectors.multi_async import MultiaSyncDataCollector as MultiaSyncDataCollector
    from ._collectors.multi_collector import BaseCollector as BaseCollector
    from ._collectors.multi_collector import MultiCollector as MultiCollector
    from ._collectors.multi_sync import MultiSyncCollector as MultiSyncCollector
    from ._collectors.multi_sync import MultiSyncDataCollector as MultiSyncDataCollector
    from ._collectors.options import CollectorOptions as CollectorOptions
    from ._collectors.statistics import CollectorStatistics as CollectorStatistics
    from ._collectors.statistics import WorkerStatistics as WorkerStatistics
    from ._distributed.ray_collector import RayCollector as RayCollector
    from ._distributed.rpc_collector import RPCCollector as RPCCollector
    from ._engine.profile import ProfileReport as ProfileReport
    from ._engine.trajectories import split_trajectories as split_trajectories
    from ._envs.async_env import AsyncEnv as AsyncEnv
    from ._envs.coroutine_group import ThreadEnv as ThreadEnv
    from ._envs.gym import GymEnv as GymEnv
    from ._errors import CollectorBusyError as CollectorBusyError
    from ._errors import CollectorClosedError as CollectorClosedError
    from ._errors import CollectorError as CollectorError
    from ._errors import CollectorFailedError as CollectorFailedError
    from ._errors import EnvError as EnvError
    from ._errors import PolicyError as PolicyError
    from ._errors import RemoteCollectorError as RemoteCollectorError
    from ._errors import StartTimeoutError as StartTimeoutError
    from ._errors import StepTimeoutError as StepTimeoutError
    from ._errors import WorkerError as WorkerError
    from ._policies.random import RandomPolicy as RandomPolicy
    from ._tune import tune as tune

"""``AsyncCollector``: one collector's worth of envs, collected in the background.

>>> from aiocollect import AsyncCollector, GymEnv
>>> collector = AsyncCollector(lambda: GymEnv("Pendulum-v1"), policy,
...                            frames_per_batch=200, total_frames=20_000)
>>> for data in collector:      # data.shape == (200,), collected while you trained
...     ...

TorchRL's ``AsyncCollector`` (formerly ``aSyncDataCollector``): ``create_env_fn`` is what
a :class:`~aiocollect.Collector` takes (a factory of one env or of a ``VectorEnv``, an
env id, or a list of factories); the envs run in their own worker process and the next
batch is being collected while you use the current one. It is a
:class:`~aiocollect.MultiAsyncCollector` with a single worker. With a ``replay_buffer``,
``start()`` keeps it filling the buffer until ``async_shutdown()``.
"""

from __future__ import annotations

from typing import Any

from .multi_async import MultiAsyncCollector


class AsyncCollector(MultiAsyncCollector):
    """Background collection from one worker process; see the module docstring."""

    @staticmethod
    def _entries(create_env_fn: Any) -> Any:
        return [create_env_fn]


aSyncDataCollector = AsyncCollector

"""``AsyncCollector``: one collector's worth of envs, collected in the background.

A ``MultiAsyncCollector`` whose ``create_env_fn`` is a single worker entry; the class
docstring says what users see.
"""

from __future__ import annotations

from typing import Any

from .._envs.build import check_not_instance_for_worker
from .multi_async import MultiAsyncCollector


class AsyncCollector(MultiAsyncCollector):
    """Collects from envs in one worker process, in the background, while you train.

    TorchRL's ``AsyncCollector``; it is also exported as ``aSyncDataCollector``, TorchRL's
    seed-era name. It is a [`MultiAsyncCollector`][aiocollect.MultiAsyncCollector] with a
    single worker: the envs run in their own process, the policy in this one (or, for a
    small policy on the CPU, a copy of it in the worker: ``policy_in_workers``), and
    the next batch is being collected while you use the current one (the worker keeps
    collecting until two finished batches wait for you).

    **When to use it.** Envs that fit in one process, and a training step that could
    overlap with collecting the next batch: the envs step in the worker while you train
    (the policy calls run on the engine thread, or in the worker), at the price of
    data collected ahead, before your latest weight updates: off-policy training (SAC,
    TD3, DQN). For on-policy data use [`Collector`][aiocollect.Collector] or
    [`MultiSyncCollector`][aiocollect.MultiSyncCollector]; for several worker processes,
    [`MultiAsyncCollector`][aiocollect.MultiAsyncCollector]; to bound how stale a batch
    may be in policy versions, pass ``max_policy_lag``.

    **Batches.** ``[T]`` for one env, ``T = frames_per_batch``; ``[num_envs, T]`` for a
    ``VectorEnv`` factory or a list of factories, ``T = frames_per_batch // num_envs``.

    Args:
        create_env_fn: the envs of the one worker: a factory of one env or of a gymnasium
            ``VectorEnv``, an env id, or a list of those (several envs stepped one after
            the other in the worker). Not an env instance: the worker builds its own envs.
            Factories travel with cloudpickle: lambdas and closures work, no
            ``if __name__ == "__main__"`` guard needed.
        policy: as for [`Collector`][aiocollect.Collector]; it runs in this process, or
            as a copy in the worker, chosen as for
            [`MultiSyncCollector`][aiocollect.MultiSyncCollector] (``policy_in_workers``).
        max_policy_lag: no delivered frame was produced by a policy more than this many
            versions older than the newest published when the batch is delivered; older
            frames are dropped and collected again (``None``: no bound). See
            [`MultiAsyncCollector`][aiocollect.MultiAsyncCollector].
        step_timeout: as for [`MultiSyncCollector`][aiocollect.MultiSyncCollector]: a step
            or reset of the worker process (or of a coroutine env, which then runs on the
            engine loop in this process) that takes longer, in seconds, fails the collection
            with a [`StepTimeoutError`][aiocollect.StepTimeoutError].
        start_timeout: as for [`MultiSyncCollector`][aiocollect.MultiSyncCollector]: the
            seconds the worker process may take to start (default 300; ``None``: no bound),
            past which the constructor raises a
            [`StartTimeoutError`][aiocollect.StartTimeoutError].
        max_batch_size: not accepted, nor ``min_batch_size`` and ``batch_timeout``: see
            [`MultiAsyncCollector`][aiocollect.MultiAsyncCollector].
        cat_results: checked for TorchRL compatibility; no effect (a batch is the worker's).
        preemptive_threshold: not accepted: ``ValueError``.
        update_at_each_batch: accepted for TorchRL compatibility; no effect here.
        num_threads: accepted for TorchRL compatibility; no effect (the worker does not
            run torch).
        num_sub_threads: as ``num_threads``.

    The other arguments are the options every collector shares: see
    [`CollectorOptions`][aiocollect.CollectorOptions].

    Examples:
        >>> from aiocollect import AsyncCollector, GymEnv
        >>> collector = AsyncCollector(lambda: GymEnv("Pendulum-v1"), policy,
        ...                            frames_per_batch=200, total_frames=20_000)
        >>> for data in collector:      # data.shape == (200,), collected while you trained
        ...     train(data)
        ...     collector.update_policy_weights_()
        >>> collector.shutdown()

        With a replay buffer, ``start()`` keeps it filling the buffer until
        ``async_shutdown()``:

        >>> collector = AsyncCollector(make_env, policy, frames_per_batch=200,
        ...                            total_frames=-1, replay_buffer=buffer)
        >>> collector.start()
    """

    _one_entry = True

    @staticmethod
    def _entries(create_env_fn: Any) -> Any:
        check_not_instance_for_worker(create_env_fn, "create_env_fn")  # (named as given, not [0])
        return [create_env_fn]


aSyncDataCollector = AsyncCollector

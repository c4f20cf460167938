"""``Collector``: one env group in this process, batches on demand.

>>> import torch.nn as nn
>>> from tensordict.nn import TensorDictModule
>>> from aiocollect import Collector, GymEnv
>>> policy = TensorDictModule(nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
>>> collector = Collector(lambda: GymEnv("Pendulum-v1"), policy,
...                       frames_per_batch=200, total_frames=10_000, max_frames_per_traj=50)
>>> for data in collector:          # or: async for data in collector
...     data.shape, data.names      # torch.Size([200]), ['time']
...     break
>>> collector.shutdown()            # or use it as a (async) context manager

``create_env_fn`` may be a factory, an env, an env id, a gymnasium ``VectorEnv`` or a list
of factories; the last two give batches of shape ``[num_envs, T]`` with
``T = frames_per_batch // num_envs``. Nothing runs until the first batch is asked for:
the envs are built (to learn their spaces) but reset lazily, so ``set_seed()`` called
right after construction seeds the very first reset.

Factories may return **coroutine envs** (:class:`~aiocollect.AsyncEnv`: ``async def
step``), hundreds of them: each steps as soon as its action is ready, on the collector's
own event loop, and the policy runs batched on whichever envs are ready
(``max_batch_size``, ``min_batch_size``, ``batch_timeout``; ``step_timeout`` fails a
collection whose env does not answer). Gymnasium envs in the same list are stepped inline.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase
from tensordict.nn import InteractionType

from .._engine.buffer import RolloutBuffer
from .._engine.coroutines import CoroutineEngine
from .._engine.engine import Engine
from .._envs.coroutine_group import CoroutineGroup
from .._envs.group import check_create_env_fn, make_group
from .._policies.setup import PolicySetup, check_policy
from .base import DataCollectorBase
from .loop_thread import LoopThread
from .options import options_from, validate_batching


class Collector(DataCollectorBase):
    """Collects batches from envs stepped in this process, with batched policy calls.

    The arguments and their meanings are TorchRL's ``Collector`` (formerly
    ``SyncDataCollector``); see :class:`~aiocollect.CollectorOptions` for each option.

    Args:
        create_env_fn: a callable returning a gymnasium env (e.g. ``lambda:
            GymEnv("Pendulum-v1")``), an env instance, an env id, a gymnasium
            ``VectorEnv``, or a list of callables (one env each).
        policy: a ``TensorDictModuleBase``, an ``nn.Module`` or callable taking the
            observation tensor(s) and returning the action, or ``None`` for a
            :class:`~aiocollect.RandomPolicy`.
    """

    def __init__(
        self,
        create_env_fn: Any = None,
        policy: Any = None,
        *,
        frames_per_batch: int,
        total_frames: int = -1,
        device: Any = None,
        storing_device: Any = None,
        env_device: Any = None,
        policy_device: Any = None,
        create_env_kwargs: dict | None = None,
        max_frames_per_traj: int | None = None,
        init_random_frames: int | None = None,
        reset_at_each_iter: bool = False,
        postproc: Any = None,
        split_trajs: bool | None = None,
        exploration_type: InteractionType | str = InteractionType.RANDOM,
        return_same_td: bool = False,
        reset_when_done: bool = True,
        interruptor: Any = None,
        set_truncated: bool = False,
        replay_buffer: Any = None,
        progress: bool = False,
        max_batch_size: int | None = None,
        min_batch_size: int | None = None,
        batch_timeout: float | None = None,
        step_timeout: float | None = None,
    ):
        options = options_from(locals())
        check_policy(policy)
        if create_env_fn is None:
            raise TypeError("create_env_fn is required: a callable returning a gymnasium env, or an env id.")
        check_create_env_fn(create_env_fn, options.create_env_kwargs)
        super().__init__(options)

        group, self._batched = make_group(create_env_fn, options.create_env_kwargs)
        self._resources.closers.append(group.close)
        self.group = group
        self._coroutine = isinstance(group, CoroutineGroup)
        try:
            batching = validate_batching(max_batch_size=max_batch_size, min_batch_size=min_batch_size,
                                         batch_timeout=batch_timeout, step_timeout=step_timeout,
                                         coroutine=self._coroutine)
            if self._coroutine and not options.reset_when_done:
                raise ValueError(
                    "reset_when_done=False: coroutine envs are reset as soon as they finish; "
                    "a finished coroutine env cannot be stepped on."
                )
        except BaseException:
            self.shutdown()
            raise
        n = group.num_envs
        if options.frames_per_batch % n:
            self.shutdown()
            lower = options.frames_per_batch // n * n
            raise ValueError(
                f"frames_per_batch={options.frames_per_batch} does not split evenly over {n} envs; "
                f"use a multiple of {n}, such as {lower or n} or {lower + n}."
            )
        self.num_envs = n
        self._steps_per_batch = options.frames_per_batch // n
        self.env_device = options.env_device or group.device or torch.device("cpu")
        self.storing_device = options.storing_device
        self.policy_device = options.policy_device

        obs_keys = [leaf.key for leaf in group.obs_leaves]
        self._policy = PolicySetup(policy, group.action_space, obs_keys, device=self.policy_device,
                                   exploration_type=options.exploration_type)
        self.policy = self._policy.policy
        if self._coroutine:
            # coroutine envs belong to one loop for their whole life: the collector's own
            self._engine = CoroutineEngine(group, max_frames_per_traj=options.max_frames_per_traj,
                                           batching=batching)
            self._persistent_loop = True
            self._resources.loop = LoopThread()
            self._resources.aclosers.append(group.aclose)
        else:
            self._engine = Engine(
                group, max_frames_per_traj=options.max_frames_per_traj, reset_when_done=options.reset_when_done
            )
        self._buffer: RolloutBuffer | None = None
        self._same_td: TensorDictBase | None = None

    # ------------------------------------------------------------------ collection

    async def _collect(self) -> tuple[TensorDictBase, int]:
        loop = self._resources.loop
        if self._coroutine and not loop.in_this_thread():
            # the async face, from the user's loop: collect on the envs' loop
            return await asyncio.wrap_future(loop.portal.start_task_soon(self._collect_here))
        return await self._collect_here()

    async def _collect_here(self) -> tuple[TensorDictBase, int]:
        opts = self.options
        runner = self._policy.random_runner if self._frames < opts.init_random_frames else self._policy.runner
        if opts.reset_at_each_iter:
            self._engine.request_reset()
        reuse = self._buffer if opts.return_same_td else None
        buffer, valid = await self._engine.rollout(
            self._steps_per_batch, runner, interruptor=opts.interruptor, buffer=reuse,
            set_truncated=opts.set_truncated,
        )
        if opts.return_same_td and buffer is self._buffer and self._same_td is not None:
            td = self._same_td
        else:
            td = buffer.to_tensordict(self._batched, self.storing_device)
            if opts.return_same_td:
                self._buffer, self._same_td = buffer, td
        frames = int(valid.sum()) if isinstance(valid, np.ndarray) else valid * self.num_envs
        return td, frames

    def _counters(self) -> tuple[int, int]:
        return self._engine.env_steps, self._engine.completed_trajectories

    # ------------------------------------------------------------------ control

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed the envs: env ``i``'s next reset uses ``seed + i`` (``seed`` if ``static_seed``).

        Every env is reset with its seed before the next step (starting new trajectories),
        and the random policy is reseeded with ``seed``. Returns the last seed used.
        """
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an integer, got {seed!r}")
        seeds = [seed] * self.num_envs if static_seed else [seed + i for i in range(self.num_envs)]

        def apply():
            self._engine.request_reset(seeds)
            self._policy.random.seed(seed)

        self._on_engine(apply)
        return seeds[-1]

    def reset(self) -> None:
        """Reset every env before the next step; ongoing trajectories end there."""
        self._on_engine(self._engine.request_reset)

    def _check_worker_ids(self, worker_ids: Any) -> None:
        if worker_ids not in (None, 0, [0], (0,)):
            raise ValueError(f"worker_ids={worker_ids!r}: a Collector has a single worker, 0.")

    def state_dict(self) -> OrderedDict:
        """``policy_state_dict``, ``env_state_dict`` (gymnasium envs have none), counters."""
        state = OrderedDict()
        if self._policy.has_weights:
            state["policy_state_dict"] = self._policy.state_dict()
        state["env_state_dict"] = OrderedDict()
        state["frames"] = self._frames
        state["iter"] = self._batches
        state["traj_pool"] = self._engine.state_dict()
        return state

    def load_state_dict(self, state_dict: dict, strict: bool = True) -> None:
        """Restore what :meth:`state_dict` saved; the envs restart from a reset."""
        self._policy.load_state_dict(state_dict, strict)

        def apply():
            self._frames = int(state_dict.get("frames", self._frames))
            self._batches = int(state_dict.get("iter", self._batches))
            if "traj_pool" in state_dict:
                self._engine.load_state_dict(state_dict["traj_pool"])

        self._on_engine(apply)

    def __repr__(self) -> str:
        shape = f"[{self.num_envs}, {self._steps_per_batch}]" if self._batched else f"[{self._steps_per_batch}]"
        return (
            f"{type(self).__name__}(envs={self.num_envs}, batch={shape}, total_frames={self.total_frames}, "
            f"policy={type(self.policy).__name__})"
        )


SyncDataCollector = Collector

"""``Collector``: one env group in this process, batches on demand.

Every env runs on the scheduler of the worker collectors (``_engine.scheduler``), into a
private storage of one batch:

* gymnasium envs (and vector envs) over one ``InlineWorker`` (``_workers.inline_worker``)
  that steps the group right here, through the scheduler's synchronous fast path
  (``run_inline``);
* coroutine envs each as a lane of their own (``_workers.coroutine_lanes``), stepped as
  tasks on the collector's loop, with the scheduler's per-env rounds.

This module builds the env group, validates the options, has the engine built over it
(``_collectors.assembly``), and turns each batch into a TensorDict. What the user sees is
described in the class docstring.
"""

from __future__ import annotations

import os
from collections import OrderedDict, deque
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase
from tensordict.nn import InteractionType

from .._engine.lanes import READY, Sealed
from .._engine.rounds import InlineRounds
from .._engine.scheduler import Scheduler
from .._engine.storage import host_empty
from .._engine.trajectories import split_trajectories
from .._envs.agents import stack_agents
from .._envs.build import check_create_env_fn, make_group
from .._envs.coroutine_group import CoroutineGroup
from .._envs.keyed import KeyedActions, observation_keys
from .._envs.object_batches import without_objects
from .._envs.policy_transforms import with_policy_transforms
from .._errors import CollectorError, EnvError
from .._policies.setup import PolicySetup
from .assembly import EnvShape, build_engine, lanes_here, policy_setup
from .base import DataCollectorBase
from .checks import grouped_env_options
from .delivery import with_torchrl_versions, without_private_keys
from .options import env_seeds, fit_to_envs, next_seed, options_from, validate_batching
from .torchrl_compat import (
    check_torchrl_keywords,
    collector_backend,
    envs_as_given,
    policy_from,
    take_torchrl_keywords,
    worker_entries,
)


class Collector(DataCollectorBase):
    """Collects batches from envs stepped in this process, with one batched policy call per step.

    TorchRL's ``Collector``, with its arguments and their meanings; it is also exported as
    ``SyncDataCollector``, TorchRL's seed-era name. Per step, the policy runs once on the
    observations of every env, then the envs step (one after the other, in this process,
    unless a ``VectorEnv`` runs them elsewhere), and each transition is written into a
    preallocated buffer; a batch becomes a TensorDict once, when it is delivered.

    **When to use it.** Envs that are cheap to step (CartPole-like, a few microseconds per
    step), a ``VectorEnv`` that already runs its envs in processes, or coroutine envs that
    wait on I/O: there, worker processes only add a round trip per step (on the 2-core VM
    of the benchmarks, 8 CartPole envs with random actions make 102k frames/s here, as many
    as a plain gymnasium vector-env loop, while 2 worker processes of 16 envs make 94k in a
    [`MultiSyncCollector`][aiocollect.MultiSyncCollector]).
    When a step costs real CPU time (a physics simulator, ~1 ms), spread the envs over
    worker processes with [`MultiSyncCollector`][aiocollect.MultiSyncCollector] (on-policy)
    or [`MultiAsyncCollector`][aiocollect.MultiAsyncCollector] (collects ahead).

    **Batches.** ``[T]`` for one env, with ``T = frames_per_batch``; ``[num_envs, T]`` for a
    list of factories or a ``VectorEnv``, with ``T = frames_per_batch // num_envs``. The last
    dim is named ``"time"``. Keys and dtypes are TorchRL's, plus
    ``("collector", "policy_version")``.

    Nothing runs until the first batch is asked for: the envs are built at construction
    (to learn their spaces) but reset lazily, so [`set_seed`][aiocollect.Collector.set_seed]
    called right after construction seeds the very first reset.

    **Coroutine envs.** Factories may return coroutine envs
    ([`AsyncEnv`][aiocollect.AsyncEnv]: ``async def reset`` and ``step``), hundreds of them:
    each steps as soon as its action is ready, on the collector's own event loop, and the
    policy runs batched on whichever envs are ready. Gymnasium envs in the same list are
    stepped inline, on that loop. Only coroutine envs take the four arguments below.

    Args:
        create_env_fn: a callable returning a gymnasium env (e.g. ``lambda:
            GymEnv("Pendulum-v1")``) or a coroutine env, an env instance, an env id, a
            gymnasium ``VectorEnv`` (any autoreset mode) or a factory of one, or a list of
            factories, env ids or env instances (one env each). All envs must share their
            spaces.
        policy: a ``TensorDictModuleBase``, an ``nn.Module`` or callable taking the
            observation tensor(s) and returning the action, a
            [`JaxPolicy`][aiocollect.jax.JaxPolicy], or ``None`` for a
            [`RandomPolicy`][aiocollect.RandomPolicy]. The collector acts with the object
            you pass (a module is not copied, as in TorchRL's ``Collector``): your optimiser
            steps between two batches reach the next one without ``update_policy_weights_``,
            each a new ``policy_version``; with a ``policy_device`` the module's tensors are
            not on, it runs a copy there that follows the module. A lazy module is
            initialised by the first policy call. See [weights](../weights.md).
        max_batch_size: coroutine envs: at most this many envs per policy call (default:
            every ready env).
        min_batch_size: coroutine envs: a policy call waits for this many ready envs while
            others are still stepping (default 1).
        batch_timeout: coroutine envs: the longest such wait in seconds, counted from the
            first ready env (default 0.005).
        step_timeout: coroutine envs: a ``reset`` or ``step`` that takes longer (in
            seconds) fails the collection with [`StepTimeoutError`][aiocollect.StepTimeoutError]
            (default: no limit).
        step_ahead: coroutine envs: an env that has its ``T`` steps of the batch steps on
            into the next batch instead of waiting for the slowest env (default ``False``).
            Batches keep their shape and meaning, but the first steps of a batch may come
            from the policy as it was before you received the batch before it (each frame's
            ``("collector", "policy_version")`` says which); ``set_seed()`` between two
            batches takes effect at each env's next step, inside the next batch for an env
            that stepped ahead, while ``reset()`` and ``load_state_dict()`` drop the steps
            taken ahead (the next batch starts from the reset). An env goes at most one
            batch ahead, not past ``total_frames``, and never while the random batches of
            ``init_random_frames`` are collected. Not with an ``interruptor`` or
            ``reset_at_each_iter``, which cut or reset every env at a batch's edge.
        start_timeout: not accepted (``ValueError``): it bounds the start of worker
            processes, and a ``Collector`` starts none. With ``num_collectors=N`` it goes to
            the worker collector built (see
            [`MultiSyncCollector`][aiocollect.MultiSyncCollector]).

    The other arguments are the options every collector shares: see
    [`CollectorOptions`][aiocollect.CollectorOptions].

    Raises:
        ValueError: an option is out of range, the envs' spaces differ, or a coroutine-env argument is given
            for other envs.
        TypeError: an argument has the wrong type (e.g. a factory that returns a TorchRL
            env: pass the gymnasium env).

    Examples:
        >>> import torch.nn as nn
        >>> from tensordict.nn import TensorDictModule
        >>> from aiocollect import Collector, GymEnv
        >>> policy = TensorDictModule(nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
        >>> collector = Collector(lambda: GymEnv("Pendulum-v1"), policy,
        ...                       frames_per_batch=200, total_frames=10_000, max_frames_per_traj=50)
        >>> for data in collector:          # or: async for data in collector
        ...     print(data.shape, data.names)
        ...     break
        torch.Size([200]) ['time']
        >>> collector.shutdown()            # or use it as a (async) context manager

        Eight envs, batches ``[8, 50]``:

        >>> collector = Collector([lambda: GymEnv("Pendulum-v1")] * 8, policy, frames_per_batch=400)
    """

    _scheduler: Scheduler
    """Its engine (``_engine.scheduler``), built by ``__init__``: a local collector always has one."""
    _policy: PolicySetup
    """Its policy, set up by ``__init__``."""

    def __new__(cls, create_env_fn: Any = None, policy: Any = None, *, num_collectors: int | None = None,
                sync: bool | None = None, backend: str | None = None, backend_options: dict | None = None,
                **kwargs: Any):
        """``Collector(..., num_collectors=N)`` is TorchRL 0.14's entry point to its worker
        collectors: it builds a [`MultiSyncCollector`][aiocollect.MultiSyncCollector]
        (``sync=True``) or a [`MultiAsyncCollector`][aiocollect.MultiAsyncCollector]
        (``sync=False``, TorchRL's default) over ``N`` workers, each with the env factory
        (or the ``N`` entries of a list of factories). ``backend`` picks the same way
        (``collector_backend``): ``"direct"`` (or ``None`` without ``num_collectors``) this
        class, ``"process"``/``"multiprocessing"`` a worker collector, ``"ray"`` and
        ``"rpc"`` a [`RayCollector`][aiocollect.RayCollector] or an
        [`RPCCollector`][aiocollect.RPCCollector]; ``backend_options`` are more arguments
        for the collector built."""
        kind = collector_backend(backend, num_collectors, sync, backend_options, kwargs)
        if cls is not Collector or kind == "direct":
            return super().__new__(cls)
        kwargs.update(backend_options or {})
        if "step_ahead" in kwargs:  # (a Collector's own: the collectors built here take none)
            step_ahead = kwargs.pop("step_ahead")
            if not isinstance(step_ahead, bool):
                raise TypeError(f"step_ahead must be True or False, got {step_ahead!r}")
            if step_ahead:
                raise ValueError(f"step_ahead=True with num_collectors={num_collectors!r} (a {kind} collector): "
                                 "step_ahead is for coroutine envs (aiocollect.AsyncEnv) in one Collector, "
                                 "in this process. Remove the argument or num_collectors.")
        if kind in ("ray", "rpc"):
            target = _distributed_collector(kind)
            return target(create_env_fn, policy, num_collectors=num_collectors, sync=bool(sync), **kwargs)
        count = num_collectors
        if count is None:  # (TorchRL's process backend: one worker per entry, or one for a single factory)
            count = len(create_env_fn) if isinstance(create_env_fn, (list, tuple)) else 1
        entries = worker_entries(create_env_fn, count, "num_collectors", ", or None for one process")
        if sync is not None and not isinstance(sync, bool):
            raise TypeError(f"sync must be True or False, got {sync!r}")
        from .multi_async import MultiAsyncCollector
        from .multi_sync import MultiSyncCollector

        target = MultiSyncCollector if sync else MultiAsyncCollector
        return target(entries, policy, **kwargs)

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
        track_policy_version: bool = False,
        replay_buffer: Any = None,
        progress: bool = False,
        trajs_per_batch: int | None = None,
        traj_format: str | None = None,
        trajs_per_write: int | None = None,
        max_batch_size: int | None = None,
        min_batch_size: int | None = None,
        batch_timeout: float | None = None,
        step_timeout: float | None = None,
        step_ahead: bool = False,
        num_collectors: int | None = None,
        sync: bool | None = None,
        backend: str | None = None,
        backend_options: dict | None = None,
        start_timeout: Any = None,
        policy_factory: Any = None,
        compile_policy: Any = None,
        cudagraph_policy: Any = None,
        **torchrl_options: Any,
    ):
        _refuse_worker_arguments(sync, start_timeout)
        check_torchrl_keywords(type(self).__name__, torchrl_options)
        options = options_from(locals())
        policy, cuda_graphs, _ = policy_from(locals(), options.policy_device)
        if create_env_fn is None:
            raise TypeError("create_env_fn is required: a callable returning a gymnasium env, or an env id.")
        if isinstance(options.create_env_kwargs, list):
            raise TypeError("create_env_kwargs: a list (one dict per worker) is for the multi-process collectors; "
                            "a Collector builds its envs here: give one dict.")
        check_create_env_fn(create_env_fn, options.create_env_kwargs)
        create_env_fn = with_policy_transforms(create_env_fn, policy, torchrl_options)
        super().__init__(options)

        group, self._batched = make_group(create_env_fn, options.create_env_kwargs)
        self._resources.env_closers.append(group.close)
        self.group = group
        self._coroutine = isinstance(group, CoroutineGroup)
        with self._shut_down_on_error():
            batching = validate_batching(max_batch_size=max_batch_size, min_batch_size=min_batch_size,
                                         batch_timeout=batch_timeout, step_timeout=step_timeout,
                                         coroutine=self._coroutine, reset_when_done=options.reset_when_done)
            self._step_ahead = _checked_step_ahead(step_ahead, self._coroutine, options)
        n = group.num_envs
        self.options = options = fit_to_envs(options, n, f"{n} envs", stacklevel=3)
        self.num_envs = n
        """How many envs the collector steps."""
        self._steps_per_batch = options.frames_per_batch // n
        self.env_device = options.env_device or torch.device(group.device or "cpu")
        self.storing_device = options.storing_device
        self.policy_device = options.policy_device
        self._reuse_td = options.return_same_td
        with self._shut_down_on_error():  # (a policy whose keys do not fit the envs: close the envs built)
            self._build_engine(policy, cuda_graphs, batching, torchrl_options)
        self.policy = self._policy.policy
        """The policy the collector runs: the object given (a module is not copied: your
        optimiser steps reach the next policy call, each a new policy version), or a copy
        on ``policy_device`` that follows it when the module's tensors are elsewhere; a
        [`RandomPolicy`][aiocollect.RandomPolicy] for ``policy=None``."""
        self._batch_start = 0
        """Env steps taken before the batch under way began (coroutine envs)."""

    def _build_engine(self, policy: Any, cuda_graphs: int | None, batching: Any, torchrl_options: dict) -> None:
        """The engine (``_collectors.assembly``): the scheduler of the worker collectors, writing
        into a private storage of one batch, over one worker that steps the group inline, or one
        lane per coroutine env."""
        group, options, res = self.group, self.options, self._resources
        envs = EnvShape.of_group(group, options)
        grouped_env_options(group.observation_space, options)
        take_torchrl_keywords(self, torchrl_options, options, policy,
                              observation_keys(group.observation_space, envs.obs_keys))
        # the policy runs only while the user waits for a batch: act with the user's module
        # itself, as TorchRL does, a change of it being a new policy version
        self._policy = policy_setup(res, policy, envs, options, cuda_graphs, share=True)
        lanes, self._envs = lanes_here(res, group, envs, options, columns=self._steps_per_batch,
                                       step_timeout=batching.step_timeout, slots=2 if self._step_ahead else 1)
        if self._coroutine:
            self._persistent_loop = True  # (coroutine envs live on the collector's own loop)
        # random actions go in runs of steps (``_engine.rounds.InlineRounds``), as in the worker
        # collectors: never where a batch is cut after any step (an interruptor), finished envs
        # wait for a reset, or the actions are under keys of their own (checked and packed here)
        runs = (not self._coroutine and options.reset_when_done and options.interruptor is None
                and not isinstance(envs.action_space, KeyedActions))
        engine = build_engine(res, self._policy, lanes, envs, options,
                              batching=batching if self._coroutine else None, runs=runs)
        self._scheduler, self._staging = engine.scheduler, engine.staging
        self._timelines = engine.scheduler.timelines
        self._parts: list[deque[Sealed]] = [deque() for _ in engine.scheduler.lanes]
        """``step_ahead``: each env's sealed batches not delivered yet, oldest first."""
        self._next_slot = [0] * len(engine.scheduler.lanes)
        """``step_ahead``: the slot of each env's next batch (batch ``k`` of every env lives in slot ``k % 2``)."""

    # ------------------------------------------------------------------ collection

    async def _collect(self) -> tuple[TensorDictBase, int]:
        loop = self._resources.loop
        try:
            # (coroutine envs live on the collector's own loop, from the constructor to shutdown)
            if self._coroutine and loop is not None and not loop.in_this_thread():
                # the async face, from the user's loop: collect on the envs' loop
                return await self._across(loop, self._collect_here)
            return await self._collect_here()
        except Exception as exc:
            if isinstance(exc, CollectorError) or not hasattr(exc, "env_index"):
                raise  # the policy's own exception, as it is
            raise EnvError.of(exc, worker=0, pid=os.getpid(), in_process=True) from exc

    async def _collect_here(self) -> tuple[TensorDictBase, int]:
        opts = self.options
        runner = self._policy.random_runner if self._frames < opts.init_random_frames else self._policy.runner
        if self._step_ahead:
            sealed = await self._collect_ahead(runner)
        elif self._coroutine:
            sealed = await self._collect_coroutines(runner)
        else:
            sealed = await self._collect_inline(runner)
        sched = self._scheduler
        try:
            tensors = sched.batch_all(sealed)
        finally:
            for part in sealed:
                sched.release(part)
        frames = sealed[0].frames
        if self._batched:
            td = self._tensordict(tensors, [self.num_envs, frames])
        else:
            td = self._tensordict({k: v[0] for k, v in tensors.items()}, [frames])
        return td, sum(part.valid * part.lane.num_envs for part in sealed)

    def _begin(self) -> None:
        """Start a new batch in every lane, unless a cancelled call left one midway (it resumes)."""
        opts, sched = self.options, self._scheduler
        if sched.lanes[0].held:
            if opts.reset_at_each_iter:
                sched.timelines.request_reset()
            for lane in sched.lanes:
                sched.begin(lane, self._steps_per_batch, opts.interruptor is not None)
            self._batch_start = sched.timelines.env_steps

    async def _collect_inline(self, runner) -> list:
        opts, sched = self.options, self._scheduler
        lane = sched.lanes[0]
        self._begin()
        interruptor = opts.interruptor
        if interruptor is None:
            def until() -> bool:
                return lane.t >= lane.frames
        else:
            def until() -> bool:  # every batch takes at least one step (TorchRL's rule)
                return lane.t >= lane.frames or (lane.t > 0 and interruptor.collection_stopped())
        await sched.run_inline(lambda: runner, until)
        return [sched.seal(lane, opts.set_truncated)]

    async def _collect_coroutines(self, runner) -> list:
        """Each env takes its steps at its own pace; an env that has them waits for the others."""
        opts, sched, envs = self.options, self._scheduler, self._envs
        assert envs is not None  # (coroutine envs)
        lanes, tl = sched.lanes, sched.timelines
        self._begin()
        full = [sum(lane.full for lane in lanes)]

        def on_full(lane) -> None:
            full[0] += 1

        interruptor, n = opts.interruptor, len(lanes)
        if interruptor is None:
            def until() -> bool:
                return full[0] == n
        else:
            def until() -> bool:  # every batch takes at least one step (TorchRL's rule)
                return full[0] == n or (tl.env_steps > self._batch_start and interruptor.collection_stopped())
        try:
            await sched.pump(lambda: runner, until, on_full)
            if full[0] < n:  # interrupted: let the steps under way land
                await sched.settle()
        except BaseException:
            sched.abandon([lanes[env.lo] for env in envs.cancel()])  # they restart from a reset
            raise
        return [sched.seal(lane, opts.set_truncated) for lane in lanes]

    async def _collect_ahead(self, runner) -> list:
        """``_collect_coroutines`` with ``step_ahead``: an env that has its steps of this batch
        begins the next one at once, in the other slot, if it may (``_start``); the batch is
        complete once every env has sealed its part."""
        sched, envs, parts = self._scheduler, self._envs, self._parts
        assert envs is not None  # (coroutine envs)
        lanes = sched.lanes
        opts = self.options
        fpb = self._steps_per_batch * self.num_envs
        ahead = ((opts.total_frames < 0 or self._frames + 2 * fpb <= opts.total_frames)
                 and self._frames >= opts.init_random_frames)  # (the next batch's runner is this one's)
        have = [0]

        def on_full(lane) -> None:
            part = parts[lane.lo]
            part.append(sched.seal(lane, opts.set_truncated))
            if len(part) == 1:
                have[0] += 1
            self._start(lane, ahead)

        for lane in lanes:
            if not lane.held and lane.full:  # (its last step landed after the last collection)
                on_full(lane)
            elif lane.held:
                self._start(lane, ahead)
        have[0] = sum(1 for part in parts if part)
        n = len(lanes)
        try:
            await sched.pump(lambda: runner, lambda: have[0] == n, on_full)
        except BaseException:
            cut = [lanes[env.lo] for env in envs.cancel()]  # they restart from a reset
            for lane in cut:
                waiting = parts[lane.lo]
                if lane.state is not READY and lane.t == 0 and waiting and waiting[-1].valid:
                    # cut at the first step of its next batch: the step before it, the last of the
                    # batch waiting to be delivered, says truncated (``abandon`` marks the step
                    # before only within one batch), so its trajectory never runs on unended
                    last = waiting[-1]
                    sched.storage.truncated[last.slot, last.valid - 1, lane.lo : lane.hi] = True
            sched.abandon(cut)
            raise
        return [part.popleft() for part in parts]

    def _start(self, lane, ahead: bool) -> None:
        """Begin ``lane``'s next batch in its slot, if that slot is free and the lane has no
        sealed batch waiting or may step ``ahead`` (``_collect_ahead``)."""
        slot = self._next_slot[lane.lo]
        if slot in lane.reserved or (self._parts[lane.lo] and not ahead):
            return
        self._scheduler.begin(lane, self._steps_per_batch, False, slot=slot)
        self._next_slot[lane.lo] = 1 - slot

    def _drop_ahead(self) -> None:
        """``step_ahead`` (a no-op without): forget the steps taken ahead of the batches
        delivered, for ``reset`` and ``load_state_dict``: the sealed batches not delivered yet
        and the batches envs began ahead (their steps under way cancelled). Every env then
        starts its next batch afresh in slot 0, from the reset asked for, with a new id, as
        without ``step_ahead``. (On the engine's thread: nothing steps meanwhile.)"""
        if not self._step_ahead:
            return
        sched, envs = self._scheduler, self._envs
        assert envs is not None  # (coroutine envs)
        sched.abandon([sched.lanes[env.lo] for env in envs.cancel()])
        for lane, parts in zip(sched.lanes, self._parts, strict=True):
            while parts:
                sched.release(parts.popleft())
            lane.held = True  # (its batch begun ahead, if any, dropped: _collect_ahead begins another)
        self._next_slot = [0] * len(sched.lanes)

    def _counters(self) -> tuple[int, int]:
        return self._timelines.env_steps, self._timelines.completed_trajectories

    def fake_tensordict(self) -> TensorDictBase:
        """A batch of zeros laid out as this collector's batches: TorchRL's ``fake_tensordict()``,
        for a replay buffer's storage or a compiled loss, with no env stepped.

        Its keys, shapes, dtypes and dims are those of ``next(iter(collector))`` (``compact_obs``,
        ``track_traj_ids``, ``track_policy_version``, ``split_trajs`` and ``postproc`` applied,
        private keys left out):
        built by the rollout storage that builds the real batches, the policy's outputs found by
        one call of the policy on zeros shaped as the envs' observations (the first call, if the
        collector has not called it yet).

        Returns:
            A TensorDict of zeros.

        Raises:
            NotImplementedError: the env has entries of no fixed shape (non-tensor entries, a
                ``-1`` dim: ``_envs.objects``), which have no zeros to lay out; the message says
                to zero a real batch instead.
        """
        if self._object_entries:
            raise NotImplementedError(
                "fake_tensordict(): the env has entries of no fixed shape (non-tensor entries, or a -1 dim), "
                "whose zeros have no shape to take; use a real batch's zeros instead: "
                "next(iter(collector)).zero_()."
            )
        if self._closed:
            raise self._closed_error()
        st, n, frames = self._scheduler.storage, self.num_envs, self._steps_per_batch
        runner = self._policy.runner
        keys = self._scheduler.lanes[0].keys
        if keys is None:  # (the policy not called yet: its outputs, from one call on zeros)
            zeros = {leaf.key: torch.from_numpy(np.zeros((n, *leaf.shape), leaf.dtype))
                     for leaf in self.group.obs_leaves}
            out = self._on_engine(lambda: runner(zeros, n))
            st.reserve(out)
            keys = tuple(out)
        tensors = self._on_engine(lambda: st.batch(0, 0, n, frames, np.full(n, frames), keys, None, False,
                                                   empty=host_empty))
        td = (self._tensordict(tensors, [n, frames]) if self._batched
              else self._tensordict({k: v[0] for k, v in tensors.items()}, [frames])).zero_()
        td = stack_agents(without_objects(td))  # (entries with no fixed shape have no zeros)
        if self._left_out:
            td = td.exclude(*self._left_out)
        if self.options.track_policy_version:
            with_torchrl_versions(td)
        if self.options.split_trajs:
            td = split_trajectories(td)
        if self.options.postproc is not None:
            td = self.options.postproc(td)
        return without_private_keys(td)

    # ------------------------------------------------------------------ control

    @property
    def env(self) -> Any:
        """The env this collector steps, as built from ``create_env_fn``: TorchRL's
        ``collector.env`` (a TorchRL env as the TorchRL env; a ``VectorEnv`` as it is; for a
        list of factories, the list of their envs). Read it, don't step or reset it: the
        collector owns its state between batches."""
        return envs_as_given(self.group, self._batched)

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed the envs: env ``i``'s next reset uses ``seed + i`` (``seed`` if ``static_seed``).

        Every env is reset with its seed before the next step (starting new trajectories;
        with ``step_ahead``, the steps taken ahead of the batches delivered are dropped, as
        ``reset`` drops them),
        and the random policy (``policy=None``, ``init_random_frames``) is reseeded with
        ``seed`` (until then its seed comes from torch's global generator, as TorchRL's
        ``action_spec.rand()`` does: ``torch.manual_seed`` repeats it). Called right after
        construction, it seeds the very first reset, so a deterministic policy reproduces a
        hand-written ``env.reset(seed=...)`` loop.

        Args:
            seed: the seed of env 0.
            static_seed: give every env ``seed`` itself.

        Returns:
            The seed to give the next collector or env, as TorchRL's ``set_seed``:
            ``seed + num_envs``, the first seed these envs did not take, so that
            ``seed = c1.set_seed(seed); c2.set_seed(seed)`` never seeds two envs alike;
            ``seed`` itself with ``static_seed``.

        Raises:
            TypeError: ``seed`` is not an integer (numpy integers are taken).
            ValueError: a seed gymnasium refuses (``< 0``) or too large (env seeds must stay
                below ``2**63``); nothing is queued then.
        """
        seeds = env_seeds(seed, self.num_envs, static_seed)
        seed = seeds[0]  # a Python int, numpy's converted

        def apply():
            self._drop_ahead()  # (``step_ahead``: no step taken before the seed is delivered after it)
            self._timelines.request_reset(seeds)
            self._policy.random.seed(seed)
            rounds = self._scheduler.rounds
            if isinstance(rounds, InlineRounds):  # (a batch cut midway: the rest of its actions the new seed's)
                rounds.redraw()

        self._on_engine(apply)
        return next_seed(seed, self.num_envs, static_seed)

    def reset(self) -> None:
        """Reset every env before the next step; ongoing trajectories end there.

        Trajectories cut this way are not counted as completed; the envs start new ones
        with new ids. TorchRL's ``reset_at_each_iter=True`` does this before every batch.
        With ``trajs_per_batch``, the trajectories not yet delivered are dropped,
        as TorchRL does. With ``step_ahead``, the steps taken ahead of the batches
        delivered are dropped too: the next batch starts from the reset.
        """
        def apply() -> None:  # on the engine's thread, where trajectories are assembled
            self._drop_ahead()
            self._assembler.clear(cut=self._timelines.request_reset())

        self._on_engine(apply)

    def _check_worker_ids(self, worker_ids: Any) -> None:
        if worker_ids not in (None, 0, [0], (0,)):
            raise ValueError(f"worker_ids={worker_ids!r}: a Collector has a single worker, 0.")

    def state_dict(self) -> OrderedDict:
        """The collector's state, with TorchRL's keys, for a checkpoint.

        Returns:
            An ``OrderedDict``: ``policy_state_dict`` (a copy of the policy's weights, any
            pending update applied first) and ``policy_version`` (their version, TorchRL's
            key), both only for a policy with weights, ``env_state_dict``
            (empty: gymnasium envs have no state to save), ``frames`` (frames delivered),
            ``iter`` (TorchRL's: the index of the last batch delivered, ``-1`` before the
            first), ``traj_pool`` (``next_traj_id``, the next trajectory id, and
            ``completed_trajectories``) and ``aiocollect_format`` (``2``: the meaning of
            ``iter``; checkpoints without it, from earlier versions, counted batches there).
            With ``trajs_per_batch``, ``trajectories`` holds the complete trajectories not
            delivered yet (plain tensors: ``torch.load(..., weights_only=True)`` reads them),
            which the collector restored from it delivers first, and ``frames`` counts them
            too; trajectories still under way are neither saved nor counted (the envs of a
            restored collector restart from a reset).
        """
        state: OrderedDict[str, Any] = OrderedDict()
        if self._policy.has_weights:
            state["policy_state_dict"] = self._policy.state_dict()
            state["policy_version"] = self._policy.latest  # (its weights' version: TorchRL's key)
        state["env_state_dict"] = OrderedDict()
        counters = self._counters_state()
        state["frames"] = counters["frames"]
        state["iter"] = counters["iter"]
        state["traj_pool"] = self._timelines.state_dict()
        state["aiocollect_format"] = counters["aiocollect_format"]
        if "trajectories" in counters:
            state["trajectories"] = counters["trajectories"]
        return state

    def load_state_dict(self, state_dict: dict, strict: bool = True) -> None:
        """Restore what [`state_dict`][aiocollect.Collector.state_dict] saved; the envs restart from a reset.

        With ``step_ahead``, the steps taken ahead of the batches delivered are dropped: the
        next batch starts from that reset.

        The policy weights are published as with
        [`update_policy_weights_`][aiocollect.DataCollectorBase.update_policy_weights_], and
        take up their saved ``policy_version`` again (as in TorchRL) where that is newer than
        this collector's versions so far (else the next one); the frame and batch counters
        are restored (so ``total_frames`` counts on from them), and trajectory ids go on after
        the saved counter, so none is ever reused.

        The whole state is checked first: on any error nothing is loaded (weights that do not
        fit the policy give an error of ``load_state_dict`` saying what does not fit). A checkpoint of
        an earlier aiocollect (``iter`` counting batches) loads with its meaning. A TorchRL
        collector's checkpoint is refused (its env and trajectory state are TorchRL's): load
        its weights alone with ``update_policy_weights_(state_dict["policy_state_dict"])``.

        Args:
            state_dict: what ``state_dict()`` returned, here or in a collector built the
                same way.
            strict: raise if ``policy_state_dict`` is missing while the policy has weights.

        Raises:
            KeyError: ``frames``, ``iter`` or ``traj_pool`` (with ``next_traj_id``) is
                missing (not an aiocollect checkpoint); ``strict`` and no
                ``policy_state_dict`` for a policy with weights; or weights that lack an
                entry of the policy's, or have one it does not.
            TypeError: an entry has the wrong type (``policy_state_dict`` included).
            ValueError: a negative counter, a checkpoint from a newer aiocollect, or
                weights of another shape than the policy's.
        """
        saved = self._checked_and_weights_loaded(state_dict, strict)

        def apply():
            self._drop_ahead()
            self._restore_counters(saved)
            self._timelines.load_state_dict({"next_traj_id": saved.next_traj_id,
                                        "completed_trajectories": saved.completed_trajectories})

        self._on_engine(apply)

    def __repr__(self) -> str:
        shape = f"[{self.num_envs}, {self._steps_per_batch}]" if self._batched else f"[{self._steps_per_batch}]"
        return (
            f"{type(self).__name__}(envs={self.num_envs}, batch={shape}, total_frames={self.total_frames}, "
            f"policy={type(self.policy).__name__})"
        )


SyncDataCollector = Collector


def _checked_step_ahead(step_ahead: Any, coroutine: bool, options: Any) -> bool:
    """The ``step_ahead`` keyword, checked: a bool, for coroutine envs, with neither an
    interruptor nor ``reset_at_each_iter`` (both act on every env at a batch's edge)."""
    if not isinstance(step_ahead, bool):
        raise TypeError(f"step_ahead must be True or False, got {step_ahead!r}")
    if not step_ahead:
        return False
    if not coroutine:
        raise ValueError("step_ahead=True: it applies to coroutine envs (aiocollect.AsyncEnv), each of which "
                         "steps at its own pace; these envs step together, so none waits for another at a "
                         "batch's end. Remove the argument.")
    for name, given in (("interruptor", options.interruptor is not None),
                        ("reset_at_each_iter", options.reset_at_each_iter)):
        if given:
            raise ValueError(f"step_ahead=True with {name}: {name} acts on every env at a batch's edge, "
                             "which an env that stepped on into the next batch has passed. Remove one of them.")
    return True


def _refuse_worker_arguments(sync: Any, start_timeout: Any) -> None:
    """``sync`` and ``start_timeout`` are for the worker collectors that ``num_collectors=N`` builds."""
    if sync is not None:
        raise ValueError("sync: it chooses between the worker collectors that num_collectors=N builds; "
                         "a Collector without num_collectors steps its envs in this process. Remove it.")
    if start_timeout is not None:
        raise ValueError(f"start_timeout={start_timeout!r}: it bounds the start of worker processes, and a "
                         "Collector without num_collectors starts no worker process (its envs step in this "
                         "process). Remove it, or pass num_collectors=N for N worker processes.")


_DISTRIBUTED = {"ray": ("aiocollect._distributed.ray_collector", "RayCollector"),
                "rpc": ("aiocollect._distributed.rpc_collector", "RPCCollector")}
"""Where ``Collector(backend="ray" | "rpc")``'s classes live. Looked up by name, on purpose:
the distributed collectors are built on these (``_distributed`` imports ``_collectors``), so an
import statement here would close a circle of layers; this is a plug-in lookup, as an entry
point would be, and costs nothing until that backend is asked for."""


def _distributed_collector(kind: str) -> type:
    import importlib

    module, name = _DISTRIBUTED[kind]
    return getattr(importlib.import_module(module), name)

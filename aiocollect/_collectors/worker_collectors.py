"""What the multi-process collectors share: workers, the scheduler, the engine thread.

A worker collector plans its workers (validation, pickling, spaces: all before any
process starts), chooses where the policy acts, and has the engine built
(``_collectors.assembly``, as a ``Collector`` does): it lays out the shared memory and
starts the workers on its **engine loop**
(a private uvloop thread that lives from construction to ``shutdown()``, because the
worker processes and their sockets belong to it), and keeps its policy here, in the main
process. Every step of every worker goes through that loop, whichever face the user
iterates with: ``for`` runs the collection on it directly, ``async for`` awaits it from the
caller's loop (so even a Jupyter or plain-asyncio caller gets uvloop's speed).

The variants only say when a batch is cut (``_collect_here``) and how many steps each env
takes per batch (``_steps_per_env``).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from tensordict import TensorDictBase
from tensordict.nn import InteractionType

from .._engine.scheduler import Scheduler
from .._envs.keyed import KeyedActions, batch_entries, observation_keys
from .._envs.objects import has_objects
from .._envs.policy_transforms import with_policy_transforms
from .._policies.actor import payload, shared_fields
from .._policies.probe import own_state_changes, probe, scratch_copy
from .._policies.random import RandomPolicy
from .._policies.setup import PolicySetup, runs_on_gpu
from .._policies.weights_board import board_fields
from .._workers.plan import WorkerPlan, plan_workers
from .._workers.protocol import env_flag
from .assembly import EnvShape, build_engine, lanes_in_workers, policy_setup
from .base import DataCollectorBase
from .checks import grouped_env_options
from .options import (
    START_TIMEOUT_S,
    CollectorOptions,
    WorkerOptions,
    env_seeds,
    next_seed,
    options_from,
    validate_batching,
    validate_timeout,
    worker_indices,
)
from .placement import cannot_act_in_workers, measure, placement
from .statistics import WorkerStatistics
from .torchrl_compat import (
    check_torchrl_keywords,
    per_worker_frames,
    policy_from,
    take_torchrl_keywords,
    worker_entries,
)

logger = logging.getLogger("aiocollect")


class _Choice(NamedTuple):
    """Where the policy may act, as planned before any process starts."""

    where: str
    """``placement``'s first answer (``"cannot"``: it acts here)."""
    why_here: str | None
    """Why it cannot act in the workers, where it cannot."""
    random_runs: bool
    """Random actions go in runs of steps (a random policy, ``reset_when_done``, no interruptor)."""


class WorkerCollectorBase(DataCollectorBase):
    """Base of the collectors whose envs live in worker processes; see the module docstring.

    Args:
        create_env_fn: one entry per worker: an env factory (a callable returning a
            gymnasium env, or a gymnasium ``VectorEnv``), an env id, or a list of those
            (several envs stepped one after the other in that worker). Entries travel to
            their worker with cloudpickle: lambdas and closures work, no
            ``if __name__ == "__main__"`` guard needed.
        policy: as for [`Collector`][aiocollect.Collector]; it runs here, batched over every
            ready worker's envs, or in each worker, a copy of it next to the envs: a torch
            module or a ``JaxPolicy`` on the CPU goes there when the workers leave the engine no core, or
            when its call there costs less than a round here (``policy_in_workers``,
            ``placement_costs``; ``AIOCOLLECT_POLICY_IN_WORKERS`` forces either).

    The other arguments are TorchRL's, see [`CollectorOptions`][aiocollect.CollectorOptions] and
    ``WorkerOptions`` (``max_policy_lag``:
    [`MultiAsyncCollector`][aiocollect.MultiAsyncCollector] only). Entries that build coroutine envs
    ([`AsyncEnv`][aiocollect.AsyncEnv]) run on the engine loop instead of in a process
    (``_workers.coroutine_worker``). ``step_timeout`` applies to every worker: a coroutine
    env's call that takes longer is cancelled, and a worker process whose step or reset
    takes longer is killed (``_workers.watchdog``); either way the collector raises a
    [`StepTimeoutError`][aiocollect.StepTimeoutError]. ``start_timeout`` (default 300 s;
    ``None``: no bound) bounds the start of the worker processes: the constructor waits until
    every worker has built its envs, and raises
    [`StartTimeoutError`][aiocollect.StartTimeoutError] past it. ``num_threads`` and
    ``num_sub_threads`` are accepted for compatibility: a worker that runs the policy runs
    torch on one thread.
    """

    _persistent_loop = True
    _scheduler: Scheduler
    """Its engine (``_engine.scheduler``), built by ``__init__``: a local collector always has one."""
    _policy: PolicySetup
    """Its policy, set up by ``__init__``."""
    _hook_after_postproc = False  # (TorchRL's workers call post_collect_hook with their own batches)

    def __init__(
        self,
        create_env_fn: Any = None,
        policy: Any = None,
        *,
        frames_per_batch: int | Sequence[int],
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
        cat_results: str | int | None = None,
        preemptive_threshold: float | None = None,
        update_at_each_batch: bool = False,
        num_threads: int | None = None,
        num_sub_threads: int = 1,
        max_policy_lag: int | None = None,
        policy_placement: str = "auto",
        spin: bool | None = None,
        pipeline: bool | None = None,
        step_timeout: float | None = None,
        start_timeout: float | None = START_TIMEOUT_S,
        max_batch_size: int | None = None,
        min_batch_size: int | None = None,
        batch_timeout: float | None = None,
        policy_factory: Any = None,
        compile_policy: Any = None,
        cudagraph_policy: Any = None,
        num_workers: int | None = None,
        **torchrl_options: Any,
    ):
        check_torchrl_keywords(type(self).__name__, torchrl_options)
        if num_workers is not None:  # TorchRL: that many workers of a single factory
            create_env_fn = worker_entries(create_env_fn, num_workers, "num_workers")
        frames_per_batch, worker_frames = per_worker_frames(frames_per_batch, create_env_fn)
        options = options_from(locals())
        worker_options = options_from(locals(), WorkerOptions)
        policy, cuda_graphs, source = policy_from(locals(), options.policy_device, source_allowed=True)
        if create_env_fn is None:
            raise TypeError("create_env_fn is required: a list with one env factory per worker.")
        compiled = cuda_graphs is not None or compile_policy not in (None, False)
        create_env_fn = with_policy_transforms(create_env_fn, policy, torchrl_options)
        plan, choice = self._plan_workers(create_env_fn, policy, options, worker_options, compiled)
        self._worker_frames = worker_frames
        """TorchRL's ``frames_per_batch`` list, one share per worker (``None``: an int was given)."""
        options = self._check_plan(plan, options, worker_options)
        validate_batching(max_batch_size=max_batch_size, min_batch_size=min_batch_size,
                          batch_timeout=batch_timeout, step_timeout=None,
                          coroutine=any(w.coroutine for w in plan.workers),
                          reset_when_done=options.reset_when_done, per_env=False)
        # step_timeout applies to process workers too, so it is checked on its own (as a
        # coroutine env's knob: a positive number of seconds, or None)
        step_timeout = validate_batching(max_batch_size=None, min_batch_size=None, batch_timeout=None,
                                         step_timeout=step_timeout, coroutine=True).step_timeout
        super().__init__(options)
        envs = EnvShape.of_plan(plan, options)
        with self._shut_down_on_error():
            grouped_env_options(plan.observation_space, options)
            take_torchrl_keywords(self, torchrl_options, options, policy,
                                  observation_keys(plan.observation_space, envs.obs_keys))
        self.worker_options = worker_options
        self._plan = plan
        self.num_workers = len(plan.workers)
        """How many workers: ``len(create_env_fn)``."""
        self.num_envs = plan.num_envs
        """How many envs, over all workers."""
        self.storing_device = options.storing_device
        self.policy_device = options.policy_device
        self.env_device = options.env_device or torch.device("cpu")
        with self._shut_down_on_error():
            self._build_engine(policy, cuda_graphs, envs, choice, step_timeout, source)

    def _build_engine(self, policy: Any, cuda_graphs: int | None, envs: EnvShape, choice: _Choice,
                      step_timeout: float | None, source: Any) -> None:
        """The engine (``_collectors.assembly``), with the policy here or a copy in each worker;
        ``source``: where ``update_policy_weights_()`` takes weights from, if not the policy."""
        plan, options, res = self._plan, self.options, self._resources
        self._policy = policy_setup(res, policy, envs, options, cuda_graphs, share=False, weights_from=source)
        outputs, sent, costs, why_here = self._place(choice.where, choice.why_here, plan, envs.obs_leaves, options,
                                                     envs.action)
        if self.worker_options.policy_placement == "workers" and outputs is None:
            raise ValueError(f"policy_placement='workers': the policy cannot act in the workers: {why_here}. "
                             "Use policy_placement='auto' (or 'central').")
        self.policy_in_workers = outputs is not None
        """Whether each worker acts with its own copy of the policy (``_policies.actor``
        says when, and ``AIOCOLLECT_POLICY_IN_WORKERS`` decides): ``False``, the policy runs
        here, batched over the workers."""
        self.placement_costs = costs
        """What the choice of where the policy runs measured (``_policies.costs.Costs``:
        ``print()`` it), or ``None`` where nothing was measured (the choice forced, no core left
        for the engine, or a policy the workers cannot run)."""
        self.policy = self._policy.policy
        """The policy the collector runs: its own copy of the one given if that has weights
        (on ``policy_device``), the given object otherwise, a
        [`RandomPolicy`][aiocollect.RandomPolicy] for ``policy=None``."""
        columns = max(self._steps_per_env(w.num_envs) for w in plan.workers)
        runs = choice.random_runs or outputs is not None
        if runs:  # (no policy call between steps: nothing for parts to overlap)
            plan = plan.without_parts()
        extra = () if outputs is None else shared_fields(outputs, 2, columns, plan.num_envs)
        kept = () if outputs is None else board_fields(self._policy.policy)
        layout = envs.layout(plan.num_envs, plan.num_lanes, columns=columns, extra=extra, kept=kept)
        lanes, self._pool = lanes_in_workers(res, plan, layout, options, step_timeout=step_timeout,
                                             start_timeout=self.worker_options.start_timeout, payload=sent,
                                             spin=self.worker_options.spin)
        self.spin = lanes.spin_s > 0
        """Whether the engine spins for the workers' replies (the ``spin`` keyword, or chosen)."""
        self.pipeline = any(w.parts for w in plan.workers)
        """Whether workers step their envs in two halves, in turn (the ``pipeline`` keyword, or chosen)."""
        engine = build_engine(res, self._policy, lanes, envs, options, runs=runs, outputs=outputs)
        self._scheduler, self._staging, self._pool_task = engine.scheduler, engine.staging, engine.task
        self._local_actor = engine.local_actor
        self._worker_lanes = [[lane for lane in self._scheduler.lanes if lane.index == w.index]
                              for w in plan.workers]
        """Each worker's lanes (the parts of its envs: ``_workers.plan``), by worker index."""

    # ------------------------------------------------------------------ planning hooks

    def _plan_workers(self, create_env_fn: Any, policy: Any, options: CollectorOptions,
                      worker_options: WorkerOptions, compiled: bool) -> tuple[WorkerPlan, _Choice]:
        """The workers' plan (validation, pickling, spaces: all before any process starts), and
        where the policy may act (``_Choice``)."""
        # random actions go in runs of steps (``_engine.scheduler``), with no policy call to
        # overlap; so do the steps of a policy that runs in the workers (``_policies.actor``)
        may_run = options.reset_when_done and options.interruptor is None
        entries = self._entries(create_env_fn)
        where = placement(policy, num_workers=len(entries), policy_device=options.policy_device, compiled=compiled,
                          runs=may_run, choice=worker_options.policy_placement) \
            if isinstance(entries, (list, tuple)) else "cannot"
        why_here = None if where != "cannot" else cannot_act_in_workers(
            policy, policy_device=options.policy_device, compiled=compiled, runs=may_run) \
            or "these workers' envs are not a list of entries the workers step"
        random_runs = may_run and (policy is None or isinstance(policy, RandomPolicy))
        # (parts, for a policy that may yet stay here; dropped below if it goes to the workers)
        plan = plan_workers(entries, options.create_env_kwargs, policy_between_steps=not random_runs,
                            gpu_policy=runs_on_gpu(policy, options.policy_device), single=self._one_entry,
                            parts=worker_options.pipeline)
        if isinstance(plan.action_space, KeyedActions):
            # several action keys (a TorchRL multi-agent env): the policy acts here, batched,
            # whose checks and packing are the engine's; random actions too
            where, random_runs = "cannot", False
            why_here = ("the env's actions are under keys of their own (a TorchRL multi-agent env, or "
                        "heterogeneous agents), checked and packed here")
        elif has_objects(plan.observation_space):  # (non-tensor entries, or of a dynamic shape)
            where = "cannot"
            why_here = "the env has entries of no fixed shape, put back into the policy's input here"
        elif batch_entries(plan.observation_space, options.truncates)[3]:  # (a TorchRL env of batch [5, 2])
            where = "cannot"
            why_here = "the env has several batch dims, and the policy is called with them, here"
        return plan, _Choice(where, why_here, random_runs)

    _one_entry = False
    """``create_env_fn`` is one worker's entry (``AsyncCollector``): errors name it as given."""

    @staticmethod
    def _entries(create_env_fn: Any) -> Any:
        return create_env_fn

    def _place(self, where: str, why_here: str | None, plan: WorkerPlan, obs_leaves: list, options,
               action: Any) -> tuple[Any, Any, Any, str | None]:
        """Whether the workers act with copies of the policy (``where``: ``placement``'s first
        answer): ``(outputs, payload, costs, why not)``, the probe's outputs and the payload
        the workers get when they do (``None`` when it acts here, and why, if it could not go)."""
        if where not in ("workers", "measure"):
            return None, None, None, why_here or (
                "policy_placement='central' (or AIOCOLLECT_POLICY_IN_WORKERS=0) keeps it here" if where == "central"
                else "these workers' envs are not a list of entries the workers step")
        if any(w.coroutine for w in plan.workers):
            return None, None, None, "some workers' envs are coroutines, stepped in this process"
        scratch = scratch_copy(self._policy.policy)  # (what the probe and the timing call)
        if scratch is None:
            return None, None, None, "it cannot be copied (deepcopy failed)"
        # (a policy that does not take the observations raises here: nothing started yet)
        outputs = probe(scratch, obs_leaves, options.exploration_type, action)
        if outputs is None:
            return None, None, None, ("its outputs cannot be laid out in shared memory (a recurrent state, a dtype "
                                      "numpy lacks, one call per env), or its call on zeros failed")
        # (after the probe: its call is the copy's first, as a worker's first call will be)
        stateful = own_state_changes(scratch, obs_leaves, options.exploration_type)
        if stateful is not None:  # (one policy, here: copies would each change their own state)
            if self.worker_options.policy_placement == "auto" and env_flag("AIOCOLLECT_POLICY_IN_WORKERS"):
                logger.warning("aiocollect: AIOCOLLECT_POLICY_IN_WORKERS=1, but the policy runs here, batched "
                               "over the workers: %s, and copies in the workers would each change their own",
                               stateful)
            return None, None, None, f"{stateful}, and copies in the workers would each change their own"
        costs = None
        if where == "measure":
            costs = measure(scratch, obs_leaves, options.exploration_type, [w.num_envs for w in plan.workers])
            logger.debug("%s", costs)
            if costs is None or not costs.in_workers:
                return None, None, costs, "it costs less here (placement_costs)"
        del scratch  # (a copy of the whole policy: not kept past the choice)
        try:
            sent = payload(self._policy.runner, tuple(k for k, _, _ in outputs), len(plan.workers))
        except Exception as exc:  # noqa: BLE001 - (a lock, an open file...): it runs here
            return None, None, costs, f"it cannot be sent to the workers ({type(exc).__name__}: {exc})"
        return outputs, sent, costs, None

    def _check_plan(self, plan: WorkerPlan, options, worker_options: WorkerOptions) -> CollectorOptions:
        """Raise before any process starts if the options do not fit the envs; returns them
        with ``frames_per_batch`` rounded up to fit (``fit_to_envs``)."""
        return options

    def _steps_per_env(self, num_envs: int) -> int:
        """Steps per env in a batch of a worker with ``num_envs`` envs."""
        raise NotImplementedError

    # ------------------------------------------------------------------ collection

    async def _collect(self) -> tuple[TensorDictBase, int]:
        loop = self._resources.loop
        if loop is None:
            self._check_usable()
        assert loop is not None  # (_check_usable raised: the loop goes with shutdown only)
        if loop.in_this_thread():
            return await self._collect_or_stop()
        # the async face, called from the user's loop: collect on the engine loop
        return await self._across(loop, self._collect_or_stop)

    async def _collect_or_stop(self) -> tuple[TensorDictBase, int]:
        sched = self._scheduler
        # the consumer waits for this batch, so the engine thread may spin for the
        # workers; not under start(), where the user trains meanwhile
        sched.spin = not self.is_running()
        try:
            return await self._collect_here()
        except Exception:
            # a worker failed (or the policy did): stop every worker now, not at shutdown()
            await self._pool.stop_and_wait()
            raise
        finally:
            sched.spin = False

    async def _collect_here(self) -> tuple[TensorDictBase, int]:
        raise NotImplementedError

    def _runner(self):
        opts = self.options
        if self._frames < opts.init_random_frames:
            return self._policy.random_runner
        return self._local_actor or self._policy.runner

    def _counters(self) -> tuple[int, int]:
        tl = self._scheduler.timelines
        return tl.env_steps, tl.completed_trajectories

    def _worker_statistics(self) -> tuple[WorkerStatistics, ...]:
        return tuple(
            WorkerStatistics(w.index, w.pid, w.num_envs, w.env_steps, w.alive) for w in self._pool.workers
        )

    # ------------------------------------------------------------------ control

    def _workers_of(self, worker_ids: Any) -> list[int]:
        return worker_indices(worker_ids, self.num_workers, "worker")

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed the envs: env ``k``, counted over all workers in order, uses ``seed + k``.

        Every env is reset with its seed before its next step (starting new trajectories),
        and the random policy (``policy=None``, ``init_random_frames``) is reseeded with
        ``seed`` (until then its seed comes from torch's global generator, as TorchRL's
        ``action_spec.rand()`` does: ``torch.manual_seed`` repeats it).

        Args:
            seed: the seed of env 0 of worker 0.
            static_seed: give every env ``seed`` itself.

        Returns:
            The seed to give the next collector or env, as TorchRL's ``set_seed``:
            ``seed + num_envs`` (all workers' envs), the first seed these envs did not
            take; ``seed`` itself with ``static_seed``.

        Raises:
            TypeError: ``seed`` is not an integer (numpy integers are taken).
            ValueError: a seed gymnasium refuses (``< 0``) or too large (env seeds must stay
                below ``2**63``); nothing is queued then.
        """
        seeds = env_seeds(seed, self.num_envs, static_seed)
        seed = seeds[0]  # a Python int, numpy's converted

        def apply():
            self._scheduler.timelines.request_reset(seeds)
            self._policy.random.seed(seed)

        self._on_engine(apply)
        return next_seed(seed, self.num_envs, static_seed)

    def reset(self) -> None:
        """Reset every env before its next step; ongoing trajectories end there.

        Trajectories cut this way are not counted as completed; the envs start new ones
        with new ids.
        With ``trajs_per_batch``, the trajectories not yet delivered are dropped,
        as TorchRL does.
        """
        self._check_usable()
        def apply() -> None:  # on the engine's thread, where trajectories are assembled
            self._assembler.clear(cut=self._scheduler.timelines.request_reset())

        self._on_engine(apply)

    def _check_worker_ids(self, worker_ids: Any) -> None:
        # one policy's weights serve every worker (here, or loaded by all the workers' copies at once)
        self._workers_of(worker_ids)

    def state_dict(self) -> OrderedDict:
        """The collector's state, with TorchRL's keys, for a checkpoint.

        Returns:
            An ``OrderedDict``: ``policy_state_dict`` (a copy of the policy's weights, any
            pending update applied first) and ``policy_version`` (their version), both only
            for a policy with weights, ``worker0``,
            ``worker1``... (each with ``policy_state_dict``, the same weights, and
            ``policy_version``, as TorchRL's, and an empty ``env_state_dict``, its completed
            trajectories and env steps), ``frames``
            (frames delivered), ``iter`` (TorchRL's: the index of the last batch delivered,
            ``-1`` before the first), ``traj_pool``
            (``next_traj_id``, the next trajectory id) and ``aiocollect_format``, and with
            ``trajs_per_batch`` ``trajectories`` (as for
            [`Collector.state_dict`][aiocollect.Collector.state_dict]).
        """
        state: OrderedDict = OrderedDict()
        if self._policy.has_weights:
            state["policy_state_dict"] = self._policy.state_dict()
            state["policy_version"] = self._policy.latest  # (its weights' version: TorchRL's key)
        for lanes in self._worker_lanes:
            worker = state[f"worker{lanes[0].index}"] = OrderedDict()
            if self._policy.has_weights:  # (every worker acts with the one policy: TorchRL's per-worker key,
                worker["policy_state_dict"] = state["policy_state_dict"]  # the same dict, saved once)
            worker["env_state_dict"] = OrderedDict()
            worker["completed_trajectories"] = sum(lane.completed_trajectories for lane in lanes)
            worker["env_steps"] = sum(lane.worker.env_steps for lane in lanes)
            if self._policy.has_weights:
                worker["policy_version"] = state["policy_version"]
        counters = self._counters_state()
        state["frames"] = counters["frames"]
        state["iter"] = counters["iter"]
        state["traj_pool"] = {"next_traj_id": self._scheduler.ids.next}
        state["aiocollect_format"] = counters["aiocollect_format"]
        if "trajectories" in counters:
            state["trajectories"] = counters["trajectories"]
        return state

    def load_state_dict(self, state_dict: dict, strict: bool = True) -> None:
        """Restore what ``state_dict()`` saved, as
        [`Collector.load_state_dict`][aiocollect.Collector.load_state_dict] does; each
        worker's count of completed trajectories is restored too (``0`` for a worker the
        checkpoint does not name). The whole state is checked first: on any error nothing
        is loaded.

        Args:
            state_dict: what ``state_dict()`` returned, here or in a collector built the
                same way.
            strict: raise if ``policy_state_dict`` is missing while the policy has weights.

        Raises:
            KeyError: as [`Collector.load_state_dict`][aiocollect.Collector.load_state_dict].
            TypeError: an entry has the wrong type.
            ValueError: a negative counter, or a checkpoint from a newer aiocollect.
        """
        saved = self._checked_and_weights_loaded(state_dict, strict)

        def apply():
            self._restore_counters(saved)
            completed = 0
            for lanes in self._worker_lanes:
                done = saved.workers.get(lanes[0].index, 0)
                for k, lane in enumerate(lanes):  # the worker's count goes to its first part
                    lane.completed_trajectories = done if k == 0 else 0
                completed += done
            self._scheduler.timelines.load_state_dict({"next_traj_id": saved.next_traj_id,
                                                      "completed_trajectories": completed})

        self._on_engine(apply)

    # ------------------------------------------------------------------ lifecycle

    def shutdown(self, timeout: float | None = None, close_env: bool = True) -> None:
        """Stop every worker and the engine thread. Idempotent, bounded, safe from any thread.

        Each worker is asked to close its envs and exit (``CLOSE``); one still running after
        the grace period gets ``SIGTERM``, then ``SIGKILL``. No process and no shared
        memory is left behind.

        Args:
            timeout: the workers' grace period in seconds (``None``: 5 s).
            close_env: ignored: worker envs are always closed (they live in the workers).

        Raises:
            TypeError: ``timeout`` is not a number; checked before anything is stored or
                stopped, so a refused call changes nothing and ``shutdown()`` still works.
            ValueError: ``timeout`` is negative, ``nan`` or infinite (likewise).
        """
        timeout = validate_timeout(timeout)
        pool = getattr(self, "_pool", None)
        if pool is not None:
            if timeout is not None:
                pool.stop_timeout = timeout
            # the loop thread ends once the workers are gone: coroutine envs closed, then
            # CLOSE, SIGTERM and SIGKILL for the processes (WorkerPool._stop_all), each bounded
            self._resources.join_timeout = 2 * pool.stop_timeout + 1.0 + 5.0 + 10.0
        super().shutdown(timeout, close_env=True)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(workers={self.num_workers}, envs={self.num_envs}, "
            f"frames_per_batch={self.frames_per_batch}, total_frames={self.total_frames}, "
            f"policy={type(self.policy).__name__})"
        )

"""The engine of a local collector, assembled in one place and in one order.

``Collector`` (envs in this process) and the worker collectors (envs in worker processes)
drive the same engine (``_engine.scheduler``), and both build it here. Each part is handed
its collaborators when it is built, so nothing is wired afterwards, and each part that holds
something is registered for release (``_collectors.resources``) as soon as it exists, so a
part that fails to build leaves nothing behind once the collector shuts down:

1. ``policy_setup``: the policy on its device, its runners and its weights channel
   (``_policies.setup``), checked against the envs' observations;
2. ``EnvShape.layout``: the memory of the rollout storage, ``[slots, columns, rows]`` per
   field (``_workers.shm``);
3. the lanes that step the envs (``Lanes``), over that memory: one ``InlineWorker`` or one
   lane per coroutine env over a private memory of one batch (``lanes_here``: a
   ``Collector``), or the parts of a ``WorkerPool``'s workers over shared memory two
   batches deep (``lanes_in_workers``);
4. ``build_engine``: the rollout storage over the lanes' memory (with the pinned staging of
   a GPU ``storing_device``, and the outputs that workers acting with copies of the policy
   write), the timelines of its rows (which keep the ids of trajectories a reset cuts when
   ``trajs_per_batch`` must drop them), the scheduler over lanes, storage and timelines, and
   the local actor whose weights the workers' copies load (``_policies.actor``); then the lanes start (the
   engine loop, and a pool's processes on it) and, while they start, the policy is prepared
   for every row count a round can have (compiled or captured).

What the variants bring is what the envs are (``EnvShape``, read from an env group or a
worker plan), the layout's sizes, and which lanes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .._engine.scheduler import Scheduler
from .._engine.staging import DeviceStaging
from .._engine.storage import RolloutStorage
from .._engine.timelines import Timelines
from .._envs.coroutine_group import CoroutineGroup
from .._envs.keyed import KeyedActionCheck, action_check, batch_entries
from .._envs.spaces import ActionCheck, Leaf, flatten_space
from .._policies.actor import LocalActor
from .._policies.setup import PolicySetup
from .._policies.weights_board import WeightsBoard
from .._workers.coroutine_lanes import CoroutineEnvs
from .._workers.inline_worker import InlineWorker
from .._workers.lane import LaneWorker
from .._workers.plan import WorkerPlan
from .._workers.pool import WorkerPool
from .._workers.shm import Layout, SharedArrays
from .loop_thread import LoopThread
from .options import CollectorOptions
from .resources import Resources


@dataclass(frozen=True)
class EnvShape:
    """What the engine is built for, known before any of its parts: the envs' observation
    leaves, their action space and the check of actions for it, and what their batches hold
    besides observations (``_envs.keyed.batch_entries``: the last, ``env_batch``, is the
    batch dims of an env with several)."""

    obs_leaves: list[Leaf]
    action_space: Any
    action: ActionCheck | KeyedActionCheck
    entries: tuple

    @classmethod
    def of_group(cls, group: Any, options: CollectorOptions) -> EnvShape:
        """The envs of an env group built here (``_envs.build.make_group``)."""
        return cls(group.obs_leaves, group.action_space, group.check_action,
                   batch_entries(group.observation_space, options.truncates))

    @classmethod
    def of_plan(cls, plan: WorkerPlan, options: CollectorOptions) -> EnvShape:
        """The envs of a worker plan, read from the spaces the plan learnt (``_workers.plan``)."""
        return cls(flatten_space(plan.observation_space, "observation", "observation_space"), plan.action_space,
                   action_check(plan.action_space), batch_entries(plan.observation_space, options.truncates))

    @property
    def obs_keys(self) -> list:
        return [leaf.key for leaf in self.obs_leaves]

    def layout(self, num_envs: int, num_lanes: int, *, columns: int, slots: int = 2, extra: Any = (),
               kept: Any = ()) -> Layout:
        """Step 2: the storage's memory for ``num_envs`` envs in ``num_lanes`` lanes, ``columns``
        steps per env and ``slots`` batches at once; ``extra``: more fields, ``kept``: more still,
        kept past shutdown (``Layout.plan``)."""
        return Layout.plan([(leaf.dtype, leaf.shape) for leaf in self.obs_leaves],
                           (self.action.dtype, self.action.shape), num_envs, num_lanes, columns=columns,
                           slots=slots, extra=list(extra), kept=list(kept))


def policy_setup(resources: Resources, policy: Any, envs: EnvShape, options: CollectorOptions,
                 cuda_graphs: int | None, *, share: bool, weights_from: Any = None) -> PolicySetup:
    """Step 1: the collector's side of ``policy`` (``share``: act with the user's module itself,
    as a ``Collector`` does; ``weights_from``: the module whose weights updates take by
    default, where that is not ``policy``; see ``_policies.setup``)."""
    setup = PolicySetup(policy, envs.action_space, envs.obs_keys, device=options.policy_device,
                        exploration_type=options.exploration_type, share=share, cuda_graphs=cuda_graphs,
                        weights_from=weights_from,
                        obs_leaves=envs.obs_leaves, env_batch=envs.entries[3],
                        random_frames=bool(options.init_random_frames))
    resources.closers.append(setup.close)
    return setup


@dataclass(frozen=True)
class Lanes:
    """Step 3: what steps the envs, writing into ``shared``: the ``workers`` the scheduler
    drives (``_workers.lane.LaneWorker``), how long it spins for a completion before it sleeps
    (``spin_s``: worker processes only), and whether they live on the engine loop for their
    whole life (``on_loop``: coroutine envs, worker pools), with what runs there meanwhile
    (``run``: a pool starting, watching and stopping its processes)."""

    shared: SharedArrays
    workers: Sequence[LaneWorker]
    spin_s: float = 0.0
    on_loop: bool = False
    run: Callable[..., Awaitable[None]] | None = None


def lanes_here(resources: Resources, group: Any, envs: EnvShape, options: CollectorOptions, *, columns: int,
               step_timeout: float | None, slots: int = 1) -> tuple[Lanes, CoroutineEnvs | None]:
    """A ``Collector``'s lanes, over a private memory of ``slots`` batches (anonymous: nobody
    else maps it): one ``InlineWorker`` stepping ``group`` here, or one lane per coroutine env
    (returned too: the collector cancels and closes them)."""
    shared = SharedArrays(envs.layout(group.num_envs, 1, columns=columns, slots=slots), -1)
    if not isinstance(group, CoroutineGroup):
        worker = InlineWorker(group, shared, max_frames_per_traj=options.max_frames_per_traj,
                              reset_when_done=options.reset_when_done)
        return Lanes(shared, [worker]), None
    coroutines = CoroutineEnvs(group, shared, max_frames_per_traj=options.max_frames_per_traj,
                               step_timeout=step_timeout)
    resources.aclosers.append(coroutines.aclose)
    return Lanes(shared, coroutines.lanes, on_loop=True), coroutines


def lanes_in_workers(resources: Resources, plan: WorkerPlan, layout: Layout, options: CollectorOptions, *,
                     step_timeout: float | None, start_timeout: float | None,
                     payload: dict | None, spin: bool | None = None) -> tuple[Lanes, WorkerPool]:
    """A worker collector's lanes: the parts of the workers of a ``WorkerPool`` (returned too),
    over the shared memory it lays out; ``payload``: what each worker needs to act with its
    own copy of the policy (``_policies.actor``), or ``None``; ``spin``: the ``spin``
    keyword (``None``: the pool chooses)."""
    pool = WorkerPool(plan, layout, reset_when_done=options.reset_when_done,
                      max_frames_per_traj=options.max_frames_per_traj, step_timeout=step_timeout,
                      start_timeout=start_timeout, policy=payload, spin=spin)
    resources.closers.append(pool.kill_leftovers)
    return Lanes(pool.shared, pool.lanes, spin_s=pool.spin_s, on_loop=True, run=pool.run), pool


@dataclass(frozen=True)
class Engine:
    """What ``build_engine`` built: the collector keeps each part (``_policy``, ``_scheduler``...)."""

    policy: PolicySetup
    scheduler: Scheduler
    staging: DeviceStaging | None
    """The pinned staging of a GPU ``storing_device`` (``_engine.staging``), or ``None``."""
    local_actor: LocalActor | None
    """The actor while the workers act with copies of the policy (``_policies.actor``), or ``None``."""
    task: Any
    """The lanes' ``run`` on the engine loop (a future), or ``None``."""


def build_engine(resources: Resources, policy: PolicySetup, lanes: Lanes, envs: EnvShape,
                 options: CollectorOptions, *, batching: Any = None, runs: bool = False,
                 outputs: list | None = None) -> Engine:
    """Step 4: storage, timelines and scheduler over ``lanes``, then the lanes started and the
    policy prepared. ``batching``: per-env rounds (coroutine envs, ``_engine.rounds``); ``runs``:
    random actions (or the workers' policy) go in runs of steps; ``outputs``: the policy's
    outputs, written by the workers that act with copies of it."""
    device = options.storing_device
    staging = DeviceStaging(device) if device is not None and device.type != "cpu" else None
    step_count = options.max_frames_per_traj is not None
    storage = RolloutStorage(lanes.shared, envs.obs_leaves, step_count=step_count, entries=envs.entries,
                             staging=staging, outputs=outputs)
    timelines = Timelines(storage.num_envs, reset_when_done=options.reset_when_done, count_steps=step_count,
                          keep_cut=options.trajs_per_batch is not None)
    # (ignore: scheduler.py types its lanes a list and its action check an ActionCheck; it
    # takes any sequence of lanes, and a KeyedActionCheck too)
    scheduler = Scheduler(storage, timelines, lanes.workers, envs.action,  # type: ignore[arg-type]
                          spin_s=lanes.spin_s, batching=batching, runs=runs)
    local_actor = None
    if outputs is not None:  # (published into the board, whose views the policy here acts with)
        channel = policy.publish_through(WeightsBoard(lanes.shared.arrays))
        local_actor = LocalActor(policy.runner, channel, tuple(key for key, _, _ in outputs))
    task = None
    if lanes.on_loop:  # (they belong to one loop for their whole life: the collector's own)
        resources.loop = LoopThread()
        if lanes.run is not None:
            task, _ = resources.loop.portal.start_task(lanes.run)
    # (while the workers start:) a JAX policy on a GPU compiles for each round's row count;
    # with cudagraph_policy, a torch policy is captured for each
    policy.prepare([lane.num_envs for lane in scheduler.lanes], envs.obs_leaves)
    return Engine(policy, scheduler, staging, local_actor, task)

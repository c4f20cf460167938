"""What ``statistics()`` returns: frozen snapshots of a collector's counters.

[`CollectorStatistics`][aiocollect.CollectorStatistics] is the whole collector's,
[`WorkerStatistics`][aiocollect.WorkerStatistics] one worker's (or one remote collector's).
A snapshot never changes once returned: ask again for new figures.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerStatistics:
    """One worker of a collector, as seen from the main process.

    An entry of [`CollectorStatistics.workers`][aiocollect.CollectorStatistics.workers]: one
    per entry of ``create_env_fn`` for the multi-process collectors
    ([`MultiSyncCollector`][aiocollect.MultiSyncCollector],
    [`MultiAsyncCollector`][aiocollect.MultiAsyncCollector],
    [`AsyncCollector`][aiocollect.AsyncCollector]), one per remote collector for
    [`RayCollector`][aiocollect.RayCollector] and [`RPCCollector`][aiocollect.RPCCollector].

    Examples:
        >>> dead = [w.index for w in collector.statistics().workers if not w.alive]
    """

    index: int
    """Its position in ``create_env_fn`` (the remote collector's index for the distributed collectors)."""
    pid: int | None
    """Its process id; ``None`` for an entry of coroutine envs, which runs on the engine loop
    in the main process instead of in a process of its own."""
    num_envs: int
    """How many envs it steps."""
    env_steps: int
    """Env steps it took (summed over its envs); for a remote collector of the distributed
    collectors, the valid frames of the batches it delivered."""
    alive: bool
    """Whether it still works: false once it failed or died, or the collector shut down."""


@dataclass(frozen=True)
class CollectorStatistics:
    """A frozen snapshot of a collector's counters.

    [`statistics()`][aiocollect.DataCollectorBase.statistics] returns a new one at each call;
    its fields never change afterwards. Frames are counted when a batch is delivered (by
    iteration or background collection); [`rollout()`][aiocollect.DataCollectorBase.rollout]
    adds to ``env_steps`` and ``collect_seconds`` only.

    Examples:
        >>> stats = collector.statistics()
        >>> print(f"{stats.frames} frames in {stats.batches} batches, {stats.frames_per_second:.0f} frames/s")
        >>> stats.latest_policy_version - stats.policy_version   # published, not in effect yet
    """

    frames: int
    """Frames delivered so far (masked-out frames not counted)."""
    batches: int
    """Batches delivered so far."""
    env_steps: int
    """Env steps taken, including those of batches cut short or cancelled (for the
    distributed collectors: the valid frames of the batches they delivered)."""
    completed_trajectories: int
    """Trajectories that ended (terminated, truncated or ``max_frames_per_traj``; for the
    distributed collectors: the ``("next", "done")`` flags of the delivered batches)."""
    collect_seconds: float
    """Time spent collecting (not waiting for the consumer)."""
    frames_per_second: float
    """``frames / collect_seconds``."""
    running_in_background: bool
    """Whether ``start()`` collection is going on."""
    workers: tuple[WorkerStatistics, ...] = ()
    """One [`WorkerStatistics`][aiocollect.WorkerStatistics] per worker (multi-process
    collectors) or remote collector (distributed collectors); empty for
    [`Collector`][aiocollect.Collector]."""
    policy_version: int = 0
    """The policy version in effect (0: the weights at construction; each update adds one).
    For the distributed collectors: the newest version that every remote collector has
    received (each puts it in effect before its next policy call)."""
    latest_policy_version: int = 0
    """The newest version published by ``update_policy_weights_`` (in effect from the next policy call)."""
    max_policy_lag: int = 0
    """The largest lag seen in a delivered batch: the newest version at delivery minus the
    version that produced the batch's oldest frame."""
    stale_frames_dropped: int = 0
    """Frames collected again because they broke ``max_policy_lag`` (MultiAsync)."""
    mean_episode_return: float | None = None
    """The mean return of the last 100 episodes that finished in delivered batches (``None``
    before the first). Rewards are summed per trajectory id, so an episode that spans
    batches, or workers, counts once and whole; one cut by ``max_frames_per_traj`` counts."""

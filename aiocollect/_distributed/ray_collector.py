"""``RayCollector``: aiocollect collectors on Ray actors, gathered into one iterator.

The transport half of a distributed collector (``_distributed.remote_collectors`` has the rest): each
remote collector is a Ray actor holding a ``RemoteCollector``, batches come back through
Ray's object store and weights go out with one ``ray.put`` per update. The class
docstring says what users see.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from tensordict.nn import InteractionType

from .._collectors.options import validate_start_timeout
from .._errors import CollectorError, StartTimeoutError, exception_text
from .remote import RemoteCollector, switches
from .remote_collectors import RemoteCollectorsBase, _per_collector, plan_remotes, remote_options


def _import_ray():
    try:
        import ray
    except ImportError as exc:
        raise ImportError(
            "RayCollector needs Ray, which is not installed: pip install 'aiocollect[ray]' (or pip install ray)."
        ) from exc
    return ray


@contextlib.contextmanager
def _loopback_node(enabled: bool) -> Iterator[None]:
    """Within the block, a Ray instance started here takes ``127.0.0.1`` as its node's address.

    Ray's processes (GCS, raylet, workers, agents) listen on the node's address, or on all
    interfaces, and ``ray.init`` replaces a loopback ``_node_ip_address`` by the machine's
    external address. The one loopback mode Ray has is its single-machine mode, on by
    default on macOS and Windows and chosen by ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``
    there: this turns it on for the ``ray.init`` call (the flag is read when Ray is
    imported, so it is set on Ray's constants module), and Ray's processes then listen on
    127.0.0.1 only."""
    constants: Any
    try:
        constants = importlib.import_module("ray._private.ray_constants")
    except ImportError:  # another Ray layout: its own defaults
        constants = None
    if not enabled or not hasattr(constants, "ENABLE_RAY_CLUSTER"):
        yield
        return
    saved = constants.ENABLE_RAY_CLUSTER
    constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        constants.ENABLE_RAY_CLUSTER = saved


def _resources(read: Callable[[], dict]) -> dict:
    """Ray's resources as ``read()`` gives them, without the per-node entries (``node:...``)."""
    try:
        return {k: v for k, v in read().items() if not k.startswith("node:")}
    except Exception:  # noqa: BLE001 - for a message only
        return {}


def _init_failed(ray: Any, config: dict, local: bool, elapsed: float, exc: BaseException) -> CollectorError:
    """The error for ``ray.init(**config)`` that raised ``exc`` (or exited) after ``elapsed`` s."""
    with contextlib.suppress(Exception):
        if ray.is_initialized():  # half started: leave nothing behind
            ray.shutdown()
    shown = ", ".join(f"{k}={v!r}" for k, v in config.items())
    if local:
        fix = ("Ray could not start a local instance here: Ray's log above (and /tmp/ray/session_latest/logs) "
               "says why; or give ray_init_config={'address': ...} to join a running cluster.")
    else:
        address = config.get("address") if config.get("address") not in (None, "auto") else \
            os.environ.get("RAY_ADDRESS", config.get("address"))
        fix = (f"Check that a Ray cluster runs at {address!r} and that this machine reaches it (`ray status "
               f"--address {address}` there), or leave the address out (and unset RAY_ADDRESS) to start a "
               "local instance.")
    what = f"exited (SystemExit {exc.code!r})" if isinstance(exc, SystemExit) else \
        f"raised {type(exc).__name__}: {exception_text(exc)}"
    return CollectorError(f"RayCollector: ray.init({shown}) {what} after {elapsed:.1f} s; no remote collector "
                          f"was started. {fix}")


class RayCollector(RemoteCollectorsBase):
    """Runs aiocollect collectors on Ray actors and offers them as one collector.

    TorchRL's ``distributed.RayCollector``, with its arguments. Each remote collector is a
    Ray actor holding an aiocollect collector (``collector_class``); batches travel
    through Ray's object store. Needs Ray: the ``ray`` extra (``pip install -e ".[ray]"`` in a
    checkout), or ``pip install ray``.

    **When to use it.** When the envs need more cores than one machine has, or you already
    run a Ray cluster. Each remote collector runs its own copy of the policy. On one
    machine, the multi-process collectors
    ([`MultiSyncCollector`][aiocollect.MultiSyncCollector],
    [`MultiAsyncCollector`][aiocollect.MultiAsyncCollector]) need no Ray and run one policy
    call per step for all their workers; for a torchrun or SLURM launch without Ray, use
    [`RPCCollector`][aiocollect.RPCCollector].

    **Batches.** ``sync=True`` asks every actor for ``frames_per_batch / num_collectors``
    frames, each collected entirely with the newest weights sent to it before it was asked
    for (on-policy), and stacks their batches: ``[num_collectors, ...]``, e.g. ``[4, 100]``
    for 4 single-env collectors and ``frames_per_batch=400``. ``sync=False`` (TorchRL's
    default) keeps a request in flight at every actor, yields each actor's
    ``frames_per_batch``-frame batch as soon as it is ready, and asks that actor for the
    next one at once.

    **The cluster.** With ``ray_init_config={"address": "ray://head-node:10001"}`` (or
    ``RAY_ADDRESS`` set) it joins that cluster; if Ray is already initialised in this
    process it uses that; otherwise it starts a new local Ray instance (with the other
    ``ray_init_config`` arguments), declaring at least as many logical CPUs as the actors
    ask for (so ``num_collectors=4`` with ``num_cpus=1`` each runs on a 2-core laptop), and
    stops it on ``shutdown()``. That instance listens on 127.0.0.1 only, serves no
    dashboard, and runs its workers (the remote collectors) at this process's priority, not at
    Ray's nice 15, where a learner busy in this process would starve them, unless
    ``ray_init_config`` says otherwise (``_node_ip_address``, ``include_dashboard``,
    ``_system_config={"worker_niceness": 15}``). (A cluster started elsewhere keeps its own:
    ``RAY_worker_niceness=0 ray start ...`` gives the same.) Env factories and policies
    travel with cloudpickle, and the driver's ``sys.path`` with them, so code from your own
    modules imports on the actors (on a multi-node cluster, the files must exist on every
    node, or ship them with Ray's ``runtime_env``). So do the driver's ``AIOCOLLECT_*``
    switches (``AIOCOLLECT_POLICY_IN_WORKERS``...): each remote collector is built with them
    set, as a collector built here would be.

    **Weights.** ``update_policy_weights_()`` puts one snapshot in the object store (a CPU
    state dict, or a JAX params pytree) and tells the chosen actors (``worker_ids``) to load
    it; it does not wait. The actors load it between two policy calls of their collector,
    while it collects. Every frame carries the driver's version in
    ``("collector", "policy_version")``. ``await update_policy_weights(...)`` returns once
    every chosen actor has it in effect.

    **Faults.** An actor that dies (or whose collector raises) fails the iterator with a
    [`RemoteCollectorError`][aiocollect.RemoteCollectorError] naming it, with the remote
    error as its ``__cause__``; ``shutdown()`` kills every actor, and the Ray instance if it
    started one.

    Args:
        create_env_fn: what each remote collector's ``collector_class`` takes as its
            ``create_env_fn`` (for a multi-process class, an env factory is repeated
            ``num_workers_per_collector`` times), or, with ``collector_class="single"``, a
            list of those, one per collector.
        policy: the policy each remote collector runs (its own copy); ``None`` for random
            actions.
        num_collectors: how many actors (default: the length of a ``create_env_fn`` list
            for ``collector_class="single"``, else 1).
        sync: stack one batch of every actor (``True``) or yield the first ready
            (``False``, TorchRL's default).
        collector_class: the remote collectors' class: [`Collector`][aiocollect.Collector],
            [`MultiSyncCollector`][aiocollect.MultiSyncCollector],
            [`MultiAsyncCollector`][aiocollect.MultiAsyncCollector], or ``"single"`` (the
            default), ``"sync"``, ``"async"``. TorchRL's classes are not accepted.
        collector_kwargs: extra arguments of the remote collectors: a dict, or a list of
            dicts, one per collector.
        num_workers_per_collector: for a multi-process ``collector_class``, how many
            workers each remote collector runs.
        remote_configs: ``ray.remote`` options of each actor (default ``{"num_cpus": 1}``),
            or a list of them, one per actor.
        ray_init_config: ``ray.init`` arguments, e.g. ``{"address": "ray://head:10001"}``
            to join a cluster; without an address, those of the local instance.
        update_after_each_batch: send the policy's weights to every actor (sync) or to the
            actor that delivered (async) after each batch.
        start_timeout: seconds the actors may take to be placed and to build their
            collectors (default 120; ``None``: no bound); past it, a
            [`StartTimeoutError`][aiocollect.StartTimeoutError] names the remote
            collectors that were up and those that were not, and says what
            ``remote_configs`` asks and what the cluster has. Every actor is killed.

    The other arguments are TorchRL's (see [`CollectorOptions`][aiocollect.CollectorOptions])
    and go to every remote collector (``max_frames_per_traj``, ``init_random_frames``,
    ``exploration_type``, ``reset_at_each_iter``, devices), except ``total_frames``,
    ``postproc``, ``split_trajs``, ``track_policy_version``, ``replay_buffer``, ``progress`` and
    ``trajs_per_batch`` (with ``traj_format``, ``trajs_per_write``: trajectories are assembled
    here, over every remote collector's batches), which apply here. The others
    (``reset_when_done``, ``create_env_kwargs``...) go in ``collector_kwargs``.
    ``policy_factory`` (a callable, or a list of them, one per remote collector) is called in
    each remote collector's process, as in TorchRL, so a policy that cannot be pickled still
    works; there is no policy here then, so weights go out with
    ``update_policy_weights_(weights)``. TorchRL's other keywords are taken as by the local
    collectors (see ``docs/migrating.md``).

    Raises:
        ImportError: Ray is not installed.
        ValueError: ``frames_per_batch`` does not split over ``num_collectors`` with
            ``sync=True``, or ``collector_kwargs`` repeats one of this collector's own
            arguments.
        StartTimeoutError: the actors could not start within ``start_timeout`` (a
            ``TimeoutError``).
        CollectorError: ``ray.init`` failed (a cluster that cannot be reached: Ray itself
            exits the process then, with ``SystemExit``, which becomes this error), naming
            the address, how long it tried and what to check.

    Examples:
        >>> from aiocollect import RayCollector, Collector, GymEnv
        >>> collector = RayCollector(create_env_fn=lambda: GymEnv("Pendulum-v1"), policy=policy,
        ...                          frames_per_batch=400, total_frames=40_000, num_collectors=4,
        ...                          sync=True, collector_class=Collector,
        ...                          collector_kwargs={"max_frames_per_traj": 50},
        ...                          remote_configs={"num_cpus": 1, "num_gpus": 0, "memory": 2 * 1024 ** 3},
        ...                          update_after_each_batch=True)
        >>> for data in collector:            # data.shape == (4, 100): one row per remote collector
        ...     train(data)
        >>> collector.shutdown()
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
        max_frames_per_traj: int | None = None,
        init_random_frames: int | None = None,
        reset_at_each_iter: bool = False,
        postproc: Any = None,
        split_trajs: bool | None = None,
        exploration_type: InteractionType | str = InteractionType.RANDOM,
        track_policy_version: bool = False,
        replay_buffer: Any = None,
        progress: bool = False,
        trajs_per_batch: int | None = None,
        traj_format: str | None = None,
        trajs_per_write: int | None = None,
        collector_class: Any = "single",
        collector_kwargs: dict | list[dict] | None = None,
        num_workers_per_collector: int = 1,
        sync: bool = False,
        ray_init_config: dict | None = None,
        remote_configs: dict | list[dict] | None = None,
        num_collectors: int | None = None,
        update_after_each_batch: bool = False,
        start_timeout: float | None = 120.0,
        policy_factory: Any = None,
        **torchrl_options: Any,
    ):
        options = remote_options(type(self).__name__, locals())
        start_timeout = validate_start_timeout(start_timeout)
        ray = _import_ray()
        num_collectors, payloads = plan_remotes(locals(), options)
        configs = _per_collector(remote_configs, num_collectors, "remote_configs", lambda: {"num_cpus": 1})
        if not all(isinstance(c, dict) for c in configs):
            raise TypeError("remote_configs must be a dict of ray.remote options (or a list of them).")
        super().__init__(options, policy, num_collectors, sync, update_after_each_batch)
        self._ray, self._started_ray = ray, False
        self._actors: list[Any] = []
        self._init_config, self._configs, self._start_timeout = ray_init_config, configs, start_timeout
        self._start(payloads)

    # ------------------------------------------------------------------ the transport

    def _launch(self, payloads: list[bytes]) -> list[tuple[int, int]]:
        ray, configs, timeout = self._ray, self._configs, self._start_timeout
        if not ray.is_initialized():
            config = dict(self._init_config or {})
            local = config.get("address") in (None, "local") and not os.environ.get("RAY_ADDRESS")
            if local:  # a new instance on this machine, not one found under /tmp/ray
                asked = sum(float(c.get("num_cpus", 1)) for c in configs)
                config.setdefault("num_cpus", max(os.cpu_count() or 1, int(-(-asked // 1))))
                config.setdefault("include_dashboard", False)
                # Ray starts its workers at nice 15; its actors here are the collectors' workers,
                # which a learner at nice 0 in this process would starve (8x fewer frames/s with
                # two busy processes on 2 cores): at this process's own priority, as a
                # MultiSyncCollector's workers run
                config["_system_config"] = {"worker_niceness": 0, **(config.get("_system_config") or {})}
                config["address"] = "local"
            on_loopback = local and "_node_ip_address" not in config
            start = time.monotonic()
            try:
                with warnings.catch_warnings(), _loopback_node(on_loopback):
                    # JAX's warning at fork: Ray forks and execs at once
                    warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
                    ray.init(**config)
            except (TypeError, ValueError):
                raise  # a bad ray_init_config: Ray's own message names the argument
            except (Exception, SystemExit) as exc:  # Ray exits (SystemExit) when it cannot reach a cluster
                raise _init_failed(ray, config, local, time.monotonic() - start, exc) from exc
            self._started_ray = True
        actor = ray.remote(RemoteCollector)
        self._actors = [
            actor.options(**{"max_concurrency": 2, **cfg}).remote(payload, list(sys.path), switches())
            for cfg, payload in zip(configs, payloads)
        ]
        refs = [a.info.remote() for a in self._actors]
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        info: list[Any] = [None] * len(refs)
        for i, ref in enumerate(refs):
            if ref not in ready:
                continue
            try:  # a remote collector that failed to build says why, whatever the others do
                info[i] = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - any remote failure becomes a RemoteCollectorError
                error = self._error(i, exc)
                raise error from error.__cause__
        if pending:
            assert timeout is not None  # (ray.wait without a timeout leaves none pending)
            late = [i for i, ref in enumerate(refs) if ref not in ready]
            raise StartTimeoutError.remote(
                timeout=timeout, started=[i for i in range(len(refs)) if i not in late], pending=late,
                asked=[configs[i] for i in late], available=_resources(ray.available_resources),
                total=_resources(ray.cluster_resources))
        return info

    def _submit(self, index: int, method: str, *args: Any) -> Any:
        return getattr(self._actors[index], method).remote(*args)

    def _on_done(self, handle: Any, callback: Callable[[BaseException | None], None]) -> None:
        handle.future().add_done_callback(
            lambda f: callback(None if not f.cancelled() and f.exception() is None else RuntimeError("failed")))

    async def _result(self, index: int, handle: Any) -> Any:
        return await handle

    def _share(self, weights: Any) -> Any:
        return self._ray.put(weights)  # one copy in the object store, for every actor

    def _where(self, index: int) -> str:
        actors = self._actors
        return f"Ray actor {actors[index]._actor_id.hex()[:12]}" if index < len(actors) else "Ray actor"

    def _stop(self) -> None:
        ray = self._ray
        if not ray.is_initialized():  # (ray.kill would start a new instance)
            self._actors = []
            return
        for actor in self._actors:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self._actors = []
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False

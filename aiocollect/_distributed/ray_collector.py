"""``RayCollector``: aiocollect collectors on Ray actors, gathered into one iterator.

>>> from aiocollect import RayCollector, Collector, GymEnv
>>> collector = RayCollector(create_env_fn=lambda: GymEnv("Pendulum-v1"), policy=policy,
...                          frames_per_batch=400, total_frames=40_000, num_collectors=4,
...                          sync=True, collector_class=Collector,
...                          collector_kwargs={"max_frames_per_traj": 50},
...                          remote_configs={"num_cpus": 1, "num_gpus": 0, "memory": 2 * 1024 ** 3},
...                          update_after_each_batch=True)
>>> for data in collector:            # data.shape == (4, 100): one row per remote collector
...     ...
>>> collector.shutdown()

Each remote collector is a Ray actor holding an aiocollect collector (``collector_class``:
``Collector``, ``MultiSyncCollector``, ``MultiAsyncCollector``, or "single" / "sync" /
"async"); batches travel through Ray's object store. ``sync=True`` asks every actor for
``frames_per_batch / num_collectors`` frames and stacks their batches, each collected
entirely with the newest weights sent before it was asked for; ``sync=False`` yields
each actor's ``frames_per_batch``-frame batch as soon as it is ready, and asks that actor
for the next one at once.

**The cluster.** With ``ray_init_config={"address": "ray://head-node:10001"}`` (or any
``ray.init`` arguments) it joins that cluster; if Ray is already initialised in this
process it uses that; otherwise it starts a local Ray instance, declaring at least as many
logical CPUs as the actors ask for (so ``num_collectors=4`` with ``num_cpus=1`` each runs on
a 2-core laptop), and stops it on ``shutdown()``. Actors that cannot be placed within
``start_timeout`` seconds (the cluster lacks what ``remote_configs`` asks) are an error
that says what was asked and what the cluster has.

**Weights.** ``update_policy_weights_()`` puts one snapshot in the object store (a CPU state
dict, or a JAX params pytree) and tells the chosen actors (``worker_ids``) to load it; it
does not wait. The actors load it between two policy calls of their collector, while it
collects. Every frame carries the driver's version in ``("collector", "policy_version")``.
``await update_policy_weights(...)`` returns once every chosen actor has it in effect.

**Faults.** An actor that dies (or whose collector raises) fails the iterator with a
:class:`RemoteCollectorError` naming it, with the remote traceback; ``shutdown()`` kills
every actor, and the Ray instance if it started one.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import cloudpickle
import torch
from tensordict import TensorDictBase
from tensordict.nn import InteractionType

from .._collectors.base import DataCollectorBase, WorkerStatistics
from .._collectors.options import options_from
from .remote import RemoteCollector, RemoteCollectorError, portable_weights, resolve_collector_class

_RESERVED = ("create_env_fn", "policy", "frames_per_batch", "total_frames", "replay_buffer")


def _import_ray():
    try:
        import ray
    except ImportError as exc:
        raise ImportError(
            "RayCollector needs Ray, which is not installed: pip install 'aiocollect[ray]' (or pip install ray)."
        ) from exc
    return ray


def _per_collector(value: Any, n: int, name: str, default: Any) -> list:
    if value is None:
        return [default() if callable(default) else default for _ in range(n)]
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{name}: a list of {len(value)} entries for {n} remote collectors; give one "
                             "per collector, or a single value for all.")
        return list(value)
    return [value] * n


class RayCollector(DataCollectorBase):
    """Aiocollect collectors on Ray actors; see the module docstring.

    Args:
        create_env_fn: what each remote collector's ``collector_class`` takes as its
            ``create_env_fn`` (for a multi-process class, an env factory is repeated
            ``num_workers_per_collector`` times), or a list of those, one per collector.
        policy: the policy each remote collector runs (its own copy); ``None`` for random actions.
        num_collectors: how many actors (default: the length of a ``create_env_fn`` list, or 1).
        sync: stack one batch of every actor (``True``) or yield the first ready (``False``, TorchRL's default).
        collector_class, collector_kwargs: the remote collectors' class and extra arguments
            (a dict, or a list of dicts, one per collector).
        remote_configs: ``ray.remote`` options of each actor (default ``{"num_cpus": 1}``).
        ray_init_config: ``ray.init`` arguments, e.g. ``{"address": "ray://head:10001"}``.
        update_after_each_batch: send the policy's weights to every actor (sync) or to the
            actor that delivered (async) after each batch.
        start_timeout: seconds the actors may take to be placed and to build their collectors.

    The other arguments are TorchRL's and go to every remote collector
    (``max_frames_per_traj``, ``init_random_frames``, ``exploration_type``, devices...), except
    ``postproc``, ``split_trajs`` and ``replay_buffer``, which apply here.
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
        replay_buffer: Any = None,
        collector_class: Any = "single",
        collector_kwargs: dict | list[dict] | None = None,
        num_workers_per_collector: int = 1,
        sync: bool = False,
        ray_init_config: dict | None = None,
        remote_configs: dict | list[dict] | None = None,
        num_collectors: int | None = None,
        update_after_each_batch: bool = False,
        start_timeout: float = 120.0,
    ):
        options = options_from(locals())
        ray = _import_ray()
        cls = resolve_collector_class(collector_class)
        if create_env_fn is None:
            raise TypeError("create_env_fn is required: an env factory (or a list, one per remote collector).")
        if num_collectors is None:
            num_collectors = len(create_env_fn) if isinstance(create_env_fn, list) and cls.__name__ == "Collector" \
                else 1
        if isinstance(num_collectors, bool) or not isinstance(num_collectors, int) or num_collectors < 1:
            raise ValueError(f"num_collectors={num_collectors!r}: give a number of remote collectors >= 1.")
        if not isinstance(sync, bool) or not isinstance(update_after_each_batch, bool):
            raise TypeError("sync and update_after_each_batch must be True or False.")
        fpb = options.frames_per_batch
        if sync and fpb % num_collectors:
            raise ValueError(
                f"frames_per_batch={fpb} does not split over {num_collectors} remote collectors (sync=True "
                f"asks each for an equal share); use a multiple of {num_collectors}."
            )
        envs = (create_env_fn if isinstance(create_env_fn, list) and cls.__name__ == "Collector"
                and len(create_env_fn) == num_collectors else [create_env_fn] * num_collectors)
        kwargs_list = _per_collector(collector_kwargs, num_collectors, "collector_kwargs", dict)
        configs = _per_collector(remote_configs, num_collectors, "remote_configs", lambda: {"num_cpus": 1})
        for i, (kw, cfg) in enumerate(zip(kwargs_list, configs)):
            if not isinstance(kw, dict) or not isinstance(cfg, dict):
                raise TypeError(f"collector_kwargs and remote_configs must be dicts (collector {i}).")
            clash = sorted(set(kw) & set(_RESERVED))
            if clash:
                raise ValueError(f"collector_kwargs: {clash} are RayCollector's own arguments; pass them to "
                                 "RayCollector itself.")
        forwarded = {
            "device": device, "storing_device": storing_device, "env_device": env_device,
            "policy_device": policy_device, "max_frames_per_traj": max_frames_per_traj,
            "init_random_frames": init_random_frames, "reset_at_each_iter": reset_at_each_iter,
            "exploration_type": exploration_type,
        }
        per_batch = fpb // num_collectors if sync else fpb
        payloads = []
        for i in range(num_collectors):
            env = envs[i]
            if cls.__name__ != "Collector" and not isinstance(env, list):
                env = [env] * num_workers_per_collector
            kwargs = {**forwarded, **kwargs_list[i], "frames_per_batch": per_batch, "total_frames": -1}
            try:
                payloads.append(cloudpickle.dumps((cls, (env, policy), kwargs, i)))
            except Exception as exc:
                raise TypeError(f"remote collector {i}: its env factory, policy or collector_kwargs cannot be "
                                f"pickled with cloudpickle: {type(exc).__name__}: {exc}") from exc
        super().__init__(options)
        self.num_collectors, self.sync = num_collectors, sync
        self.update_after_each_batch = update_after_each_batch
        self._user_policy = policy
        self._version = 0
        self._acked = [0] * num_collectors
        self._sent = [0] * num_collectors
        self._pending: dict[int, Any] = {}
        self._env_steps = 0
        self._completed = 0
        self._ray = ray
        self._actors: list[Any] = []
        self._started_ray = False
        self._resources.closers.append(self._stop_remote)
        try:
            self._start(ray, ray_init_config, configs, payloads, start_timeout)
        except BaseException:
            self.shutdown()
            raise

    # ------------------------------------------------------------------ the actors

    def _start(self, ray, init_config, configs, payloads, timeout) -> None:
        if not ray.is_initialized():
            config = dict(init_config or {})
            if config.get("address") is None:
                asked = sum(float(c.get("num_cpus", 1)) for c in configs)
                config.setdefault("num_cpus", max(os.cpu_count() or 1, int(-(-asked // 1))))
                config.setdefault("include_dashboard", False)
                config.setdefault("log_to_driver", True)
            ray.init(**config)
            self._started_ray = True
        actor = ray.remote(RemoteCollector)
        self._actors = [
            actor.options(**{"max_concurrency": 2, **cfg}).remote(payload, list(sys.path))
            for cfg, payload in zip(configs, payloads)
        ]
        refs = [a.info.remote() for a in self._actors]
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        if pending:
            raise TimeoutError(
                f"{len(pending)} of {len(refs)} remote collectors did not start within {timeout} s: the "
                f"cluster may lack what remote_configs asks ({configs[0]} each); it has "
                f"{ray.available_resources()} available."
            )
        self._info = []
        for i, ref in enumerate(refs):
            try:
                self._info.append(ray.get(ref))
            except Exception as exc:
                raise self._error(i, exc) from None

    def _error(self, index: int, exc: BaseException) -> RemoteCollectorError:
        actor = self._actors[index]
        pid = self._info[index][0] if getattr(self, "_info", None) and index < len(self._info) else None
        cause = getattr(exc, "cause", None)
        return RemoteCollectorError.wrap(index, f"Ray actor {actor._actor_id.hex()[:12]}", pid, cause or exc)

    def _stop_remote(self) -> None:
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
        if self._started_ray and ray.is_initialized():
            ray.shutdown()
            self._started_ray = False

    async def _fetch(self, index: int, ref: Any) -> Any:
        try:
            return await ref
        except Exception as exc:
            raise self._error(index, exc) from None

    # ------------------------------------------------------------------ collection

    async def _collect(self) -> tuple[TensorDictBase, int]:
        if not self._actors:
            self._check_usable()
        if self.sync:
            if self.update_after_each_batch and self._batches:
                self.update_policy_weights_()
            # each batch is collected with the newest weights sent to its actor (on-policy)
            batches = await asyncio.gather(
                *(self._fetch(i, a.next_batch.remote(self._sent[i])) for i, a in enumerate(self._actors)))
            batch = torch.stack(batches) if batches[0] is not None else None
        else:
            for i, a in enumerate(self._actors):
                if i not in self._pending:
                    self._pending[i] = asyncio.ensure_future(self._fetch(i, a.next_batch.remote()))
            by_future = {f: i for i, f in self._pending.items()}
            done, _ = await asyncio.wait(by_future, return_when=asyncio.FIRST_COMPLETED)
            future = next(iter(done))
            index = by_future[future]
            del self._pending[index]
            batch = future.result()
            if self.update_after_each_batch:
                self.update_policy_weights_(worker_ids=[index])
            actor = self._actors[index]
            self._pending[index] = asyncio.ensure_future(self._fetch(index, actor.next_batch.remote()))
        if batch is None:  # the remote collectors feed a replay buffer of their own
            return batch, self.frames_per_batch
        mask = batch.get(("collector", "mask"), None)
        frames = int(mask.sum()) if mask is not None else batch.numel()
        self._env_steps += frames
        self._completed += int(batch.get(("next", "done")).sum())
        return batch, frames

    def _counters(self) -> tuple[int, int]:
        return self._env_steps, self._completed

    def _worker_statistics(self) -> tuple[WorkerStatistics, ...]:
        return tuple(WorkerStatistics(i, pid, n, 0, bool(self._actors))
                     for i, (pid, n) in enumerate(getattr(self, "_info", [])))

    def _versions(self) -> tuple[int, int]:
        return min(self._acked), self._version

    # ------------------------------------------------------------------ weights

    def _workers_of(self, worker_ids: Any) -> list[int]:
        if worker_ids is None:
            return list(range(self.num_collectors))
        ids = [worker_ids] if isinstance(worker_ids, int) and not isinstance(worker_ids, bool) else list(worker_ids)
        bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.num_collectors]
        if bad:
            raise ValueError(f"worker_ids={worker_ids!r}: give remote collector indices in "
                             f"0..{self.num_collectors - 1}, or None for all.")
        return ids

    def _send(self, policy_or_weights: Any, worker_ids: Any, wait: bool) -> tuple[int, list]:
        ids = self._workers_of(worker_ids)
        self._check_usable()
        src = self._user_policy if policy_or_weights is None else policy_or_weights
        if src is None:
            return self._version, []
        ref = self._ray.put(portable_weights(src))  # one copy in the object store, for every actor
        self._version += 1
        version = self._version
        refs = []
        for i in ids:
            self._sent[i] = version
            done = self._actors[i].load_weights.remote(ref, version, wait)
            refs.append((i, done))
            done.future().add_done_callback(lambda f, i=i, v=version: self._ack(i, v, f))
        return version, refs

    def _ack(self, index: int, version: int, future: Any) -> None:
        if not future.cancelled() and future.exception() is None:
            self._acked[index] = max(self._acked[index], version)

    def update_policy_weights_(self, policy_or_weights: Any = None, *, worker_ids: Any = None) -> int:
        """Send new weights to the remote collectors (``worker_ids``: which; default all).

        One ``ray.put`` of a snapshot (a CPU state dict for torch weights), then a load
        request per actor; returns the new version without waiting. See the module docstring.
        """
        version, _ = self._send(policy_or_weights, worker_ids, wait=False)
        return version

    async def update_policy_weights(self, policy_or_weights: Any = None, *, worker_ids: Any = None) -> int:
        """``update_policy_weights_``, then wait until every chosen actor has them in effect."""
        version, refs = self._send(policy_or_weights, worker_ids, wait=True)
        await asyncio.gather(*(self._fetch(i, ref) for i, ref in refs))
        return version

    # ------------------------------------------------------------------ control

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed every remote collector's envs: env ``k``, counted over all collectors, uses ``seed + k``."""
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an integer, got {seed!r}")
        offset, refs = 0, []
        for actor, (_, n) in zip(self._actors, self._info):
            refs.append(actor.set_seed.remote(seed if static_seed else seed + offset, static_seed))
            offset += n
        self._ray.get(refs)
        return seed if static_seed else seed + offset - 1

    def __repr__(self) -> str:
        return (f"RayCollector(num_collectors={self.num_collectors}, sync={self.sync}, "
                f"frames_per_batch={self.frames_per_batch}, total_frames={self.total_frames})")

"""What the distributed collectors share; the transport (Ray, torch RPC) is a subclass's.

A distributed collector drives ``num_collectors`` ``RemoteCollector`` objects, each
an aiocollect collector in another process, and offers them as one collector:

* **sync** (``sync=True``): each remote collector is asked for ``frames_per_batch /
  num_collectors`` frames, collected entirely with the newest weights sent to it before
  the request (on-policy), and the batches are stacked ``[num_collectors, ...]``;
* **async** (``sync=False``): every remote collector always has a request in flight; the
  first batch to arrive is yielded (its own ``frames_per_batch`` frames) and that remote
  collector is asked for the next one at once;
* **weights**: one snapshot per update (a CPU state dict for torch weights), shared with
  the chosen remote collectors (``worker_ids``), loaded between two of their policy calls
  while they collect; frames carry the driver's version;
* **trajectories**: ids are made global here (``_global_ids``), and each batch comes with
  the ids its remote collector's resets cut since its last one, which ``trajs_per_batch``
  drops here (``_take_cut``), as a local collector does;
* **faults**: a remote collector that raises or dies fails the iterator with a
  [`RemoteCollectorError`][aiocollect.RemoteCollectorError] naming it.

A transport implements ``_launch`` (start the remote collectors, return their ``info()``),
``_submit`` (call a method without waiting, from any thread), ``_on_done``, ``_result``
(await a submitted call), ``_share`` (weights as the transport passes them) and ``_stop``.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import cloudpickle
import numpy as np
import torch
from tensordict import TensorDictBase

from .._collectors.base import DataCollectorBase
from .._collectors.checkpoint import read_checkpoint
from .._collectors.options import (
    FORWARD,
    CollectorOptions,
    env_seeds,
    next_seed,
    options_from,
    options_of,
    worker_indices,
)
from .._collectors.statistics import WorkerStatistics
from .._collectors.torchrl_compat import DISTRIBUTED_KEYWORDS, check_torchrl_keywords, weights_given
from .._errors import add_note
from .remote import RemoteCollectorError, RemoteFailure, portable_weights, resolve_collector_class

_RESERVED = ("create_env_fn", "policy", "policy_factory", "frames_per_batch", "total_frames", "replay_buffer")


def _per_collector(value: Any, n: int, name: str, default: Callable[[], Any]) -> list:
    if value is None:
        return [default() for _ in range(n)]
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{name}: a list of {len(value)} entries for {n} remote collectors; give one "
                             "per collector, or a single value for all.")
        return list(value)
    return [value] * n


FORWARDED = tuple(name for name, spec in options_of(CollectorOptions).items() if spec.distributed == FORWARD)
"""The distributed collectors' options that every remote collector receives, as given (the
``CollectorOptions`` fields declared ``FORWARD``); the others they take apply here."""


def remote_options(owner: str, arguments: dict[str, Any]) -> CollectorOptions:
    """A distributed collector's first checks, among its constructor's ``locals()``: TorchRL's
    keywords, ``policy_factory``, then the options, returned validated."""
    check_torchrl_keywords(owner, arguments["torchrl_options"], DISTRIBUTED_KEYWORDS)
    check_policy_factory(arguments["policy"], arguments["policy_factory"], arguments["update_after_each_batch"])
    return options_from(arguments, stacklevel=5)


def check_policy_factory(policy: Any, policy_factory: Any, update_after_each_batch: Any) -> None:
    """``policy_factory`` as the distributed collectors take it (TorchRL's): a callable, or a
    list of them (one per remote collector), each called in its remote collector's process,
    never here; so it is only checked here. There is then no policy in this process whose
    weights ``update_after_each_batch`` could send."""
    if policy_factory is None:
        return
    if policy is not None:
        raise ValueError("policy and policy_factory: give one of them, not both.")
    factories = policy_factory if isinstance(policy_factory, (list, tuple)) else [policy_factory]
    if not factories or not all(callable(f) for f in factories):
        raise TypeError(f"policy_factory must be a callable returning the policy (or a list of them, one per "
                        f"remote collector), got {policy_factory!r}")
    if update_after_each_batch is True:
        raise ValueError(
            "update_after_each_batch=True sends this process's policy weights, but with policy_factory each "
            "remote collector builds its own policy and there is none here: pass policy=... instead, or call "
            "update_policy_weights_(weights) yourself."
        )


def plan_remotes(arguments: dict[str, Any], options: CollectorOptions) -> tuple[int, list[bytes]]:
    """Validate the distributed arguments among a constructor's ``locals()``; returns
    ``num_collectors`` and each remote collector's cloudpickled ``(class, args, kwargs,
    index)``, its kwargs the ``FORWARDED`` options as given. Nothing starts here.

    ``policy_factory`` (checked by ``check_policy_factory``): each remote collector gets its
    own factory and calls it, as TorchRL's remote collectors do (so a policy that cannot be
    pickled can still be used)."""
    create_env_fn, policy, sync = arguments["create_env_fn"], arguments["policy"], arguments["sync"]
    num_collectors, num_workers_per_collector = arguments["num_collectors"], arguments["num_workers_per_collector"]
    forwarded = {name: arguments[name] for name in FORWARDED}
    cls = resolve_collector_class(arguments["collector_class"])
    single = cls.__name__ == "Collector"
    if create_env_fn is None:
        raise TypeError("create_env_fn is required: an env factory (or a list, one per remote collector).")
    if num_collectors is None:
        num_collectors = len(create_env_fn) if isinstance(create_env_fn, list) and single else 1
    if isinstance(num_collectors, bool) or not isinstance(num_collectors, int) or num_collectors < 1:
        raise ValueError(f"num_collectors={num_collectors!r}: give a number of remote collectors >= 1.")
    if not isinstance(sync, bool):
        raise TypeError(f"sync must be True or False, got {sync!r}")
    if isinstance(num_workers_per_collector, bool) or not isinstance(num_workers_per_collector, int) \
            or num_workers_per_collector < 1:
        raise ValueError(f"num_workers_per_collector={num_workers_per_collector!r}: give a number >= 1.")
    fpb = options.frames_per_batch
    if sync and fpb % num_collectors:
        raise ValueError(
            f"frames_per_batch={fpb} does not split over {num_collectors} remote collectors (sync=True "
            f"asks each for an equal share); use a multiple of {num_collectors}."
        )
    envs = (create_env_fn if isinstance(create_env_fn, list) and single and len(create_env_fn) == num_collectors
            else [create_env_fn] * num_collectors)
    kwargs_list = _per_collector(arguments["collector_kwargs"], num_collectors, "collector_kwargs", dict)
    factories = _per_collector(arguments["policy_factory"], num_collectors, "policy_factory", lambda: None)
    per_batch = fpb // num_collectors if sync else fpb
    payloads = []
    for i, (env, kw, factory) in enumerate(zip(envs, kwargs_list, factories)):
        if not isinstance(kw, dict):
            raise TypeError(f"collector_kwargs must be a dict (or a list of dicts); entry {i} is {type(kw).__name__}.")
        clash = sorted(set(kw) & set(_RESERVED))
        if clash:
            raise ValueError(f"collector_kwargs: {clash} are the distributed collector's own arguments; pass "
                             "them to it directly.")
        if not single and not isinstance(env, list):
            env = [env] * num_workers_per_collector
        kwargs = {**forwarded, **kw, "frames_per_batch": per_batch, "total_frames": -1}
        if factory is not None:
            kwargs["policy_factory"] = factory
        try:
            payloads.append(cloudpickle.dumps((cls, (env, policy), kwargs, i)))
        except Exception as exc:
            raise TypeError(f"remote collector {i}: its env factory, policy (or policy_factory) or collector_kwargs "
                            f"cannot be pickled with cloudpickle: {type(exc).__name__}: {exc}") from exc
    return num_collectors, payloads


class RemoteCollectorsBase(DataCollectorBase):
    """Remote collectors offered as one collector; see the module docstring."""

    def __init__(self, options: CollectorOptions, policy: Any, num_collectors: int, sync: bool,
                 update_after_each_batch: bool):
        if not isinstance(update_after_each_batch, bool):
            raise TypeError(f"update_after_each_batch must be True or False, got {update_after_each_batch!r}")
        super().__init__(options)
        self.num_collectors, self.sync = num_collectors, sync
        self.update_after_each_batch = update_after_each_batch
        self._user_policy = policy
        self._version = 0
        self._sent = [0] * num_collectors
        self._acked = [0] * num_collectors
        self._pending: dict[int, Any] = {}
        """async mode: the request in flight per remote collector (a transport handle, not
        an asyncio future: the next batch may be awaited from another event loop)."""
        self._env_steps = 0
        self._completed = 0
        self._remote_steps = [0] * self.num_collectors  # the valid frames each one delivered
        self._info: list[tuple[int, int]] = []
        self._cut: list[np.ndarray] = []
        """The (global) ids of trajectories the remote collectors' resets cut, not yet taken
        by ``_take_cut``."""
        self._resources.closers.append(self._stop)

    # ------------------------------------------------------------------ the transport

    def _launch(self, payloads: list[bytes]) -> list[tuple[int, int]]:
        raise NotImplementedError

    def _submit(self, index: int, method: str, *args: Any) -> Any:
        raise NotImplementedError

    def _on_done(self, handle: Any, callback: Callable[[BaseException | None], None]) -> None:
        raise NotImplementedError

    async def _result(self, index: int, handle: Any) -> Any:
        raise NotImplementedError

    def _share(self, weights: Any) -> Any:
        return weights

    def _where(self, index: int) -> str:
        raise NotImplementedError

    def _stop(self) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ shared

    def _start(self, payloads: list[bytes]) -> None:
        try:
            self._info = self._launch(payloads)
        except BaseException:
            self.shutdown()
            raise

    def _pid(self, index: int) -> int | None:
        return self._info[index][0] if index < len(self._info) else None

    def _error(self, index: int, exc: BaseException) -> RemoteCollectorError:
        pid = self._pid(index)
        cause = getattr(exc, "cause", None)  # Ray: the remote exception, its traceback left in exc's text
        if cause is not None and cause is not exc:
            add_note(cause, f"remote traceback:\n{exc}")
        return RemoteCollectorError.wrap(index, self._where(index), pid, cause or exc)

    async def _fetch(self, index: int, handle: Any) -> Any:
        try:
            batch = await self._result(index, handle)
        except Exception as exc:  # noqa: BLE001 - any remote failure becomes a RemoteCollectorError
            error = self._error(index, exc)
            raise error from error.__cause__  # the remote exception, with the remote traceback
        if isinstance(batch, RemoteFailure):
            error = RemoteCollectorError.wrap(index, self._where(index), self._pid(index), batch.exception())
            raise error from error.__cause__
        return batch

    def _ask(self, index: int) -> Any:
        return self._submit(index, "next_batch", self._sent[index] if self.sync else 0)

    async def _collect(self) -> tuple[TensorDictBase, int]:
        self._check_usable()
        if self.sync:
            if self.update_after_each_batch and self._batches:
                self.update_policy_weights_()
            arrived = await asyncio.gather(*(self._fetch(i, self._ask(i)) for i in range(self.num_collectors)))
            batches = [self._arrived(i, result) for i, result in enumerate(arrived)]
            batch: TensorDictBase | None = torch.stack(batches) if batches[0] is not None else None
            if batch is not None:
                for i, part in enumerate(batches):
                    self._remote_steps[i] += _valid_frames(part)
        else:
            for i in range(self.num_collectors):
                if i not in self._pending:
                    self._pending[i] = self._ask(i)
            by_future = {asyncio.ensure_future(self._fetch(i, h)): i for i, h in self._pending.items()}
            try:
                done, _ = await asyncio.wait(by_future, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for future in by_future:  # stop waiting on the others; their requests stay in flight
                    if not future.done():
                        future.cancel()
            future = next(iter(done))
            index = by_future[future]
            del self._pending[index]
            batch = self._arrived(index, future.result())
            if batch is not None:
                self._remote_steps[index] += _valid_frames(batch)
            if self.update_after_each_batch:
                self.update_policy_weights_(worker_ids=[index])
            self._pending[index] = self._ask(index)
        if batch is None:  # the remote collectors feed a replay buffer of their own
            return batch, self.frames_per_batch
        frames = _valid_frames(batch)
        self._env_steps += frames
        self._completed += int(batch.get(("next", "done")).sum())
        return batch, frames

    def _arrived(self, index: int, result: tuple[Any, np.ndarray]) -> Any:
        """Remote collector ``index``'s ``next_batch`` result: its batch, trajectory ids made
        global, and its cut ids, kept (global too) for ``_take_cut``."""
        batch, cut = result
        if len(cut):
            self._cut.append(_global_ids(np.asarray(cut, dtype=np.int64), index, self.num_collectors))
        ids = batch.get(("collector", "traj_ids"), None) if isinstance(batch, TensorDictBase) else None
        if ids is not None and self.num_collectors > 1:
            batch.set(("collector", "traj_ids"), _global_ids(ids, index, self.num_collectors))
        return batch

    def _take_cut(self) -> Any:
        cut, self._cut = self._cut, []
        return np.concatenate(cut) if cut else ()

    def _counters(self) -> tuple[int, int]:
        return self._env_steps, self._completed

    def _worker_statistics(self) -> tuple[WorkerStatistics, ...]:
        alive = not self._closed and self._failed is None
        return tuple(WorkerStatistics(i, pid, n, steps, alive)
                     for i, ((pid, n), steps) in enumerate(zip(self._info, self._remote_steps)))

    def _versions(self) -> tuple[int, int]:
        return min(self._acked), self._version

    # ------------------------------------------------------------------ weights

    def _workers_of(self, worker_ids: Any) -> list[int]:
        return worker_indices(worker_ids, self.num_collectors, "remote collector")

    def _send(self, policy_or_weights: Any, worker_ids: Any, wait: bool) -> tuple[int, list]:
        ids = self._workers_of(worker_ids)
        self._check_usable()
        src = self._user_policy if policy_or_weights is None else policy_or_weights
        if src is None:
            return self._version, []
        shared = self._share(portable_weights(src))
        self._version += 1
        version = self._version
        handles = []
        for i in ids:
            self._sent[i] = version
            handle = self._submit(i, "load_weights", shared, version, wait)
            self._on_done(handle, partial(self._ack, i, version))
            handles.append((i, handle))
        return version, handles

    def _ack(self, index: int, version: int, exc: BaseException | None) -> None:
        if exc is None:
            self._acked[index] = max(self._acked[index], version)

    def update_policy_weights_(self, policy_or_weights: Any = None, *, worker_ids: Any = None, weights: Any = None,
                               policy: Any = None, model_id: str | None = None,
                               weights_dict: dict | None = None) -> int:
        """Send new weights to the remote collectors; returns without waiting for any of them.

        One snapshot (a CPU state dict for torch weights, a JAX params pytree as it is),
        then a load request per chosen remote collector, which loads it between two policy
        calls of its collector while it collects. Every frame's
        ``("collector", "policy_version")`` is this driver's version, whichever remote
        collectors each update went to.

        Args:
            policy_or_weights: a module, a TensorDict of parameters, a state dict, a JAX
                params pytree, or ``None``: the weights of the policy object given at
                construction (nothing is sent if that was ``None``).
            worker_ids: the remote collectors to update: an int, a list of ints, or
                ``None`` for all.
            weights: TorchRL's keyword spelling of ``policy_or_weights`` (weights).
            policy: TorchRL's keyword spelling of ``policy_or_weights`` (a module).
            model_id: the model to update: only ``"policy"`` (a collector has one model).
            weights_dict: TorchRL's ``{"policy": weights}`` spelling.

        Returns:
            The new policy version (the current one if nothing was sent).

        Raises:
            ValueError: ``worker_ids`` names no remote collector.
        """
        given = weights_given(policy_or_weights, weights, policy, model_id, weights_dict)
        version, _ = self._send(given, worker_ids, wait=False)
        return version

    async def update_policy_weights(self, policy_or_weights: Any = None, *, worker_ids: Any = None, weights: Any = None,
                                    policy: Any = None, model_id: str | None = None,
                                    weights_dict: dict | None = None) -> int:
        """Send new weights, then wait until every chosen remote collector has them in effect.

        Args:
            policy_or_weights: as for ``update_policy_weights_``.
            worker_ids: as for ``update_policy_weights_``.
            weights: as for ``update_policy_weights_``.
            policy: as for ``update_policy_weights_``.
            model_id: as for ``update_policy_weights_``.
            weights_dict: as for ``update_policy_weights_``.

        Returns:
            The new policy version.

        Raises:
            RemoteCollectorError: a remote collector failed to load them.
        """
        given = weights_given(policy_or_weights, weights, policy, model_id, weights_dict)
        version, handles = self._send(given, worker_ids, wait=True)
        await asyncio.gather(*(self._fetch(i, h) for i, h in handles))
        return version

    # ------------------------------------------------------------------ control

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed the remote collectors' envs: env ``k``, counted over all of them, uses ``seed + k``.

        Waits until every remote collector has taken its seeds; each resets its envs with
        them before its next step.

        Args:
            seed: the seed of env 0 of remote collector 0.
            static_seed: give every env ``seed`` itself.

        Returns:
            The seed to give the next collector or env, as TorchRL's ``set_seed``:
            ``seed + num_envs`` (all remote collectors' envs), the first seed these envs
            did not take; ``seed`` itself with ``static_seed``.

        Raises:
            TypeError: ``seed`` is not an int.
        """
        num_envs = sum(n for _, n in self._info)
        seeds = env_seeds(seed, num_envs, static_seed)
        self._check_usable()
        offset, calls = 0, []
        for i, (_, n) in enumerate(self._info):  # each remote collector seeds its envs from its first one's
            calls.append((i, self._submit(i, "set_seed", seeds[offset], static_seed)))
            offset += n

        async def wait_all():
            await asyncio.gather(*(self._fetch(i, h) for i, h in calls))

        self._run_sync("set_seed()", wait_all)
        return next_seed(seed, num_envs, static_seed)

    def state_dict(self) -> list[OrderedDict]:
        """The remote collectors' states, as TorchRL's ``RayCollector.state_dict``.

        Returns:
            A list: each remote collector's ``state_dict()``, in order (the keys of
            [`Collector.state_dict`][aiocollect.Collector.state_dict] or a worker
            collector's). As in TorchRL, this driver's own counters are not in it: after
            ``load_state_dict``, ``total_frames`` counts from this driver's construction.
        """
        self._check_usable()
        calls = [(i, self._submit(i, "state_dict")) for i in range(self.num_collectors)]

        async def gather():
            return await asyncio.gather(*(self._fetch(i, h) for i, h in calls))

        return list(self._run_sync("state_dict()", gather))

    def load_state_dict(self, state_dict: Any, strict: bool = False) -> None:
        """Load ``state_dict()``'s list back, one state per remote collector, as TorchRL's
        ``RayCollector.load_state_dict``; returns once every remote collector has it.

        Every state is checked here first, so a bad one loads nothing anywhere. Policy
        weights in them become a new policy version of this driver, as with
        ``update_policy_weights_``; trajectory ids go on after the saved counters.

        Args:
            state_dict: the list ``state_dict()`` returned (one state per remote
                collector), or one state for all of them.
            strict: each remote collector raises if its state has no ``policy_state_dict``
                while its policy has weights (TorchRL's remote collectors load with
                ``strict=False``, the default).

        Raises:
            ValueError: a list whose length is not ``num_collectors``.
            KeyError: a state lacks an entry (TypeError, ValueError: a bad entry), as
                [`Collector.load_state_dict`][aiocollect.Collector.load_state_dict] says.
            RemoteCollectorError: a remote collector failed to load its state.
        """
        states = [state_dict] if isinstance(state_dict, Mapping) else list(state_dict)
        if len(states) == 1:
            states *= self.num_collectors
        if len(states) != self.num_collectors:
            raise ValueError(f"load_state_dict: {len(states)} states for {self.num_collectors} remote collectors; "
                             "give the list state_dict() returned, or one state for all.")
        for i, state in enumerate(states):
            read_checkpoint(state, f"{type(self).__name__} (remote collector {i})")
        self._check_usable()
        with_weights = any("policy_state_dict" in state for state in states)
        if with_weights:
            self._version += 1
        version = self._version
        calls = []
        for i, state in enumerate(states):
            state = dict(state)
            if "policy_state_dict" in state:
                state["policy_state_dict"] = portable_weights(state["policy_state_dict"])  # (on CPU)
            handle = self._submit(i, "load_state_dict", state, version, strict)
            if "policy_state_dict" in state:
                self._on_done(handle, partial(self._ack, i, version))
            calls.append((i, handle))

        async def wait_all():
            await asyncio.gather(*(self._fetch(i, h) for i, h in calls))

        self._run_sync("load_state_dict()", wait_all)
        for i, state in enumerate(states):  # sync mode: their next batches wait for these weights
            if "policy_state_dict" in state:
                self._sent[i] = max(self._sent[i], version)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(num_collectors={self.num_collectors}, sync={self.sync}, "
                f"frames_per_batch={self.frames_per_batch}, total_frames={self.total_frames})")


def _valid_frames(batch: TensorDictBase) -> int:
    """The frames of a remote batch that were collected (not masked out)."""
    mask = batch.get(("collector", "mask"), None)
    return int(mask.sum()) if mask is not None else batch.numel()


def _global_ids(ids: Any, index: int, count: int) -> Any:
    """Remote collector ``index`` of ``count`` numbers its trajectories from 0, as every one
    does: id ``k`` becomes ``k * count + index``, so no two remote collectors share an id and
    each one's ids still grow. -1 (masked-out frames) stays -1. ``ids``: a tensor or an array."""
    return (torch if isinstance(ids, torch.Tensor) else np).where(ids >= 0, ids * count + index, ids)

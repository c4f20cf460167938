"""Planning workers before any process starts: validation, pickling, spaces.

``plan_workers(create_env_fn, ...)`` checks everything that can be checked in this
process, so that bad input fails with a clear error *before* a worker is spawned:

* ``create_env_fn`` must be a non-empty list of worker entries; an entry is an env
  factory (one env, a gymnasium ``VectorEnv``, or a TorchRL env, batched or not, which the
  worker then builds and steps: ``_envs.torchrl_env``), an env id, or a list of those
  (several envs stepped one after the other in the worker);
* every entry must survive ``cloudpickle`` (that is how it reaches its worker; lambdas,
  closures and classes defined in ``__main__`` or a notebook cell all do);
* every entry's envs must have the same spaces. To learn them, each distinct entry is
  built once here and closed again (the same entry repeated is built once).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from typing import Any

import cloudpickle
import gymnasium as gym
from gymnasium.vector import VectorEnv

from .._envs.build import check_not_torchrl, is_torchrl_env, make_group
from .._envs.coroutine_group import CoroutineGroup
from .._envs.group import InProcessGroup
from .protocol import env_flag, usable_cores


@dataclass(frozen=True)
class WorkerSpec:
    """One worker, as planned: what it builds and which shared-memory rows it owns."""

    index: int
    entry: bytes
    """The cloudpickled entry of ``create_env_fn``."""
    num_envs: int
    batched: bool
    """Whether its batches have an env dim (a list of factories or a ``VectorEnv``)."""
    lo: int
    hi: int
    coroutine: bool = False
    """Its envs are coroutine envs: they run on the engine loop, not in a process."""
    parts: tuple[tuple[int, int], ...] = ()
    """Its rows split into *parts* that step in turn, each with its own control line, so the
    policy runs for one part while the worker steps the other (``_workers.protocol``);
    ``()``: one part, ``lo:hi``."""
    kwargs: dict = field(default_factory=dict)
    """The keywords its entry is called with (``create_env_kwargs``, or its own dict of them)."""

    @property
    def lanes(self) -> tuple[tuple[int, int], ...]:
        """The row ranges the scheduler drives as lanes: the parts, or the whole worker."""
        return self.parts or ((self.lo, self.hi),)


@dataclass(frozen=True)
class WorkerPlan:
    workers: tuple[WorkerSpec, ...]
    observation_space: gym.Space
    action_space: gym.Space

    @property
    def num_envs(self) -> int:
        return self.workers[-1].hi

    @property
    def num_lanes(self) -> int:
        return sum(len(w.lanes) for w in self.workers)

    def without_parts(self) -> WorkerPlan:
        """The same plan with every worker in one part (no policy call between its steps)."""
        return replace(self, workers=tuple(replace(w, parts=()) for w in self.workers))


def _kind(item: Any) -> str:
    return f"{type(item).__module__}.{type(item).__qualname__}"


def _where(i: int, single: bool) -> str:
    """How errors name worker entry ``i``: ``create_env_fn[i]``, or ``create_env_fn`` itself
    for a collector of one worker whose argument is that worker's entry (``AsyncCollector``)."""
    return "create_env_fn" if single else f"create_env_fn[{i}]"


class EnvCopy:
    """A TorchRL env instance given as a worker's entry, as TorchRL's multi-process collectors
    take it: each worker steps a copy of it (TorchRL pickles it to its worker process too),
    never the instance itself, which stays the caller's. A factory of copies: each call
    unpickles a fresh one (the spaces' probe here, then the worker's own)."""

    def __init__(self, env: Any, where: str):
        self.where = where
        try:
            self.blob = cloudpickle.dumps(env)
        except Exception as exc:
            raise TypeError(
                f"{where} is a TorchRL env instance ({_kind(env)}) that cannot be pickled ({type(exc).__name__}: "
                f"{exc}); each worker steps a copy of it. Pass a factory instead, e.g. `lambda: GymEnv(...)`."
            ) from exc
        self.__qualname__ = f"copy of {_kind(env)}"

    def __call__(self, **kwargs: Any) -> Any:
        if kwargs:
            raise ValueError(f"create_env_kwargs: given with an env instance ({self.where}); the instance is "
                             "built already: pass a factory that takes the keywords instead.")
        return cloudpickle.loads(self.blob)


def _copies_of_instances(create_env_fn: list, single: bool) -> list:
    """``create_env_fn`` with each TorchRL env instance in it replaced by an ``EnvCopy``."""
    return [EnvCopy(entry, _where(i, single)) if is_torchrl_env(entry) else entry
            for i, entry in enumerate(create_env_fn)]


def _check_entry(where: str, entry: Any) -> None:
    check_not_torchrl(entry, where)
    if isinstance(entry, (gym.Env, VectorEnv)) or is_torchrl_env(entry):
        raise TypeError(
            f"{where} is an env instance ({_kind(entry)}); a worker builds its own envs: pass a "
            "factory instead, e.g. `lambda: gym.make(...)` or `lambda: GymEnv(...)` for a TorchRL "
            "env, or the env id string."
        )
    if isinstance(entry, (list, tuple)):
        if not entry:
            raise ValueError(f"{where} is an empty list; give each worker at least one env factory.")
        for j, item in enumerate(entry):
            check_not_torchrl(item, f"{where}[{j}]")
            if isinstance(item, (gym.Env, VectorEnv)) or is_torchrl_env(item) \
                    or not (callable(item) or isinstance(item, str)):
                raise TypeError(
                    f"{where}[{j}]: expected an env factory or an env id, got {_kind(item)}."
                )
        return
    if not (callable(entry) or isinstance(entry, str)):
        raise TypeError(
            f"{where}: expected an env factory (a callable returning a gymnasium env or VectorEnv), "
            f"an env id, or a list of those; got {_kind(entry)}."
        )


def _pickle(where: str, entry: Any) -> bytes:
    try:
        return cloudpickle.dumps(entry)
    except Exception as exc:
        if isinstance(entry, (list, tuple)):  # name the factory of the list that fails
            for j, item in enumerate(entry):
                _pickle(f"{where}[{j}]", item)
        name = getattr(entry, "__qualname__", None) or _kind(entry)
        raise TypeError(
            f"{where} ({name}) cannot be pickled with cloudpickle, which is how env "
            f"factories reach their worker process: {type(exc).__name__}: {exc}. Make the "
            "factory build everything it needs inside itself (no open files, locks, sockets or "
            "live envs captured from the enclosing scope)."
        ) from exc


def _close_probe(where: str, entry: Any, group: Any) -> None:
    """Close the envs built to read the entry ``where``'s spaces, every one of them (coroutine
    envs too, on a loop of their own). An env whose ``close()`` raises still runs in its
    worker (which reports such errors at shutdown): warn, naming the factory and each env
    that failed, instead of failing the constructor."""
    try:
        if isinstance(group, CoroutineGroup):
            group.close_unstarted()
        else:
            group.close()
    except Exception as exc:  # noqa: BLE001 - see above
        from .._errors import exception_text

        name = getattr(entry, "__qualname__", None) or _kind(entry)
        warnings.warn(
            f"{where} ({name}): closing the envs built in this process to read its "
            f"spaces: {exception_text(exc)}",
            RuntimeWarning, stacklevel=4,
        )


def plan_workers(create_env_fn: Any, create_env_kwargs: dict | list[dict] | None, *,
                 policy_between_steps: bool = True, gpu_policy: bool = False, single: bool = False,
                 parts: bool | None = None) -> WorkerPlan:
    """Validate ``create_env_fn`` and lay the workers out; see the module docstring.

    ``create_env_kwargs``: the keywords of every entry, or a list with each worker's own (as
    in TorchRL's multi-process collectors).

    ``single``: ``create_env_fn`` is ``[the user's argument]``, one worker's entry
    (``AsyncCollector``'s), so errors name it ``create_env_fn`` and its factories
    ``create_env_fn[j]``, as the user wrote them.

    ``policy_between_steps``: the policy runs between steps (``False`` for random actions,
    which workers take in runs of steps: then no worker is split in parts, as no policy
    call is there to overlap). ``gpu_policy``: it runs on a GPU (see ``pipeline``).
    ``parts``: the collectors' ``pipeline`` keyword (``None``: ``pipeline`` chooses).
    """
    if isinstance(create_env_fn, (str, gym.Env, VectorEnv)) or not isinstance(create_env_fn, (list, tuple)):
        raise TypeError(
            "create_env_fn: a multi-process collector takes a list with one entry per worker, "
            f"e.g. `[make_env] * 4`; got {_kind(create_env_fn)}."
        )
    if not create_env_fn:
        raise ValueError("create_env_fn: the list of workers is empty; give at least one env factory.")
    create_env_fn = _copies_of_instances(list(create_env_fn), single)
    for i, entry in enumerate(create_env_fn):
        _check_entry(_where(i, single), entry)
    pickled = [_pickle(_where(i, single), entry) for i, entry in enumerate(create_env_fn)]
    kwargs = _worker_kwargs(create_env_kwargs, len(create_env_fn), single)

    probed: dict[tuple[int, int], tuple[gym.Space, gym.Space, int, bool, bool, bool]] = {}
    specs, first, lo = [], None, 0
    separable: list[bool] = []  # envs this worker steps one by one: it may step them in parts
    for i, entry in enumerate(create_env_fn):
        key = (id(entry), id(kwargs[i]))
        if key not in probed:
            group, batched = make_group(list(entry) if isinstance(entry, tuple) else entry, kwargs[i],
                                        _where(i, single))
            try:
                probed[key] = (group.observation_space, group.action_space, group.num_envs, batched,
                               isinstance(group, CoroutineGroup), isinstance(group, InProcessGroup))
            finally:
                _close_probe(_where(i, single), entry, group)
        obs_space, action_space, n, batched, coroutine, separable_here = probed[key]
        if first is None:
            first = (obs_space, action_space)
        elif (obs_space, action_space) != first:
            raise ValueError(
                f"create_env_fn[{i}] builds envs with spaces {obs_space} / {action_space}, but "
                f"create_env_fn[0] has {first[0]} / {first[1]}; all workers of a collector must "
                "share their observation and action spaces."
            )
        specs.append(WorkerSpec(i, pickled[i], n, batched, lo, lo + n, coroutine, kwargs=kwargs[i]))
        separable.append(separable_here)
        lo += n
    if policy_between_steps and pipeline(sum(not w.coroutine for w in specs), gpu_policy, forced=parts):
        asked = parts if parts is not None else env_flag("AIOCOLLECT_PIPELINE")
        least = 1 if asked else MIN_PART  # (asked for: any worker of 2 envs or more is split)
        specs = [replace(w, parts=_halves(w.lo, w.num_envs, least)) if ok else w for w, ok in zip(specs, separable)]
    assert first is not None  # (create_env_fn is not empty)
    return WorkerPlan(tuple(specs), first[0], first[1])


def _worker_kwargs(create_env_kwargs: dict | list[dict] | None, workers: int, single: bool) -> list[dict]:
    """Each worker's keywords: one dict for all (the same object), or the list's own."""
    if not isinstance(create_env_kwargs, list):
        shared = dict(create_env_kwargs or {})
        return [shared] * workers
    if len(create_env_kwargs) != workers:
        what = "create_env_fn (one worker)" if single else f"create_env_fn's {workers} workers"
        raise ValueError(f"create_env_kwargs: a list of {len(create_env_kwargs)} dicts for {what}; give one dict "
                         "per worker, in the order of create_env_fn, or one dict for all of them.")
    return [dict(kw) for kw in create_env_kwargs]


MIN_PART = 4
"""Fewest envs in a part: smaller parts make more policy calls than the overlap saves."""


def _halves(lo: int, n: int, least: int = MIN_PART) -> tuple[tuple[int, int], ...]:
    if n < 2 * least:
        return ()
    mid = lo + (n + 1) // 2
    return ((lo, mid), (mid, lo + n))


def pipeline(processes: int, gpu_policy: bool = False, cores: int | None = None, forced: bool | None = None) -> bool:
    """Whether process workers step their envs in two parts, in turn (see ``WorkerSpec.parts``;
    a worker needs ``2 * MIN_PART`` envs or more to be split).

    The policy call for one part then overlaps the other part's steps, at the price of
    twice the policy calls. By default, only when the engine has cores to spare
    (``cores``: this process's usable cores):

    * a policy on the CPU computes on the engine's core, and twice the calls cost it twice
      the CPU: parts when ``2 * processes <= cores``. On 2 cores, 1 worker x 16 CartPole
      envs collects 13-16% faster in parts, while 2 workers x 16 (the engine taking its
      core from the workers) collect up to 27% slower (``docs/changelog.md``, 2026-11-23);
    * a policy on a GPU costs the engine little CPU but a wait for the GPU at every call,
      which parts hide: parts when the engine has a core of its own, ``processes + 1 <=
      cores``. On the 2-core VM, 1 worker x 8 pixel envs (1.6 ms a step) with a policy
      whose call waits 0.5 ms collects at 0.87 of the envs' limit in parts, 0.58-0.61 without.

    ``forced`` (the collectors' ``pipeline`` keyword), else ``AIOCOLLECT_PIPELINE=0``/``1``,
    forces it off/on (on: for any worker with at least 2 envs).
    """
    if forced is None:
        forced = env_flag("AIOCOLLECT_PIPELINE")
    if forced is not None:
        return forced
    cores = usable_cores() if cores is None else cores
    return (processes + 1 if gpu_policy else 2 * processes) <= cores


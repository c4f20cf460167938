"""TorchRL 0.14's collector keywords, taken so that a TorchRL program runs with only its import changed.

Every keyword of TorchRL's collectors is accepted by the collector of the same name, in one
of three ways:

* **implemented**: ``policy_factory`` (the policy is ``policy_factory()``), ``compile_policy``
  (``torch.compile`` of the policy's network: ``True`` or a dict of ``torch.compile``
  arguments), ``cudagraph_policy`` (the policy's calls on a CUDA device captured in CUDA
  graphs, ``_policies.graphs``; the distributed collectors take it in ``collector_kwargs``),
  ``num_collectors`` with ``sync`` (``Collector(..., num_collectors=N)``, TorchRL
  0.14's entry point, builds a ``MultiSyncCollector`` when ``sync=True`` and a
  ``MultiAsyncCollector`` otherwise, over ``N`` copies of the env factory), ``num_workers``
  (the worker collectors: ``N`` copies of a single factory), and ``trajs_per_batch``,
  ``traj_format``, ``trajs_per_write``, which are collector options (``CollectorOptions``);
* **already what aiocollect does**, so accepted at the values that mean it, e.g.
  ``extend_buffer=True`` (the replay buffer is extended once per batch), ``no_cuda_sync`` (there
  is no explicit CUDA synchronisation to skip). ``track_policy_version`` is a collector option
  (every frame carries ``("collector", "policy_version")`` anyway; ``True`` also adds TorchRL's
  own keys for it, ``"policy_version"`` and ``("next", "policy_version")``);
* **implemented in round 2** (issue 51): ``pre_collect_hook``/``post_collect_hook``
  (``TorchRLAccessors``' attributes say when and where they run), ``Collector``'s ``backend``
  and ``backend_options`` (``collector_backend``), ``compact_obs``, ``extend_buffer=False``
  (``Delivery._add_steps``), ``worker_idx`` (stored), TorchRL's in-process weight updaters,
  ``auto_register_policy_transforms=True`` (the transforms appended where each TorchRL env
  is built: ``_envs.policy_transforms``);
* **not supported**: accepted only at the value that turns them off (``init_fn=None``,
  ``collector_class=None``...); any other value is a ``ValueError`` that says what to do
  instead. TorchRL's weight-sync schemes (``weight_sync_schemes``) are taken: they carry
  weights to policies in other processes, and here ``update_policy_weights_()`` is that
  carrier (to the policy in this process, and to the workers' copies where they have one).
  With them, ``policy`` and ``policy_factory`` together are TorchRL's pattern for a policy
  that cannot be pickled, which the worker collectors take as TorchRL's do (``policy_from``).

A keyword TorchRL does not have is the usual ``TypeError``, with the nearest valid name.

Its collectors' methods besides iteration (``policy_version``, ``getattr_policy``, ``env``,
``n_env``...) live here too, in ``TorchRLAccessors``, each answered the way aiocollect's
design allows; the TorchRL methods that have nothing to do here (``init_updater``) or cannot
work (``register_scheme_receiver`` with a scheme) say so.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .._engine.profile import Profile, ProfileReport
from .._envs.agents import has_agents
from .._envs.objects import OBJECTS
from .._errors import CollectorError
from .._policies.random import SpecRandomPolicy
from .._policies.setup import check_policy, cuda_graphs_for
from .options import CollectorOptions, as_int, options_of
from .parts import CollectorParts


@dataclass(frozen=True)
class _Keyword:
    accepted: tuple
    """The values taken; a callable among them is a test of the value (TorchRL's weight-sync schemes)."""
    meaning: str
    """What aiocollect does about it, or what to do instead (the error's second half)."""


def _torchrl_schemes(value: Any) -> bool:
    """A TorchRL ``WeightSyncScheme`` (or a subclass of one), or a dict of them for the policy
    (``{}`` or ``{"policy": scheme}``: this collector has no other model to carry weights to)."""
    if isinstance(value, dict):
        if set(value) - {"policy"}:
            return False
        values = list(value.values())
    else:
        values = [value]
    return all(any(c.__module__.startswith("torchrl.weight_update") for c in type(v).__mro__) for v in values)


def _hook(value: Any) -> bool:
    return callable(value)


def _int_index(value: Any) -> bool:
    return as_int(value) is not None and value >= 0


def _torchrl_local_updater(value: Any) -> bool:
    """One of TorchRL's own in-process weight updaters (``VanillaWeightUpdater``,
    ``MultiProcessedWeightUpdater``), or its class: they send the weights of the policy to
    the collector's policy, which is what ``update_policy_weights_()`` does here."""
    cls = value if isinstance(value, type) else type(value)
    return cls.__module__.startswith("torchrl.collectors") and cls.__name__ in (
        "VanillaWeightUpdater", "MultiProcessedWeightUpdater")


_KEYWORDS: dict[str, _Keyword] = {
    "extend_buffer": _Keyword((True, False), ""),  # False: the replay buffer gets each step (``add``)
    "track_traj_ids": _Keyword((True, False), ""),  # False: no ("collector", "traj_ids") in the batches
    "no_cuda_sync": _Keyword((None, True, False), ""),  # aiocollect makes no explicit CUDA synchronisation call
    "use_buffers": _Keyword((None, True, False), ""),  # batches always go through preallocated storage
    "trust_policy": _Keyword((None, True, False), ""),  # a policy's outputs are checked on its first calls
    "compact_obs": _Keyword((True, False), ""),  # True: ("next", obs) left out of the batches
    # (True is checked against the policy: see ``policy_transforms_needed``)
    "auto_register_policy_transforms": _Keyword((None, True, False), ""),
    # (Collector and the worker collectors take it; the distributed ones pass it on)
    "cudagraph_policy": _Keyword((None, False), "the policies run in the remote collectors: pass it to them, "
                                                "collector_kwargs={'cudagraph_policy': True}"),
    # TorchRL's schemes carry weights to policies in other processes; here update_policy_weights_() (or,
    # for Collector, the shared module) is that carrier, to the policy here and the workers' copies
    "weight_sync_schemes": _Keyword((None, _torchrl_schemes), "give a TorchRL weight-sync scheme for the "
                                                              "policy (it is taken: weights reach the policy "
                                                              "in this process through update_policy_weights_()), "
                                                              "or None; no other model takes weights here"),
    "weight_recv_schemes": _Keyword((None, _torchrl_schemes), "give TorchRL weight-sync schemes, or None"),
    "weight_updater": _Keyword((None, _torchrl_local_updater),
                               "weights reach the policy through update_policy_weights_(), which does what "
                               "TorchRL's own VanillaWeightUpdater and MultiProcessedWeightUpdater do (they are "
                               "taken); an updater of your own pushes weights to TorchRL's workers or inference "
                               "servers, which aiocollect does not have: call update_policy_weights_(weights), "
                               "or use RayCollector or RPCCollector for remote collectors"),
    "backend_options": _Keyword((None,), "it is Collector's keyword (Collector(..., backend=..., "
                                         "backend_options={...})); remove it"),
    "pre_collect_hook": _Keyword((None, _hook), "give a callable taking no argument, called before each batch "
                                                "is collected, or None"),
    "post_collect_hook": _Keyword((None, _hook), "give a callable taking the collected batch, or None"),
    "worker_idx": _Keyword((None, _int_index), "give the index of this collector among yours (an int >= 0), "
                                               "or None; it is stored as collector.worker_idx"),
    "init_fn": _Keyword((None,), "workers run no user code but the env factory; put setup in the factory"),
    "collector_class": _Keyword((None,), "aiocollect's workers step envs only (the policy runs in this "
                                         "process); remove it, or use RayCollector(collector_class=...)"),
    "backend": _Keyword((None,), "it is Collector's keyword: Collector(..., backend=...) picks the collector "
                                 "class (MultiSyncCollector or MultiAsyncCollector for 'process'); remove it"),
}

_NOT_REMOTE: dict[str, _Keyword] = {
    "pre_collect_hook": _Keyword((None,), "the remote collectors run their own collection; wrap the "
                                          "iteration instead"),
    "post_collect_hook": _Keyword((None,), "the remote collectors run their own collection; use postproc= "
                                           "for batches"),
    "weight_updater": _Keyword((None,), "weights reach the remote collectors through update_policy_weights_(); "
                                        "remove it"),
    "worker_idx": _Keyword((None,), "it is set by TorchRL's own multi-process collectors; remove it"),
    "compact_obs": _Keyword((False,), "pass it to the remote collectors: collector_kwargs={'compact_obs': True}"),
    "track_traj_ids": _Keyword((True,), "pass it to the remote collectors: "
                                        "collector_kwargs={'track_traj_ids': False}"),
    "extend_buffer": _Keyword((True,), "the replay buffer is extended once per batch; remove it"),
    "auto_register_policy_transforms": _Keyword((None, False), "give the env its InitTracker and "
                                                               "TensorDictPrimer yourself"),
}
"""What the distributed collectors take of the keywords the local ones implement."""


DISTRIBUTED_KEYWORDS: dict[str, _Keyword] = {
    **_NOT_REMOTE,
    "max_weight_update_interval": _Keyword((-1,), "remote collectors take new weights when you call "
                                                  "update_policy_weights_() (or with update_after_each_batch=True); "
                                                  "remove it"),
    "use_env_creator": _Keyword((True, False), ""),  # env factories travel with cloudpickle either way
    "slurm_kwargs": _Keyword((None,), "RPCCollector starts its workers on this machine, or joins an RPC world "
                                      "you started (worker_names=[...]); SLURM submission is not supported"),
    "launcher": _Keyword(("mp",), "RPCCollector starts its workers as local processes (TorchRL's 'mp'); to use "
                                  "other machines, start the RPC world yourself and pass worker_names=[...]"),
    "backend": _Keyword((None, "gloo"), "RPCCollector's transport is TensorPipe, with Gloo; remove it"),
    "visible_devices": _Keyword((None,), "set CUDA_VISIBLE_DEVICES for the workers yourself"),
    "tensorpipe_options": _Keyword((None,), "RPCCollector sets TensorPipe's options itself (see rpc_timeout)"),
}
"""The keywords of TorchRL's ``RayCollector`` and ``RPCCollector`` on top of the others."""


def check_torchrl_keywords(owner: str, given: dict[str, Any], extra: dict[str, _Keyword] | None = None) -> None:
    """Raise for a keyword TorchRL's collectors do not have (``TypeError``) or one given a value
    aiocollect cannot honour (``ValueError``); accept the rest (see the module docstring).
    ``extra``: the keywords of ``owner`` on top of the shared ones (``DISTRIBUTED_KEYWORDS``)."""
    keywords = {**_KEYWORDS, **(extra or {})}
    for name, value in given.items():
        keyword = keywords.get(name)
        if keyword is None:
            known = [k for k in (*keywords, *_KNOWN_ELSEWHERE, *options_of(CollectorOptions)) if k != name]
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"{owner}() got an unexpected keyword argument {name!r}{hint}")
        if not any(v(value) if callable(v) else value is v or (isinstance(v, str) and value == v)
                   for v in keyword.accepted):
            off = " or ".join(repr(v) for v in keyword.accepted if not callable(v))
            raise ValueError(f"{name}={value!r}: {keyword.meaning} (TorchRL's keyword is taken at {off}).")


_KNOWN_ELSEWHERE = ("create_env_fn", "policy", "num_collectors", "compile_policy", "cudagraph_policy",
                    "policy_factory", "num_workers", "sync")
"""Constructor arguments that are not options, offered (with the options) as the nearest name."""


def take_torchrl_keywords(collector: Any, given: Mapping[str, Any], options: CollectorOptions,
                          policy: Any, obs_keys: list) -> None:
    """Set what ``collector`` keeps of the TorchRL keywords it implements (``given``, already
    checked by ``check_torchrl_keywords``); raise where they do not fit the other options,
    with TorchRL's error types. ``policy``: the policy the collector runs; ``obs_keys``: its
    envs' observation keys."""
    for name in ("pre_collect_hook", "post_collect_hook", "weight_updater"):
        if given.get(name) is not None:
            setattr(collector, name, given[name])
    if given.get("worker_idx") is not None:
        collector.worker_idx = int(given["worker_idx"])
    collector._object_entries = OBJECTS in obs_keys
    collector._agent_groups = has_agents(obs_keys)
    collector.compact_obs = bool(given.get("compact_obs", False))
    collector.track_traj_ids = bool(given.get("track_traj_ids", True))
    if not collector.track_traj_ids:  # (TorchRL's error, and its type, with the fix)
        if options.split_trajs:
            raise ValueError("split_trajs=True requires track_traj_ids=True: trajectories are told apart by "
                             "their ids; remove track_traj_ids=False (or split_trajs).")
        if options.trajs_per_batch is not None:
            raise ValueError("trajs_per_batch requires track_traj_ids=True: complete trajectories are told apart "
                             "by their ids; remove track_traj_ids=False (or trajs_per_batch).")
    collector._left_out = ((compact_keys(obs_keys) if collector.compact_obs else ())
                           + (() if collector.track_traj_ids else (("collector", "traj_ids"),)))
    extend = given.get("extend_buffer", True)
    collector.extend_buffer = extend
    if not extend and options.replay_buffer is not None:
        if options.postproc is not None:  # (TorchRL's errors, and their type)
            raise TypeError("postproc must be None when a replay buffer is passed, or extend_buffer must be set "
                            "to True.")
        if options.split_trajs:
            raise TypeError("split_trajs must be None/False when a replay buffer is passed, or extend_buffer "
                            "must be set to True.")
        if options.return_same_td:
            raise TypeError("return_same_td must be False when a replay buffer is passed, or extend_buffer must "
                            "be set to True.")
        if options.trajs_per_batch is not None:
            raise ValueError("extend_buffer=False with trajs_per_batch: the replay buffer gets whole "
                             "trajectories (trajs_per_write at a time); remove extend_buffer.")
    if given.get("auto_register_policy_transforms"):
        needed = policy_transforms_needed(policy, obs_keys)
        if needed:
            raise ValueError(
                f"auto_register_policy_transforms=True: the policy has recurrent modules ({', '.join(needed)}), "
                "whose state keys and \"is_init\" the envs lack, and they are not TorchRL envs, to which "
                "TorchRL's InitTracker and TensorDictPrimer are added (_envs.policy_transforms); build them as "
                "TorchRL envs (GymEnv, GymWrapper), or give their observations those keys."
            )


def policy_transforms_needed(policy: Any, obs_keys: list) -> list[str]:
    """The modules of ``policy`` for which TorchRL's ``auto_register_policy_transforms=True``
    would add env transforms: those with ``make_tensordict_primer`` (``LSTMModule``,
    ``GRUModule``...) whose state keys (or ``"is_init"``, the ``InitTracker``'s) the env's
    observations lack. None where the env has them already (TorchRL's check is spec-based
    too), or for a policy without such modules: there is nothing to register."""
    modules = getattr(policy, "modules", None)
    if not callable(modules):
        return []
    try:
        recurrent = [m for m in modules() if callable(getattr(m, "make_tensordict_primer", None))]
    except TypeError:  # (a callable named ``modules`` that is not nn.Module's)
        return []
    have = {k if isinstance(k, tuple) else (k,) for k in obs_keys}
    needed = []
    for module in recurrent:
        try:
            primer = module.make_tensordict_primer()
            keys = {k if isinstance(k, tuple) else (k,) for k in primer.primers.keys(True, True)}
        except Exception:  # noqa: BLE001 - (no primer to read: count the module as needing one)
            keys = {("",)}
        if not (keys | {("is_init",)}) <= have:
            needed.append(type(module).__name__)
    return needed


def compact_keys(obs_keys: list) -> tuple:
    """``compact_obs=True``: the ``("next", obs)`` keys a batch leaves out."""
    return tuple(("next", *(k if isinstance(k, tuple) else (k,))) for k in obs_keys)


def policy_from(arguments: Mapping[str, Any], policy_device: Any, *,
                source_allowed: bool = False) -> tuple[Any, int | None, Any]:
    """The policy a collector runs in this process, from its constructor's ``locals()``:
    ``policy`` or ``policy_factory()``, compiled as ``compile_policy`` asks, checked; and
    ``cudagraph_policy`` checked against it (``cuda_graphs_for``); and the module whose
    weights ``update_policy_weights_()`` takes by default, where that is not the policy run:
    TorchRL's ``policy`` given with a ``policy_factory`` and ``weight_sync_schemes``, which
    the worker collectors take (``source_allowed``) as TorchRL's do: the factory's policy
    acts, with the weights of ``policy``, now and at each update (``None`` otherwise)."""
    compile_policy = arguments["compile_policy"]
    policy, factory = arguments["policy"], arguments["policy_factory"]
    source = None
    if policy is not None and factory is not None and source_allowed \
            and arguments["torchrl_options"].get("weight_sync_schemes") is not None:
        source, policy = policy, None
    policy = resolve_policy(policy, factory, compile_policy, weights_from=source)
    check_policy(policy)
    # (a warning points at the constructor's caller)
    return policy, cuda_graphs_for(arguments["cudagraph_policy"], policy, policy_device, compile_policy,
                                   stacklevel=4), source


_BACKENDS = {"direct": "direct", "process": "process", "multiprocessing": "process", "ray": "ray", "rpc": "rpc"}
"""TorchRL 0.14's ``Collector(backend=...)`` values aiocollect has, each to the collector it builds."""

_OTHER_BACKENDS = {
    "thread": "TorchRL's Collector has no thread backend either",
    "threading": "TorchRL's Collector has no thread backend either",
    "distributed": "TorchRL's DistributedCollector (torch.distributed) has no aiocollect counterpart; use "
                   "backend='rpc' (RPCCollector) or backend='ray' (RayCollector)",
    "submitit": "SLURM submission is not supported; use backend='rpc' (RPCCollector) over workers you start, "
                "or backend='ray' (RayCollector)",
    "monarch": "TorchRL's Collector has no monarch backend either",
}


def collector_backend(backend: Any, num_collectors: Any, sync: Any, backend_options: Any,
                      kwargs: Mapping[str, Any]) -> str:
    """Which collector ``Collector(..., backend=...)`` builds, as TorchRL 0.14's
    ``Collector`` picks it: ``"direct"`` (this process: ``Collector`` itself; ``None``
    without ``num_collectors``), ``"process"`` (``"multiprocessing"``; ``None`` with
    ``num_collectors``: a worker collector), ``"ray"``, ``"rpc"``; checked as TorchRL checks
    it (``num_collectors`` and ``sync`` for ``"direct"``, ``backend_options``)."""
    kind: str | None
    if backend is None:
        kind = "direct" if num_collectors is None else "process"
    else:
        kind = _BACKENDS.get(backend) if isinstance(backend, str) else None
        if kind is None:
            why = _OTHER_BACKENDS.get(backend) if isinstance(backend, str) else None
            supported = ", ".join(repr(b) for b in (*_BACKENDS, None))
            raise ValueError(f"backend={backend!r}: aiocollect's Collector takes {supported}"
                             + (f" ({why})." if why else "."))
    if backend_options is not None and not isinstance(backend_options, Mapping):
        raise TypeError(f"backend_options must be a dict of arguments for the collector built, got "
                        f"{backend_options!r}")
    options = dict(backend_options or {})
    reserved = sorted({"backend_options", "num_collectors", "num_workers", "sync"} & set(options))
    if reserved:
        raise ValueError(f"backend_options contains reserved selector keys: {reserved}.")
    duplicates = sorted(set(options) & (set(kwargs) | {"create_env_fn", "policy"}))
    if duplicates:
        raise ValueError(f"Backend options duplicate top-level collector arguments: {duplicates}.")
    if kind == "direct":
        if num_collectors not in (None, 1):
            raise ValueError(f"backend='direct' supports at most one collector (num_collectors={num_collectors!r}); "
                             "use backend='process' for worker processes.")
        if options:
            raise ValueError("backend_options are only valid for non-direct collectors.")
    return kind


def worker_entries(create_env_fn: Any, count: Any, name: str, none: str = "") -> list:
    """``create_env_fn`` as one entry per worker process, for TorchRL's ``num_workers`` and
    ``num_collectors`` (``name``, whose ``None`` means what ``none`` says): a single factory
    repeated ``count`` times, or a list (or tuple) of ``count`` entries."""
    n = as_int(count)
    if n is None or n < 1:
        raise ValueError(f"{name}={count!r}: give the number of worker processes (an int >= 1){none}.")
    if not isinstance(create_env_fn, (list, tuple)):
        return [create_env_fn] * n
    if len(create_env_fn) != n:
        raise ValueError(f"{name}={n} but create_env_fn has {len(create_env_fn)} entries; give one entry per "
                         "worker, or a single factory.")
    return list(create_env_fn)


def per_worker_frames(frames_per_batch: Any, create_env_fn: Any) -> tuple[Any, tuple[int, ...] | None]:
    """TorchRL's ``frames_per_batch`` as a list, one entry per worker: ``(sum, the entries)``;
    an int as it is, ``(frames_per_batch, None)``. The sum is what TorchRL counts as the
    collector's ``frames_per_batch``: a ``MultiSyncCollector`` batch holds every worker's share,
    and a ``MultiAsyncCollector`` worker's batch is that many frames (TorchRL's
    ``frames_per_batch_worker()``). Raises ``ValueError`` for a list of another length than
    the workers, or entries that are not positive ints."""
    if not isinstance(frames_per_batch, (list, tuple)):
        return frames_per_batch, None
    workers = len(create_env_fn) if isinstance(create_env_fn, (list, tuple)) else 1
    if len(frames_per_batch) != workers:
        raise ValueError(f"frames_per_batch={list(frames_per_batch)!r}: a list gives one value per worker, and "
                         f"there are {workers} worker(s); give {workers} values, or one int for the whole batch.")
    entries = [as_int(v) for v in frames_per_batch]
    shares = [v for v in entries if v is not None and v >= 1]
    if len(shares) != len(entries):
        raise ValueError(f"frames_per_batch={list(frames_per_batch)!r}: each worker's share is a positive int.")
    return sum(shares), tuple(shares)


class _BothPolicies(TypeError, ValueError):
    """``policy`` with ``policy_factory``: TorchRL's ``TypeError`` (its worker collectors take both only
    with ``weight_sync_schemes``, the policy then a source of weights for the workers' policies);
    a ``ValueError`` too, as aiocollect raised it before."""


def resolve_policy(policy: Any, policy_factory: Callable[[], Any] | None, compile_policy: Any, *,
                   weights_from: Any = None) -> Any:
    """The policy to collect with: ``policy``, or ``policy_factory()`` (with the weights of
    ``weights_from``, if given: see ``policy_from``); compiled if asked."""
    if policy_factory is not None:
        if policy is not None:
            raise _BothPolicies(
                "policy and policy_factory: give one of them, not both. (TorchRL's MultiSyncCollector and "
                "MultiAsyncCollector take both with weight_sync_schemes, policy then the source of the weights of "
                "the policy the factory builds, and so do aiocollect's; Collector takes one.)")
        if isinstance(policy_factory, (list, tuple)) and len(policy_factory) \
                and all(f is policy_factory[0] for f in policy_factory):
            policy_factory = policy_factory[0]  # (TorchRL's [factory] * num_workers: one policy, built once)
        if isinstance(policy_factory, (list, tuple)):
            raise TypeError(
                f"policy_factory: a list of {len(policy_factory)} different factories (TorchRL's per-worker "
                "policies); aiocollect runs one policy for the envs of every worker (here, or the same copy in "
                "each): give one factory, or the same one for every worker. "
                "(RayCollector and RPCCollector take a list, one per remote collector.)"
            )
        if not callable(policy_factory):
            raise TypeError(f"policy_factory must be a callable returning the policy, got {policy_factory!r}")
        policy = policy_factory()
        if weights_from is not None:
            _load_weights(policy, weights_from)
    if compile_policy is None or compile_policy is False:
        return policy
    if compile_policy is True:
        options: dict = {}
    elif isinstance(compile_policy, dict):
        options = dict(compile_policy)
    else:
        raise TypeError(f"compile_policy must be True, False, None or a dict of torch.compile arguments, "
                        f"got {compile_policy!r}")
    return _compiled(policy, options)


def _load_weights(policy: Any, source: Any) -> None:
    """Copy the weights of ``source`` (TorchRL's ``policy`` given with a ``policy_factory`` and
    ``weight_sync_schemes``) into ``policy``, the factory's: they act from the first step, as
    TorchRL's schemes send them to the workers' policies when the collector starts."""
    import torch

    from .._policies.weights import TorchWeights

    if not isinstance(policy, torch.nn.Module) or not isinstance(source, torch.nn.Module):
        raise TypeError(
            "policy with policy_factory and weight_sync_schemes: policy is the source of the weights of the "
            "policy the factory builds, and both must be torch modules; got policy "
            f"{type(source).__name__} and policy_factory() {type(policy).__name__}. Give only one of them.")
    weights = TorchWeights(policy)
    try:
        snapshot = weights.snapshot(source)
    except (KeyError, ValueError) as exc:
        misfit = getattr(exc, "misfit", str(exc.args[0]).removeprefix("update_policy_weights_: "))
        raise ValueError(
            "policy with policy_factory and weight_sync_schemes: policy is the source of the weights of the "
            f"policy the factory builds, and its weights do not fit that policy ({misfit}). Give a factory "
            "that builds the same network as policy.") from None
    weights.load(snapshot)  # (a lazy tensor of the factory's policy takes the source's shape)


def _compiled(policy: Any, options: dict) -> Any:
    """``policy`` with its network compiled by ``torch.compile(**options)``.

    A plain ``TensorDictModule`` keeps its keys and gets its ``module`` compiled (a new
    ``TensorDictModule``: the user's object is not changed, and the parameters stay shared);
    a bare ``nn.Module`` or a function of the observations is compiled whole. Other
    TensorDict policies (``ProbabilisticActor``, a ``TensorDictSequential``) are refused with
    a clear error: compiled whole they would no longer be called with a TensorDict."""
    import torch
    from tensordict.nn import TensorDictModule

    if policy is None:
        raise ValueError("compile_policy: there is no policy to compile (policy=None is a random policy).")
    if type(policy) is TensorDictModule:
        return TensorDictModule(torch.compile(policy.module, **options), in_keys=policy.in_keys,
                                out_keys=policy.out_keys)
    if callable(policy) and not _takes_tensordict_module(policy):
        return torch.compile(policy, **options)
    raise ValueError(
        f"compile_policy: a {type(policy).__name__} cannot be compiled here without changing how it is "
        "called; compile its network yourself (torch.compile(module)) and build the policy around it."
    )


def _takes_tensordict_module(policy: Any) -> bool:
    from tensordict.nn import TensorDictModuleBase

    return isinstance(policy, TensorDictModuleBase)


def weights_given(policy_or_weights: Any, weights: Any = None, policy: Any = None, model_id: Any = None,
                  weights_dict: Any = None) -> Any:
    """The one weights argument among TorchRL's spellings of ``update_policy_weights_``:
    positional, ``weights=``, ``policy=``, or ``weights_dict={"policy": ...}``; ``model_id``
    may only name the policy (``"policy"``, TorchRL's default), the one model a collector has."""
    if model_id is not None and model_id != "policy":
        raise ValueError(
            f"update_policy_weights_: model_id={model_id!r}: a collector has one model, the policy "
            "(model_id='policy'); other models (a critic, a target network) stay with your trainer."
        )
    if weights_dict is not None:
        if model_id is not None:
            raise ValueError("update_policy_weights_: give model_id or weights_dict, not both.")
        if not isinstance(weights_dict, dict) or set(weights_dict) != {"policy"}:
            keys = list(weights_dict) if isinstance(weights_dict, dict) else type(weights_dict).__name__
            raise ValueError(
                f"update_policy_weights_: weights_dict has {keys}; a collector has one model: pass "
                "weights_dict={'policy': weights}, or the weights themselves."
            )
    given = [(name, value) for name, value in (("policy_or_weights", policy_or_weights), ("weights", weights),
                                               ("policy", policy)) if value is not None]
    if weights_dict is not None:
        given.append(("weights_dict", weights_dict["policy"]))
    if len(given) > 1:
        raise ValueError(
            f"update_policy_weights_: {' and '.join(name for name, _ in given)} were both given; pass the "
            "weights once."
        )
    return given[0][1] if given else None


def envs_as_given(group: Any, batched: bool) -> Any:
    """The env objects an in-process env group steps, as the user made them: TorchRL's
    ``collector.env`` for ``Collector``.

    One env: that env; a ``VectorEnv`` (or a batched TorchRL env): that env; a list of
    factories: the list of their envs. A TorchRL env is given back as the TorchRL env
    (not aiocollect's gymnasium adapter around it), and a gymnasium env that aiocollect
    adapted to run among coroutine envs as the gymnasium env. (An ``aiocollect.GymEnv``,
    which only carries a device, is given back as the gymnasium env it wraps.)
    """
    venv = getattr(group, "venv", None)
    if venv is not None:
        return _unwrapped(venv)
    envs = [_unwrapped(env) for env in group.envs]
    return envs if batched else envs[0]


def _unwrapped(env: Any) -> Any:
    coroutine = sys.modules.get("aiocollect._envs.coroutine_group")
    if coroutine is not None and type(env) is coroutine.SyncEnvAdapter:
        env = env.env
    adapters = sys.modules.get("aiocollect._envs.torchrl_env")  # (loaded only once a TorchRL env was given)
    if adapters is not None and isinstance(env, (adapters.TorchRLEnv, adapters.TorchRLVectorEnv)):
        env = env.torchrl_env
    return env


def _writable_trace_path(save_path: str | Path) -> Path:
    """``enable_profile``'s ``save_path``, checked where it is given: a file that can be
    written (its folder is made if missing), not a folder."""
    if not isinstance(save_path, (str, Path)):
        raise TypeError(f"enable_profile: save_path={save_path!r}: give a file path (str or Path), such as "
                        "'trace.json'.")
    path = Path(save_path).expanduser()
    if path.is_dir():
        raise ValueError(f"enable_profile: save_path={str(save_path)!r} is a folder: give a file path in it, "
                         f"such as {str(path / 'trace.json')!r}.")
    folder = path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"enable_profile: save_path={str(save_path)!r}: its folder cannot be made "
                         f"({exc.strerror or exc}); give a path in a writable folder.") from None
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ValueError(f"enable_profile: save_path={str(save_path)!r} is not writable; give a path in a "
                         "writable folder.")
    return path


@dataclass(frozen=True)
class ProfileConfig:
    """What ``enable_profile()`` was given, under TorchRL's ``ProfileConfig`` field names
    (``collector.profile_config``)."""

    workers: list[int] | None
    num_rollouts: int
    warmup_rollouts: int
    save_path: Path | None
    activities: list[str]
    record_shapes: bool
    profile_memory: bool
    with_stack: bool
    with_flops: bool
    on_trace_ready: Callable[[Any], None] | None


class TorchRLAccessors(CollectorParts):
    """``DataCollectorBase``'s TorchRL accessors. Uses the collector's ``options``,
    ``_policy``, ``_versions`` and ``update_policy_weights_``."""

    pre_collect_hook: Callable[[], Any] | None = None
    """TorchRL's ``pre_collect_hook``: called with no argument before each batch is collected
    (a ``MultiSyncCollector`` calls it once per worker, as each TorchRL worker does before its
    share), where the batch is asked for: on the thread that runs the delivery (see
    ``post_collect_hook``). Its return value is ignored. It may be set at any time."""
    post_collect_hook: Callable[[Any], Any] | None = None
    """TorchRL's ``post_collect_hook``: called with each collected batch. A ``Collector``
    calls it as TorchRL's does, with the batch delivered (after ``split_trajs`` and
    ``postproc``, before the replay buffer gets it); the worker collectors, as TorchRL's
    workers do, with each worker's batch (``[T]``, or ``[envs, T]``: a view of the batch
    about to be delivered, before ``split_trajs`` and ``postproc``; for
    ``MultiSyncCollector`` once per worker). Both hooks run in this process (TorchRL's worker
    collectors run them in their worker processes), where ``postproc`` runs: on the
    collector's loop thread for ``for``/``next()``/``rollout()``, on your event loop for
    ``async for``, on the background loop under ``start()``; never two at once. A hook that
    blocks holds the collection back; one that raises fails the iteration with its
    exception. Its return value is ignored. It may be set at any time."""
    worker_idx: int | None = None
    """TorchRL's ``worker_idx``: the index given at construction (``None`` by default),
    stored for you to read; aiocollect's worker processes have their own indices."""
    compact_obs: bool = False
    """TorchRL's ``compact_obs``: with ``True`` the batches hold no ``("next", obs)`` entries
    (each a copy of the next frame's observation); reward, done and the other entries stay."""
    track_traj_ids: bool = True
    """TorchRL's ``track_traj_ids``: with ``False`` the batches hold no ``("collector",
    "traj_ids")`` entry (the engine still tells trajectories apart: episode returns and
    statistics count them), and ``split_trajs`` and ``trajs_per_batch``, which need the ids,
    are refused."""
    extend_buffer: bool = True
    """TorchRL's ``extend_buffer``: with ``False`` and a ``replay_buffer``, the buffer gets
    each step with ``add`` (per worker, the step of each of its envs) instead of the batch's
    frames with ``extend``."""
    weight_updater: Any = None
    """TorchRL's ``weight_updater`` as given (one of TorchRL's in-process updaters, or
    ``None``); ``update_policy_weights_()`` does what they do."""
    _left_out: tuple = ()
    """The keys a delivered batch leaves out: ``compact_obs``'s ``("next", obs)`` entries,
    ``track_traj_ids=False``'s trajectory ids."""
    _object_entries = False
    """Whether the envs have entries with no fixed shape (``_envs.objects``), unpickled into each
    batch (which ``return_same_td`` then does not reuse: their shapes are each batch's own)."""
    _agent_groups = False
    """Whether the envs have heterogeneous agents (``_envs.agents``), their groups lazily stacked in each batch."""
    _hook_after_postproc = True
    """``post_collect_hook`` takes the batch delivered (``Collector``), not each worker's."""

    def _run_pre_collect_hook(self) -> None:
        """``pre_collect_hook``, before a batch is collected: once per worker that collects a share."""
        hook = self.pre_collect_hook
        if hook is not None:
            for _ in range(self._hooked_parts()):
                hook()

    def _hooked_parts(self) -> int:
        """How many calls of ``pre_collect_hook`` a batch takes: one per worker that collects a share."""
        return 1

    def _worker_parts(self, batch: Any) -> list:
        """``batch`` as the batches of the workers that collected it (views), for
        ``post_collect_hook`` and ``extend_buffer=False``."""
        return [batch]

    @property
    def policy_version(self) -> int:
        """The newest policy version: TorchRL's ``collector.policy_version``.

        0 is the weights at construction; each
        [`update_policy_weights_`][aiocollect.DataCollectorBase.update_policy_weights_] (or
        [`increment_version`][aiocollect.DataCollectorBase.increment_version]) adds one, and
        it is in effect from the next policy call on (the one in effect now is
        ``statistics().policy_version``). For a ``Collector``, an optimiser step on your
        module becomes a version when the next policy call finds it. TorchRL gives ``None``
        unless ``track_policy_version=True``; aiocollect versions every frame anyway, so this
        is always an int (0 for a policy without weights, which keeps its one version).
        """
        versions = self._versions()
        return 0 if versions is None else versions[1]

    def get_policy_version(self) -> int:
        """[`policy_version`][aiocollect.DataCollectorBase.policy_version], as a method (TorchRL's
        spelling for remote calls, where properties cannot be read).

        Returns:
            The newest policy version.
        """
        return self.policy_version

    def increment_version(self) -> int:
        """Make a new policy version: TorchRL's ``increment_version()``.

        In aiocollect a version is a set of weights, so this is
        ``update_policy_weights_()`` with no argument: the weights of the policy object given
        at construction become the new version, in effect from the next policy call. A
        ``Collector`` acts with your module itself: nothing is copied, the version is only
        counted. The worker collectors copy your module's weights into theirs (TorchRL's
        multi-process collectors count the version and leave the weights alone). A policy
        without weights (``None``, a plain function) has one version, 0, and this changes
        nothing.

        Returns:
            The new version (TorchRL returns ``None``).
        """
        return self.update_policy_weights_()

    def getattr_policy(self, attr: str) -> Any:
        """An attribute of the collector's policy: TorchRL's ``getattr_policy(attr)``.

        Every local collector keeps its policy in this process (a worker's copy, where each
        worker acts with one, loads its weights), so the attribute is read here, from the
        policy the collector runs (``collector.policy``: for a ``Collector``
        your module itself, or its copy on ``policy_device``; for the worker collectors the
        one copy that acts for every worker, where TorchRL asks its first worker's), and
        then from the object you gave (first from it for a TorchRL ``RandomPolicy``, which
        the collector runs through a stand-in).

        Args:
            attr: the attribute's name.

        Returns:
            Its value (the object itself, not a copy).

        Raises:
            AttributeError: neither policy object has it.
            NotImplementedError: the collector has no policy in this process (a distributed
                collector: each remote collector runs its own).
        """
        setup = self._policy
        if setup is None:
            raise NotImplementedError(
                f"getattr_policy: {type(self).__name__} runs its policy in its remote collectors, not in "
                "this process; read the attribute from the policy object you built."
            )
        order = (setup.policy, setup.user_policy)
        if isinstance(setup.policy, SpecRandomPolicy):  # a stand-in for the TorchRL RandomPolicy given
            order = order[::-1]
        for policy in order:
            if policy is not None and hasattr(policy, attr):
                return getattr(policy, attr)
        raise AttributeError(f"getattr_policy: the collector's policy ({type(setup.policy).__name__}) has no "
                             f"attribute {attr!r}")

    @property
    def env(self) -> Any:
        """The env this collector steps in this process: TorchRL's ``collector.env``.

        For a [`Collector`][aiocollect.Collector]: the env as built from ``create_env_fn``
        (a TorchRL env as the TorchRL env; a ``VectorEnv`` as it is), or the list of envs
        for a list of factories. Use it to read the env, not to step or reset it: the
        collector owns its state between batches. The worker collectors have their envs in
        their worker processes, and no ``env`` (``AttributeError``, so ``hasattr`` is false).
        """
        raise AttributeError(  # (Collector, whose envs are here, overrides this)
            f"{type(self).__name__} has no env in this process: its envs are its workers' (worker "
            "processes, or remote collectors), which step envs and answer nothing else; build one with "
            "your env factory to look at it."
        )

    def getattr_env(self, attr: str) -> Any:
        """An attribute of the collector's env: TorchRL's ``getattr_env(attr)``.

        A [`Collector`][aiocollect.Collector] answers from its env in this process
        ([`env`][aiocollect.DataCollectorBase.env]; for a list of envs, from the first, as
        TorchRL's multi-process collectors answer from their first worker's). The worker
        collectors refuse: their envs live in worker processes that step envs and answer
        nothing else, and an answer from a copy built here could silently differ from the
        live env's (its state, its seed); build one with your env factory to read a static
        attribute such as a spec.

        Args:
            attr: the attribute's name.

        Returns:
            Its value.

        Raises:
            AttributeError: the env has no such attribute.
            NotImplementedError: the collector's envs are not in this process.
        """
        try:
            env = self.env
        except AttributeError as exc:
            raise NotImplementedError(f"getattr_env({attr!r}): {exc}") from None
        if isinstance(env, list):
            env = env[0]
        return getattr(env, attr)

    def getattr_rb(self, attr: str) -> Any:
        """An attribute of the ``replay_buffer``: TorchRL's ``getattr_rb(attr)``.

        Args:
            attr: the attribute's name.

        Returns:
            ``getattr(collector.replay_buffer, attr)``.

        Raises:
            AttributeError: the collector has no replay buffer, or it has no such attribute.
        """
        if self.options.replay_buffer is None:
            raise AttributeError(f"getattr_rb({attr!r}): {type(self).__name__} has no replay_buffer.")
        return getattr(self.options.replay_buffer, attr)

    @property
    def n_env(self) -> int:
        """How many envs the collector steps: TorchRL's ``n_env`` (``num_envs``, over every worker)."""
        num = getattr(self, "num_envs", None)
        if num is None:
            raise AttributeError(f"{type(self).__name__} has no n_env: its envs live in its remote collectors.")
        return num

    def stats(self, workers: str = "aggregate") -> dict[str, int | float | bool]:
        """TorchRL's ``stats()``: a cheap snapshot of the collector's progress, scalars only
        (what TorchRL's ``LoggerMonitor`` turns into rates); safe while it collects.

        ``"frames"``, ``"batches"``, ``"total_frames"`` and ``"completed"`` (not for an
        endless collector), ``"requested_frames_per_batch"``, ``"policy_version"``; a
        collector with workers adds ``"workers"`` and ``"workers_alive"``, and with
        ``workers="per_worker"`` or ``"both"`` each worker's ``"worker_<i>/frames"`` (the env
        steps it took) and ``"worker_<i>/alive"`` (read here: no worker is asked).
        [`statistics`][aiocollect.DataCollectorBase.statistics] has the rest (env steps,
        frames/s, lag...).

        Args:
            workers: ``"aggregate"`` (the collector's counters), ``"per_worker"`` (each
                worker's alone) or ``"both"``, as in TorchRL.
        """
        if workers not in ("aggregate", "per_worker", "both"):
            raise ValueError(f"stats: workers={workers!r}: use 'aggregate', 'per_worker' or 'both'.")
        snap = self.statistics()
        out: dict[str, int | float | bool] = {}
        if workers != "per_worker":
            out["frames"], out["batches"] = snap.frames, snap.batches
            total = self.options.total_frames
            if total >= 0:
                out["total_frames"], out["completed"] = total, snap.frames >= total
            out["requested_frames_per_batch"] = self.options.frames_per_batch
            out["policy_version"] = snap.latest_policy_version
        if snap.workers:
            out["workers"] = len(snap.workers)
            out["workers_alive"] = sum(w.alive for w in snap.workers)
            if workers != "aggregate":
                for w in snap.workers:
                    out[f"worker_{w.index}/frames"], out[f"worker_{w.index}/alive"] = w.env_steps, w.alive
        return out

    def get_distant_attr(self, attr: str) -> Any:
        """TorchRL's ``get_distant_attr`` for a collector of its own: the attribute at the
        dotted path ``attr`` (``"env.batch_size"``, ``"options.frames_per_batch"``; an item as
        ``"a['key']"``). TorchRL's multi-process collectors ask each worker's inner collector,
        which aiocollect's workers do not have: they raise ``NotImplementedError``."""
        if getattr(self, "_worker_lanes", None) is not None:
            raise NotImplementedError(
                f"{type(self).__name__}.get_distant_attr: its workers step envs and hold no collector of "
                "their own to read from; read the collector's own attributes, or statistics().workers.")
        value: Any = self
        for part in re.findall(r"[^.\[\]]+|\[[^\]]*\]", attr):
            if part.startswith("["):
                key = part[1:-1].strip()
                value = value[key[1:-1] if key[:1] in "'\"" and len(key) > 1 else int(key)]
            else:
                value = getattr(value, part)
        return value

    @property
    def requested_frames_per_batch(self) -> int:
        """Frames in each batch, summed over its envs: TorchRL's ``requested_frames_per_batch``.

        ``frames_per_batch`` as the collector uses it: rounded up (with a warning) to split
        evenly over the envs, as TorchRL's ``Collector`` does.
        """
        return self.options.frames_per_batch

    def enable_profile(self, *, workers: list[int] | None = None, num_rollouts: int = 3, warmup_rollouts: int = 1,
                       save_path: str | Path | None = None, activities: list[str] | None = None,
                       record_shapes: bool = True, profile_memory: bool = False, with_stack: bool = False,
                       with_flops: bool = False, on_trace_ready: Callable[[Any], None] | None = None) -> None:
        """Time where the collection's time goes from now on: TorchRL's ``enable_profile``.

        The engine counts and times its policy calls and the batches it copies out of the
        rollout storage, and the caller's side how long your loop waited for each batch and
        how long it spent between two batches (a ``MultiSyncCollector`` also how much of the
        wait came after its first worker had its share, waiting for the slowest);
        [`profile_report()`][aiocollect.DataCollectorBase.profile_report] returns the figures
        (``print()`` shows them as a table). The same parts are named for ``torch.profiler``
        (``aiocollect.policy``, ``aiocollect.batch`` ranges). With ``save_path`` (or
        ``on_trace_ready``), batches ``warmup_rollouts`` to ``num_rollouts - 1`` after this
        call are also recorded by ``torch.profiler``, in the thread where the engine runs,
        and the trace saved there as a Chrome trace. TorchRL profiles its workers, where its
        policy runs; here the engine runs in this process, so ``workers`` selects nothing (a
        policy in the workers is not timed call by call: it acts within their runs of steps; a
        distributed collector's policy runs in its remote collectors: there only the caller's
        side is timed). Calling it again starts the counts afresh.

        Args:
            workers: TorchRL's; checked (a list of worker indices, or ``None``), no effect.
            num_rollouts: the batch (counted from this call) before which the trace ends.
            warmup_rollouts: the batch from which the trace records.
            save_path: where the Chrome trace goes (``None``: no trace, unless ``on_trace_ready``);
                ``{worker_idx}`` in it is the first of ``workers`` (``0`` without), as TorchRL
                names each worker's trace.
            activities: ``"cpu"`` and/or ``"cuda"`` (default ``["cpu"]``).
            record_shapes: ``torch.profiler.profile``'s.
            profile_memory: ``torch.profiler.profile``'s.
            with_stack: ``torch.profiler.profile``'s.
            with_flops: ``torch.profiler.profile``'s.
            on_trace_ready: called with the ``torch.profiler.profile`` once the trace ends.

        Raises:
            ValueError: ``warmup_rollouts`` is not below ``num_rollouts``, a count is
                negative, or an activity is neither ``"cpu"`` nor ``"cuda"``.
            TypeError: an argument of the wrong type.

        Examples:
            >>> collector.enable_profile(save_path="trace.json")
            >>> for batch in collector:
            ...     train(batch)
            >>> print(collector.profile_report())
        """
        if self._closed:
            raise self._closed_error()
        if workers is not None and not (isinstance(workers, (list, tuple)) and all(
                as_int(w) is not None for w in workers)):
            raise TypeError(f"enable_profile: workers={workers!r}: give a list of worker indices, or None.")
        for name, value in (("num_rollouts", num_rollouts), ("warmup_rollouts", warmup_rollouts)):
            if as_int(value) is None or value < 0:
                raise ValueError(f"enable_profile: {name}={value!r}: give a count of batches (an int >= 0).")
        if warmup_rollouts >= num_rollouts:
            raise ValueError(f"enable_profile: warmup_rollouts={warmup_rollouts} must be below num_rollouts="
                             f"{num_rollouts} (the trace records batches warmup_rollouts to num_rollouts - 1).")
        unknown = set(activities or ()) - {"cpu", "cuda"}
        if unknown:
            raise ValueError(f"enable_profile: activities={activities!r}: use 'cpu' and/or 'cuda'.")
        if on_trace_ready is not None and not callable(on_trace_ready):
            raise TypeError(f"enable_profile: on_trace_ready={on_trace_ready!r} is not callable.")
        if isinstance(save_path, (str, Path)):  # ("{worker_idx}": TorchRL's trace per worker; ours: the engine's)
            save_path = str(save_path).replace("{worker_idx}", str(workers[0] if workers else 0))
        if save_path is not None:
            save_path = _writable_trace_path(save_path)
        if self._profile is not None:
            self._on_engine(self._end_trace)
        self._profile_config = ProfileConfig(list(workers) if workers is not None else None, num_rollouts,
                                             warmup_rollouts, save_path, list(activities or ["cpu"]), record_shapes,
                                             profile_memory, with_stack, with_flops, on_trace_ready)
        self._profile = Profile(num_rollouts=num_rollouts, warmup_rollouts=warmup_rollouts, save_path=save_path,
                                on_trace_ready=on_trace_ready, activities=activities, record_shapes=record_shapes,
                                profile_memory=profile_memory, with_stack=with_stack, with_flops=with_flops)
        if self._end_trace not in self._resources.closers:  # (once, whatever the number of calls)
            self._resources.closers.append(self._end_trace)  # a trace under way at shutdown is saved
        if self._scheduler is not None:  # a local collector: its engine times its own parts
            self._scheduler.profile = self._profile

    def _trace_step(self) -> None:
        """On the engine, before each batch: start or end torch's trace (``Profile.trace_step``).
        A trace begun on the collector's loop thread is ended there before that thread ends
        (``LoopThread.at_exit``): torch's profiler ends a trace only in the thread it began in."""
        prof = self._profile
        assert prof is not None  # (enable_profile() set it before it scheduled this)
        prof.trace_step(prof.batches)
        loop = self._resources.loop
        if prof.tracing and loop is not None and loop.in_this_thread() and self._end_trace not in loop.at_exit:
            loop.at_exit.append(self._end_trace)

    def _end_trace(self) -> None:
        """End the trace under way, if any, and save it (``Profile.finish``): where it began,
        on the collector's loop thread while that runs, or here if it began here."""
        prof = self._profile
        if prof is None or not prof.tracing:
            return
        loop = self._resources.loop
        if not prof.in_trace_thread() and loop is not None and loop.usable and not loop.in_this_thread():
            loop.portal.call(prof.finish)
        else:
            prof.finish()

    def fake_tensordict(self) -> Any:
        """TorchRL's ``fake_tensordict()``: ``Collector`` gives a batch of zeros laid out as its
        batches; the other collectors raise ``NotImplementedError``, as TorchRL's multi-process
        ones do (build a ``Collector`` over one worker's envs for the layout)."""
        raise NotImplementedError(
            f"{type(self).__name__}.fake_tensordict() is not implemented, as in TorchRL: call it on a "
            "Collector over one worker's envs (its batches have the same keys).")

    @property
    def profile_config(self) -> ProfileConfig | None:
        """TorchRL's ``profile_config``: the arguments of the last ``enable_profile()``
        (``None`` before any)."""
        return getattr(self, "_profile_config", None)

    def profile_report(self) -> ProfileReport:
        """Where the collection's time went since ``enable_profile()``: a frozen snapshot.

        Returns:
            A [`ProfileReport`][aiocollect.ProfileReport]; ``print()`` shows it as a table.

        Raises:
            CollectorError: ``enable_profile()`` was not called.
        """
        if self._profile is None:
            raise CollectorError("profile_report(): call collector.enable_profile() first: the collection is "
                                 "timed only from then on (off, it costs nothing).")
        report = self._profile.report()
        if self._scheduler is None:  # (distributed: each remote collector places its own policy)
            return report
        where = "in the workers" if getattr(self, "policy_in_workers", False) else "here"
        costs = getattr(self, "placement_costs", None)
        if costs is not None:
            where += f" (measured: {costs.figures})"
        return replace(report, policy_placement=where)

    def init_updater(self, *args: Any, **kwargs: Any) -> None:
        """TorchRL's ``init_updater(...)``: nothing to do here.

        TorchRL passes the arguments to its ``weight_updater``, and does nothing without
        one. An aiocollect collector never has one (``weight_updater=None``): weights reach
        the policy through ``update_policy_weights_``. So this does nothing.
        """

    def register_scheme_receiver(self, weight_recv_schemes: dict, *, synchronize_weights: bool = True) -> None:
        """TorchRL's ``register_scheme_receiver``: not available for a scheme (``NotImplementedError``).

        In TorchRL it makes a collector receive weights from a parent collector through
        weight-sync schemes. No collector sends weights to an aiocollect collector that
        way: send them with ``update_policy_weights_``. An empty dict registers nothing.

        Args:
            weight_recv_schemes: ``{model_id: scheme}``.
            synchronize_weights: TorchRL's; unused.

        Raises:
            NotImplementedError: ``weight_recv_schemes`` names a scheme.
        """
        if weight_recv_schemes:
            raise NotImplementedError(
                f"register_scheme_receiver({sorted(weight_recv_schemes)}): an aiocollect collector receives "
                "weights only through update_policy_weights_(weights); call it with the weights instead."
            )

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
* **not supported**: accepted only at the value that turns them off (``weight_updater=None``,
  ``backend=None``...); any other value is a ``ValueError`` that says what to do
  instead. TorchRL's weight-sync schemes (``weight_sync_schemes``) are taken: they carry
  weights to policies in other processes, and here the policy runs in this process, where
  ``update_policy_weights_()`` is that carrier.

A keyword TorchRL does not have is the usual ``TypeError``, with the nearest valid name.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


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


_KEYWORDS: dict[str, _Keyword] = {
    "extend_buffer": _Keyword((True,), "aiocollect extends the replay buffer once per batch, as TorchRL "
                                       "does by default (extend_buffer=False is deprecated there); remove it"),
    "track_traj_ids": _Keyword((True, False), ""),  # every frame carries its trajectory id anyway
    "no_cuda_sync": _Keyword((None, True, False), ""),  # aiocollect makes no explicit CUDA synchronisation call
    "use_buffers": _Keyword((None, True, False), ""),  # batches always go through preallocated storage
    "trust_policy": _Keyword((None, True, False), ""),  # a policy's outputs are checked on its first calls
    "compact_obs": _Keyword((False,), "aiocollect keeps the observation before and after each step, as "
                                      "TorchRL's default layout does; remove it"),
    "auto_register_policy_transforms": _Keyword((None, False), "aiocollect does not add env transforms for "
                                                               "recurrent policies; give the env its "
                                                               "InitTracker and TensorDictPrimer yourself"),
    # (Collector and the worker collectors take it; the distributed ones pass it on)
    "cudagraph_policy": _Keyword((None, False), "the policies run in the remote collectors: pass it to them, "
                                                "collector_kwargs={'cudagraph_policy': True}"),
    # TorchRL's schemes carry weights to policies in other processes; here the policy runs in this
    # process and update_policy_weights_() (or, for Collector, the shared module) is that carrier
    "weight_sync_schemes": _Keyword((None, _torchrl_schemes), "give a TorchRL weight-sync scheme for the "
                                                              "policy (it is taken: weights reach the policy "
                                                              "in this process through update_policy_weights_()), "
                                                              "or None; no other model takes weights here"),
    "weight_recv_schemes": _Keyword((None, _torchrl_schemes), "give TorchRL weight-sync schemes, or None"),
    "weight_updater": _Keyword((None,), "weights reach the policy through update_policy_weights_(); for "
                                        "remote collectors use RayCollector or RPCCollector"),
    "backend_options": _Keyword((None,), "pick the collector class instead (MultiSyncCollector, RayCollector...)"),
    "pre_collect_hook": _Keyword((None,), "collection hooks are not supported; wrap the iteration instead"),
    "post_collect_hook": _Keyword((None,), "collection hooks are not supported; use postproc= for batches"),
    "worker_idx": _Keyword((None,), "it is set by TorchRL's own multi-process collectors; remove it"),
    "init_fn": _Keyword((None,), "workers run no user code but the env factory; put setup in the factory"),
    "collector_class": _Keyword((None,), "aiocollect's workers step envs only (the policy runs in this "
                                         "process); remove it, or use RayCollector(collector_class=...)"),
    "backend": _Keyword((None,), "pick the collector class instead: Collector (one process), "
                                 "MultiSyncCollector or MultiAsyncCollector (worker processes), RayCollector"),
}


DISTRIBUTED_KEYWORDS: dict[str, _Keyword] = {
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
        if name in OPTION_KEYWORDS:
            continue  # checked with the other options (validate_options)
        keyword = keywords.get(name)
        if keyword is None:
            close = difflib.get_close_matches(name, [*keywords, *_KNOWN_ELSEWHERE, *OPTION_KEYWORDS], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"{owner}() got an unexpected keyword argument {name!r}{hint}")
        if not any(v(value) if callable(v) else value is v or (isinstance(v, str) and value == v)
                   for v in keyword.accepted):
            off = " or ".join(repr(v) for v in keyword.accepted if not callable(v))
            raise ValueError(f"{name}={value!r}: {keyword.meaning} (TorchRL's keyword is taken at {off}).")


OPTION_KEYWORDS = ("trajs_per_batch", "traj_format", "trajs_per_write", "track_policy_version")
"""TorchRL keywords that are collector options here: taken through ``**torchrl_options``
and validated by ``validate_options`` with the others."""

_KNOWN_ELSEWHERE = ("frames_per_batch", "total_frames", "create_env_fn", "policy", "device", "storing_device",
                    "policy_device", "env_device", "max_frames_per_traj", "init_random_frames", "split_trajs",
                    "reset_at_each_iter", "postproc", "exploration_type", "replay_buffer", "num_collectors",
                    "compile_policy", "cudagraph_policy", "policy_factory", "num_workers", "sync")


def resolve_policy(policy: Any, policy_factory: Callable[[], Any] | None, compile_policy: Any) -> Any:
    """The policy to collect with: ``policy``, or ``policy_factory()``; compiled if asked."""
    if policy_factory is not None:
        if policy is not None:
            raise ValueError("policy and policy_factory: give one of them, not both.")
        if isinstance(policy_factory, (list, tuple)):
            raise TypeError(
                f"policy_factory: a list of {len(policy_factory)} factories (TorchRL's per-worker policies); "
                "aiocollect runs one policy in this process for the envs of every worker: give one factory. "
                "(RayCollector and RPCCollector take a list, one per remote collector.)"
            )
        if not callable(policy_factory):
            raise TypeError(f"policy_factory must be a callable returning the policy, got {policy_factory!r}")
        policy = policy_factory()
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

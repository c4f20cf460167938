"""TorchRL's ``auto_register_policy_transforms=True``: the env transforms a policy needs, added to
its TorchRL envs where they are built.

A recurrent TorchRL policy (``LSTMModule``, ``GRUModule``: any module with
``make_tensordict_primer()``) reads its state and ``"is_init"`` from the env. Given
``auto_register_policy_transforms=True``, TorchRL's collectors append to the env the
transforms the policy needs and the env's specs lack: an ``InitTracker`` (for any module
policy, recurrent or not: so its batches then have ``"is_init"`` and ``("next", "is_init")``)
and the ``TensorDictPrimer`` of each recurrent module, in that order. Without the keyword
they leave the env as it is.

aiocollect builds its envs where they are stepped (a worker process, or here), from the
entries of ``create_env_fn``: so ``with_policy_transforms`` wraps each entry (a factory, or a
TorchRL env instance) in a ``PolicyTransforms``, which builds the env and appends what its
specs lack (a fresh copy of each transform: a transform belongs to one env), with
``env.append_transform`` as TorchRL does (in place for a ``TransformedEnv``, a new one around
any other env instance: the collector steps that one). A gymnasium env
takes no TorchRL transform and is left as it is (the collector then says what the policy
lacks: ``torchrl_compat.policy_transforms_needed``). TorchRL is imported only when the keyword
is given, with a module policy.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from gymnasium.vector import VectorEnv

from .build import check_not_torchrl, is_torchrl_env


def with_policy_transforms(create_env_fn: Any, policy: Any, given: dict) -> Any:
    """``create_env_fn`` with each entry wrapped in a ``PolicyTransforms`` when ``given`` (the
    collector's TorchRL keywords) has ``auto_register_policy_transforms=True`` and ``policy``
    is a module; otherwise ``create_env_fn`` itself."""
    if not given.get("auto_register_policy_transforms"):
        return create_env_fn
    transforms = transforms_for(policy)
    if not transforms:
        return create_env_fn
    return _wrap(create_env_fn, transforms, "create_env_fn")


def transforms_for(policy: Any) -> list:
    """What TorchRL would append for ``policy``, the env aside: an ``InitTracker``, then the
    ``TensorDictPrimer`` of each of its recurrent modules. None for a policy that is not a
    module (a function, ``None``: TorchRL walks modules only) or where TorchRL is missing
    (then no env can be TorchRL's)."""
    if policy is None or not hasattr(policy, "apply"):
        return []
    try:
        from torchrl.envs.transforms import InitTracker
        from torchrl.modules.utils import get_primers_from_module
    except ImportError:
        return []
    from .torchrl_env import flat_transforms

    # strict=False: a module that cannot build its primer is passed over with a warning, as TorchRL does
    primers = get_primers_from_module(policy, warn=False, strict=False)
    return [InitTracker(init_key="is_init"), *flat_transforms(primers)]


def _wrap(entry: Any, transforms: list, where: str) -> Any:
    if isinstance(entry, (list, tuple)):
        return type(entry)(_wrap(item, transforms, f"{where}[{i}]") for i, item in enumerate(entry))
    check_not_torchrl(entry, where)  # (its own message, before the entry is hidden in a wrapper)
    if isinstance(entry, (str, gym.Env, VectorEnv)) or not (callable(entry) or is_torchrl_env(entry)):
        return entry
    return PolicyTransforms(entry, transforms)


class PolicyTransforms:
    """An entry of ``create_env_fn`` whose TorchRL env gets the policy's transforms that its
    specs lack (``missing``), appended when it is built."""

    def __init__(self, source: Any, transforms: list):
        self.source = source
        self.transforms = transforms
        self.__qualname__ = getattr(source, "__qualname__", type(source).__name__)

    def __call__(self, **kwargs: Any) -> Any:
        source = self.source
        if is_torchrl_env(source):  # (an instance: TorchRL envs are modules, callable too)
            if kwargs:
                raise ValueError("create_env_kwargs: given with an env instance, which is built already; pass a "
                                 "factory that takes the keywords instead.")
            env = source
        else:
            env = source(**kwargs)
        if not is_torchrl_env(env):
            return env
        for transform in missing(env, self.transforms):
            env = env.append_transform(transform)
        return env


def missing(env: Any, transforms: list) -> list:
    """Copies of the ``transforms`` whose keys ``env``'s observation and state specs lack,
    TorchRL's spec-based rule: an ``InitTracker`` unless a leaf is named its ``init_key``, a
    ``TensorDictPrimer`` unless all its keys are there."""
    from torchrl.envs.transforms import InitTracker, TensorDictPrimer

    keys: set = set()
    for name in ("full_observation_spec", "full_state_spec"):
        spec = getattr(env, name, None)
        if spec is not None:
            try:
                keys.update(spec.keys(True, True))
            except (RuntimeError, AttributeError):
                pass
    out = []
    for transform in transforms:
        if isinstance(transform, InitTracker):
            name = transform.init_key
            if any(k == name or (isinstance(k, tuple) and k[-1:] == (name,)) for k in keys):
                continue
        elif isinstance(transform, TensorDictPrimer) and set(transform.primers.keys(True, True)) <= keys:
            continue
        out.append(transform.clone())
    return out

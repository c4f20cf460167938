"""The collector's side of a policy: placement, runners, weight copies, state.

Every collector keeps its policy in the main process (envs may live elsewhere), so the
same :class:`PolicySetup` serves the in-process collector and the multi-worker ones:

* the policy is moved to ``policy_device`` (a copy, when it lives elsewhere);
* ``runner`` calls it batched; ``random_runner`` draws random actions for
  ``init_random_frames``;
* :meth:`weights_update` turns whatever ``update_policy_weights_`` was given into a
  function that copies the weights in place (to run between two policy calls).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import InteractionType

from .random import RandomPolicy
from .runner import PolicyRunner


def check_policy(policy: Any) -> None:
    if policy is not None and not callable(policy):
        raise TypeError(
            f"policy must be a TensorDictModuleBase, an nn.Module, a callable taking the "
            f"observation tensor, or None (random actions); got {type(policy).__name__}."
        )


def _place(policy: Any, device: torch.device | None) -> Any:
    """``policy`` on ``device``: itself if already there, else a copy moved there."""
    if device is None or not isinstance(policy, torch.nn.Module):
        return policy
    tensors = list(policy.parameters()) + list(policy.buffers())
    if all(t.device == device for t in tensors):
        return policy
    return copy.deepcopy(policy).to(device)


class PolicySetup:
    """A collector's policy and the runners that call it; see the module docstring."""

    def __init__(self, policy: Any, action_space: gym.Space, obs_keys: list, *,
                 device: torch.device | None, exploration_type: InteractionType):
        self.user_policy = policy
        if policy is None:
            policy = RandomPolicy(action_space)
        self.policy = _place(policy, device)
        self.runner = PolicyRunner(self.policy, obs_keys, device=device, exploration_type=exploration_type)
        self.random = self.policy if isinstance(self.policy, RandomPolicy) else RandomPolicy(action_space)
        self.random_runner = PolicyRunner(self.random, obs_keys, device=None, exploration_type=exploration_type)

    @property
    def has_weights(self) -> bool:
        return isinstance(self.policy, torch.nn.Module) and not isinstance(self.policy, RandomPolicy)

    def weights_update(self, policy_or_weights: Any) -> Callable[[], None] | None:
        """A function copying the new weights into the policy, or ``None`` if nothing to do.

        ``policy_or_weights``: a module (its parameters are copied), a TensorDict of
        parameters, a state dict, or ``None`` (take them from the policy given at
        construction; nothing to do when the collector runs that very object).
        """
        policy = self.policy
        if not isinstance(policy, torch.nn.Module):
            if policy_or_weights is None:
                return None
            raise TypeError("update_policy_weights_: the collector's policy has no weights (not an nn.Module).")
        src = self.user_policy if policy_or_weights is None else policy_or_weights
        if src is policy or src is None:
            return None
        if isinstance(src, torch.nn.Module):
            weights = TensorDict.from_module(src)
        elif isinstance(src, TensorDictBase):
            weights = src
        elif isinstance(src, dict):
            weights = None
        else:
            raise TypeError(
                "update_policy_weights_: expected a module, a TensorDict of parameters, a state "
                f"dict or None; got {type(src).__name__}."
            )

        def apply() -> None:
            with torch.no_grad():
                if weights is None:
                    policy.load_state_dict(src)
                else:
                    TensorDict.from_module(policy).update_(weights)

        return apply

    def state_dict(self) -> dict | None:
        return self.policy.state_dict() if self.has_weights else None

    def load_state_dict(self, state_dict: dict, strict: bool) -> None:
        if "policy_state_dict" in state_dict:
            self.policy.load_state_dict(state_dict["policy_state_dict"], strict=strict)
        elif strict and self.has_weights:
            raise KeyError("load_state_dict: 'policy_state_dict' missing (pass strict=False to skip it).")

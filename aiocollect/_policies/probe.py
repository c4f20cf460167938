"""Probing a policy before any worker starts: what it writes, and whether copies of it may act.

Before the workers start, the collector calls a scratch copy of the policy (``scratch_copy``:
a call may change a module's state) on zeros of the observations, as the engine would call
it:

* ``probe``: the outputs it writes, ``(key, dtype, per-env shape)`` each, which lay out its
  shared-memory fields (``_policies.actor.shared_fields``) and the ``OutputWriter`` that
  fills them; ``None`` where the workers cannot write them (a recurrent state, a dtype numpy
  lacks, one call per env, a failing call);
* ``own_state_changes``: why it must act in one place (a buffer its call changes, running
  statistics), or ``None``.

``_policies.actor`` gives the tour of where the policy acts.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from .._envs.spaces import NonFiniteAction
from .array import ArrayPolicy
from .outputs import check_outputs, is_shape_error, note_policy_inputs
from .runner import PolicyRunner


def scratch_copy(policy: Any) -> Any | None:
    """A deep copy of the policy for ``probe`` and then ``measure`` to call (a call may change
    a module's state: a ``BatchNorm``'s running stats...), so that the policy the collector
    runs and sends to the workers stays as it was; ``None`` if it cannot be copied (nor then
    pickled for the workers). One copy serves both: what the probe's call changed in it does
    not change what the calls cost."""
    try:
        if isinstance(policy, ArrayPolicy):  # (its own copy: a JAX policy's shares what XLA compiled)
            return policy.copy()
        return copy.deepcopy(policy)
    except Exception:  # noqa: BLE001 - a module that cannot be copied cannot be pickled either
        return None


def own_state_changes(policy: Any, obs_leaves: list, exploration_type: Any) -> str | None:
    """Why ``policy`` must act here, in one place, or ``None``: it changes its own state while
    acting, so copies in the workers would each change theirs apart, unseen by
    ``collector.policy`` and the checkpoints, and act otherwise than the one policy here.

    Found two ways: a submodule that keeps running statistics (``BatchNorm``, ``InstanceNorm``
    with ``track_running_stats``: they change in train mode, which the user may switch to at
    any time), or a buffer that one call on zeros of two envs' observations changes, replaces
    or adds, in train mode and in eval mode (a counter, an estimate...). ``policy`` is called, so
    it is a scratch copy (``scratch_copy``), left in the modes it had; torch's generator is left
    as it was. A call that fails says nothing (``probe``'s call then fails too)."""
    if isinstance(policy, ArrayPolicy):  # (a pure function of its weights: a JAX policy)
        return None
    for name, module in policy.named_modules():
        if getattr(module, "track_running_stats", False) and getattr(module, "running_mean", None) is not None:
            return (f"its {type(module).__name__} {name or '(the policy itself)'!r} keeps running statistics, "
                    "which it updates while acting in train mode")
    keys = [leaf.key for leaf in obs_leaves]
    runner = PolicyRunner(policy, keys, device=None, exploration_type=exploration_type)
    modes = [(m, m.training) for m in policy.modules()]
    rng = torch.random.get_rng_state()
    obs = zeros(obs_leaves, 2)
    try:
        for training in (policy.training, not policy.training):
            policy.train(training)
            before = {k: b.detach().clone() for k, b in policy.named_buffers()}
            runner(obs, 2)
            after = dict(policy.named_buffers())
            changed = sorted(set(before) ^ set(after)) or [
                k for k, b in before.items() if b.shape != after[k].shape or not torch.equal(b, after[k].detach())]
            if changed:
                return (f"its buffer{'s' if len(changed) > 1 else ''} {', '.join(map(repr, changed[:3]))} "
                        f"changed in a call ({'train' if training else 'eval'} mode)")
    except Exception:  # noqa: BLE001 - the probe's call fails too, and says nothing either
        return None
    finally:
        for m, training in modes:
            m.training = training
        torch.random.set_rng_state(rng)
    return None


class _NotTheirShape(Exception):  # (carries the policy's own error past ``probe``'s catch-all)
    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


def probe(policy: Any, obs_leaves: list, exploration_type: Any, check: Any) -> list[tuple[Any, np.dtype, tuple]] | None:
    """The policy's outputs as the workers will write them, ``(key, dtype, per-env
    shape)`` each, found by one call on zeros of two envs' observations, as the engine
    calls it; ``None`` if that call fails, writes what shared memory cannot hold
    (a dtype numpy lacks) or writes a recurrent state (``("next", key)``). ``policy`` is
    called, so it is a scratch copy (``scratch_copy``); torch's generator is left as it was.
    A call that fails on the shapes of its inputs (``outputs.is_shape_error``) raises, with a
    note naming them: the policy does not take the envs' observations."""
    keys = [leaf.key for leaf in obs_leaves]
    runner = PolicyRunner(policy, keys, device=None, exploration_type=exploration_type)
    if runner.kind not in ("module", "tensordict", "callable", "array"):
        return None
    n = 2
    obs = zeros(obs_leaves, n)
    state = torch.random.get_rng_state()
    try:
        try:
            out = runner(obs, n)
        except Exception as exc:
            if is_shape_error(exc):  # (not the zeros: its inputs' shapes) said now, before any worker starts
                note_policy_inputs(exc, obs, n, " (zeros shaped as the envs' observations, before any worker starts)")
                raise _NotTheirShape(exc) from exc
            return None  # then it runs centrally, where its first call says what is wrong
        if runner.per_env:  # (called once per env: central, where its calls are made so)
            return None
        check_outputs(out, n)
        specs = []
        for key, value in out.items():
            if isinstance(key, tuple) and key[0] == "next":
                return None
            value = _array(value)
            if key == "action":
                try:
                    value = check(value, n)
                except NonFiniteAction:  # (NaN on zeros, a division by their norm...: the layout is what counts)
                    pass
            if value.dtype.kind not in "biuf" or value.shape[0] != n:
                return None
            specs.append((key, value.dtype, tuple(value.shape[1:])))
        return specs
    except _NotTheirShape as wrapped:
        raise wrapped.error from None
    except Exception:  # noqa: BLE001 - then it runs centrally, where its first call says what is wrong
        return None
    finally:
        torch.random.set_rng_state(state)  # (the probe takes no draw from the user's generator)


def zeros(obs_leaves: list, n: int) -> dict:
    """Zeros of ``n`` envs' observations, as the engine hands them to the policy (``probe``'s
    and ``measure``'s calls)."""
    return {leaf.key: torch.from_numpy(np.zeros((n, *leaf.shape), dtype=leaf.dtype)) for leaf in obs_leaves}


def _array(value: Any) -> np.ndarray:
    return value if isinstance(value, np.ndarray) else value.detach().cpu().numpy()

"""Where the policy acts: in the main process (central), or a copy in each worker.

``_policies.actor`` gives the tour of the two placements; this module makes the choice,
once, while a worker collector is built (it reads the machine's cores and the
``AIOCOLLECT_POLICY_IN_WORKERS`` switch, so it lives with the collectors, above the workers).

**When** (``placement``, then ``_policies.costs.measure``): ``AIOCOLLECT_POLICY_IN_WORKERS=1`` forces it,
``0`` forbids it. Unset, it is chosen for a torch module on the CPU (no ``policy_device``
other than the CPU, no ``compile_policy``/``cudagraph_policy``, no lazy module), or a
``JaxPolicy`` on the CPU (never one on a GPU or TPU: ``ArrayPolicy.worker_actor``), when random
actions may go in runs (``reset_when_done``, no ``interruptor``), ``_policies.probe.probe`` finds outputs the
workers can write, and either the workers are at least as many as the usable cores (the
engine has no core of its own), or ``measure`` finds it cheaper: it times the policy's call
on one worker's envs on one thread, as a worker would make it, against the main process's
round over every worker (the call on all their envs, on the threads the workers leave free,
and the engine's own work for each worker), and keeps the policy here only if that round
costs no more than the one worker's call. A small MLP goes to the workers everywhere it was
measured: on 2 cores with one worker (1.0-2.6x the frames of central inference with 8-64
CartPole envs) and on 16 cores with 15 (1.6-2.6x); a large network on a machine with cores to
spare for its threads stays here. A recurrent policy (one that writes ``("next", key)``
state) stays central.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict.nn import TensorDictModule
from torch.nn.parameter import is_lazy

from .._policies import costs
from .._policies.array import ArrayPolicy
from .._policies.outputs import NUMPY_DTYPES
from .._policies.random import RandomPolicy
from .._workers.protocol import env_flag, usable_cores


def placement(policy: Any, *, num_workers: int, policy_device: Any, compiled: bool, runs: bool,
              choice: str = "auto") -> str:
    """Where the policy runs, as far as can be told before the probe (see the module docstring):

    * ``"workers"``: in the workers, asked for (``choice="workers"``, the collectors'
      ``policy_placement``; or ``AIOCOLLECT_POLICY_IN_WORKERS=1`` with ``"auto"``) or with no
      core left for the engine (as many workers as usable cores, or more);
    * ``"measure"``: it may run in either place; ``measure`` chooses;
    * ``"central"``: here, asked for (``"central"``, or ``AIOCOLLECT_POLICY_IN_WORKERS=0``);
    * ``"cannot"``: here, as the workers cannot run it (``cannot_act_in_workers`` says why).
    """
    forced = {"central": False, "workers": True}.get(choice, env_flag("AIOCOLLECT_POLICY_IN_WORKERS"))
    if forced is False:
        return "central"
    if cannot_act_in_workers(policy, policy_device=policy_device, compiled=compiled, runs=runs) is not None:
        return "cannot"
    return "workers" if forced or num_workers >= usable_cores() else "measure"


def cannot_act_in_workers(policy: Any, *, policy_device: Any, compiled: bool, runs: bool) -> str | None:
    """Why the workers cannot act with a copy of ``policy`` (``None``: they can, as far as can
    be told before the probe's call)."""
    if isinstance(policy, ArrayPolicy):  # (a JAX policy)
        return _array_policy_stays(policy, policy_device=policy_device, runs=runs)
    if not isinstance(policy, torch.nn.Module) or isinstance(policy, RandomPolicy):
        return "it is not a torch module (random actions, a plain function)"
    if compiled:
        return "it is compiled (compile_policy, cudagraph_policy), for this process"
    if not runs:
        return _NO_RUNS
    if policy_device is not None and torch.device(policy_device).type != "cpu":
        return f"it acts on {policy_device}, and the workers act on the CPU"
    if isinstance(policy, TensorDictModule) and not isinstance(policy.module, torch.nn.Module):
        return "it is a TensorDictModule around a plain function (a worker's copy is built from a module)"
    tensors = policy.state_dict(keep_vars=True).values()
    if any(not isinstance(t, torch.Tensor) for t in tensors):
        return "it has extra state (get_extra_state), not weights the workers' copies could load"
    if any(is_lazy(t) or t.device.type != "cpu" or t.dtype not in NUMPY_DTYPES for t in tensors):
        # (a lazy module takes its shapes at its first call, or from the first update)
        return "it has lazy, non-CPU or non-numpy tensors, which shared memory cannot hold"
    return None


_NO_RUNS = ("a batch may be cut after any step (interruptor) or envs wait for a reset "
            "(reset_when_done=False): the engine steps them one at a time")


def _array_policy_stays(policy: ArrayPolicy, *, policy_device: Any, runs: bool) -> str | None:
    """Why the workers cannot act with a copy of an ``ArrayPolicy`` (a JAX policy), or ``None``:
    one on the CPU can (its ``worker_actor``), with weights whose leaves shared memory holds."""
    if policy.worker_actor is None:
        where = "a GPU or TPU" if policy.accelerated else "this process only"
        return f"it is a {type(policy).__name__} that acts on {where}, batched here"
    if not runs:
        return _NO_RUNS
    if policy_device is not None and torch.device(policy_device).type != "cpu":
        return f"it acts on {policy_device}, and the workers act on the CPU"
    try:
        leaves = policy.weight_arrays()
    except Exception as exc:  # noqa: BLE001 - (leaves that are not arrays): it acts here
        return f"its weights cannot be laid out in shared memory ({type(exc).__name__}: {exc})"
    if any(a.dtype.kind not in "biuf" for a in leaves):
        return "its weights have leaves of a dtype shared memory does not hold (bfloat16...)"
    return None


def measure(policy: Any, obs_leaves: list, exploration_type: Any, envs_per_worker: list[int]) -> costs.Costs | None:
    """``_policies.costs.measure`` on this machine's usable cores (what the workers leave to
    the policy here)."""
    return costs.measure(policy, obs_leaves, exploration_type, envs_per_worker, usable_cores())

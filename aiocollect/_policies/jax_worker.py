"""A worker's own copy of a JAX policy: the local side of ``_policies.actor`` for a ``JaxPolicy``.

A ``JaxPolicy`` on the CPU acts in the workers as a small torch policy does (the collectors'
``policy_placement``): each worker process rebuilds it from the pickled policy (the function,
through cloudpickle, its params and its key), jits it there, and calls it on its own envs'
observations at each step, with no round trip to the main process. The rest is the torch
copy's (``WorkerActor``, which this extends): the action checked by ``env_actions``, the
outputs written by the same ``OutputWriter`` over the shared fields the probe laid out, the
policy's version stored next to them, errors that name the env.

What is JAX's own:

* **The process's JAX** (``configure``, before JAX is imported here): the CPU only
  (``JAX_PLATFORMS=cpu``: a CPU policy; a machine's GPU is the main process's), XLA on one
  thread (``--xla_cpu_multi_thread_eigen=false``, ``intra_op_parallelism_threads=1``: the
  workers are one per core, and would fight over the cores otherwise), synchronous dispatch
  (``jax_cpu_enable_async_dispatch=False``: a small policy's call costs half as much without
  the hand-off to JAX's dispatch thread), and the main process's ``jax_enable_x64`` (the
  outputs' dtypes, which the probe laid out there). A worker started from the warm launcher
  (``_workers.launcher``) imports JAX after the fork: the launcher never imports it.
* **Compiled before the first step** (``prepare``, while the worker starts): one program per
  part of its envs (each a row count), so no compile stalls the collection.
* **Weights** (``_policies.weights_board``): the board's fields are the params' leaves
  (``JaxPolicy.weight_arrays``' order); when the board's clock moved, they are copied (behind
  its sequence lock) into private buffers, which become the params as ``jax.Array`` s
  (``jax.device_put``: a call with ``jax.Array`` params costs less than with numpy ones).
* **Randomness**: a stochastic policy's key is folded with the worker's index, so each
  worker draws its own stream, the same from run to run for the same key; ``set_seed``
  folds the policy's key with the seed instead.

Imported by the worker process (``_workers.child``) only when it is given a JAX policy
(``payload``'s ``actor``).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import cloudpickle
import numpy as np
import torch

from .worker_actor import WorkerActor

XLA_ONE_THREAD = ("--xla_cpu_multi_thread_eigen=false", "intra_op_parallelism_threads=1")
"""The XLA flags a worker's JAX runs with, unless ``XLA_FLAGS`` sets them already."""


def configure(config: dict) -> None:
    """Set this process's JAX up for a worker's copy (see the module docstring), before JAX is
    imported here; a worker whose envs imported JAX already keeps its platform and flags."""
    if "jax" not in sys.modules:
        os.environ["JAX_PLATFORMS"] = "cpu"
        flags = os.environ.get("XLA_FLAGS", "").split()
        for flag in XLA_ONE_THREAD:
            if not any(f.split("=")[0] == flag.split("=")[0] for f in flags):
                flags.append(flag)
        os.environ["XLA_FLAGS"] = " ".join(flags)
    import jax

    for name, value in (("jax_enable_x64", bool(config.get("x64", False))),
                        ("jax_cpu_enable_async_dispatch", False)):
        try:
            jax.config.update(name, value)
        except Exception:  # noqa: BLE001 - (a backend started already by the envs' code): as it is
            pass


class JaxWorkerActor(WorkerActor):
    """A worker's copy of a ``JaxPolicy`` (``_workers.child``): ``act`` writes one step's
    actions and outputs for one part of its envs, as the engine's central call would."""

    def __init__(self, setup: dict, arrays: dict[str, np.ndarray], action_space: Any, obs_keys: list, seed: int,
                 *, worker: int = 0, first: int = 0):
        configure(setup.get("config") or {})
        import jax

        self._jax = jax
        torch.set_num_threads(1)  # (torch only views the shared fields here)
        self.policy = cloudpickle.loads(setup["policy"])
        policy = self.policy
        missing = [k for k in policy.in_keys if k not in obs_keys]
        if missing:
            raise KeyError(f"policy: in_keys {missing} are not observations of the envs, which are {obs_keys}.")
        self._inputs = [obs_keys.index(k) for k in policy.in_keys]
        """Where each of the policy's inputs is among the observations' leaves."""
        self._out_keys = list(policy.out_keys)
        self._base_key = policy._key
        if self._base_key is not None:
            policy._key = jax.random.fold_in(self._base_key, worker)
        self._call = self._call_policy
        self._interaction_unset = False  # (no interaction type: a JAX function)
        self._attach(setup, arrays, action_space, obs_keys, worker, first)
        self._tree = jax.tree.structure(policy.params)
        self._private = [np.array(a, copy=True) for a in self.board.arrays]
        """The params' leaves as last loaded from the board (``_load``)."""
        self.tensors = [torch.from_numpy(a) for a in self._private]  # (what ``WeightsBoard.read`` copies into)
        self.modules: list = []
        leaves = policy.weight_arrays()
        if [(a.shape, a.dtype) for a in leaves] != [(a.shape, a.dtype) for a in self._private]:
            got = [list(a.shape) for a in leaves]
            raise RuntimeError(f"policy: this worker's copy has params of shapes {got}, "
                               f"shared memory {[list(a.shape) for a in self._private]}.")
        self.seen, self.version = 0, 0
        self._clock = self.board.clock.data
        self._params()

    def _params(self) -> None:
        """The policy's params: the private leaves, on JAX's CPU device."""
        self.policy.params = self._jax.device_put(self._jax.tree.unflatten(self._tree, self._private))

    def prepare(self, obs: list[np.ndarray]) -> None:
        """Compile for one part of the envs now, while the worker starts, on its views of the
        observations (``obs``: each leaf's ``[slots, columns, envs, ...]`` view of the part's
        rows), rather than at its first step. The key does not move; a call that fails here is
        left for the real one to report, with its context."""
        policy = self.policy
        try:
            outs, _ = policy._jitted(policy.params, policy._key, *[obs[i][0, 0] for i in self._inputs])
            self._jax.block_until_ready(outs)
        except Exception:  # noqa: BLE001 - the real call reports it
            pass

    def reseed(self, seed: int) -> None:
        """A seeded reset (``set_seed``): a stochastic policy's draws restart from its key
        folded with ``seed``."""
        if self._base_key is not None:
            self.policy._key = self._jax.random.fold_in(self._base_key, seed)

    def _load(self) -> bool:
        if not super()._load():
            return False
        self._params()  # (the leaves just copied in, as the params of the next call)
        return True

    def _column(self, obs: list[np.ndarray], s: int, t: int, lo: int, hi: int) -> tuple:
        """``(inputs, version part)`` of column ``t`` of slot ``s``: the policy's inputs as
        numpy views, in ``in_keys`` order."""
        column = ([obs[i][s, t] for i in self._inputs], self.version_field[s, t, lo:hi])
        self._columns[(lo, s, t)] = column
        return column

    def _call_policy(self, inputs: list[np.ndarray]) -> dict:
        result = self.policy(*inputs)
        if len(result) != len(self._out_keys):
            raise RuntimeError(f"policy: returned {len(result)} output(s) for out_keys {self._out_keys}.")
        return dict(zip(self._out_keys, result))

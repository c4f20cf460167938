"""A worker's own copy of the policy: the local side of ``_policies.actor``.

A thin client of what the engine uses: the policy is called as the engine's runner calls it
(a plain module's outputs mapped by ``_policies.outputs``, any other policy through a
``PolicyRunner``), its action checked by ``env_actions`` and its outputs written by an
``OutputWriter`` over the shared fields the probe laid out, its weights loaded from the
board (``_policies.weights_board``) before a step when they changed. What is the worker's
own: torch on one thread, its own seed, grad mode and interaction type set once for good
(this process only acts), and errors that name the env as the engine would.

Imported by the worker process (``_workers.child``) only when it is given a copy of the
policy; a plain module's worker does not import tensordict.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import cloudpickle
import numpy as np
import torch

from .._envs.spaces import ActionCheck, NonFiniteAction
from .._errors import PolicyError
from .direct_calls import direct_calls
from .output_writer import OutputWriter, env_actions, host_view
from .outputs import check_outputs, module_outputs
from .weights_board import SEQ, WeightsBoard, weight_tensors


class WorkerActor:
    """A worker's copy of the policy (``_workers.child``): ``act`` writes one step's actions
    and outputs for one part of its envs, as the engine's central call would."""

    def __init__(self, setup: dict, arrays: dict[str, np.ndarray], action_space: Any, obs_keys: list, seed: int,
                 *, worker: int = 0, first: int = 0):
        torch.set_num_threads(1)
        torch.manual_seed(seed)
        torch.set_grad_enabled(False)  # (what the engine sets around each call, set once for good)
        self.policy = cloudpickle.loads(setup["policy"])
        self._call = self._caller(setup, obs_keys)
        self._exploration = setup["exploration_type"]
        self._interaction_unset = True
        """The interaction type (tensordict's) is not set yet: it lives in tensordict, so
        it is set once something imported tensordict (the policy's unpickling, or its own
        call: see ``_act``)."""
        if "tensordict" in sys.modules:
            self._set_interaction()
        direct_calls(self.policy)  # (a private copy: its submodules skip __call__'s empty checks)
        self._attach(setup, arrays, action_space, obs_keys, worker, first)
        self.tensors = weight_tensors(self.policy)
        self.modules = list(self.policy.modules())
        if setup["in_keys"] is not None:  # (the collector's policy is the TensorDictModule around it)
            self.modules.insert(0, torch.nn.Module())
        shapes = [tuple(a.shape) for a in self.board.arrays]
        if shapes != [tuple(t.shape) for t in self.tensors]:
            got = [list(t.shape) for t in self.tensors]
            raise RuntimeError(f"policy: this worker's copy has weights of shapes {got}, "
                               f"shared memory {[list(x) for x in shapes]}.")
        self.seen, self.version = 0, 0
        self._clock = self.board.clock.data
        """The weights' clock, read as Python ints (no numpy scalar made at each step)."""

    def _attach(self, setup: dict, arrays: dict[str, np.ndarray], action_space: Any, obs_keys: list,
                worker: int, first: int) -> None:
        """What every worker's copy of a policy (torch or JAX) takes from its setup: the
        observations it reads, the action check, the output writer over the shared fields and
        the weights board."""
        self.obs_keys = obs_keys
        self._columns: dict[tuple, tuple] = {}
        """Per part, slot and column (``_column``): the policy's input tensors and the
        version's part, made once (the writer keeps its outputs' views likewise)."""
        self.check = ActionCheck.for_space(action_space)
        self.worker, self.first = worker, first
        """This worker's index, and the row of its env 0 (errors name an env as the engine does)."""
        self.keys = tuple(setup["keys"])
        self._acts = "action" in self.keys
        self.writer = OutputWriter(*arrays["version"].shape)
        self.writer.adopt([(key, arrays[f"out{i}"].dtype, arrays[f"out{i}"].shape[3:])
                           for i, key in enumerate(self.keys)], arrays)
        self.version_field = arrays["version"]
        self.board = WeightsBoard(arrays)

    def _caller(self, setup: dict, obs_keys: list) -> Any:
        """The call of the policy on one step's inputs, as the engine's runner makes it."""
        if setup["in_keys"] is None:
            from .runner import PolicyRunner  # (imports tensordict: only for a policy that needs it)

            return PolicyRunner(self.policy, obs_keys, device=None, exploration_type=None).call_bare
        module, in_keys, out_keys = self.policy, setup["in_keys"], setup["out_keys"]
        return lambda obs: module_outputs(module(*[obs[k] for k in in_keys]), out_keys)

    def _set_interaction(self) -> None:
        from tensordict.nn import InteractionType, set_interaction_type  # (imported already: see __init__)

        set_interaction_type(InteractionType[self._exploration]).__enter__()
        self._interaction_unset = False

    def reseed(self, seed: int) -> None:
        """A seeded reset (``set_seed``): the policy's own draws restart from ``seed`` too."""
        torch.manual_seed(seed)

    def act(self, obs: list[np.ndarray], action: np.ndarray, s: int, t: int, lo: int, hi: int) -> None:
        """Column ``t`` of slot ``s`` for rows ``lo:hi``: the policy's outputs from the
        observations ``obs`` (each leaf's ``[slots, columns, envs, ...]`` view of these rows;
        column ``t`` is read as tensors made once per column), the envs' actions into ``action``."""
        try:
            self._act(obs, action, s, t, lo, hi)
        except BaseException as exc:
            try:
                exc._aiocollect_policy = True  # type: ignore[attr-defined]  # (a mark: the engine raises it as the policy's)
            except AttributeError:
                pass
            raise

    def _act(self, obs: list[np.ndarray], action: np.ndarray, s: int, t: int, lo: int, hi: int) -> None:
        # (runs at every step of every env part: each numpy or torch call here costs a few
        # microseconds once the envs' own code has taken the caches, so there are few)
        if self._clock[SEQ] != self.seen:
            self._load()
        inputs, version = self._columns.get((lo, s, t)) or self._column(obs, s, t, lo, hi)
        out = self._call(inputs)
        if self._interaction_unset and "tensordict" in sys.modules:
            # this call imported tensordict (a policy that imports it in its forward): it read no
            # interaction type; once the collector's is set, the call is made again, under it
            self._set_interaction()
            out = self._call(inputs)
        if tuple(out) != self.keys:
            raise KeyError(f"policy: wrote {list(out)!r} at this step but {list(self.keys)!r} at its first call; "
                           "a policy must write the same keys at every step.")
        n = hi - lo
        stored = None
        if self._acts:
            value = out["action"]
            try:
                value = host_view(value)
                fits = value.shape[:1] == (n,)
            except Exception:  # noqa: BLE001 - not a tensor, no data: the engine's message, next
                fits = False
            if not fits:
                check_outputs(out, n)
            try:
                stored, to_env = env_actions(self.check, value, n)
            except NonFiniteAction as exc:  # (the engine's error, naming the env as it does)
                raise PolicyError.not_finite(exc.value, worker=self.worker, env=lo + exc.row - self.first,
                                             pid=os.getpid()) from None
            action[...] = to_env
        self.writer.write_block(s, t, lo, hi, out, stored, rows=n)
        version[...] = self.version

    def _load(self) -> bool:
        """Load new weights from the board, if the collector published any since the last
        load: whether it did."""
        got = self.board.read(self.tensors, self.seen, self.modules)
        if got is None:
            return False
        self.seen, self.version = got
        return True

    def _column(self, obs: list[np.ndarray], s: int, t: int, lo: int, hi: int) -> tuple:
        """``(inputs, version part)`` of column ``t`` of slot ``s``, rows ``lo:hi``."""
        column = ({key: torch.from_numpy(x[s, t]) for key, x in zip(self.obs_keys, obs)},
                  self.version_field[s, t, lo:hi])
        self._columns[(lo, s, t)] = column
        return column

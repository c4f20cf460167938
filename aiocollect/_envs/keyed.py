"""Envs whose steps are more than one action, one reward and one done flag: TorchRL's
multi-agent and nested-key envs, as the engine sees them.

The engine moves one action per env from the policy to the envs and keeps one reward and
one pair of flags per env for its own bookkeeping (episode ends, trajectory ids, returns).
A TorchRL env may instead have several action keys (``("agents", "agent_0", "action")``,
``("nested_1", "action")``...), rewards and done flags per agent group, and none of them at
the root. Two spaces describe such an env without changing the engine:

* ``KeyedActions``: the env's actions, one per key, each with a gymnasium space. The policy
  writes each under its key (stored as written, like any policy output); the engine checks
  each against its space (``KeyedActionCheck``) and hands the envs all of them packed into
  one row of bytes per env, which the env side unpacks. So the worker processes, the shared
  memory and the rounds move one array, whatever the number of keys.
* ``EnvEntries``: the env's observation space (a ``Dict``) with the entries TorchRL keeps
  beside observations: done flags per group (at the root of each frame and under ``"next"``,
  as observations are) and rewards per group (under ``"next"`` only). It also says which of
  the engine's own root entries (``"reward"``, ``"done"``, ``"terminated"``, ``"truncated"``)
  the env has, so a batch holds exactly the keys TorchRL's would, and the shape of each
  group (a ``("data",)`` group of 3 agents has batch dims ``[..., 3]`` in TorchRL's batches).

This module is numpy only: workers import it without torch.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from gymnasium import spaces

from .spaces import ActionCheck, NestedKey, NonFiniteAction, _leaf_dtype_shape

ENGINE_FLAGS = ("reward", "done", "terminated", "truncated")
"""The root entries the engine writes itself for every env."""


def _name(key: NestedKey) -> str:
    return repr(key)


class KeyedActions(spaces.Box):
    """The actions of an env with several (or nested) action keys, as one row of bytes per env.

    ``keys[i]``'s action has the gymnasium space ``parts[i]``, stored in the row at
    ``offsets[i]`` as ``dtypes[i]`` of shape ``shapes[i]``. To the engine it is a ``Box`` of
    ``uint8`` (what moves through shared memory); ``pack`` and ``unpack`` convert.
    """

    def __init__(self, keys: list[NestedKey], parts: list[spaces.Space]):
        self.keys, self.parts = tuple(keys), tuple(parts)
        self.dtypes, self.shapes, self.offsets = [], [], []
        offset = 0
        for key, part in zip(self.keys, self.parts):
            dtype, shape = _leaf_dtype_shape(part, f"action {key!r}")
            offset = -(-offset // dtype.itemsize) * dtype.itemsize  # each part aligned to its dtype
            self.dtypes.append(dtype)
            self.shapes.append(shape)
            self.offsets.append(offset)
            offset += dtype.itemsize * math.prod(shape)
        super().__init__(0, 255, (max(offset, 1),), np.uint8)

    def pack(self, values: list[np.ndarray], num_envs: int) -> np.ndarray:
        """One byte row per env holding ``values[i]`` (``[num_envs, *shapes[i]]``, cast to ``dtypes[i]``)."""
        rows = np.zeros((num_envs, self.shape[0]), np.uint8)
        for value, dtype, shape, offset in zip(values, self.dtypes, self.shapes, self.offsets):
            size = dtype.itemsize * math.prod(shape)
            part = np.ascontiguousarray(np.asarray(value).reshape(num_envs, *shape), dtype=dtype)
            rows[:, offset : offset + size] = part.reshape(num_envs, -1).view(np.uint8)
        return rows

    def unpack(self, rows: np.ndarray) -> list[np.ndarray]:
        """Each key's actions from byte rows ``[..., nbytes]`` (one env's row, or a batch): copies."""
        rows = np.ascontiguousarray(rows, dtype=np.uint8)
        lead = rows.shape[:-1]
        out = []
        for dtype, shape, offset in zip(self.dtypes, self.shapes, self.offsets):
            size = dtype.itemsize * math.prod(shape)
            part = rows[..., offset : offset + size].copy().view(dtype)
            out.append(part.reshape((*lead, *shape)))
        return out

    def sample(self, mask: Any = None, probability: Any = None) -> np.ndarray:
        """One env's random action (each key's space sampled), packed."""
        return self.pack([np.asarray(p.sample())[None] for p in self.parts], 1)[0]

    def seed(self, seed: int | None = None) -> list[int]:
        """Seed each key's space (with ``seed + i``: the parts draw independently)."""
        seeds: list[int] = []
        for i, part in enumerate(self.parts):
            got = part.seed(None if seed is None else seed + i)
            seeds += got if isinstance(got, list) else [got]
        return seeds

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, KeyedActions) and self.keys == other.keys and self.parts == other.parts

    def __hash__(self) -> int:
        return hash(self.keys)

    def __repr__(self) -> str:
        return "KeyedActions(" + ", ".join(f"{k!r}: {p}" for k, p in zip(self.keys, self.parts)) + ")"


class KeyedActionCheck:
    """``ActionCheck`` for a ``KeyedActions`` space: each key's action checked against its
    own space, as a lone ``"action"`` is, then packed for the envs."""

    def __init__(self, space: KeyedActions):
        self.space = space
        self.keys = space.keys
        self.checks = [ActionCheck.for_space(p) for p in space.parts]
        self.dtype, self.shape = np.dtype(np.uint8), tuple(space.shape)

    def check(self, out: dict[NestedKey, Any], num_envs: int, as_array: Any) -> tuple[dict, np.ndarray]:
        """The policy outputs ``out`` with each action checked (a converted one replacing
        it), and the packed actions the envs get. ``as_array``: a tensor as numpy."""
        missing = [k for k in self.keys if k not in out]
        if missing:
            raise KeyError(
                f"policy: the env takes actions under {list(self.keys)!r}, and the policy wrote no "
                f"{', '.join(_name(k) for k in missing)} (it wrote {list(out)!r}). Write each action "
                "key of the env (a TensorDictModule's out_keys, or one module per agent group)."
            )
        values = []
        for key, check in zip(self.keys, self.checks):
            action = out[key]
            if not isinstance(action, np.ndarray):
                action = as_array(action)
            try:
                checked = check(action, num_envs)
            except NonFiniteAction:
                raise
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"{key!r}: {exc}") from None
            if checked is not action:
                out = {**out, key: checked}
            values.append(check.env_action(checked))
        return out, self.space.pack(values, num_envs)


def action_check(space: spaces.Space) -> ActionCheck | KeyedActionCheck:
    """The check of a policy's actions for envs of action space ``space``: a
    ``KeyedActionCheck`` for several action keys, an ``ActionCheck`` for any other space."""
    return KeyedActionCheck(space) if isinstance(space, KeyedActions) else ActionCheck.for_space(space)


class EnvEntries(spaces.Dict):
    """An env's observation space with the other entries TorchRL keeps per step (see the
    module docstring).

    Args:
        tree: the nested dict of ``Box`` leaves (observations, done flags, rewards).
        next_only: keys of leaves a batch holds under ``"next"`` only (rewards).
        engine_flags: which of ``ENGINE_FLAGS`` the batch holds (all; none, for an env with
            rewards and flags per group; all but ``"truncated"``, for an env without one). The
            engine keeps every one of them for itself, whatever a batch holds.
        group_shapes: per nested group (a key prefix), its own batch dims (``(3,)`` for
            three agents), as TorchRL's sub-TensorDicts have them.
        env_batch: the batch dims of an env with more than one (``(5, 2)``): its envs are
            stepped as ``5 * 2`` rows, and a batch has TorchRL's ``[5, 2, time]`` dims.
        not_observations: the keys of the leaves that are done flags or rewards.
    """

    def __init__(self, tree: dict[str, Any], next_only: frozenset, engine_flags: tuple[str, ...],
                 group_shapes: dict[tuple[str, ...], tuple[int, ...]], env_batch: tuple[int, ...] = (),
                 not_observations: frozenset = frozenset()):
        super().__init__(tree)
        self.not_observations = frozenset(not_observations)
        """The keys of the done flags and rewards among the leaves (``compact_obs`` keeps them)."""
        self.next_only = frozenset(next_only)
        self.engine_flags = tuple(engine_flags)
        self.group_shapes = dict(group_shapes)
        self.env_batch = tuple(env_batch)

    def __eq__(self, other: Any) -> bool:
        return (isinstance(other, EnvEntries) and super().__eq__(other) and self.next_only == other.next_only
                and self.engine_flags == other.engine_flags and self.group_shapes == other.group_shapes
                and self.env_batch == other.env_batch and self.not_observations == other.not_observations)

    __hash__ = None  # type: ignore[assignment]


NO_ENTRIES: tuple[frozenset, tuple[str, ...], dict, tuple[int, ...]] = (frozenset(), ENGINE_FLAGS, {}, ())
"""``batch_entries`` of a gymnasium env: no entry but its observations, every engine flag, no group."""


def batch_entries(space: Any, truncates: bool = False) -> tuple[frozenset, tuple[str, ...], dict, tuple[int, ...]]:
    """``(next_only, engine_flags, group_shapes, env_batch)`` of an observation space: an
    ``EnvEntries``' own, and for any other space ``NO_ENTRIES``. ``truncates``: the collector
    itself truncates (``max_frames_per_traj``, ``set_truncated``), so a batch of an env with
    the engine's flags but no ``"truncated"`` of its own has one, as TorchRL's has then."""
    if not isinstance(space, EnvEntries):
        return NO_ENTRIES
    flags = space.engine_flags
    if truncates and flags and "truncated" not in flags:
        flags = ENGINE_FLAGS
    return space.next_only, flags, space.group_shapes, space.env_batch


def observation_keys(space: Any, keys: list) -> list:
    """The keys among ``keys`` (an observation space's leaves') that are observations: all of
    them, but an ``EnvEntries``' done flags and rewards."""
    drop = space.not_observations if isinstance(space, EnvEntries) else ()
    return [k for k in keys if k not in drop]


def grouped(space: Any) -> bool:
    """Whether an env of observation space ``space`` has its rewards and done flags per group
    (``EnvEntries`` keeping none of the engine's flags)."""
    return isinstance(space, EnvEntries) and not space.engine_flags

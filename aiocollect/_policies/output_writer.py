"""Turning a policy's outputs into rows of the storage: one writer, wherever the policy acts.

The engine (``_engine.storage.RolloutStorage``, central inference) and a worker acting with
its own copy of the policy (``_policies.worker_actor``) write a policy call's outputs the
same way, with one ``OutputWriter``: its fields are ``[slots, columns, rows, ...]`` arrays,
one per output key, either allocated here at the key's first call (``field``: central
inference, where the first call lays them out) or handed over from shared memory, laid out
before the workers started from the probe's call (``adopt``: ``_policies.probe``). For each
output ``write``:

* converts the value to what numpy holds (a view of a CPU tensor; a dtype numpy lacks, such
  as bfloat16, goes to a torch field instead);
* checks it against the field: the per-env shape of its first call (numpy would broadcast a
  1 without a word) and a dtype that casts to the field's without changing kind;
* stores it at the index given (a block of rows at one column, or rows each at its own
  column), the action as the check made it (``env_actions``).

``env_actions`` is the action check both places make: the stored action (booleans for a
discrete space...) and what the envs are given (one-hot rows as indices).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._envs.spaces import NestedKey
from .outputs import check_outputs, dtype_changed, host_array, shape_changed


@dataclass(frozen=True)
class OutputSpec:
    """Per-env shape and dtype of one policy output."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @classmethod
    def of(cls, value: Any) -> OutputSpec:
        if isinstance(value, np.ndarray):  # possibly read-only (a JAX output): no tensor
            return cls(tuple(value.shape[1:]), torch.from_numpy(np.empty(0, value.dtype)).dtype)
        t = torch.as_tensor(value)
        return cls(tuple(t.shape[1:]), t.dtype)


def env_actions(check: Any, action: np.ndarray, num_envs: int) -> tuple[np.ndarray, np.ndarray]:
    """``(stored, to_env)``: ``action`` (``num_envs`` rows) as ``check`` (an ``ActionCheck``)
    accepts it, the batch stores it, and the envs take it (one-hot rows as indices).

    Raises:
        NonFiniteAction: a NaN or infinite action (its row says which env's).
    """
    stored = check(action, num_envs)
    return stored, check.env_action(stored)


def host_view(value: Any) -> np.ndarray:
    """``value`` as numpy holds it: a CPU tensor's view at the cost of one call, else
    ``host_array`` (another device, a dtype numpy lacks as float32)."""
    if isinstance(value, np.ndarray):
        return value
    try:
        return value.numpy()
    except (TypeError, RuntimeError):  # (on a GPU, needing grad, a dtype numpy lacks)
        return host_array(value)


def _torch_index(at: tuple) -> tuple:
    return tuple(torch.from_numpy(i) if isinstance(i, np.ndarray) else i for i in at)


class OutputWriter:
    """The fields of a policy's outputs, ``[slots, columns, rows, ...]`` each; see the module docstring."""

    def __init__(self, slots: int, columns: int, rows: int):
        self.size = (slots, columns, rows)
        self.specs: dict[NestedKey, OutputSpec] = {}
        """Each output's per-env shape and dtype (its first call's, or the probe's)."""
        self.tensors: dict[NestedKey, torch.Tensor] = {}
        """Each output's field as a tensor."""
        self.arrays: dict[NestedKey, np.ndarray | None] = {}
        """The same fields as numpy arrays (``None``: a dtype numpy lacks, the tensor only)."""
        self._blocks: dict[tuple[int, int, int, int], dict[NestedKey, Any]] = {}
        """Per block of rows at a column (``write_block``): each field's view there, made once."""

    def adopt(self, outputs: list[tuple[NestedKey, np.dtype, tuple]], arrays: dict[str, np.ndarray]) -> None:
        """The outputs (``(key, dtype, per-env shape)`` each, the probe's) live in the fields
        ``out{i}`` of ``arrays`` (shared memory, where the workers write them)."""
        for i, (key, _, shape) in enumerate(outputs):
            x = arrays[f"out{i}"]
            self.arrays[key], self.tensors[key] = x, torch.from_numpy(x)
            self.specs[key] = OutputSpec(tuple(shape), self.tensors[key].dtype)

    def field(self, key: NestedKey, value: Any) -> np.ndarray | None:
        """The field of output ``key``, laid out from ``value`` (one call's, a row per env)
        if it has none yet."""
        dst = self.arrays.get(key, False)
        if dst is not False:
            return dst
        spec = self.specs[key] = OutputSpec.of(value)
        tensor = torch.zeros((*self.size, *spec.shape), dtype=spec.dtype)
        self.tensors[key] = tensor
        try:
            dst = tensor.numpy()
        except TypeError:  # a dtype numpy lacks (bfloat16...)
            dst = None
        self.arrays[key] = dst
        return dst

    def write(self, at: tuple, out: dict[NestedKey, Any], action: np.ndarray | None = None) -> None:
        """Store ``out`` (one call's outputs) at ``(s, cols, rows)`` of every field, index
        arrays: row ``j`` of each value to env ``rows[j]`` at its column ``cols[j]``.
        ``action``: the ``"action"`` as checked (``env_actions``), stored instead of
        ``out["action"]``."""
        for key, value in out.items():
            dst = self.field(key, value)
            value = self._value(key, value, dst is not None, action, None, None, out)
            if dst is None:  # a dtype numpy lacks: its torch field
                self.tensors[key][_torch_index(at)] = value  # (index_put takes only its own dtype)
            else:
                dst[at] = value

    def write_block(self, s: int, t: int, lo: int, hi: int, out: dict[NestedKey, Any],
                    action: np.ndarray | None = None, part: slice | None = None, rows: int | None = None) -> None:
        """Store ``out`` (one call's outputs) at column ``t`` of slot ``s``, envs ``lo:hi``,
        through views made once per block. ``action``: as for ``write``; ``part``: the rows of
        each value to store (``None``: all); ``rows``: the rows each value must have (checked
        where the caller did not check them: ``check_outputs``' message)."""
        views = self._blocks.get((s, t, lo, hi))
        if views is None:
            views = self._blocks[(s, t, lo, hi)] = {}
        for key, value in out.items():
            dst = views.get(key)
            if dst is None:
                field = self.field(key, value)
                dst = views[key] = (self.tensors[key] if field is None else field)[s, t, lo:hi]
            dst[...] = self._value(key, value, isinstance(dst, np.ndarray), action, part, rows, out)

    def _value(self, key: NestedKey, value: Any, numpy: bool, action: np.ndarray | None, part: slice | None,
               rows: int | None, out: dict[NestedKey, Any]) -> Any:
        """``value`` (output ``key`` of ``out``) as its field takes it (a numpy array; a
        tensor of the field's dtype where ``numpy`` is false), checked (see the module docstring)."""
        if key == "action" and action is not None:
            value = action if part is None else action[part]
        elif part is not None and isinstance(value, torch.Tensor) and value.device.type != "cpu":
            value = host_array(value[part])  # (copy only these rows over)
        elif numpy:
            try:
                value = host_view(value)
            except Exception:
                if rows is not None:
                    check_outputs(out, rows)  # (not a tensor, no data: its message)
                raise
            value = value if part is None else value[part]
        elif part is not None:
            value = value[part]
        if rows is not None and value.shape[:1] != (rows,):
            check_outputs(out, rows)
        spec = self.specs[key]
        if tuple(value.shape[1:]) != spec.shape:
            raise shape_changed(key, tuple(value.shape[1:]), spec.shape)  # (numpy would broadcast a 1)
        if not numpy:  # a dtype numpy lacks: its torch field's
            value = torch.as_tensor(value)
            first = self.tensors[key].dtype
            if value.dtype != first and (error := dtype_changed(key, value.dtype, first)):
                raise error
            return value.to("cpu", first)
        value = host_view(value)
        if value.dtype != self.arrays[key].dtype and (error := dtype_changed(key, value.dtype, self.arrays[key].dtype)):
            raise error
        return value

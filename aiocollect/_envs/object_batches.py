"""Entries with no fixed shape, from their ``OBJECTS`` rows back into TensorDicts.

``_envs.objects`` carries an env's non-tensor entries and entries of a dynamic shape as a
pickled row per env and step. ``with_objects`` puts them back under their own keys, laid out
as TorchRL's collectors lay them out:

* a non-tensor entry is a ``NonTensorStack`` over the batch dims (``batch["nt"][t]`` is step
  ``t``'s value), a ``NonTensorData`` in a TensorDict with no batch dim;
* a tensor entry whose shape is the same everywhere is a plain tensor;
* where a tensor entry's shape differs (``EnvWithDynamicSpec``'s observation grows every step),
  the TensorDict is lazily stacked along its last dim (``"time"`` in a batch, the envs in a
  policy's input), each part with its own shapes, as TorchRL's ``Collector`` returns a
  ``LazyStackedTensorDict`` for such an env.

It imports torch and tensordict: the engine side only (workers use ``_envs.objects``).
"""

from __future__ import annotations

import numpy as np
import torch
from tensordict import LazyStackedTensorDict, NonTensorData, NonTensorStack, TensorDictBase

from .objects import OBJECTS, Tensor, decode_all

_PLACES = ((), ("next",))


def object_keys(td: TensorDictBase) -> list[tuple]:
    """The ``OBJECTS`` leaves of ``td`` (at its root and under ``"next"``)."""
    keys = set(td.keys(include_nested=True, leaves_only=True))
    return [(*p, OBJECTS) for p in _PLACES if ((*p, OBJECTS) if p else OBJECTS) in keys]


def with_objects(td: TensorDictBase) -> TensorDictBase:
    """``td`` without its ``OBJECTS`` leaves and with the entries they hold (see the module
    docstring); ``td`` itself when it has none."""
    found = object_keys(td)
    if not found:
        return td
    cells: dict[tuple, np.ndarray] = {}
    for key in found:
        decoded = decode_all(td.get(key if len(key) > 1 else OBJECTS).cpu().numpy())
        names = {k for d in decoded.flat for k in d}
        for name in names:
            path = (*key[:-1], *(name if isinstance(name, tuple) else (name,)))
            cells[path] = np.vectorize(lambda d, n=name: d.get(n), otypes=[object])(decoded)
    rest = td.exclude(*[k if len(k) > 1 else OBJECTS for k in found])
    return _fill(rest, cells)


def _fill(td: TensorDictBase, cells: dict[tuple, np.ndarray]) -> TensorDictBase:
    dims = tuple(td.batch_size)
    if all(_uniform(c) for c in cells.values()):
        for path, c in cells.items():
            _set(td, path, c)
        return td
    last = len(dims) - 1
    names = list(td.names)
    parts = [_fill(td[(..., t)], {p: c[..., t] for p, c in cells.items()}) for t in range(dims[-1])]
    out = LazyStackedTensorDict.lazy_stack(parts, dim=last)
    if any(n is not None for n in names):
        out.names = names
    return out


def _uniform(cell: np.ndarray) -> bool:
    shapes = {v.array.shape for v in cell.flat if isinstance(v, Tensor)}
    return len(shapes) <= 1


def _set(td: TensorDictBase, path: tuple, cell: np.ndarray) -> None:
    key = path[0] if len(path) == 1 else path
    values = list(cell.flat)
    arrays = [v.array for v in values if isinstance(v, Tensor)]
    if arrays and len(arrays) == len(values):
        td.set(key, torch.as_tensor(np.stack(arrays).reshape(*cell.shape, *arrays[0].shape), device=td.device))
    elif arrays:  # (padded frames: None where a tensor is due, zeros there)
        zero = np.zeros_like(arrays[0])
        full = [v.array if isinstance(v, Tensor) else zero for v in values]
        td.set(key, torch.as_tensor(np.stack(full).reshape(*cell.shape, *zero.shape), device=td.device))
    elif cell.ndim == 0:
        td.set(key, NonTensorData(cell.item()))
    else:
        td.set(key, NonTensorStack.from_list(cell.tolist()))


def without_objects(td: TensorDictBase) -> TensorDictBase:
    """``td`` less its ``OBJECTS`` leaves (their entries left out)."""
    found = object_keys(td)
    return td.exclude(*[k if len(k) > 1 else OBJECTS for k in found]) if found else td


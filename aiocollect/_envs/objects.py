"""Env entries that have no fixed shape, carried as objects: non-tensor entries (TorchRL's
``NonTensor`` specs: a string, an instruction, any Python value) and entries whose shape
changes from step to step (a ``-1`` dim in the spec: ``EnvWithDynamicSpec``'s growing
observation).

Everything else an env gives has a fixed shape per env and lives in shared memory, written by
the worker where it steps the env and read by the engine in place. These entries cannot be laid
out in advance, so the env side pickles a step's values of all of them (one dict per env) into
one more fixed-size observation leaf, ``OBJECTS``: a row of bytes per env, a 4-byte length and
the pickle. It travels as any observation does (shared memory, a worker's rows, the rollout
storage, root and ``"next"``), and the TensorDict side (``_envs.object_batches``) unpickles it
into the entries under their own keys: in each batch (lazily stacked where shapes differ, as
TorchRL's collectors give them) and in a TensorDict policy's input.

A row holds ``object_bytes()`` bytes (4096, or ``AIOCOLLECT_OBJECT_BYTES``): a step whose values
do not fit is an error that names the entries and the variable to raise.

This module is numpy only: workers import it without torch.
"""

from __future__ import annotations

import os
import pickle
from typing import Any

import numpy as np
from gymnasium import spaces

OBJECTS = "_objects"
"""The observation leaf holding a step's object entries (private: never in a delivered batch)."""

_HEADER = 4
_DEFAULT_BYTES = 4096


def object_bytes() -> int:
    """The bytes of an ``OBJECTS`` row: ``AIOCOLLECT_OBJECT_BYTES`` or 4096."""
    raw = os.environ.get("AIOCOLLECT_OBJECT_BYTES", "")
    if not raw:
        return _DEFAULT_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 64:
        raise ValueError(f"AIOCOLLECT_OBJECT_BYTES={raw!r}: give a whole number of bytes, at least 64 "
                         f"(default {_DEFAULT_BYTES}).")
    return value


def objects_space(nbytes: int) -> spaces.Box:
    """The space of an ``OBJECTS`` leaf of ``nbytes`` bytes."""
    return spaces.Box(0, 255, (nbytes,), np.uint8)


class Tensor:
    """A tensor entry's value for one env, as numpy (``decode`` gives it back as is: the
    TensorDict side makes a tensor of it); any other value is a non-tensor entry's."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray):
        self.array = array

    def __reduce__(self) -> tuple:
        return (Tensor, (self.array,))


def encode(values: dict, out: np.ndarray, where: str) -> None:
    """Pickle ``values`` (key -> ``Tensor`` or any object) into the byte row ``out``."""
    data = pickle.dumps(values, protocol=pickle.HIGHEST_PROTOCOL)
    room = out.shape[-1] - _HEADER
    if len(data) > room:
        sizes = {k: len(pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL)) for k, v in values.items()}
        raise ValueError(
            f"{where}: the entries without a fixed shape ({', '.join(f'{k!r}: {n} bytes' for k, n in sizes.items())}) "
            f"take {len(data)} bytes pickled, more than the {room} an env's step has for them. Raise "
            f"AIOCOLLECT_OBJECT_BYTES (now {out.shape[-1]}) in the environment of the process that builds "
            "the collector, or give those entries a fixed shape with a transform."
        )
    out[:_HEADER] = np.frombuffer(len(data).to_bytes(_HEADER, "little"), np.uint8)
    out[_HEADER : _HEADER + len(data)] = np.frombuffer(data, np.uint8)


def decode(row: np.ndarray) -> dict:
    """The values ``encode`` wrote into ``row`` (an empty dict for a row never written: a
    padded frame, or zeros)."""
    n = int.from_bytes(row[:_HEADER].tobytes(), "little")
    if n == 0:
        return {}
    return pickle.loads(row[_HEADER : _HEADER + n].tobytes())


def decode_all(rows: np.ndarray) -> np.ndarray:
    """``decode`` of every row of ``rows`` (``[*dims, nbytes]``): an object array ``[*dims]`` of dicts."""
    out = np.empty(rows.shape[:-1], dtype=object)
    for idx in np.ndindex(*rows.shape[:-1]):
        out[idx] = decode(rows[idx])
    return out


def has_objects(space: Any) -> bool:
    """Whether an observation space carries object entries (an ``OBJECTS`` leaf)."""
    return isinstance(space, spaces.Dict) and OBJECTS in space.spaces

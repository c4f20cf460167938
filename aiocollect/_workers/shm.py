"""Shared memory laid out from the spaces: where env results and actions cross processes.

One segment serves every worker of a collector. It holds, for each field, one array with
a row per env (all workers' envs, worker ``k`` owning rows ``lo_k:hi_k``):

==============  ==========================================================================
field           meaning
==============  ==========================================================================
``obs{i}``      observation leaf ``i``: the latest result (a *final* observation for an
                env that just finished)
``reset_obs{i}``  the first observation of the next episode, for envs the worker already
                reset on its own (``pre_reset`` set)
``action``      the actions the engine wants the worker to take
``reward``,     the latest step's results
``terminated``,
``truncated``
``pre_reset``   the worker reset this env after it finished; ``reset_obs`` holds the result
``reset_mask``  which envs a ``RESET`` command resets
``seed``,       per-env seeds for that reset (``seed_set`` false: no seed)
``seed_set``
==============  ==========================================================================

After the per-env fields comes the *control block*: one 64-byte line of ``int64`` per
worker (not per env), through which commands and completions pass (see
``_workers.protocol``).

The segment is anonymous (``memfd_create``): it has no name under ``/dev/shm``, is
handed to the workers as an inherited file descriptor, and disappears when the last
process that maps it exits, so nothing can leak, not even after ``SIGKILL``. Where
``memfd_create`` is missing (macOS), a POSIX segment is created and unlinked at once,
which gives the same guarantee.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass

import numpy as np

_ALIGN = 64
CONTROL_WORDS = _ALIGN // 8
"""int64 words per worker in the control block: one cache line each."""


@dataclass(frozen=True)
class Field:
    name: str
    dtype: str
    shape: tuple[int, ...]
    """Full shape, rows first."""
    offset: int

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class Layout:
    """Where each field lives in the segment; small and picklable, sent to every worker."""

    fields: tuple[Field, ...]
    size: int
    num_obs: int
    control: Field
    """``(workers, CONTROL_WORDS)`` int64: each worker's control line."""

    @classmethod
    def plan(cls, obs: list[tuple[np.dtype, tuple[int, ...]]], action: tuple[np.dtype, tuple[int, ...]],
             num_envs: int, num_workers: int) -> Layout:
        """``obs``: (dtype, per-env shape) of each observation leaf; ``action`` likewise."""
        specs: list[tuple[str, np.dtype, tuple[int, ...]]] = []
        for i, (dtype, shape) in enumerate(obs):
            specs.append((f"obs{i}", dtype, shape))
            specs.append((f"reset_obs{i}", dtype, shape))
        specs += [
            ("action", action[0], action[1]),
            ("reward", np.dtype(np.float32), ()),
            ("terminated", np.dtype(bool), ()),
            ("truncated", np.dtype(bool), ()),
            ("pre_reset", np.dtype(bool), ()),
            ("reset_mask", np.dtype(bool), ()),
            ("seed", np.dtype(np.int64), ()),
            ("seed_set", np.dtype(bool), ()),
        ]
        fields, offset = [], 0
        for name, dtype, shape in specs:
            field = Field(name, np.dtype(dtype).str, (num_envs, *shape), offset)
            fields.append(field)
            offset += -(-max(field.nbytes, 1) // _ALIGN) * _ALIGN
        control = Field("control", np.dtype(np.int64).str, (num_workers, CONTROL_WORDS), offset)
        return cls(tuple(fields), offset + control.nbytes, len(obs), control)


def create_segment(size: int) -> int:
    """A new zero-filled anonymous shared-memory file of ``size`` bytes; returns its fd."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("aiocollect", os.MFD_CLOEXEC)
    else:  # pragma: no cover - macOS
        import _posixshmem
        import secrets

        name = f"/aiocollect-{secrets.token_hex(8)}"
        fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        _posixshmem.shm_unlink(name)
        os.set_inheritable(fd, False)
    try:
        os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return fd


class SharedArrays:
    """Numpy views of every field of a mapped segment (``arrays[name]``, rows first).

    The mapping stays alive as long as any view (or tensor made from one) does.
    """

    def __init__(self, layout: Layout, fd: int):
        self.layout = layout
        self._map = mmap.mmap(fd, layout.size)
        self.arrays: dict[str, np.ndarray] = {}
        for f in layout.fields:
            count = int(np.prod(f.shape, dtype=np.int64))
            self.arrays[f.name] = np.frombuffer(self._map, f.dtype, count, f.offset).reshape(f.shape)
        c = layout.control
        self.control = np.frombuffer(self._map, c.dtype, c.shape[0] * c.shape[1], c.offset).reshape(c.shape)
        """Row ``k``: worker ``k``'s control line."""

    def rows(self, lo: int, hi: int) -> dict[str, np.ndarray]:
        """Every field restricted to rows ``lo:hi`` (views)."""
        return {name: a[lo:hi] for name, a in self.arrays.items()}

    def obs(self, rows: dict[str, np.ndarray], prefix: str = "obs") -> list[np.ndarray]:
        return [rows[f"{prefix}{i}"] for i in range(self.layout.num_obs)]


def set_aside_resets(obs: list[np.ndarray], reset_obs: list[np.ndarray], pre_reset: np.ndarray,
                     idx: np.ndarray, final: list[np.ndarray]) -> None:
    """After a worker reset finished envs ``idx`` on its own: their fresh observations move
    to ``reset_obs``, ``obs`` gets back their ``final`` ones (taken before the reset, with
    ``[a[idx] for a in obs]``), and ``pre_reset`` tells the engine so."""
    for a, r, f in zip(obs, reset_obs, final):
        r[idx] = a[idx]
        a[idx] = f
    pre_reset[idx] = True

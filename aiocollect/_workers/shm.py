"""Shared memory laid out from the spaces: the rollout storage that workers write into.

One segment serves every worker of a collector. Its *storage* fields hold whole batches,
laid out time-major, ``[K, T, N, ...]``: ``K`` batch slots (two, so that the next batch
fills while the last one waits to be delivered), ``T`` columns (steps per env of the
longest batch), ``N`` rows (all workers' envs, worker ``k`` owning rows ``lo_k:hi_k``).
A worker told to step column ``t`` of slot ``s`` writes what its envs return straight
into ``[s, t, lo:hi]``; column ``t`` of every env of a round is one contiguous block,
which is what the policy reads (a view, no copy).

==================  ==========================================================================
field               meaning
==================  ==========================================================================
``obs{i}``          ``[K, T + 1, N, ...]`` observation leaf ``i`` *before* each step: column
                    ``t + 1`` is written by the step of column ``t`` (the reset observation
                    for an env the worker reset after it finished); column ``T`` carries
                    the current observation over to the next batch
``next_obs{i}``     ``[K, T, N, ...]`` what each step returned (a *final* observation for an
                    env that just finished)
``reward``,         ``[K, T, N]`` each step's results (``truncated`` includes truncation by
``terminated``,     ``max_frames_per_traj``, which the worker applies)
``truncated``
``action``          ``[T, N, ...]`` the actions of each column's step, as the envs take them
                    (written by the engine before it posts the step, or the run of steps)
``reset_mask``      ``[N]`` which envs a ``RESET`` command resets
``seed``,           ``[N]`` per-env seeds for that reset (``seed_set`` false: no seed)
``seed_set``
==================  ==========================================================================

With the policy in the workers (``_policies.actor``), fields the collector adds
(``extra``) follow: the policy's outputs ``out{i}`` (``[K, T, N, ...]``, as the main
process stores them) and each step's ``version``; then the fields *kept* past shutdown
(``kept``: the weights the workers load, whose memory the collector's own copy of the policy
uses, ``_policies.weights_board``), which ``release`` leaves alone.

After the fields comes the *control block*: one 128-byte line of ``int64`` per lane (a
worker, or a part of a worker's envs: ``_workers.plan``; not per env), through which
commands, their slot and column, and completions pass (see ``_workers.protocol``).

The segment is anonymous (``memfd_create``): it has no name under ``/dev/shm``, is
handed to the workers as an inherited file descriptor, and disappears when the last
process that maps it exits, so nothing can leak, not even after ``SIGKILL``. Where
``memfd_create`` is missing (macOS), a POSIX segment is created and unlinked at once,
which gives the same guarantee. Pages are only backed once written, so columns a short
batch never uses cost nothing.

In this process the segment is mapped with libc's ``mmap`` (``Mapping``), which keeps no
descriptor of its own (Python's ``mmap`` keeps a duplicate until it is closed, which it
cannot be while a view exists): the pool closes its descriptor once the workers have
theirs. At ``shutdown()`` the fields that are not kept are swapped for private zero pages
(``SharedArrays.release``), so a collector object that outlives its shutdown (kept by its
caller, or by a traceback some library stored) holds no part of the segment, or, with the
policy in the workers, only the weights' pages.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

_ALIGN = 64
CONTROL_WORDS = 2 * _ALIGN // 8
"""int64 words per lane in the control block: two cache lines each."""


@dataclass(frozen=True)
class Field:
    name: str
    dtype: str
    shape: tuple[int, ...]
    """Full shape."""
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
    """``(lanes, CONTROL_WORDS)`` int64: each lane's control line."""
    slots: int = 2
    columns: int = 1
    kept_from: int = -1
    """Where the fields kept past ``SharedArrays.release`` begin (-1: none is kept)."""

    @classmethod
    def plan(cls, obs: list[tuple[np.dtype, tuple[int, ...]]], action: tuple[np.dtype, tuple[int, ...]],
             num_envs: int, num_lanes: int, columns: int = 1, slots: int = 2,
             extra: Sequence[tuple[str, np.dtype, tuple[int, ...]]] = (),
             kept: Sequence[tuple[str, np.dtype, tuple[int, ...]]] = ()) -> Layout:
        """``obs``: (dtype, per-env shape) of each observation leaf; ``action`` likewise;
        ``columns``: steps per env of the longest batch; ``slots``: batches held at once;
        ``extra``: more fields, ``(name, dtype, full shape)`` each; ``kept``: more still, whose
        memory ``SharedArrays.release`` keeps."""
        k, t, n = slots, columns, num_envs
        specs: list[tuple[str, np.dtype, tuple[int, ...]]] = []
        for i, (dtype, shape) in enumerate(obs):
            specs.append((f"obs{i}", dtype, (k, t + 1, n, *shape)))
            specs.append((f"next_obs{i}", dtype, (k, t, n, *shape)))
        specs += [
            ("reward", np.dtype(np.float32), (k, t, n)),
            ("terminated", np.dtype(bool), (k, t, n)),
            ("truncated", np.dtype(bool), (k, t, n)),
            ("action", action[0], (t, n, *action[1])),
            ("reset_mask", np.dtype(bool), (n,)),
            ("seed", np.dtype(np.int64), (n,)),
            ("seed_set", np.dtype(bool), (n,)),
            *extra,
        ]
        fields, offset, kept_from = [], 0, -1
        for i, (name, dtype, shape) in enumerate([*specs, *kept]):
            if i == len(specs) and kept:
                kept_from = offset
            field = Field(name, np.dtype(dtype).str, shape, offset)
            fields.append(field)
            offset += -(-max(field.nbytes, 1) // _ALIGN) * _ALIGN
        control = Field("control", np.dtype(np.int64).str, (num_lanes, CONTROL_WORDS), offset)
        layout = cls(tuple(fields), offset + control.nbytes, len(obs), control, k, t, kept_from)
        layout.check_fits()
        return layout

    def check_fits(self) -> None:
        """Raise ``ValueError`` if the storage, and the batch copied out of it, cannot fit
        in this machine's memory: checked before any process starts or memory is taken,
        rather than failing in an allocator at the first batch."""
        need = self.size + self.size // max(self.slots, 1)  # the slots, and one batch copied out
        have = physical_memory()
        if have is not None and need > have:
            raise ValueError(
                f"frames_per_batch: batches of {self.columns} steps per env need {_gib(need)} of memory "
                f"(the storage holds {self.slots} at once, and one more is copied out), more than this machine's "
                f"{_gib(have)}; use a smaller frames_per_batch (or fewer envs)."
            )


def physical_memory() -> int | None:
    """This machine's memory in bytes (``None`` where the OS does not say). A collector's
    storage is checked against it: what is free now may be free later."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return None


def available_memory() -> int | None:
    """Bytes of memory this machine can still give (Linux's ``MemAvailable``; elsewhere its
    whole memory), ``None`` where unknown. ``aiocollect collect`` checks its batches
    against it: a command runs now, with what is free now."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return physical_memory()


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:,.1f} GiB"


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


class Mapping:
    """A shared mapping of a segment's descriptor made with libc's ``mmap``, which keeps no
    descriptor (the caller may close its own at once); ``buffer`` is a ctypes array over it,
    for ``np.frombuffer``. It is unmapped once the last view of it is gone (a finalizer on
    ``buffer``, which every view made from it references)."""

    def __init__(self, fd: int, size: int):
        libc = _libc()
        assert libc is not None  # (the caller checked: ``SharedArrays``)
        addr = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == _MAP_FAILED:
            raise _errno_error(f"mmap of the shared segment ({size} bytes)")
        self.addr = addr
        self.buffer = (ctypes.c_char * size).from_address(addr)
        unmap = weakref.finalize(self.buffer, libc.munmap, addr, size)
        unmap.atexit = False  # (at exit, views may still be read by the collectors' own finalizers)

    def madvise(self, advice: int, start: int, length: int) -> None:
        if _libc().madvise(self.addr + start, length, advice) != 0:
            raise _errno_error("madvise")

    def zero_private(self, length: int) -> None:
        """Swap the first ``length`` bytes (whole pages) for private zero pages, in place: views
        of them read zeros, as after ``MADV_REMOVE``, and the segment is no longer mapped there."""
        flags = mmap.MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_FIXED
        if _libc().mmap(self.addr, length, mmap.PROT_READ | mmap.PROT_WRITE, flags, -1, 0) != self.addr:
            raise _errno_error("mmap of private zero pages")


_MAP_FAILED = ctypes.c_void_p(-1).value
_MAP_ANONYMOUS = getattr(mmap, "MAP_ANONYMOUS", 0x20)
_MAP_FIXED = 0x10  # (the same on Linux and macOS; Python's mmap module does not name it)


@functools.cache
def _libc():
    """libc with ``mmap``, ``munmap`` and ``madvise`` typed, or ``None`` where there is none."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int64]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    except (OSError, AttributeError):  # pragma: no cover - no libc to call
        return None
    return libc


def _errno_error(what: str) -> OSError:
    """The ``OSError`` of the libc call ``what`` that just failed (its ``errno``)."""
    err = ctypes.get_errno()
    return OSError(err, f"{what}: {os.strerror(err)}")


class SharedArrays:
    """Numpy views of every field of a mapped segment (``arrays[name]``, shaped as the layout says).

    The mapping stays alive as long as any view (or tensor made from one) does. ``fd``: the
    segment's descriptor (it may be closed once this is built), or -1 for memory of this
    process alone (a ``Collector``'s in-process envs).
    """

    def __init__(self, layout: Layout, fd: int):
        self.layout = layout
        self._map: mmap.mmap | Mapping
        buffer: Any
        if fd >= 0 and _libc() is not None:
            self._map = Mapping(fd, layout.size)
            buffer = self._map.buffer
        else:
            self._map = mmap.mmap(fd, layout.size)
            buffer = self._map
        self.arrays: dict[str, np.ndarray] = {}
        for f in layout.fields:
            count = int(np.prod(f.shape, dtype=np.int64))
            self.arrays[f.name] = np.frombuffer(buffer, f.dtype, count, f.offset).reshape(f.shape)
        c = layout.control
        self.control = np.frombuffer(buffer, c.dtype, c.shape[0] * c.shape[1], c.offset).reshape(c.shape)
        """Row ``k``: lane ``k``'s control line."""
        self._released = False

    def release(self) -> None:
        """Give the segment's memory back now, once no worker uses it (``shutdown()``): a
        collector object kept after its shutdown would otherwise hold its whole rollout
        storage until it is garbage-collected. The views stay valid and read zeros, but for
        the pages of the fields laid out as ``kept`` (from ``Layout.kept_from`` on). Mapped
        with ``Mapping``, those pages are private zero pages from then on, so the segment is
        not mapped there any more; elsewhere (``MADV_REMOVE``, Linux only) the segment's pages
        are punched out, and the mapping stays."""
        if self._released:
            return
        self._released = True
        kept = self.layout.kept_from
        end = self.layout.size if kept < 0 else kept // mmap.PAGESIZE * mmap.PAGESIZE
        if not end:
            return
        advice = getattr(mmap, "MADV_REMOVE", None)
        if advice is not None:
            try:
                self._map.madvise(advice, 0, end)  # (the segment's pages freed, for any mapping of it)
            except OSError:  # a file system without hole punching: the memory goes with the mappings
                pass
        if isinstance(self._map, Mapping):
            try:
                self._map.zero_private(end)
            except OSError:  # (out of mappings: the segment stays mapped until the views go)
                pass

    def obs(self, prefix: str = "obs") -> list[np.ndarray]:
        """The arrays of every observation leaf (``"obs"`` or ``"next_obs"``), in leaf order."""
        return [self.arrays[f"{prefix}{i}"] for i in range(self.layout.num_obs)]

"""Doorbells to sleeping workers through one futex word in shared memory (Linux).

A worker with no command to carry out sleeps (``_workers.protocol``: its ``W_ASLEEP`` word set).
The engine wakes it once it posted it a command. With a byte on the worker's socket, that was
one ``send`` per worker and step, each waking one process: 15 workers x 16 envs on 2 cores spent
a fifth of the engine's CPU in those calls (issue 54). Here every worker of a pool sleeps on
the same 32-bit word of the control block (``BELL``, in its first line), each with its own bit
(``1 << index % 32``), with ``FUTEX_WAIT_BITSET``; the engine rings the workers of a whole round
with **one** ``FUTEX_WAKE_BITSET`` whose mask holds their bits (``Bell.hold`` and
``Bell.release`` around the round), and the kernel wakes them together.

The word counts the engine's wakes: a worker reads it *before* it looks for a command, then
sleeps only while it still holds that count, so a wake between its look and its sleep is never
lost (the kernel compares the word under its lock). Waking a worker whose bit another shares
(more than 32 workers) costs that other a look and nothing more.

The count-then-look order needs the worker's two loads and the engine's two stores (the
command, then the count) seen in program order, which x86-64 guarantees and Python gives no
barrier for elsewhere (an aarch64 worker could see the new count with the old command, and
sleep through its ring): like spinning (``_workers.protocol``), the bell is x86-64 only.

The socket stays for the rest: ``CLOSE`` and the end of the engine. A sleeper wakes to read it
after ``FIRST_S``, then at intervals that double up to ``SLEEP_S`` (so a worker whose engine
died without a word still reads the end of the file and exits within about a second, and an
idle one costs one look a second), and the pool sets ``CLOSING`` and wakes everyone when it
closes. (A sleeper that spun first looks again after 1 ms: only then can a ring be missed,
see ``_workers.protocol``.)
Where futexes are missing (not Linux on x86-64, a ``syscall()``-less libc, a kernel or sandbox
that refuses ``FUTEX_WAIT_BITSET``: ``futex()`` tries it once) or switched off
(``AIOCOLLECT_FUTEX=0``, read as a pool is built), ``futex()`` is ``None`` and the doorbells are
bytes on the sockets, as before. A wait that fails all the same (an unexpected ``errno``) sleeps
its timeout out instead, so that no failure turns the sleep into a spin.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import sys
import time
from collections.abc import Callable

import numpy as np

BELL, CLOSING = 10, 11
"""Words of the control block's first line: the futex word (its low 32 bits) and the pool's
"closing: read your socket" flag."""
FIRST_S, SLEEP_S = 0.1, 1.0
"""How long a worker that did not spin first sleeps before a look at its socket; the longest
it sleeps without one (idle workers woke every 0.1 s: 4 of them cost 4-6 ms of CPU a second)."""
SWITCH = "AIOCOLLECT_FUTEX"
"""The environment variable that turns the bell off (``0``, ``false``, ``no``, ``off``)."""

_FUTEX_WAIT_BITSET, _FUTEX_WAKE_BITSET = 9, 10
_SYS_FUTEX = {"x86_64": 202, "amd64": 202}
"""The ``futex`` system call's number, on the machines the bell serves (see the docstring)."""
_AWAKE = (errno.EAGAIN, errno.EINTR, errno.ETIMEDOUT)
"""What a wait that works may fail with: the count moved, a signal, the timeout."""
_MAX_WAKE = 0x7FFFFFFF
_ALL = 0xFFFFFFFF


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def futex() -> Callable[..., int] | None:
    """``call(op, addr, val, timeout, bitset)``, the ``futex`` system call on this machine, or
    ``None`` where it is not available (then the doorbells go over the sockets; whether a pool
    rings it at all is ``wanted()``'s, the engine's decision, which its workers follow)."""
    if not sys.platform.startswith("linux"):
        return None
    number = _SYS_FUTEX.get(platform.machine().lower())
    if number is None:
        return None
    try:
        syscall = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):  # pragma: no cover - a libc without syscall()
        return None
    syscall.restype = ctypes.c_long
    nr, c_long, null = ctypes.c_long(number), ctypes.c_long, None

    def call(op: int, addr: ctypes.c_void_p, val: int, timeout: object, bitset: int) -> int:
        return syscall(nr, addr, c_long(op), c_long(val), timeout, null, c_long(bitset))

    return call if _works(call) else None


def _works(call: Callable[..., int]) -> bool:
    """Whether this kernel takes the bell's two operations: a wait on a word that does not
    hold the value given fails at once with ``EAGAIN``, a wake finds nobody."""
    word = ctypes.c_uint32(0)
    addr = ctypes.c_void_p(ctypes.addressof(word))
    if call(_FUTEX_WAIT_BITSET, addr, 1, None, _ALL) != -1 or ctypes.get_errno() != errno.EAGAIN:
        return False
    return call(_FUTEX_WAKE_BITSET, addr, _MAX_WAKE, None, _ALL) == 0


def wanted() -> Callable[..., int] | None:
    """``futex()``, unless ``AIOCOLLECT_FUTEX`` turns the bell off."""
    from .protocol import env_flag

    return None if env_flag(SWITCH) is False else futex()


def bit(index: int) -> int:
    """Worker ``index``'s bit of the futex word."""
    return 1 << (index % 32)


def _word(control: np.ndarray) -> np.ndarray:
    """The futex word: the low 32 bits of ``BELL`` in the control block's first line (x86-64
    is little-endian)."""
    return control[0, BELL : BELL + 1].view(np.int32)[:1]


class Bell:
    """The engine's side: wakes sleeping workers, those of a round with one system call."""

    def __init__(self, control: np.ndarray, call: Callable[..., int]):
        self._word = _word(control)
        self._line = control[0]
        self._addr = ctypes.c_void_p(self._word.ctypes.data)
        self._call = call
        self._count = int(self._word[0])
        self._held = 0
        self._pending = 0

    def ring(self, mask: int) -> None:
        """Wake the workers of ``mask`` (their ``bit``s), now or at ``release``."""
        if self._held:
            self._pending |= mask
        else:
            self._wake(mask)

    def hold(self) -> None:
        """Rings from now on wait for ``release`` (a round posts its commands meanwhile)."""
        self._held += 1

    def release(self) -> None:
        """Wake, at once, every worker rung since ``hold``."""
        self._held -= 1
        if not self._held and self._pending:
            mask, self._pending = self._pending, 0
            self._wake(mask)

    def close(self) -> None:
        """Every worker, awake or asleep, reads its socket now (the pool sent ``CLOSE``)."""
        self._line[CLOSING] = 1
        self._wake(_ALL)

    def _wake(self, mask: int) -> None:
        self._count = (self._count + 1) & _MAX_WAKE
        self._word[0] = self._count  # (before the call: a worker about to sleep sees it, and does not)
        self._call(_FUTEX_WAKE_BITSET, self._addr, _MAX_WAKE, None, mask)


class Sleeper:
    """A worker's side: sleeps until rung (or ``timeout``), without missing a ring."""

    def __init__(self, control: np.ndarray, index: int, call: Callable[..., int]):
        self._word = _word(control)
        self._line = control[0]
        self._addr = ctypes.c_void_p(self._word.ctypes.data)
        self._call = call
        self._bit = bit(index)
        self._until = _Timespec()
        self._ref = ctypes.byref(self._until)

    def count(self) -> int:
        """The engine's wakes so far: read it before looking for a command, and pass it to ``sleep``."""
        return int(self._word[0])

    @property
    def closing(self) -> bool:
        return bool(self._line[CLOSING])

    def sleep(self, count: int, timeout: float) -> bool:
        """Sleep until a wake for this worker after ``count``, or ``timeout`` seconds; ``True``
        if the time ran out (then look at the socket)."""
        end = time.clock_gettime(time.CLOCK_MONOTONIC) + timeout
        until = self._until
        until.tv_sec = int(end)
        until.tv_nsec = int((end - int(end)) * 1e9)
        if self._call(_FUTEX_WAIT_BITSET, self._addr, count, self._ref, self._bit) == -1 \
                and ctypes.get_errno() not in _AWAKE:  # (never a spin, whatever failed)
            time.sleep(max(end - time.clock_gettime(time.CLOCK_MONOTONIC), 0.0))
        return time.clock_gettime(time.CLOCK_MONOTONIC) >= end

"""How the engine and a worker talk: a control line in shared memory, and a socket pair.

The data of a step (actions, observations, rewards, flags) sits in shared memory; what
crosses over per step is a command and its completion, both in the worker's *control
line*, 128 bytes of ``int64`` words in the shared segment:

=============  =================================================================================
word           meaning
=============  =================================================================================
``CMD``        written by the engine: ``seq * 4 + code``, ``code`` being ``STEP_CODE`` (step every
               env with the actions in shared memory), ``RUN_CODE`` (``COUNT`` steps in a row,
               columns ``COL`` to ``COL + COUNT - 1``, each with its column's actions) or
               ``RESET_CODE`` (reset the envs in ``reset_mask``, with ``seed`` where
               ``seed_set``); ``seq`` counts commands
``SLOT``,      written by the engine before ``CMD``: the storage slot and column the command
``COL``        writes (``_workers.shm``): a step writes its results at column ``COL`` and the
               observations the next step starts from at ``COL + 1``; a reset writes its
               observations at ``COL``
``COUNT``      written by the engine before ``CMD``: the steps of a ``RUN``; lowered to 0 while
               the run goes on, it stops the run after the step under way
``DONE``       written by the worker: the ``seq`` of the last command it carried out
``AT``         written by the worker during a ``RUN``: the steps of it done so far (the
               watchdog's sign of life, and what the engine books)
``W_ASLEEP``   the worker is (about to be) asleep: wake it (``_workers.bell``: a futex wake, or
               a byte on its socket where there are no futexes)
``E_ASLEEP``   the engine is (about to be) blocked in its event loop: wake it with a byte
``POLICY``     written by the engine before ``CMD``: 1 if the worker computes each step's actions
               with its own copy of the policy (``_policies.actor``), 0 if they are in
               shared memory
``ACTING``     written by the worker: 1 while its copy of the policy computes a step's actions,
               0 otherwise (the step watchdog reads it to tell a hung policy from a hung env)
=============  =================================================================================

Each side, while it waits, may *spin* for a short while on the other's word, and only
then sets its ``*_ASLEEP`` word and blocks on the socket. The other side sends a
*doorbell* byte only to a sleeper. This saves the kernel wakeups of a round trip, which
on virtual machines cost tens of microseconds each (a doorbell ``send`` that wakes a
sleeper took 33 us of the sender's time on the 2-core VM of the benchmarks). A spinner
calls ``sched_yield()`` between looks, so it gives its core away to any process that
wants it: spinning pays even with more processes than cores (2 workers and the engine on
2 cores: 167 us per lockstep round against 267 us with doorbells, for 140 us of work).
Not spinning is the same protocol with both ``*_ASLEEP`` words always set: a doorbell
every time, each side blocked on its socket.

With more processes than cores, the engine does not spin (it sleeps in its event loop,
woken by the workers' doorbells), but the workers still spin, for up to
``WORKER_SPIN_S``: a worker that waits for its next command gives its core to whoever
wants it at each look, and when the command comes, it needs no doorbell and no wakeup.
Sleeping workers spent about half their CPU time in those two system calls (``py-spy``,
2 workers x 16 CartPole envs on the 2-core VM); spinning workers collect 10-45% faster
there (``docs/changelog.md``, 2026-11-23).

**Parts.** A worker whose envs step in parts (``_workers.plan``: two halves, when the
engine has a core of its own) has one control line per part, and the scheduler drives each
part as a lane of its own. The worker serves whichever part has a command, starting after
the part it served last; so while the engine runs the policy for one part, the worker steps
the other, and neither side waits for a round trip. ``W_ASLEEP`` is the process's: it
lives in its first part's line. The engine writes ``E_ASLEEP`` to every line.

**Runs.** Actions that do not depend on the observations (``policy=None``: a
``RandomPolicy``) need no round trip per step: the engine draws a run of columns'
actions at once, writes them, and posts one ``RUN`` of ``COUNT`` steps. The worker steps
column after column, resetting finished envs as after any step, writes ``AT`` after each
step and ``DONE`` after the last; the engine books the ``AT`` steps at once. A run stops
after the step under way when the engine posts another command (it gave the run up: an
interrupt) or sets ``COUNT`` to 0 (a batch was cut: the workers stop after the step they
are taking, as without runs).

A one-word write is atomic and x86 keeps stores in order, so a reader that sees a new
``CMD`` or ``DONE`` also sees the data written before it. Spinning is limited to x86-64
for that reason. A doorbell could, in principle, be missed: the sleeper's flag write
and the waker's check can pass each other in the processor's store buffer. So sleepers
that spun also wake up on a timer and look again.

**Doorbells to the engine** go to one pipe that every worker of a pool shares
(``ring_fd``), not to each worker's socket: the engine wakes once, reads the pipe once, and
reads which commands are done from the ``DONE`` and ``CMD`` words of every line at once
(``Scheduler._harvest_block``), where a socket per worker cost a reader callback and a
``recv`` per completion (15 workers x 16 envs on 2 cores: 1.08 system calls per worker and
step in the engine instead of 2).

**Doorbells to the workers** (Linux) are one futex word in the control block that every
worker of a pool sleeps on, each with its own bit (``_workers.bell``): the engine posts a
round's commands, then wakes every sleeper among their workers with one system call
(15 workers x 16 envs on 2 cores: a fifth of the engine's CPU went into one socket ``send``
per worker and step). Elsewhere, and for what follows, the socket serves.

On the socket, engine -> worker: doorbells (where there are no futexes), and ``CLOSE`` (close the envs and exit);
worker -> engine: ``ERROR`` followed by a framed message describing an
exception (type, message, traceback text, env index); the failed command's ``DONE`` is
never written; after ``CLOSE``, ``CLOSED`` followed by a framed text if some envs' ``close()``
raised (the engine reads it once the worker exited, and logs it). Setup uses framed messages
both ways: a 4-byte little-endian length, then a pickle.
"""

from __future__ import annotations

import os
import pickle
import platform
import socket
import struct
from typing import Any

CLOSE = b"c"
OK = b"k"
"""A doorbell byte (either direction)."""
ERROR = b"e"
CLOSED = b"x"
"""Worker -> engine, after ``CLOSE``: followed by a framed text naming the envs whose
``close()`` raised, with their tracebacks (sent only if one did)."""

STEP_CODE, RESET_CODE, RUN_CODE = 1, 2, 3
CMD, DONE, W_ASLEEP, E_ASLEEP, SLOT, COL, COUNT, AT, POLICY, ACTING = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9

SPIN_S = 100e-6
"""How long each side spins (yielding its core between looks) before it blocks."""
WORKER_SPIN_S = 1e-3
"""How long a worker spins when the engine does not (more processes than cores)."""

_LEN = struct.Struct("<I")


def spin_budget(num_workers: int = 0, forced: bool | None = None) -> float:
    """Seconds the engine spins before blocking: ``SPIN_S``, or 0.

    ``forced`` (the collectors' ``spin`` keyword), else ``AIOCOLLECT_SPIN`` (``0``, ``false``,
    ``no``, ``off``: off; any other value: on, at your own risk off x86-64), else on x86-64
    when the engine and the ``num_workers`` workers can each have a core that other programs
    do not take (``free_cores``): spinning on a core another process wants slows both."""
    if forced is None:
        forced = env_flag("AIOCOLLECT_SPIN")
    if forced is not None:
        return SPIN_S if forced else 0.0
    if not _x86_64():
        return 0.0
    return SPIN_S if num_workers + 1 <= free_cores() else 0.0


def worker_spin_budget(num_workers: int = 0, forced: bool | None = None) -> float:
    """Seconds a worker spins before blocking: as the engine where the engine spins, or
    where ``forced``, ``AIOCOLLECT_SPIN`` or the machine decides; otherwise (more processes
    than free cores) ``WORKER_SPIN_S``."""
    engine = spin_budget(num_workers, forced)
    if engine or forced is not None or env_flag("AIOCOLLECT_SPIN") is not None or not _x86_64():
        return engine
    return WORKER_SPIN_S


def free_cores() -> float:
    """The cores this process may run on, less what the machine runs besides (``busy_elsewhere``),
    with half a core of slack so that a quiet machine's background noise counts for nothing."""
    return usable_cores() - busy_elsewhere() + 0.5


def busy_elsewhere() -> float:
    """How many cores the machine keeps busy besides the thread asking: the lesser of the
    1-minute load average, which also remembers this program's own recent work (a collector
    just shut down, the previous benchmark row), and the tasks runnable right now, less the
    one asking (``/proc/loadavg``; where there is none, the load average alone; with neither, 0)."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # (no load average on this system)
        return 0.0
    now = runnable_now()
    return load if now is None else min(load, max(now - 1, 0))


def runnable_now() -> int | None:
    """The tasks runnable on the machine at this instant, this one included (Linux's
    ``/proc/loadavg``: its fourth field, ``runnable/total``), or ``None`` where unknown."""
    try:
        with open("/proc/loadavg") as f:
            return int(f.read().split()[3].split("/")[0])
    except (OSError, IndexError, ValueError):
        return None


def env_flag(name: str) -> bool | None:
    """An on/off environment variable: ``None`` if unset; off for ``0``, ``false``, ``no``,
    ``off`` or empty (any case, spaces ignored); on for anything else."""
    value = os.environ.get(name)
    if value is None:
        return None
    return value.strip().lower() not in ("", "0", "false", "no", "off")


def _x86_64() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def usable_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def ring(sock: socket.socket) -> None:
    """Send a doorbell without ever blocking.

    A sleeper may miss reading a doorbell (it saw the command before reading its
    socket), so stale bytes can pile up in a socket's buffer over a long run. A full
    buffer is harmless: the sleeper has unread doorbells, so it wakes anyway. ``sock``
    must have no timeout (blocking or non-blocking), or ``send`` would wait for room.
    Raises ``OSError`` (``EPIPE``...) if the other end is gone.
    """
    try:
        sock.send(OK, socket.MSG_DONTWAIT)
    except BlockingIOError:
        pass


def ring_fd(fd: int) -> None:
    """``ring`` on a non-blocking pipe (the workers' doorbell to the engine): a full pipe
    is harmless the same way. Raises ``BrokenPipeError`` if the engine is gone."""
    try:
        os.write(fd, OK)
    except BlockingIOError:
        pass


def frame(obj: Any) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _LEN.pack(len(data)) + data


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Read exactly ``n`` bytes from a blocking socket (``EOFError`` if it closes)."""
    chunks, left = [], n
    while left:
        chunk = sock.recv(left)
        if not chunk:
            raise EOFError("control socket closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def recv_frame(sock: socket.socket) -> Any:
    (size,) = _LEN.unpack(recv_exact(sock, _LEN.size))
    return pickle.loads(recv_exact(sock, size))


def parse_frame(buf: bytearray, start: int) -> tuple[Any, int] | None:
    """A frame starting at ``buf[start]``: ``(message, end)``, or ``None`` if incomplete."""
    if len(buf) < start + _LEN.size:
        return None
    (size,) = _LEN.unpack_from(buf, start)
    end = start + _LEN.size + size
    if len(buf) < end:
        return None
    return pickle.loads(bytes(buf[start + _LEN.size : end])), end

"""The step watchdog: a worker process whose step outlives ``step_timeout`` is killed.

An env whose ``step()`` never returns (a deadlock, a lost connection, an infinite loop in
native code), or a worker process someone stopped (``SIGSTOP``, Ctrl-Z, a debugger),
would otherwise hang the collector forever: the engine waits on that worker's reply.
With a ``step_timeout``, the pool runs ``watch_steps`` next to its workers:

* every ``period(step_timeout)`` seconds (a quarter of it, between 50 ms and 0.5 s) it
  looks at the control line of each lane of each worker process (``_workers.protocol``;
  the pool's workers and ports, seen as ``_workers.lane.ProcessWorker`` and
  ``ProcessLane``): a command posted (``posted``) and not done (``DONE``) is
  *outstanding*, and the first look that saw it outstanding starts its clock; a ``RUN``
  of steps restarts it at each step done (``AT``), so the limit is per step, however long
  the run. The hot path pays nothing: the watchdog reads counters the engine and the
  worker write anyway;
* a command outstanding for more than ``step_timeout`` fails its worker with a
  [`StepTimeoutError`][aiocollect.StepTimeoutError] naming the worker, its pid, the envs
  and ``step_timeout``, and saying how to fix it: the env's step or reset, or, when the
  worker's copy of the policy was computing the step's actions (the line's ``ACTING``,
  which the worker sets around its policy's call), the policy. So the collector raises it at most
  about ``step_timeout + 2 * period`` after the command was posted, plus the stack read;
* before the kill, the worker's Python stack goes into the error: a running worker is sent
  ``SIGUSR1`` and writes every thread's stack to its dump pipe (``faulthandler``, see
  ``_workers.child``), read for up to ``STACK_READ_S``; a stopped worker (state ``T`` in
  ``/proc/PID/stat``) cannot answer and is named as stopped instead. Then ``SIGKILL``.

The collector then raises the error and stops the other workers, as for any worker fault.
Workers whose commands are overdue too are hung as well: the pool kills them at once
instead of giving them the grace a ``CLOSE`` gets (``overdue``), so several hung workers
cost no more time than one.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Sequence

import anyio

from .._errors import StepTimeoutError
from . import protocol
from .lane import ProcessLane, ProcessWorker

STACK_READ_S = 1.0
"""How long to wait for a hung worker's stack before killing it anyway."""
_QUIET_S = 0.1
"""The stack is complete once the dump pipe stayed quiet this long after some data."""


def period(step_timeout: float) -> float:
    """How often the watchdog looks: a quarter of ``step_timeout``, within [50 ms, 0.5 s]."""
    return min(max(step_timeout / 4, 0.05), 0.5)


async def watch_steps(workers: Sequence[ProcessWorker], step_timeout: float, stopping: Callable[[], bool],
                      since: dict[int, tuple[tuple[int, int], float]] | None = None) -> None:
    """Fail and kill any worker whose command stays outstanding over ``step_timeout``
    (until cancelled; ``stopping()`` true: the pool is stopping its workers, leave them).
    ``since``: id(port) -> ((outstanding command's seq, steps of it done), when first seen
    so), the pool's, which ``overdue`` reads when it stops the workers."""
    since = {} if since is None else since
    tick = period(step_timeout)
    while True:
        await anyio.sleep(tick)
        now = time.monotonic()
        for worker in workers:
            if worker.error is not None or stopping():
                continue
            for port in worker.ports:
                late = _late(port, since, now, step_timeout)
                if late:
                    await _kill_hung(worker, port, step_timeout, stopping)
                    break


def overdue(worker: ProcessWorker, since: dict[int, tuple[tuple[int, int], float]], step_timeout: float) -> bool:
    """Whether a command of ``worker`` was seen outstanding more than ``step_timeout`` ago
    (by the watchdog's looks, ``since``): it is hung, as the watchdog's next look would say."""
    now = time.monotonic()
    return any(_late(port, since, now, step_timeout) for port in worker.ports)


def _late(port: ProcessLane, since: dict[int, tuple[tuple[int, int], float]], now: float, step_timeout: float) -> bool:
    posted = port.posted
    if int(port.control[protocol.DONE]) == posted:
        since.pop(id(port), None)
        return False
    seen = since.get(id(port))
    mark = (posted, int(port.control[protocol.AT]))  # a run's steps done are a sign of life
    if seen is None or seen[0] != mark:
        since[id(port)] = (mark, now)
        return False
    return now - seen[1] > step_timeout


async def _kill_hung(worker: ProcessWorker, port: ProcessLane, step_timeout: float,
                     stopping: Callable[[], bool]) -> None:
    stopped = process_state(worker.pid) in ("T", "t")
    stack = "" if stopped else await read_stack(worker)
    if worker.error is not None or stopping():
        return  # it failed (or the pool began to stop it) while we read
    call = "reset" if int(port.control[protocol.CMD]) & 3 == protocol.RESET_CODE else "step"
    env = port.lo - worker.lo if port.num_envs == 1 else None
    policy = bool(port.control[protocol.ACTING])  # (its copy of the policy was computing the step's actions)
    worker.fail(StepTimeoutError.hung(worker=worker.index, pid=worker.pid, envs=(port.lo, port.hi), env=env,
                                      call=call, timeout=step_timeout, stopped=stopped, stack=stack,
                                      policy=policy))
    if worker.process is None:  # (never: the workers watched were started)
        return
    try:
        worker.process.send_signal(signal.SIGKILL)
    except ProcessLookupError:
        pass


def process_state(pid: int | None) -> str:
    """The state letter of ``/proc/PID/stat`` (``R``, ``S``, ``T`` stopped...); "" if unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


async def read_stack(worker: ProcessWorker) -> str:
    """Ask ``worker`` for its threads' Python stacks (``SIGUSR1``) and read them from its
    dump pipe: "" if it does not answer within ``STACK_READ_S``."""
    fd = worker.dump_fd
    if fd < 0 or worker.process is None:
        return ""
    try:
        worker.process.send_signal(signal.SIGUSR1)
    except ProcessLookupError:
        return ""
    data = bytearray()
    start = last = time.monotonic()
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            chunk = None
        except OSError:
            break
        now = time.monotonic()
        if chunk == b"":
            break
        if chunk:
            data += chunk
            last = now
        elif now - start > STACK_READ_S or (data and now - last > _QUIET_S):
            break
        await anyio.sleep(0.01)
    return data.decode(errors="replace")

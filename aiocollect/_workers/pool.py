"""The worker pool: starts env workers, watches them, and always stops them.

Everything here runs on the collector's engine loop (its private uvloop thread):

* ``WorkerPool.run()`` is a long-lived task. It spawns every worker as a fresh interpreter
  (``_workers.process``: spawn-safe, nothing forked, the current directory kept off its
  path, its exit learnt without ``SIGCHLD``), hands each its end of a socket pair, the
  shared-memory file descriptor and the write end of a pipe for its stack dumps, sends the
  setup message, waits until each says it is ready (the first worker that fails to start
  is raised as it is, an [`EnvError`][aiocollect.EnvError] when its envs failed to build,
  and the others are stopped; workers not ready within ``start_timeout`` are killed, their
  Python stacks read first, and a [`StartTimeoutError`][aiocollect.StartTimeoutError]
  names them), then watches the processes until it is told to stop (or
  cancelled); with a ``step_timeout``, ``_workers.watchdog`` kills a worker whose step
  outlives it. Its ``finally`` block always stops them: ``CLOSE``, then after a grace
  period ``SIGTERM``, then ``SIGKILL``; a worker whose envs' ``close()`` raised says which
  (``protocol.CLOSED``), and that is logged (``aiocollect`` logger, ``ERROR``).
* a ``Worker`` is the engine's end of one worker process: its socket, with a reader
  callback that turns error reports (and the end of the process) into ``on_reply(worker)``
  calls, and its
  ``ports``, one per part of its envs (``_workers.plan``), each with its own control line
  (``_workers.protocol``): ``post(STEP_CODE)`` and ``completed()``. The scheduler drives
  ports as lanes (``WorkerPool.lanes``). A worker that died (its socket closed, or its
  process exited) is reported the same way, with ``worker.error`` set to the
  [`WorkerError`][aiocollect.WorkerError] to raise. Workers ring the engine's doorbell on
  one pipe they all share (``_open_bell``): the engine wakes once for all of them, and the
  scheduler reads every port's completion from the control block (``on_reply(RANG)``).

A dead main process takes its workers with it: their socket reads end-of-file, and on
Linux they also get ``SIGKILL`` from ``PR_SET_PDEATHSIG``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.abc
import numpy as np

from .._errors import EnvError, StartTimeoutError, WorkerError, policy_error_from_worker
from . import protocol
from .bell import Bell, bit, wanted
from .coroutine_worker import CoroutineWorker
from .lane import LaneOwner, LaneWorker, ProcessWorker, no_reply
from .plan import WorkerPlan, WorkerSpec
from .process import WorkerProcess, worker_command
from .shm import CONTROL_WORDS, Layout, SharedArrays, create_segment
from .watchdog import overdue, read_stack, watch_steps

logger = logging.getLogger("aiocollect")

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


class _Rang(LaneOwner):
    """The owner ``on_reply`` names for doorbells rung on the pool's pipe: no lane's in
    particular (the scheduler then looks at them all), never failed."""

    index = -1
    pid = None
    process = None
    error = None


RANG = _Rang()


class Worker(ProcessWorker):
    """The engine's end of one worker process: its process, its socket, its ``ports``."""

    def __init__(self, spec: WorkerSpec):
        self.spec = spec
        self.index = spec.index
        self.lo, self.hi = spec.lo, spec.hi
        self.num_envs = spec.num_envs
        self.process: WorkerProcess | None = None
        self.pid: int | None = None
        self.sock: socket.socket | None = None
        self.ready = False
        """It built its envs and serves commands."""
        self.dump_fd = -1
        """The read end of the pipe the process writes its stacks to (``_workers.watchdog``)."""
        self.error: WorkerError | None = None
        self.on_reply: Callable[[LaneOwner], None] = no_reply
        """Called from the reader callback when a doorbell or an error arrives."""
        # (ignore: ProcessLane's error, process and pid are settable there, read-only on a Port; see Port)
        self.ports: list[Port] = [Port(self, lo, hi) for lo, hi in spec.lanes]  # type: ignore[assignment]
        """One per part of its envs (``WorkerSpec.parts``): the lanes the scheduler drives."""
        self._inbox = bytearray()
        self._reading = False
        self.bell: Bell | None = None
        """The pool's futex doorbell (``_workers.bell``; ``None``: a byte on the socket)."""
        self.bit = bit(self.index)
        """Its bit of the futex word."""

    @property
    def alive(self) -> bool:
        return self.error is None and self.process is not None and self.process.returncode is None

    @property
    def env_steps(self) -> int:
        return sum(port.env_steps for port in self.ports)

    @property
    def control(self) -> np.ndarray:
        """The first port's control line, which also holds the process's ``W_ASLEEP``."""
        return self.ports[0].control

    def ring(self) -> None:
        """Wake the worker if it sleeps (see ``_workers.protocol``)."""
        if self.control[protocol.W_ASLEEP]:
            if self.bell is not None:
                self.bell.ring(self.bit)  # (at once, or with the rest of the round: Bell.hold)
                return
            try:
                protocol.ring(self._socket())
            except OSError:  # it died (EPIPE) before its socket's EOF reached us
                self.fail(WorkerError.died(self.index, self.pid, self._exitcode()))

    def _socket(self) -> socket.socket:
        """Its socket, for the calls made once the worker was started."""
        assert self.sock is not None, f"worker {self.index} was not started"
        return self.sock

    def _process(self) -> WorkerProcess:
        """Its process, for the calls made once the worker was started."""
        assert self.process is not None, f"worker {self.index} was not started"
        return self.process

    # the reader callback: bytes from the worker -> on_reply(self)
    def start_reading(self) -> None:
        asyncio.get_running_loop().add_reader(self._socket().fileno(), self._readable)
        self._reading = True

    def stop_reading(self) -> None:
        if self._reading:
            self._reading = False
            asyncio.get_running_loop().remove_reader(self._socket().fileno())

    def _readable(self) -> None:
        try:
            data = self._socket().recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.stop_reading()
            self.fail(WorkerError.died(self.index, self.pid, self._exitcode()))
            return
        inbox = self._inbox
        if not inbox and protocol.ERROR[0] not in data:  # the common case: doorbells only
            self.on_reply(self)
            return
        inbox += data
        start = 0
        while start < len(inbox):
            if inbox[start] != protocol.ERROR[0]:
                start += 1
                continue
            parsed = protocol.parse_frame(inbox, start + 1)
            if parsed is None:
                break  # the rest of the error report is on its way
            info, start = parsed
            # (ignore: the policy's own exception, of any type; lane.py's LaneOwner.error says WorkerError)
            self.fail(policy_error_from_worker(self.index, self.pid, info)  # type: ignore[arg-type]
                      if info.get("policy") else EnvError.from_remote(self.index, self.pid, info))
        del inbox[:start]
        self.on_reply(self)

    def _exitcode(self) -> int | None:
        return None if self.process is None else self.process.returncode

    def fail(self, error: WorkerError) -> None:
        if self.error is None:
            self.error = error
            self.on_reply(self)


class Port(LaneWorker):
    """One lane of a worker process: a part of its envs, with its own control line (a
    ``_workers.lane.ProcessLane``).

    The scheduler posts commands to a port and learns of their completion; the process,
    its socket and its errors are the worker's (``port.worker``, its ``owner``).
    """

    in_process = False
    takes_runs = True
    """Takes ``RUN`` commands (steps in a row: see ``_workers.protocol``)."""
    synchronous = False
    acts_locally = False
    """Its worker acts with its own copy of the policy (set by the pool that gives it one)."""

    def __init__(self, worker: Worker, lo: int, hi: int):
        self.worker = worker
        self.index = worker.index
        self.lo, self.hi = lo, hi
        self.num_envs = hi - lo
        self.env_steps = 0
        self.control: np.ndarray = np.zeros(CONTROL_WORDS, np.int64)
        """This port's control line in shared memory (see ``_workers.protocol``), given by the
        pool once its shared memory exists (a line of zeros until then: nothing posted)."""
        self.line = -1
        """Its row of the control block (``SharedArrays.control``)."""
        self.seen: np.ndarray = np.zeros(1, np.int64)
        """The pool's record of the last command taken in, per line of the control block
        (this port's: ``seen[line]``); the scheduler reads every port's completion at once
        from the block and this array (``_engine.scheduler``)."""

    @property
    def owner(self) -> Worker:
        return self.worker

    @property
    def posted(self) -> int:
        """The sequence number of the last command posted (the ``CMD`` word holds it)."""
        return int(self.control[protocol.CMD]) >> 2

    # (the ignores: LaneOwner declares error, process and pid as attributes, which a reader
    # of them, as the scheduler and the watchdog are, does not need; a port reads its worker's)
    @property
    def error(self) -> WorkerError | None:  # type: ignore[override]
        return self.worker.error

    @property
    def process(self) -> WorkerProcess | None:  # type: ignore[override]
        return self.worker.process

    @property
    def pid(self) -> int | None:  # type: ignore[override]
        return self.worker.pid

    @property
    def on_reply(self) -> Callable[[LaneOwner], None]:
        return self.worker.on_reply

    @on_reply.setter
    def on_reply(self, callback: Callable[[LaneOwner], None]) -> None:
        self.worker.on_reply = callback

    def post(self, code: int, slot: int, col: int, count: int = 1, local: bool = False) -> None:
        """Ask for ``protocol.STEP_CODE``, ``RESET_CODE`` or ``RUN_CODE`` (``count`` steps)
        at ``slot``, ``col`` of the storage (``local``: with actions from the worker's own
        policy); ring if the worker sleeps."""
        ctl = self.control
        seq = (int(ctl[protocol.CMD]) >> 2) + 1
        ctl[protocol.SLOT] = slot
        ctl[protocol.COL] = col
        ctl[protocol.COUNT] = count
        ctl[protocol.POLICY] = 1 if local else 0
        ctl[protocol.CMD] = seq * 4 + code  # last: the worker acts once it sees it
        self.worker.ring()

    def cut_run(self) -> None:
        """Ask the ``RUN`` under way to stop after the step it is taking."""
        self.control[protocol.COUNT] = 0

    def steps_done(self) -> int:
        """The steps of the last ``RUN``, once it completed (fewer than asked if cut)."""
        return int(self.control[protocol.AT])

    def completed(self) -> bool:
        """The last posted command is done and was not reported yet (reports it once)."""
        ctl, seen, line = self.control, self.seen, self.line
        done = int(ctl[protocol.DONE])
        if done != seen[line] and done == int(ctl[protocol.CMD]) >> 2:
            seen[line] = done
            return True
        return False


class WorkerPool:
    """Starts, watches and stops the workers of one collector; see the module docstring."""

    def __init__(self, plan: WorkerPlan, layout: Layout, *, reset_when_done: bool,
                 max_frames_per_traj: int | None = None, step_timeout: float | None = None,
                 start_timeout: float | None = None, policy: dict | None = None, spin: bool | None = None):
        self.plan = plan
        self.start_timeout = start_timeout
        """How long the workers may take, together, to start (``None``: no bound; the
        collectors pass their ``start_timeout``, 300 s by default)."""
        self.layout = layout
        self.policy = policy
        """What each worker needs to run its own copy of the policy (``_policies.actor.payload``:
        the pickled module, its outputs, seeds), or ``None``: actions come from the engine."""
        self.reset_when_done = reset_when_done
        self.max_frames_per_traj = max_frames_per_traj
        # (ignore: lane.py's LaneWorker.steps_done and cut_run, bodies that raise, read as abstract)
        self.workers: list[Worker | CoroutineWorker] = [CoroutineWorker(spec, step_timeout)  # type: ignore[abstract]
                                                          if spec.coroutine else Worker(spec)
                        for spec in plan.workers]
        self.step_timeout = step_timeout
        """Coroutine workers time each env's call; process workers are watched by
        ``_workers.watchdog`` (``None``: neither)."""
        self.shm_fd = create_segment(layout.size)
        self.shared = SharedArrays(layout, self.shm_fd)
        processes = sum(not spec.coroutine for spec in plan.workers)
        self.spin_s = protocol.spin_budget(processes, spin) if processes else 0.0
        """How long the engine spins before blocking (0: never; ``spin``: forced on or off;
        see ``_workers.protocol``)."""
        self.worker_spin_s = protocol.worker_spin_budget(processes, spin)
        """How long a worker spins before blocking."""
        self.processes = [w for w in self.workers if isinstance(w, Worker)]
        """The workers that are processes."""
        self.lanes: list[LaneWorker] = [port for w in self.workers
                                         for port in (w.ports if isinstance(w, Worker) else [w])]
        """What the scheduler drives: every process worker's ports, every coroutine worker."""
        self.seen = np.zeros(len(self.lanes), np.int64)
        """The last command taken in, per line (``Port.seen``)."""
        for k, (lane, line) in enumerate(zip(self.lanes, self.shared.control)):  # (a coroutine worker's: unused)
            if isinstance(lane, Port):
                lane.control, lane.line, lane.seen = line, k, self.seen
                lane.acts_locally = policy is not None
            line[protocol.E_ASLEEP] = 1
            line[protocol.W_ASLEEP] = 1
        call = wanted() if self.processes else None
        self.bell = None if call is None else Bell(self.shared.control, call)
        """The workers' doorbell: one futex word for all (``_workers.bell``), or ``None`` where
        there are no futexes or ``AIOCOLLECT_FUTEX=0`` (a byte on each worker's socket)."""
        for w in self.processes:
            w.bell = self.bell
        self._bell: tuple[int, int] | None = None
        """The doorbell pipe every worker rings (read end, write end; see ``_workers.protocol``),
        open from ``run()`` until the workers are gone."""
        self._lines = {id(lane): k for k, lane in enumerate(self.lanes)}
        self.stop_timeout = 5.0
        self._since: dict[int, tuple[tuple[int, int], float]] = {}
        """The watchdog's clocks of outstanding commands (``_workers.watchdog``)."""
        self._stopping = False
        self._stop: anyio.Event | None = None

    # ------------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: anyio.abc.TaskStatus = anyio.TASK_STATUS_IGNORED) -> None:
        """Start the workers, report ``started``, watch them until ``stop()``; always clean up."""
        self._stop = anyio.Event()
        self._stopped = anyio.Event()
        if self._stopping:
            self._stop.set()
        try:
            if self.processes:
                self._open_bell()
            await self._start_all()
            os.close(self.shm_fd)
            self.shm_fd = -1
            processes = self.processes
            async with anyio.create_task_group() as tg:
                for worker in processes:
                    tg.start_soon(self._watch, worker)
                if self.step_timeout is not None and processes:
                    tg.start_soon(watch_steps, processes, self.step_timeout, lambda: self._stopping, self._since)
                task_status.started()
                await self._stop.wait()
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self._stop_all()
                self._stopped.set()

    def stop(self) -> None:
        """Ask ``run()`` to stop the workers (call on the engine loop)."""
        self._stopping = True
        if self._stop is not None:
            self._stop.set()

    async def stop_and_wait(self) -> None:
        """Stop the workers and wait until they are gone (call on the engine loop)."""
        self.stop()
        with anyio.CancelScope(shield=True):
            await self._stopped.wait()

    async def _start_all(self) -> None:
        """Start every worker at once; the first that fails is raised as it is (not in an
        exception group), the others cancelled (``run()``'s ``finally`` stops them). Workers
        not up within ``start_timeout`` are killed, once their Python stack is read, and a
        [`StartTimeoutError`][aiocollect.StartTimeoutError] names them."""
        errors: list[Exception] = []

        async def start(worker: Worker | CoroutineWorker) -> None:
            try:
                await self._start(worker)
            except Exception as exc:  # noqa: BLE001 - raised below, after the others stop
                errors.append(exc)
                starting.cancel_scope.cancel()

        with anyio.move_on_after(self.start_timeout) as deadline:
            async with anyio.create_task_group() as starting:
                for worker in self.workers:
                    starting.start_soon(start, worker)
        if errors:
            raise errors[0]
        if deadline.cancelled_caught:
            raise await self._start_timed_out()

    async def _start_timed_out(self) -> StartTimeoutError:
        """The error for the workers not up after ``start_timeout``, which are killed here
        (after their Python stacks are read, all at once: ``watchdog.read_stack``)."""
        assert self.start_timeout is not None  # (no bound: never timed out)
        late = [w for w in self.processes if not w.ready]
        stacks: dict[int, str] = {}

        async def read(worker: Worker) -> None:
            stacks[worker.index] = await read_stack(worker) if worker.process is not None else ""

        async with anyio.create_task_group() as tg:
            for worker in late:
                tg.start_soon(read, worker)
        for worker in late:
            if worker.process is not None:
                try:
                    worker.process.send_signal(signal.SIGKILL)  # (``_stop_all`` waits for it)
                except ProcessLookupError:
                    pass
        try:
            load = os.getloadavg()[0]
        except OSError:
            load = None
        return StartTimeoutError.workers(
            timeout=self.start_timeout, started=[w.index for w in self.workers if w not in late],
            pending=[(w.index, w.pid, stacks.get(w.index, "")) for w in late],
            processes=len(self.processes), cores=protocol.usable_cores(), load=load)

    async def _start(self, worker: Worker | CoroutineWorker) -> None:
        if isinstance(worker, CoroutineWorker):
            worker.build(self.shared, worker.spec.kwargs, self.reset_when_done, self.max_frames_per_traj)
            return
        assert self._bell is not None  # (run() opens it when there are processes)
        parent, child = socket.socketpair()
        dump_r, dump_w = os.pipe()
        try:
            worker.sock = parent
            worker.dump_fd = dump_r
            os.set_blocking(dump_r, False)
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join([_PACKAGE_ROOT, *filter(None, [env.get("PYTHONPATH")])])
            worker.process = WorkerProcess(worker_command(child.fileno(), self.shm_fd, dump_w),
                                           pass_fds=[child.fileno(), self.shm_fd, dump_w, self._bell[1]], env=env,
                                           torch=self.policy is not None)
            worker.pid = worker.process.pid
        finally:
            child.close()
            os.close(dump_w)
        parent.setblocking(False)
        loop = asyncio.get_running_loop()
        spec = worker.spec
        setup = {
            "index": spec.index,
            "sys_path": list(sys.path),
            "entry": spec.entry,
            "kwargs": spec.kwargs,
            "spaces": (self.plan.observation_space, self.plan.action_space),
            "layout": self.layout,
            "parts": [(self._lines[id(port)], port.lo, port.hi) for port in worker.ports],
            "reset_when_done": self.reset_when_done,
            "max_frames_per_traj": self.max_frames_per_traj,
            "spin_s": self.worker_spin_s,
            "futex": self.bell is not None,
            "bell": self._bell[1],
            "policy": self.policy,
        }
        await loop.sock_sendall(parent, protocol.frame(setup))
        reply = await self._recv_frame(worker)
        if reply[0] == "error":
            if reply[1].get("policy"):  # its copy of the policy could not be built (``_policies.worker_actor``)
                raise policy_error_from_worker(spec.index, worker.pid, reply[1])
            raise EnvError.from_remote(spec.index, worker.pid, reply[1])
        worker.ready = True
        worker.start_reading()

    def _open_bell(self) -> None:
        """The doorbell pipe: every worker rings its write end (inherited, non-blocking:
        ``protocol.ring_fd``); its read end wakes the engine loop once for all the
        completions rung meanwhile (``_rang``)."""
        read, write = os.pipe()
        self._bell = (read, write)
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        asyncio.get_running_loop().add_reader(read, self._rang)

    def _rang(self) -> None:
        """Doorbells on the pipe: drain it, and report them once (``on_reply(RANG)``: the
        scheduler then looks at every lane, in a few array operations)."""
        assert self._bell is not None  # (read while it is open)
        try:
            while len(os.read(self._bell[0], 65536)) == 65536:
                pass
        except BlockingIOError:
            pass
        self.processes[0].on_reply(RANG)

    def _mute_bell(self) -> None:
        """Stop reading the doorbell pipe (it stays open: a worker that rings it meanwhile
        finds it so, until ``_close_bell``)."""
        if self._bell is not None:
            with contextlib.suppress(ValueError, RuntimeError):  # (the loop is gone: kill_leftovers)
                asyncio.get_running_loop().remove_reader(self._bell[0])

    def _close_bell(self) -> None:
        if self._bell is not None:
            self._mute_bell()
            read, write = self._bell
            self._bell = None
            os.close(read)
            os.close(write)

    async def _recv_frame(self, worker: Worker):
        loop = asyncio.get_running_loop()
        buf = bytearray()
        while True:
            parsed = protocol.parse_frame(buf, 0)
            if parsed is not None:
                return parsed[0]
            data = await loop.sock_recv(worker._socket(), 65536)
            if not data:
                process = worker._process()
                with anyio.move_on_after(2):
                    await process.wait()
                raise WorkerError.died(worker.index, worker.pid, process.returncode)
            buf += data

    async def _watch(self, worker: Worker) -> None:
        process = worker._process()
        await process.wait()
        if not self._stopping:
            worker.fail(WorkerError.died(worker.index, worker.pid, process.returncode))

    async def _stop_all(self) -> None:
        """``CLOSE``, then ``SIGTERM``, then ``SIGKILL``: each step bounded in time."""
        self._stopping = True
        coroutine = [w for w in self.workers if isinstance(w, CoroutineWorker)]
        if coroutine:
            with anyio.move_on_after(self.stop_timeout):
                async with anyio.create_task_group() as tg:
                    for cw in coroutine:
                        tg.start_soon(cw.aclose)
        live = [(w, w.process) for w in self.processes if w.process is not None]
        self._mute_bell()  # (as each worker's socket below: no completion reaches the engine, which
        # would post the next command, a run of steps that no CLOSE would cut, while they stop)
        for w, process in live:
            w.stop_reading()
            if process.returncode is None and self.step_timeout is not None and w.error is None \
                    and overdue(w, self._since, self.step_timeout):
                # hung as well (the watchdog's next look would say so): no CLOSE can reach it
                logger.warning("aiocollect: worker %s is hung too (a command over step_timeout): SIGKILL", w.index)
                try:
                    process.send_signal(signal.SIGKILL)  # (the waits below see it go)
                except ProcessLookupError:
                    pass
                continue
            if process.returncode is None:
                sock = w._socket()
                try:
                    if w.ready:
                        for port in w.ports:  # a run of steps reads no socket till it ends: end it
                            port.cut_run()    # after the step under way (the envs may have slowed)
                        try:
                            sock.send(protocol.CLOSE)
                        except BlockingIOError:
                            pass  # a buffer full of stale doorbells (see protocol.ring): the end-of-file
                        # below arrives after them, and ends the worker as CLOSE does (its envs closed)
                        sock.shutdown(socket.SHUT_WR)
                    else:  # still starting (another failed): end-of-file ends its setup
                        sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        if self.bell is not None:
            self.bell.close()  # (the sleepers read their sockets: CLOSE, or the end of the file)
        for sig, grace in ((None, self.stop_timeout), (signal.SIGTERM, 1.0), (signal.SIGKILL, 5.0)):
            running = [(w, process) for w, process in live if process.poll() is None]
            if not running:
                break
            if sig is not None:
                logger.warning("aiocollect: sending %s to worker(s) %s", sig.name, [w.index for w, _ in running])
                for _, process in running:
                    try:
                        process.send_signal(sig)
                    except ProcessLookupError:
                        pass
            with anyio.move_on_after(grace):
                for _, process in running:
                    await process.wait()
        for w, _ in live:
            report = _close_report(w) if w.ready else None
            if report:
                logger.error("aiocollect: worker %s (pid %s), closing its envs at shutdown: %s", w.index, w.pid, report)
        self._let_go(kill=False)
        self.shared.release()

    def kill_leftovers(self) -> None:
        """Last resort, from any thread once the engine loop is gone: ``SIGKILL`` any worker
        that was never seen to exit (the loop stopped before ``run()`` could clean up)."""
        self._let_go(kill=True)

    def _let_go(self, kill: bool) -> None:
        """Forget every process (``SIGKILL`` it first if ``kill`` and it still runs), close
        its socket and dump pipe, and the segment's descriptor."""
        for w in self.processes:
            if w.process is not None:
                if kill:
                    w.process.kill_now()
                else:
                    w.process.close()
            if w.sock is not None:
                w.sock.close()
            _close_dump(w)
        if self.shm_fd >= 0:
            os.close(self.shm_fd)
            self.shm_fd = -1
        self._close_bell()


def _close_report(worker: Worker) -> str | None:
    """What ``worker`` said of its envs' ``close()`` (``protocol.CLOSED``: the envs whose
    ``close()`` raised), read from what is left in its socket once it exited; ``None`` if
    nothing (every env closed, or it was killed)."""
    buf = bytearray(worker._inbox)
    while True:
        try:
            data = worker._socket().recv(65536)
        except OSError:  # (BlockingIOError: nothing more)
            break
        if not data:
            break
        buf += data
    start, marks = 0, (protocol.ERROR[0], protocol.CLOSED[0])
    while start < len(buf):
        kind = buf[start]
        if kind not in marks:  # a doorbell
            start += 1
            continue
        try:
            parsed = protocol.parse_frame(buf, start + 1)
        except Exception:  # noqa: BLE001 - cut short by a kill: nothing to report
            return None
        if parsed is None:
            return None
        message, start = parsed
        if kind == protocol.CLOSED[0]:
            return str(message)
    return None


def _close_dump(worker: Worker) -> None:
    fd = worker.dump_fd
    if fd >= 0:
        os.close(fd)
        worker.dump_fd = -1

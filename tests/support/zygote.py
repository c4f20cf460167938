"""Driver processes forked from a warm interpreter, for the tests that need a process of their own.

The RPC tests run each driver in a new process (torch's RPC can be initialised once per
process), and so do the tests that send a script Ctrl-C (``support.procs.interrupt_script``, the
contract's Ctrl-C cases in every variant): a fresh ``python -c`` spends about 5 s of CPU
importing torch, tensordict and aiocollect before it does anything, a third of the RPC tests'
CPU time on the 2-core CI machine and most of the Ctrl-C cases'. Where the start-up itself is
under test (a worker's imports, the main guard, a fresh interpreter's exit with a profiler
trace), the tests still start ``sys.executable``.
The zygote is one interpreter, started once per test process, that imports them once and then
only forks: each driver is a new process (RPC never initialised in it, its own pid and pipes,
the modules already imported) that runs its script as ``python -c`` would: as ``__main__``,
with ``sys.argv == ["-c"]``, the given environment and working directory, a traceback on
stderr and exit code 1 for an uncaught exception, atexit handlers at the end.

The zygote runs no thread of its own (only the BLAS pool numpy starts at import, which
OpenBLAS stops before a fork and starts again when needed) and no torch op, and it freezes
what it imported (``gc.freeze``): forking it is as safe as ``multiprocessing``'s forkserver
with preloaded modules, and a driver's exit does not walk the imported objects (0.3 s, where
a fresh interpreter with torch takes 1.2 s).
What a driver cannot tell from a fresh interpreter: environment variables read at import time
by the preloaded modules keep the zygote's values (the drivers here set none at that level),
and its parent is the zygote.

``popen(source, stdin=None, env=None, cwd=None, text=True)`` is
``subprocess.Popen([sys.executable, "-c", source], stdin=stdin, stdout=PIPE, stderr=PIPE,
text=text, env=env, cwd=cwd)``, with what the tests use of a ``Popen`` (``pid``, the three
streams, ``poll``, ``wait``, ``kill``, ``send_signal``, ``communicate``, ``returncode``);
``run(source, timeout)`` is ``subprocess.run(..., capture_output=True, text=True,
timeout=timeout)``. A test that checks for leaks takes the ``zygote`` fixture
(``tests/conftest.py``), so that the zygote and its socket are there before the leak check
looks.
"""

from __future__ import annotations

import atexit
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PRELOAD = (
    "torch", "torch.nn", "torch.distributed.rpc", "tensordict", "tensordict.nn", "cloudpickle", "gymnasium",
    "aiocollect", "aiocollect._distributed.rpc_collector", "aiocollect._envs.gym", "aiocollect._errors",
    "support.checks", "support.envs", "support.variants",
)
"""What the drivers import (the RPC drivers, the Ctrl-C scripts of ``support.procs.interrupt_script``
and of the contract; ``tests/`` is on ``sys.path`` only while the zygote imports them: a driver
puts it there itself, as a fresh interpreter's script must)."""

_SERVER = r'''
import json, os, select, socket, sys, traceback


def serve(control):
    """Fork a driver for each request and report each one's exit; returns only in a driver."""
    children = set()
    while True:
        ready, _, _ = select.select([control], [], [], 0.05 if children else None)
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if not pid:
                break
            children.discard(pid)
            control.send(json.dumps({"exited": pid, "code": os.waitstatus_to_exitcode(status)}).encode())
        if not ready:
            continue
        message, fds, _, _ = socket.recv_fds(control, 1 << 20, 3)
        if not message:
            os._exit(0)  # the test process closed its end: it is gone
        request = json.loads(message)
        pid = os.fork()
        if pid == 0:
            control.close()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            for fd in fds:
                os.close(fd)
            os.chdir(request["cwd"])
            os.environ.clear()
            os.environ.update(request["env"])
            return request["source"]
        for fd in fds:
            os.close(fd)
        children.add(pid)
        control.send(json.dumps({"started": pid}).encode())


control = socket.socket(fileno=int(sys.argv[1]))
path = list(sys.path)
sys.path[:0] = json.loads(sys.argv[3])
try:
    for name in json.loads(sys.argv[2]):
        __import__(name)
except BaseException:
    control.send(json.dumps({"error": traceback.format_exc()}).encode())
    raise SystemExit(1)
sys.path[:] = path
import gc
gc.freeze()  # what was imported: no collection in a driver walks it (copy-on-write kept, a quick exit)
control.send(b'{"ready": true}')
source = serve(control)
# a driver from here on: run the script as python -c runs it
import builtins, types
del control, path
sys.argv[:] = ["-c"]
main = types.ModuleType("__main__")
main.__builtins__ = builtins
sys.modules["__main__"] = main
exec(compile(source, "<string>", "exec"), vars(main))
'''


class Zygote:
    """The warm interpreter of this test process, and the drivers forked from it."""

    def __init__(self, preload=PRELOAD, path=(TESTS,), timeout: float = 120.0):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _SERVER, str(theirs.fileno()), json.dumps(list(preload)),
                 json.dumps(list(path))],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL)
        self.control = ours
        self.exited: dict[int, int] = {}
        reply = self._receive(timeout)
        if "ready" not in reply:
            self.close()
            raise RuntimeError(f"the zygote could not import what it preloads:\n{reply.get('error')}")

    def alive(self) -> bool:
        return self.process.poll() is None

    def _receive(self, timeout: float | None) -> dict:
        """The zygote's next message (an exit is recorded); ``TimeoutError`` if none comes
        within ``timeout`` (0: none is there already; ``None``: wait for one)."""
        self.control.settimeout(timeout)
        try:
            data = self.control.recv(1 << 16)
        except (TimeoutError, BlockingIOError):
            raise TimeoutError from None
        if not data:
            raise RuntimeError(f"the zygote exited (code {self.process.wait()})")
        message = json.loads(data)
        if "exited" in message:
            self.exited[message["exited"]] = message["code"]
        return message

    def fork(self, source: str, fds: list[int], env: dict[str, str], cwd: str) -> int:
        """Fork a driver running ``source`` with ``fds`` as its stdin, stdout, stderr; its pid."""
        request = json.dumps({"source": source, "env": env, "cwd": cwd}).encode()
        self.control.settimeout(None)
        socket.send_fds(self.control, [request], fds)
        while True:
            message = self._receive(60.0)
            if "started" in message:
                return message["started"]

    def returncode(self, pid: int, timeout: float | None = 0.0) -> int | None:
        """``pid``'s exit code once the zygote reaped it; ``None`` while it runs, after waiting
        up to ``timeout`` seconds for it (``None``: as long as it takes)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while pid not in self.exited:
            try:
                self._receive(None if deadline is None else max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                return None
        return self.exited[pid]

    def close(self) -> None:
        self.control.close()  # the zygote exits when its end reads end-of-file
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


_zygote: Zygote | None = None


def zygote() -> Zygote:
    """This test process's zygote, started at the first call (about 5 s of imports)."""
    global _zygote
    if _zygote is None or not _zygote.alive():
        _zygote = Zygote()
        atexit.register(_zygote.close)
    return _zygote


class Driver:
    """``subprocess.Popen([sys.executable, "-c", source], stdout=PIPE, stderr=PIPE, text=text,
    stdin=stdin, env=env, cwd=cwd)``, forked from the zygote."""

    def __init__(self, source: str, stdin=None, env: dict[str, str] | None = None, cwd: str | None = None,
                 text: bool = True):
        self.args = [sys.executable, "-c", source]
        self.returncode: int | None = None
        self._readers: list[threading.Thread] | None = None
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        if stdin == subprocess.PIPE:
            in_r, in_w = os.pipe()
        elif stdin in (None, subprocess.DEVNULL):
            in_r, in_w = os.open(os.devnull, os.O_RDONLY), None
        else:
            raise ValueError("stdin: None, DEVNULL or PIPE")
        theirs = [in_r, out_w, err_w]
        try:
            self.pid = zygote().fork(source, theirs, dict(os.environ if env is None else env),
                                     os.getcwd() if cwd is None else os.fspath(cwd))
        except BaseException:
            for fd in (out_r, err_r, in_w):
                if fd is not None:
                    os.close(fd)
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        # the caller's streams, open until it closes them, as Popen(text=text) makes them
        self._empty = "" if text else b""
        if in_w is None:
            self.stdin = None
        else:
            self.stdin = io.TextIOWrapper(open(in_w, "wb"), write_through=True) if text else open(in_w, "wb", 0)  # noqa: SIM115
        self.stdout = open(out_r, "r" if text else "rb")  # noqa: SIM115
        self.stderr = open(err_r, "r" if text else "rb")  # noqa: SIM115

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = zygote().returncode(self.pid, 0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = zygote().returncode(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # (not once reaped: the pid may be someone else's)
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Both outputs to their end, then the exit, as ``Popen.communicate`` (call it again
        after a ``TimeoutExpired``)."""
        if self._readers is None:
            if self.stdin is not None:
                self.stdin.close()
            self._out: list = []
            self._err: list = []
            self._readers = [threading.Thread(target=lambda s=s, into=into: into.append(s.read()), daemon=True)
                             for s, into in ((self.stdout, self._out), (self.stderr, self._err))]
            for reader in self._readers:
                reader.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in self._readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        for stream in (self.stdout, self.stderr):
            stream.close()
        return self._empty.join(self._out), self._empty.join(self._err)


def popen(source: str, stdin=None, env: dict[str, str] | None = None, cwd: str | None = None,
          text: bool = True) -> Driver:
    """``subprocess.Popen([sys.executable, "-c", source], stdout=PIPE, stderr=PIPE, text=text, ...)``,
    forked from this test process's zygote."""
    return Driver(source, stdin=stdin, env=env, cwd=cwd, text=text)


def run(source: str, timeout: float, env: dict[str, str] | None = None, cwd: str | None = None,
        text: bool = True) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, "-c", source], capture_output=True, text=text,
    timeout=timeout, cwd=cwd)``, forked from this test process's zygote (killed past ``timeout``)."""
    proc = Driver(source, env=env, cwd=cwd, text=text)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

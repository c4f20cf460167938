"""The warm launcher: worker processes forked from one interpreter that has imported them once.

A worker started as ``python -c BOOTSTRAP`` (``_workers.process``) spends about 0.3 s of CPU
importing numpy, gymnasium and aiocollect's worker before it builds an env, and 1.5 s more
when it gets its own copy of a torch policy (``_policies.worker_actor``). A program that builds
many collectors (a test suite, a hyper-parameter sweep) pays that for every worker of every
collector. With ``AIOCOLLECT_WARM_START=1`` in the environment, the main process instead
starts one *launcher* (a child of its own, at the first worker it needs) that imports those
modules once (torch and tensordict too, at the first worker that needs them), freezes them
(``gc.freeze``) and then only forks: each worker is a fork of it, which costs milliseconds.

What a launched worker keeps of a fresh one:

- what the main process has **at the launch**, not at the launcher's start: the environment
  variables, the current directory, ``stdout``/``stderr`` (the main process's fds 1 and 2,
  sent with each request), ``sys.path`` (from the setup message, as before), stdin on
  ``/dev/null``, a session of its own, the fds the pool passes at the same numbers, no other;
- its exit is learnt from a *pidfd* (the launcher opens it before the worker can be reaped and
  sends it with the pid, so it can never name a recycled pid), signals go through it, and the
  exit status comes from the launcher, which reaps its children (``returncode``);
- it dies with its parent: ``PR_SET_PDEATHSIG`` (``child.main``) now names the launcher, and
  the launcher, which reads its control socket all the time, kills its workers and exits as
  soon as that socket reads end-of-file (the main process is gone, however it died);
- fresh random state: ``random`` reseeds itself after a fork, and numpy's global generator is
  reseeded here, as a new interpreter would seed them.

What it cannot keep: modules imported by the launcher were imported with the launcher's
``sys.path`` and environment (aiocollect reads its own variables when it uses them, never at
import), and a worker's parent is the launcher. That is why it is a switch, off by default:
``tests/conftest.py`` turns it on for the suite's collectors, except where the workers'
start-up is what a test is about.

``shutdown()`` stops the launcher; the next worker starts a new one. Otherwise it exits with
the main process, when the process's fds close: after every ``atexit`` hook and finalizer, so
that a collector shut down at exit (its ``weakref.finalize``) still finds its workers; an
``atexit`` hook of its own would run before the finalizers registered earlier. A forked copy
of the main process never uses its parent's launcher.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sys
import threading
from pathlib import Path

from . import protocol

SWITCH = "AIOCOLLECT_WARM_START"
"""The environment variable that turns the launcher on (read at each worker's start)."""

PRELOAD = ("numpy", "gymnasium", "cloudpickle", "aiocollect._workers.child", "aiocollect._workers.protocol",
           "aiocollect._workers.shm", "aiocollect._workers.bell", "aiocollect._envs.group", "aiocollect._errors")
"""What every worker imports: the launcher imports it once, at its start."""

TORCH = ("torch", "tensordict", "tensordict.nn")
"""What a worker with its own copy of the policy imports: the launcher imports it at the first
such worker (``launch(..., torch=True)``). Never JAX: a worker given a JAX policy imports it
after its fork (``_policies.jax_worker``), as JAX must not run in a process that forks."""

BOOTSTRAP = (
    "import sys; sys.path[:1] = [p for p in sys.path[:1] if p]; "
    "import aiocollect._workers.launcher as launcher; launcher.serve(int(sys.argv[1]))"
)
"""What the launcher runs: the current directory off ``sys.path`` (as ``process.BOOTSTRAP``)."""

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
_STARTUP_S = 120.0
_CONTROL_FD = 3


def enabled() -> bool:
    """Whether workers start from the launcher: ``AIOCOLLECT_WARM_START`` is on and the system
    has pidfds (Linux >= 5.3)."""
    return bool(protocol.env_flag(SWITCH)) and hasattr(os, "pidfd_open") and hasattr(socket, "send_fds")


class Launcher:
    """The main process's end of the launcher: ``fork`` a worker, learn its ``returncode``.
    Requests are serialised by a lock; each is answered at once (a fork takes milliseconds;
    the first with ``torch=True`` waits for the launcher to import torch)."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([_PACKAGE_ROOT, *filter(None, [env.get("PYTHONPATH")])])
        null = os.open(os.devnull, os.O_RDWR)
        try:
            if theirs.fileno() == _CONTROL_FD:  # (a dup2 onto itself would leave it close-on-exec)
                theirs = socket.socket(fileno=os.dup(theirs.detach()))
            # no Popen: nothing that warns at interpreter exit about a process still running,
            # as the launcher is, by design (it exits when this process's fds close)
            self.pid = os.posix_spawn(
                sys.executable, [sys.executable, "-c", BOOTSTRAP, str(_CONTROL_FD)], env,
                file_actions=[(os.POSIX_SPAWN_DUP2, null, 0), (os.POSIX_SPAWN_DUP2, null, 1),
                              (os.POSIX_SPAWN_DUP2, theirs.fileno(), _CONTROL_FD)],
                setsid=True, setsigmask=(), setsigdef=(signal.SIGPIPE, signal.SIGXFSZ))
        finally:
            os.close(null)
            theirs.close()
        self._pidfd = os.pidfd_open(self.pid)
        self._fd = ours.detach()  # (a raw fd: no socket object to warn at exit that it is open)
        self._lock = threading.Lock()
        self._torch = False
        try:
            self._receive(_STARTUP_S)
        except BaseException:
            self.close()
            raise

    def alive(self) -> bool:
        return self._fd >= 0 and not select.select([self._pidfd], [], [], 0)[0]

    def fork(self, args: list[str], pass_fds: list[int], env: dict[str, str], *,
             torch: bool = False) -> tuple[int, int]:
        """Fork a worker that runs ``child.run(["-c", *args])`` with ``pass_fds`` at the same
        numbers; ``(pid, pidfd)``."""
        std = [fd for fd in (1, 2) if _is_open(fd)]
        request = {"op": "fork", "args": args, "fds": pass_fds, "std": std, "env": env, "cwd": os.getcwd(),
                   "imports": list(TORCH) if torch and not self._torch else []}
        with self._lock, self._socket(60.0) as control:
            socket.send_fds(control, [json.dumps(request).encode()], [*std, *pass_fds])
            reply, fds = self._receive(_STARTUP_S if request["imports"] else 60.0)
        if torch:
            self._torch = True
        return reply["pid"], fds[0]

    def returncode(self, pid: int) -> int | None:
        """``pid``'s exit status once it exited (call it when its pidfd is readable); ``None``
        while it runs. ``-9`` if the launcher is gone (its workers died with it)."""
        with self._lock:
            try:
                with self._socket(30.0) as control:
                    control.sendall(json.dumps({"op": "code", "pid": pid}).encode())
                reply, _ = self._receive(30.0)
            except (OSError, RuntimeError):
                return -9
        return reply["code"]

    @contextlib.contextmanager
    def _socket(self, timeout: float):
        if self._fd < 0:
            raise RuntimeError("aiocollect's worker launcher was shut down")
        control = socket.socket(fileno=self._fd)
        try:
            control.settimeout(timeout)
            yield control
        finally:
            control.detach()

    def _receive(self, timeout: float) -> tuple[dict, list[int]]:
        with self._socket(timeout) as control:
            data, fds, _, _ = socket.recv_fds(control, 1 << 16, 1)
        if not data:
            raise RuntimeError("aiocollect's worker launcher exited")
        reply = json.loads(data)
        if "error" in reply:
            for fd in fds:
                os.close(fd)
            raise RuntimeError(f"aiocollect's worker launcher failed:\n{reply['error']}")
        return reply, fds

    def close(self) -> None:
        """Stop the launcher (it kills any worker still running) and reap it."""
        if self._fd >= 0:
            os.close(self._fd)  # end-of-file: the launcher exits
            self._fd = -1
        if self._pidfd >= 0:
            if not select.select([self._pidfd], [], [], 10.0)[0]:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            os.close(self._pidfd)
            self._pidfd = -1


_launcher: Launcher | None = None
_owner = 0
_lock = threading.Lock()


def launcher() -> Launcher:
    """This process's launcher, started at the first call (and again if it died)."""
    global _launcher, _owner
    with _lock:
        if _launcher is None or _owner != os.getpid() or not _launcher.alive():
            if _launcher is not None and _owner == os.getpid():
                _launcher.close()
            _launcher = Launcher()
            _owner = os.getpid()
        return _launcher


def current() -> Launcher | None:
    """This process's launcher if one runs (never one inherited by a fork)."""
    return _launcher if _launcher is not None and _owner == os.getpid() else None


def shutdown() -> None:
    """Stop this process's launcher, if any (its workers, if any still run, are killed)."""
    global _launcher
    with _lock:
        if _launcher is not None and _owner == os.getpid():
            _launcher.close()
        _launcher = None



def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


# -- the launcher process ------------------------------------------------------------------


def serve(control_fd: int) -> None:
    """The launcher's life: import ``PRELOAD``, then fork a worker per request and report
    exits, until the control socket reads end-of-file; never returns (a forked worker runs
    ``child.run`` from here)."""
    import gc
    import traceback

    _close_all_but(0, 1, 2, control_fd)  # (posix_spawn passes every inheritable fd: keep none)
    control = socket.socket(fileno=control_fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        for name in PRELOAD:
            __import__(name)
    except BaseException:  # noqa: BLE001 - reported to the main process
        control.send(json.dumps({"error": traceback.format_exc()}).encode())
        os._exit(1)
    gc.freeze()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    running: set[int] = set()
    exited: dict[int, int] = {}

    def reap(pid: int = -1) -> None:
        while running:
            try:
                got, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                return
            if not got:
                return
            running.discard(got)
            exited[got] = os.waitstatus_to_exitcode(status)
            if pid != -1:
                return

    control.send(b'{"ready": true}')
    while True:
        ready, _, _ = select.select([control.fileno(), wake_r], [], [])
        if wake_r in ready:
            try:
                while os.read(wake_r, 512):
                    pass
            except BlockingIOError:
                pass
            reap()
        if control.fileno() not in ready:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(control, 1 << 20, 64)
        except OSError:
            data, fds = b"", []
        if not data:  # the main process closed its end, or died: so do its workers
            for pid in running:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            os._exit(0)
        request = json.loads(data)
        if request["op"] == "code":
            pid = request["pid"]
            if pid in running:
                reap(pid)
            control.send(json.dumps({"code": exited.pop(pid, None) if pid not in running else None}).encode())
            continue
        try:
            for name in request["imports"]:
                __import__(name)
            gc.freeze()
        except BaseException:  # noqa: BLE001 - reported to the main process
            for fd in fds:
                os.close(fd)
            control.send(json.dumps({"error": traceback.format_exc()}).encode())
            continue
        pid = os.fork()
        if pid == 0:
            _become_worker(request, fds)
        for fd in fds:
            os.close(fd)
        running.add(pid)
        pidfd = os.pidfd_open(pid)
        socket.send_fds(control, [json.dumps({"pid": pid}).encode()], [pidfd])
        os.close(pidfd)


def _become_worker(request: dict, fds: list[int]) -> None:
    """In the forked worker: the fds, streams, directory, environment and signals a fresh
    worker would have, then the worker's life (``child.run``, which never returns)."""
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.setsid()
        std = request["std"]
        targets = [*std, *request["fds"]]
        high = max([*targets, *fds, 2]) + 1
        moved = [_dup_above(fd, high) for fd in fds]
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        for fd, target in zip(moved, targets):
            os.dup2(fd, target, inheritable=True)
        _close_all_but(0, 1, 2, *targets)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        if "numpy.random" in sys.modules:
            sys.modules["numpy.random"].seed()  # (``random`` reseeds itself after a fork)
        if "torch" in sys.modules:  # (as a fresh interpreter's: its own entropy, not the launcher's state)
            sys.modules["torch"].seed()
        sys.argv[:] = ["-c", *request["args"]]
    except BaseException:  # noqa: BLE001 - the worker cannot start: the engine sees it exit
        os._exit(1)
    from . import child

    child.run(sys.argv)


def _close_all_but(*keep: int) -> None:
    """Close every fd of this process but ``keep``."""
    for name in os.listdir("/proc/self/fd"):
        if int(name) not in keep:
            try:
                os.close(int(name))
            except OSError:
                pass


def _dup_above(fd: int, low: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD, low)

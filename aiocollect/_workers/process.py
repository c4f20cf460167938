"""``WorkerProcess``: a worker's OS process, started clean and reaped without SIGCHLD.

**Reaping.** asyncio's subprocesses (uvloop's too) learn that a child exited from a
``SIGCHLD`` handler. Whoever installs another handler takes that away without a word
(iterating a torch ``DataLoader`` with ``num_workers > 0`` does, for its own workers), and
``await process.wait()`` then never returns: ``shutdown()`` used to hang there. So a worker
is a plain ``subprocess.Popen`` here, and its exit is learnt from a *pidfd* (Linux >= 5.3:
a file descriptor that becomes readable when the process exits, watched by the event loop
like a socket) or, where there is none, by polling ``Popen.poll()`` every 20 ms. Nobody's
``SIGCHLD`` handler matters, and signals go through the pidfd too, so they can never reach
another process that got a recycled pid.

**Starting.** ``python -m module`` and ``python -c code`` put the current directory first
on ``sys.path``, so a ``traceback.py`` or ``socket.py`` lying in the directory the user
started from would be imported by every worker in place of the standard module. A worker
therefore starts as ``python -c BOOTSTRAP``: the bootstrap drops that entry before
importing anything else, and the worker later takes the main process's ``sys.path``
from its setup message (which has the current directory if, and only if, the main process
had it). ``-P`` (Python >= 3.11) would do the same for the first step only, and ``-I``
would also drop ``PYTHONPATH``, through which the worker finds aiocollect.

**Warm start.** With ``AIOCOLLECT_WARM_START=1``, a worker is instead forked from a launcher
that imported the worker once (``_workers.launcher``, which says what it keeps of a fresh
interpreter): its pidfd comes from the launcher and its exit status too; the rest is as above.

Everything but ``kill_now`` runs on the engine loop that started the process.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import subprocess
import sys

from . import launcher

BOOTSTRAP = (
    "import sys; sys.path[:1] = [p for p in sys.path[:1] if p]; "
    "import aiocollect._workers.child as child; child.run(sys.argv)"
)
"""What a worker runs: ``sys.path[0]`` is ``""`` (the current directory) under ``-c``;
drop it, then import the worker (``aiocollect._workers.child``)."""

_POLL_S = 0.02


def worker_command(*args: int) -> list[str]:
    """The command line of a worker: the interpreter, the bootstrap, its arguments."""
    return [sys.executable, "-c", BOOTSTRAP, *map(str, args)]


class WorkerProcess:
    """One worker's process: ``pid``, ``returncode`` (``None`` while it runs, negative
    when a signal killed it, as ``Popen.returncode``), ``await wait()``, ``send_signal``.

    Args:
        args: the command line (``worker_command``).
        pass_fds: file descriptors the process inherits (its socket, shared memory...).
        env: its environment variables.
        torch: it will import torch (its own copy of the policy): a warm launcher imports
            torch before it forks it.
    """

    def __init__(self, args: list[str], *, pass_fds: list[int], env: dict[str, str], torch: bool = False):
        self._popen: subprocess.Popen | None = None
        self._launcher: launcher.Launcher | None = None
        if launcher.enabled():
            self._launcher = launcher.launcher()
            self.pid, self._pidfd = self._launcher.fork(args[3:], pass_fds, env, torch=torch)
        else:
            # A session of its own: the terminal's Ctrl-C (sent to the whole foreground process
            # group) reaches only the main process, which handles it, and never a worker still
            # starting up (which would print a KeyboardInterrupt traceback of its imports).
            self._popen = subprocess.Popen(args, pass_fds=pass_fds, stdin=subprocess.DEVNULL, env=env,
                                           start_new_session=True)
            self.pid = self._popen.pid
            self._pidfd = _pidfd_open(self.pid)
        self.returncode: int | None = None
        self._loop = asyncio.get_running_loop()
        self._exited = asyncio.Event()
        if self._pidfd >= 0:
            self._loop.add_reader(self._pidfd, self._on_exit)

    def poll(self) -> int | None:
        """The exit status if the process has exited (reaping it), else ``None``."""
        if self.returncode is None:
            if self._popen is not None:
                self.returncode = self._popen.poll()
            elif self._launcher is not None and self._pidfd >= 0 and select.select([self._pidfd], [], [], 0)[0]:
                self.returncode = self._launcher.returncode(self.pid)
        return self.returncode

    async def wait(self) -> int:
        """Wait until the process exits; its exit status."""
        while (code := self.poll()) is None:
            if self._pidfd >= 0 and not self._exited.is_set():
                await self._exited.wait()
            else:
                await asyncio.sleep(_POLL_S)
        return code

    def send_signal(self, sig: int) -> None:
        """Send ``sig``; ``ProcessLookupError`` if the process is gone."""
        if self.poll() is not None:
            raise ProcessLookupError(self.pid)
        if self._pidfd >= 0:
            signal.pidfd_send_signal(self._pidfd, sig)
        else:
            os.kill(self.pid, sig)

    def close(self) -> None:
        """Stop watching the process (call once it exited, on the engine loop)."""
        self.poll()
        if self._pidfd >= 0:
            self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = -1

    def kill_now(self) -> None:
        """From any thread, once the engine loop is gone: ``SIGKILL`` and reap the process
        if it still runs, and forget it."""
        if self.poll() is None:
            if self._popen is None:
                try:
                    signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                select.select([self._pidfd], [], [])
                self.poll()
            else:
                try:
                    os.kill(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.returncode = self._popen.wait()
        if self._pidfd >= 0:
            os.close(self._pidfd)  # (its loop is gone, and its reader with it)
            self._pidfd = -1

    def _on_exit(self) -> None:
        self._loop.remove_reader(self._pidfd)
        self.poll()
        self._exited.set()


def _pidfd_open(pid: int) -> int:
    """A pidfd for ``pid``, or -1 where the system has none (not Linux, kernel < 5.3)."""
    if not hasattr(os, "pidfd_open"):
        return -1
    try:
        return os.pidfd_open(pid)
    except OSError:
        return -1

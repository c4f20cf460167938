"""The env worker: a fresh interpreter that builds its envs and steps them on command.

Started as ``python -m aiocollect._workers.child SOCK_FD SHM_FD`` by the pool. It never
imports torch (``import aiocollect`` is lazy): it needs gymnasium, numpy, cloudpickle and
the user's env code. Nothing of the user's ``__main__`` module is re-imported; env
factories arrive pickled by value with cloudpickle.

Its life:

1. read the setup message (``sys.path``, the pickled env entry, the shared-memory layout,
   its rows), build the envs, check their spaces, answer ``("ready", pid)``;
2. loop: wait for a command in its control line (``_workers.protocol``), step or reset the
   envs, write its completion. After every step, envs that finished are reset right
   away (unless ``reset_when_done`` is off) and the first observation of their next
   episode is left in ``reset_obs``, so the engine's reset of those envs costs no round
   trip;
3. on ``CLOSE``, or when the engine's end of the socket closes (the main process died),
   close the envs and exit at once (``os._exit``: no interpreter teardown, no ``atexit``
   hooks; ``env.close()`` is where envs release what they hold).

An exception in an env is answered with ``ERROR`` and its traceback text; the worker
then waits for ``CLOSE``.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
import traceback


def _die_with_parent() -> None:
    """Linux: get SIGKILL when the thread that started us exits."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    except Exception:  # noqa: BLE001 - best effort, the socket EOF still works
        pass


def describe_exception(exc: BaseException) -> dict:
    from .._errors import pickled_exception

    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
        "env": getattr(exc, "env_index", None),
        "pickled": pickled_exception(exc),
    }


def main(argv: list[str]) -> int:
    parent = os.getppid()
    _die_with_parent()
    if os.getppid() != parent:  # the parent died before prctl
        return 1
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    sock = socket.socket(fileno=int(argv[1]))
    shm_fd = int(argv[2])

    from . import protocol

    setup = protocol.recv_frame(sock)
    sys.path[:] = setup["sys_path"]
    try:
        worker = _Worker(setup, shm_fd)
    except BaseException as exc:  # noqa: BLE001 - reported to the engine
        sock.sendall(protocol.frame(("error", describe_exception(exc))))
        return 1
    os.close(shm_fd)
    sock.sendall(protocol.frame(("ready", os.getpid())))
    try:
        return worker.serve(sock)
    finally:
        worker.close()


class _Worker:
    def __init__(self, setup: dict, shm_fd: int):
        import cloudpickle
        import numpy as np

        from .._envs.group import make_group
        from .shm import SharedArrays, set_aside_resets

        entry = cloudpickle.loads(setup["entry"])
        self.group, _ = make_group(entry, setup["kwargs"])
        obs_space, action_space = setup["spaces"]
        g = self.group
        if g.observation_space != obs_space or g.action_space != action_space:
            raise ValueError(
                f"this worker's envs have spaces {g.observation_space} / {g.action_space}, but "
                f"the collector was planned for {obs_space} / {action_space}: the env factory "
                "builds different envs in different processes."
            )
        lo, hi = setup["rows"]
        if hi - lo != g.num_envs:
            raise ValueError(f"this worker built {g.num_envs} envs, the collector planned {hi - lo}.")
        self.shared = SharedArrays(setup["layout"], shm_fd)
        rows = self.shared.rows(lo, hi)
        self.obs = self.shared.obs(rows)
        self.reset_obs = self.shared.obs(rows, "reset_obs")
        self._set_aside = set_aside_resets
        obs = {leaf.key: a for leaf, a in zip(g.obs_leaves, self.obs)}
        g.bind(obs, rows["reward"], rows["terminated"], rows["truncated"])
        self.rows = rows
        self.control = self.shared.control[setup["index"]]
        self.spin_s = setup["spin_s"]
        self._inbox = bytearray(64)
        self.action = rows["action"]
        self.autoreset = setup["reset_when_done"]
        self._done = np.zeros(g.num_envs, dtype=bool)
        self._np = np

    def serve(self, sock: socket.socket) -> int:
        """Carry out commands until ``CLOSE`` or end-of-file (see ``_workers.protocol``)."""
        from . import protocol

        np = self._np
        count_nonzero = np.count_nonzero
        group, rows, ctl = self.group, self.rows, self.control
        step, reset = group.step_now, group.reset_now
        action, done = self.action, self._done
        terminated, truncated = rows["terminated"], rows["truncated"]
        pre_reset, reset_mask = rows["pre_reset"], rows["reset_mask"]
        seed, seed_set = rows["seed"], rows["seed_set"]
        autoreset = self.autoreset
        step_code, reset_code = protocol.STEP_CODE, protocol.RESET_CODE
        CMD, DONE, E_ASLEEP = protocol.CMD, protocol.DONE, protocol.E_ASLEEP
        doorbell = protocol.OK
        if not self.spin_s:
            ctl[protocol.W_ASLEEP] = 1  # never spinning: always ring
        last = 0
        while True:
            word = int(ctl[CMD])
            if word >> 2 == last:
                word = self._wait(sock, last)
                if word is None:
                    return 0  # CLOSE, or the engine is gone
            last, code = word >> 2, word & 3
            try:
                if code == step_code:
                    step(action)
                    # count_nonzero: a third of the cost of .any() on small arrays
                    if autoreset and (count_nonzero(terminated) or count_nonzero(truncated)):
                        np.logical_or(terminated, truncated, out=done)
                        self._reset_finished(np.flatnonzero(done))
                elif code == reset_code:
                    idx = np.flatnonzero(reset_mask)
                    seeds = None
                    if seed_set[idx].any():
                        seeds = [int(s) if f else None for s, f in zip(seed, seed_set)]
                    reset(idx, seeds)
                    pre_reset[idx] = False
            except Exception as exc:  # noqa: BLE001 - reported to the engine
                sock.settimeout(None)  # however long the report, it must get through
                sock.sendall(protocol.ERROR + protocol.frame(describe_exception(exc)))
                continue
            ctl[DONE] = last
            if ctl[E_ASLEEP]:
                sock.send(doorbell)

    def _wait(self, sock: socket.socket, last: int) -> int | None:
        """The next command word once it is posted; ``None`` on ``CLOSE`` or end-of-file."""
        from . import protocol

        ctl, CMD = self.control, protocol.CMD
        spin_s = self.spin_s
        if spin_s:
            clock = time.perf_counter
            end = clock() + spin_s
            while clock() < end:
                word = int(ctl[CMD])
                if word >> 2 != last:
                    return word
            ctl[protocol.W_ASLEEP] = 1
            timeout = 0.001  # a doorbell might be missed (see the protocol): look again
        else:
            timeout = None
        sock.settimeout(timeout)
        buf = self._inbox
        try:
            while True:
                word = int(ctl[CMD])
                if word >> 2 != last:
                    return word
                try:
                    n = sock.recv_into(buf)
                except TimeoutError:
                    sock.settimeout(timeout := min(timeout * 2, 0.1))
                    continue
                if n == 0 or protocol.CLOSE[0] in buf[:n]:
                    return None
        finally:
            if spin_s:
                ctl[protocol.W_ASLEEP] = 0

    def _reset_finished(self, idx) -> None:
        """Reset finished envs now; keep their final obs in ``obs``, the new one aside."""
        final = [a[idx] for a in self.obs]  # fancy indexing copies
        self.group.reset_now(idx, None)
        self._set_aside(self.obs, self.reset_obs, self.rows["pre_reset"], idx, final)

    def close(self) -> None:
        try:
            self.group.close()
        except Exception:  # noqa: BLE001 - exiting anyway
            pass


if __name__ == "__main__":
    code = main(sys.argv)
    # The envs are closed: skip the interpreter's teardown, which takes up to a second
    # when env code imported big libraries (torch...), as multiprocessing's workers do.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

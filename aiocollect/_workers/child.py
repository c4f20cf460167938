"""The env worker: a fresh interpreter that builds its envs and steps them on command.

Started as ``python -m aiocollect._workers.child SOCK_FD SHM_FD`` by the pool. It never
imports torch (``import aiocollect`` is lazy): it needs gymnasium, numpy, cloudpickle and
the user's env code. Nothing of the user's ``__main__`` module is re-imported; env
factories arrive pickled by value with cloudpickle.

Its life:

1. read the setup message (``sys.path``, the pickled env entry, the shared-memory layout,
   its rows), build the envs, check their spaces, answer ``("ready", pid)``;
2. loop: wait for a one-byte command, step or reset the envs, answer ``OK``. After
   every step, envs that finished are reset right away (unless ``reset_when_done`` is
   off) and the first observation of their next episode is left in ``reset_obs``, so
   the engine's reset of those envs costs no round trip;
3. on ``CLOSE``, or when the engine's end of the socket closes (the main process died),
   close the envs and exit.

An exception in an env is answered with ``ERROR`` and its traceback text; the worker
then waits for ``CLOSE``.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
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
    except Exception:  # pragma: no cover - best effort, the socket EOF still works
        pass


def describe_exception(exc: BaseException) -> dict:
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
        "env": getattr(exc, "env_index", None),
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
        from .shm import SharedArrays

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
        obs = {leaf.key: a for leaf, a in zip(g.obs_leaves, self.obs)}
        g.bind(obs, rows["reward"], rows["terminated"], rows["truncated"])
        self.rows = rows
        self.action = rows["action"]
        self.autoreset = setup["reset_when_done"]
        self._done = np.zeros(g.num_envs, dtype=bool)
        self._np = np

    def serve(self, sock: socket.socket) -> int:
        from . import protocol

        np = self._np
        group, rows = self.group, self.rows
        step, reset = group.step_now, group.reset_now
        action, done = self.action, self._done
        terminated, truncated = rows["terminated"], rows["truncated"]
        pre_reset, reset_mask = rows["pre_reset"], rows["reset_mask"]
        seed, seed_set = rows["seed"], rows["seed_set"]
        autoreset = self.autoreset
        cmd = bytearray(1)
        ok, step_cmd, reset_cmd = protocol.OK, protocol.STEP[0], protocol.RESET[0]
        while True:
            if sock.recv_into(cmd) == 0:
                return 0  # the engine is gone
            c = cmd[0]
            try:
                if c == step_cmd:
                    step(action)
                    if autoreset:
                        np.logical_or(terminated, truncated, out=done)
                        if done.any():
                            self._reset_finished(np.flatnonzero(done))
                elif c == reset_cmd:
                    idx = np.flatnonzero(reset_mask)
                    seeds = None
                    if seed_set[idx].any():
                        seeds = [int(s) if f else None for s, f in zip(seed, seed_set)]
                    reset(idx, seeds)
                    pre_reset[idx] = False
                else:
                    return 0  # CLOSE
            except Exception as exc:  # noqa: BLE001 - reported to the engine
                sock.sendall(protocol.ERROR + protocol.frame(describe_exception(exc)))
                continue
            sock.send(ok)

    def _reset_finished(self, idx) -> None:
        """Reset finished envs now; keep their final obs in ``obs``, the new one aside."""
        final = [a[idx] for a in self.obs]  # fancy indexing copies
        self.group.reset_now(idx, None)
        for a, r, f in zip(self.obs, self.reset_obs, final):
            r[idx] = a[idx]
            a[idx] = f
        self.rows["pre_reset"][idx] = True

    def close(self) -> None:
        try:
            self.group.close()
        except Exception:  # noqa: BLE001 - exiting anyway
            pass


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""The env worker: a fresh interpreter that builds its envs and steps them on command.

Started by the pool as ``python -c BOOTSTRAP SOCK_FD SHM_FD DUMP_FD`` (``_workers.process``:
the bootstrap keeps the current directory off ``sys.path``, then calls ``run``). It does
not import torch (``import aiocollect`` is lazy): it needs gymnasium, numpy, cloudpickle and
the user's env code; a worker given its own copy of the policy (``_policies.worker_actor``)
imports torch for it, and JAX too for a JAX policy's (``_policies.jax_worker``). Nothing of
the user's ``__main__`` module is re-imported; env factories arrive pickled by value with
cloudpickle.

Its life:

1. read the setup message (``sys.path``, the pickled env entry, the shared-memory layout,
   its parts: each a control line and rows), build the envs, check their spaces, answer
   ``("ready", pid)``;
2. loop: wait for a command in a part's control line (``_workers.protocol``; with two
   parts, the worker steps one while the engine runs the policy for the other), step or
   reset that part's envs (or take a run of steps: random actions, drawn in advance),
   write its completion. A step writes straight into the rollout storage
   (``_workers.shm``) at the slot and column it was given: what the envs returned at
   column ``t``, and the observations the next step starts from at ``t + 1``. Envs that
   finished are reset right away (unless ``reset_when_done`` is off), their next
   episode's first observation going to ``t + 1``, so the engine's reset of those envs
   costs no round trip. ``max_frames_per_traj`` is applied here too (the worker counts
   its envs' steps), for the same reason;
3. on ``CLOSE``, or when the engine's end of the socket closes or resets (the main
   process died), close the envs and exit at once, quietly (``os._exit``: no interpreter
   teardown, no ``atexit`` hooks, no traceback; ``env.close()`` is where envs release what
   they hold). Every env is closed, even after one whose ``close()`` raised; those that
   raised are reported to the engine (``protocol.CLOSED``), which logs them.

An exception in an env is answered with ``ERROR`` and its traceback text; the worker
then waits for ``CLOSE``.

``SIGUSR1`` makes the worker write the Python stack of each of its threads to ``DUMP_FD``
(``faulthandler``, which works even while a C extension holds the interpreter): the pool
asks for it when a step outlives ``step_timeout`` (``_workers.watchdog``), just before it
kills the worker, so that the error shows where the env was stuck. A worker with its own copy
of the policy sets ``ACTING`` in the part's control line while that copy computes a step's
actions, so that the error names the policy, not the env, when it is the policy that hung.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import select
import signal
import socket
import sys
import time
from typing import cast


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
    """What the engine needs to report ``exc`` (``EnvError.from_remote``), whatever ``exc``
    does: a ``__str__`` that raises gives ``<unprintable TYPE>``, a huge message or
    traceback is truncated (``_errors.MAX_TEXT``), an exception that cannot be pickled, or
    pickles too big, travels as text only."""
    from .._errors import exception_text, exception_traceback, pickled_exception

    env = getattr(exc, "env_index", None)
    return {
        "type": type(exc).__name__,
        "message": exception_text(exc),
        "traceback": exception_traceback(exc),
        "env": env if isinstance(env, int) else None,
        "pickled": pickled_exception(exc),
        "policy": getattr(exc, "_aiocollect_policy", False),
    }


def run(argv: list[str]) -> None:
    """The worker's whole life (``argv``: ``[_, SOCK_FD, SHM_FD, DUMP_FD]``); never returns.

    A closed or reset control socket means that the engine is gone (the main process was
    killed): the worker exits quietly, with no traceback on the terminal it shares.
    """
    try:
        code = main(argv)
    except (ConnectionError, EOFError):
        code = 0
    # The envs are closed: skip the interpreter's teardown, which takes up to a second
    # when env code imported big libraries (torch...), as multiprocessing's workers do.
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def main(argv: list[str]) -> int:
    parent = os.getppid()
    _die_with_parent()
    if os.getppid() != parent:  # the parent died before prctl
        return 1
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    sock = socket.socket(fileno=int(argv[1]))
    shm_fd = int(argv[2])
    if len(argv) > 3 and hasattr(faulthandler, "register"):
        faulthandler.register(signal.SIGUSR1, file=int(argv[3]), all_threads=True, chain=False)

    from . import protocol

    setup = protocol.recv_frame(sock)
    sys.path[:] = setup["sys_path"]
    try:
        worker = _Worker(setup, shm_fd)
    except BaseException as exc:  # noqa: BLE001 - reported to the engine
        sock.sendall(protocol.frame(("error", describe_exception(exc))))
        return 1
    os.close(shm_fd)
    try:
        sock.sendall(protocol.frame(("ready", os.getpid())))
        return worker.serve(sock)
    finally:
        worker.close(sock)


class _Worker:
    def __init__(self, setup: dict, shm_fd: int):
        import cloudpickle

        from .._envs.build import make_group
        from .._envs.group import InProcessGroup
        from .protocol import CMD
        from .rows import WorkerRows
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
        parts = setup["parts"]
        lo, hi = parts[0][1], parts[-1][2]
        if hi - lo != g.num_envs:
            raise ValueError(f"this worker built {g.num_envs} envs, the collector planned {hi - lo}.")
        self.shared = SharedArrays(setup["layout"], shm_fd)
        # (parts: envs stepped one by one, an ``InProcessGroup``: ``_workers.plan``)
        groups = cast(InProcessGroup, g).split([(a - lo, b - lo) for _, a, b in parts]) if len(parts) > 1 else [g]
        keys = [leaf.key for leaf in g.obs_leaves]
        self.parts = [
            (self.shared.control[line], group,
             WorkerRows(self.shared, a, b, keys, max_frames_per_traj=setup["max_frames_per_traj"],
                        reset_when_done=setup["reset_when_done"]))
            for (line, a, b), group in zip(parts, groups)
        ]
        """(control line, group, rows) of each part of the envs, stepped in turn."""
        self.control = self.parts[0][0]
        """The first part's line: it also holds this process's ``W_ASLEEP``."""
        self.spin_s = setup["spin_s"]
        self.bell = setup["bell"]
        """The write end of the doorbell pipe all workers ring (``protocol.ring_fd``)."""
        self.policy = None
        """The worker's own copy of the policy (``_policies.worker_actor``), if it has one."""
        self.acts: list = [None] * len(self.parts)
        if setup.get("policy") is not None:
            try:
                actor = _actor_class(setup["policy"].get("actor"))
                policy = self.policy = actor(setup["policy"], self.shared.arrays, action_space, keys,
                                             setup["policy"]["seeds"][setup["index"]], worker=setup["index"], first=lo)
                prepare = getattr(policy, "prepare", None)
                if prepare is not None:  # (a JAX copy compiles for each part's rows now, not at its first step)
                    for _, _, rows in self.parts:
                        prepare(rows.obs)
            except BaseException as exc:  # (its class not importable here...): the policy's error, not an env's
                with contextlib.suppress(AttributeError):
                    exc._aiocollect_policy = True  # type: ignore[attr-defined]  # (a mark: the policy's error)
                raise
            self.acts = [_acting(policy, ctl, rows, a, b) for (ctl, _, rows), (_, a, b) in zip(self.parts, parts)]
        self.sleeper = self._sleeper(setup)
        """Where it sleeps for its next command (``_workers.bell``), or ``None``: on its socket."""
        self._inbox = bytearray(64)
        self._poll = select.poll()
        self._cmd = CMD

    def _sleeper(self, setup: dict):
        """Its side of the pool's futex doorbell, if the pool rings one (``_workers.bell``)."""
        from .bell import Sleeper, futex

        if not setup.get("futex"):
            return None
        call = futex()
        if call is None:  # (the engine rings the futex: a sleep on the socket would never end)
            raise RuntimeError("the engine rings a futex doorbell, but this worker cannot wait on one")
        return Sleeper(self.shared.control, setup["index"], call)

    def serve(self, sock: socket.socket) -> int:
        """Carry out commands until ``CLOSE`` or end-of-file (see ``_workers.protocol``).

        With several parts, the next one looked at is the one after the part just
        served, so that no part waits while another's commands keep coming.
        """
        from . import protocol

        parts = self.parts
        count = len(parts)
        step_code, run_code = protocol.STEP_CODE, protocol.RUN_CODE
        DONE, E_ASLEEP, SLOT, COL = protocol.DONE, protocol.E_ASLEEP, protocol.SLOT, protocol.COL
        POLICY = protocol.POLICY
        acts, policy = self.acts, self.policy
        ring, bell = protocol.ring_fd, self.bell
        self._poll.register(sock, select.POLLIN)
        if not self.spin_s:
            self.control[protocol.W_ASLEEP] = 1  # never spinning: always ring
        posted = self._posted
        last = [0] * count
        j = 0
        while True:
            got = posted(last, j) or self._wait(sock, last, j)
            if got is None:
                return 0  # CLOSE, or the engine is gone
            j, word = got
            ctl, group, rows = parts[j]
            last[j] = seq = word >> 2
            try:
                code = word & 3
                act = acts[j] if ctl[POLICY] else None
                if code == step_code:
                    if act is not None:
                        act(int(ctl[SLOT]), int(ctl[COL]))
                    rows.step(group, int(ctl[SLOT]), int(ctl[COL]))
                elif code == run_code:
                    rows.run(group, int(ctl[SLOT]), int(ctl[COL]), ctl, word, act)
                else:
                    if policy is not None and rows.seed_set.any():  # set_seed: the policy's draws too
                        policy.reseed(int(rows.seed[int(rows.seed_set.argmax())]))
                    rows.reset(group, int(ctl[SLOT]), int(ctl[COL]))
            except BaseException as exc:  # noqa: BLE001 - reported to the engine
                # SystemExit, KeyboardInterrupt... raised by the env's own code are its
                # errors too: no signal raises them here (SIGINT is ignored, SIGTERM kills).
                sock.sendall(protocol.ERROR + protocol.frame(describe_exception(exc)))
                continue
            ctl[DONE] = seq
            if ctl[E_ASLEEP]:
                ring(bell)
            j = j + 1 if j + 1 < count else 0

    def _posted(self, last: list[int], j: int) -> tuple[int, int] | None:
        """A part with a command not yet served, looking from part ``j`` on, and its
        command word; ``None`` if there is none."""
        parts, cmd = self.parts, self._cmd
        count = len(parts)
        for _ in range(count):
            word = int(parts[j][0][cmd])
            if word >> 2 != last[j]:
                return j, word
            j = j + 1 if j + 1 < count else 0
        return None

    def _wait(self, sock: socket.socket, last: list[int], j: int) -> tuple[int, int] | None:
        """The next posted command, ``(part, word)``; ``None`` on ``CLOSE`` or end-of-file."""
        from . import protocol

        ctl, posted = self.control, self._posted
        spin_s = self.spin_s
        if spin_s:
            clock, yield_ = time.perf_counter, os.sched_yield
            end = clock() + spin_s
            while clock() < end:
                got = posted(last, j)
                if got is not None:
                    return got
                yield_()
            ctl[protocol.W_ASLEEP] = 1
            timeout_ms = 1  # a doorbell might be missed (see the protocol): look again
        if self.sleeper is not None:
            try:
                return self._sleep(sock, last, j)
            finally:
                if spin_s:
                    ctl[protocol.W_ASLEEP] = 0
        buf = self._inbox
        try:
            while True:
                got = posted(last, j)
                if got is not None:
                    return got
                if spin_s:  # (the socket itself never has a timeout: see protocol.ring)
                    if not self._poll.poll(timeout_ms):
                        timeout_ms = min(timeout_ms * 2, 100)
                        continue
                    try:
                        n = sock.recv_into(buf, 0, socket.MSG_DONTWAIT)
                    except BlockingIOError:
                        continue
                else:
                    n = sock.recv_into(buf)
                if n == 0 or protocol.CLOSE[0] in buf[:n]:
                    return None
        finally:
            if spin_s:
                ctl[protocol.W_ASLEEP] = 0

    def _sleep(self, sock: socket.socket, last: list[int], j: int) -> tuple[int, int] | None:
        """``_wait`` on the futex word (``_workers.bell``): the next posted command, ``None`` on
        ``CLOSE`` or end-of-file. The socket is read when the pool says it closes, and at
        intervals that double up to ``SLEEP_S``; after a spin (a ring might be missed, see the
        protocol) the first looks come sooner."""
        from .bell import FIRST_S, SLEEP_S

        sleeper, posted = self.sleeper, self._posted
        assert sleeper is not None  # (called with one)
        timeout = 0.001 if self.spin_s else FIRST_S
        while True:
            count = sleeper.count()  # (before the look: a ring after it ends the sleep below)
            got = posted(last, j)
            if got is not None:
                return got
            timed_out = sleeper.sleep(count, timeout)
            if timed_out or sleeper.closing:
                if self._closed(sock):
                    return None
                timeout = min(timeout * 2, SLEEP_S)

    def _closed(self, sock: socket.socket) -> bool:
        """``CLOSE`` or end-of-file on the socket (read without waiting)."""
        from . import protocol

        try:
            n = sock.recv_into(self._inbox, 0, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        return n == 0 or protocol.CLOSE[0] in self._inbox[:n]

    def close(self, sock: socket.socket) -> None:
        """Close every env, even after one whose ``close()`` raised (``SystemExit`` too), and
        tell the engine which did (``protocol.CLOSED``): it logs them once this process exited."""
        from .._envs.group import EnvCloseError
        from .._errors import exception_text, exception_traceback
        from . import protocol

        try:
            self.group.close(catch=BaseException)
            return
        except EnvCloseError as exc:
            report = str(exc)
        except BaseException as exc:  # noqa: BLE001 - a VectorEnv's own close(): reported too
            report = (f"close() of its VectorEnv raised {type(exc).__name__}: {exception_text(exc)}\n\n"
                      f"Traceback of the VectorEnv's close():\n{exception_traceback(exc).rstrip()}")
        try:
            sock.settimeout(1.0)  # (exiting: never wait long for an engine that does not read)
            sock.sendall(protocol.CLOSED + protocol.frame(report))
        except OSError:  # the engine is gone
            pass


def _actor_class(name: str | None) -> type:
    """The class of the worker's copy of the policy: ``WorkerActor`` (a torch policy), or the
    one a policy names (``ArrayPolicy.worker_actor``, ``"module:Class"``: a JAX policy's)."""
    if name is None:
        from .._policies.worker_actor import WorkerActor  # (torch: only for a worker given the policy)

        return WorkerActor
    import importlib

    module, _, cls = name.partition(":")
    return getattr(importlib.import_module(module), cls)


def _acting(policy, ctl, rows, lo: int, hi: int):
    """``act(s, t)`` for the part of rows ``lo:hi`` (control line ``ctl``): the worker's copy
    of the policy writes column ``t``'s actions, with ``ACTING`` set in the line meanwhile, so
    that a step that outlives ``step_timeout`` there is named as the policy's (``_workers.watchdog``)."""
    from .protocol import ACTING

    act = policy.act

    def acting(s: int, t: int) -> None:
        ctl[ACTING] = 1
        try:
            act(rows.obs, rows.action[t], s, t, lo, hi)
        finally:
            ctl[ACTING] = 0

    return acting


if __name__ == "__main__":
    run(sys.argv)

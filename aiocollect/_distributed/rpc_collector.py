"""``RPCCollector``: aiocollect collectors on ``torch.distributed.rpc`` workers.

The transport half of a distributed collector (``_distributed.remote_collectors`` has the rest): each
remote collector is a ``RemoteCollector`` created on an RPC worker with ``rpc.remote``;
batches and weights travel as RPC messages. A launched world puts the workers on ranks
0..n-1 and the driver on the last rank. The class docstring says what users see.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tensordict.nn import InteractionType

from .._collectors.checks import positive_seconds
from .._errors import CollectorError
from . import rpc_rendezvous
from .remote import RemoteCollector, switches
from .remote_collectors import RemoteCollectorsBase, plan_remotes, remote_options

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])

_launched_worlds: list[str] = []
"""The worlds launched in this process (at most one: RPC cannot be initialised twice)."""


def _remote_collector(payload: bytes, sys_path: list[str], switches: dict[str, str]) -> RemoteCollector:
    return RemoteCollector(payload, sys_path, switches)  # (runs on the worker)


def _one_port(master_port: int | None, tcp_port: int | None) -> int | None:
    """``master_port``, or ``tcp_port``, TorchRL's name for the rendezvous port."""
    if tcp_port is None:
        return master_port
    if master_port not in (None, tcp_port):
        raise ValueError(f"tcp_port={tcp_port} and master_port={master_port}: they name the same "
                         "port (tcp_port is TorchRL's name); give one.")
    return tcp_port


def _world_size(rpc: Any, worker_names: list[str] | None, num_collectors: int | None) -> int | None:
    """``num_collectors``, checked against the world this process is in (or is about to launch):
    joining one (``worker_names``) needs RPC initialised here, launching one needs it not to be."""
    if worker_names is not None:
        if not isinstance(worker_names, (list, tuple)) or not all(isinstance(n, str) for n in worker_names):
            raise TypeError("worker_names must be a list of RPC worker names (str).")
        if num_collectors not in (None, len(worker_names)):
            raise ValueError(f"num_collectors={num_collectors} but {len(worker_names)} worker_names; one "
                             "remote collector runs on each named worker.")
        if not rpc.api._is_current_rpc_agent_set():
            raise RuntimeError(
                "worker_names: joining a world needs torch.distributed.rpc initialised in this process "
                "first (rpc.init_rpc(...), as a torchrun launch script does); or leave worker_names out "
                "to let RPCCollector launch its workers on this machine."
            )
        return len(worker_names)
    if rpc.api._is_current_rpc_agent_set():
        raise RuntimeError(
            "torch.distributed.rpc is already initialised in this process: pass worker_names=[...] "
            "to run the remote collectors on workers of that world."
        )
    if _launched_worlds:
        raise RuntimeError(
            "RPCCollector already launched an RPC world in this process, and torch.distributed.rpc "
            "cannot be initialised twice in one process (a second init_rpc hangs): run one launched "
            "RPCCollector per process, or start the world once yourself and pass worker_names."
        )
    return num_collectors


class RPCCollector(RemoteCollectorsBase):
    """Runs aiocollect collectors on ``torch.distributed.rpc`` workers and offers them as one collector.

    TorchRL's ``distributed.RPCCollector``, with the interface of
    [`RayCollector`][aiocollect.RayCollector] (the same batches, ``sync`` modes, weight
    updates, policy versions and faults) over torch's RPC (TensorPipe), for shops that
    launch with torchrun or SLURM and do not run Ray. Batches and weights travel as RPC
    messages; weights are one CPU state dict (or a JAX params pytree) per update, sent to
    the chosen workers without waiting. Two ways to get a world:

    * **Launched here** (the default, when RPC is not initialised in this process): the
      collector starts ``num_collectors`` worker processes on this machine
      (``python -m aiocollect._distributed.rpc_worker``) and meets them over TCP on
      ``master_addr:master_port`` (a free port by default). The workers take ranks 0 to
      n-1 and this process the last rank. Everything the world listens on (its rendezvous
      store, TensorPipe, Gloo) is on ``master_addr`` only. ``shutdown()`` closes the remote
      collectors, shuts the world down and waits for the workers (terminating them if they
      do not exit, without waiting for one that died), so no process or port is left
      behind; the workers also exit by themselves if this process dies, however it dies.
      torch's RPC can be initialised only once per process, so a process can launch one
      such world.
    * **Joined** (``worker_names=[...]``): the world was started by torchrun (or submitit)
      and this process called ``rpc.init_rpc`` itself; ``worker_names`` names the ranks that
      host the remote collectors, each of which only runs ``rpc.init_rpc(name, rank=...,
      world_size=...)`` followed by ``rpc.shutdown()``. The collector then neither starts
      nor stops the world; ``shutdown()`` closes its remote collectors.

    A worker process that dies fails the iterator within a fraction of a second with a
    [`RemoteCollectorError`][aiocollect.RemoteCollectorError] naming it.

    Args:
        create_env_fn: as for [`RayCollector`][aiocollect.RayCollector].
        policy: the policy each remote collector runs (its own copy); ``None`` for random
            actions.
        num_collectors: how many remote collectors (with ``worker_names``: its length).
        sync: stack one batch of every remote collector (``True``) or yield the first
            ready (``False``, TorchRL's default).
        collector_class: as for [`RayCollector`][aiocollect.RayCollector].
        collector_kwargs: as for [`RayCollector`][aiocollect.RayCollector].
        num_workers_per_collector: as for [`RayCollector`][aiocollect.RayCollector].
        update_after_each_batch: as for [`RayCollector`][aiocollect.RayCollector].
        worker_names: join a world started elsewhere: the RPC names of the workers that
            host the remote collectors (one each). ``None``: launch the workers here.
        master_addr: the address a launched world meets and listens on (default
            ``127.0.0.1``: loopback only). Another address of this machine exposes the
            world on that interface; ``"0.0.0.0"`` on all of them (torch's RPC is
            unauthenticated: anyone who reaches it can run code in these processes).
        master_port: the TCP port a launched world meets on (default: a free port; read
            it back from [`master_port`][aiocollect.RPCCollector.master_port]).
            ``tcp_port``, TorchRL's name for it, is taken too.
        rpc_timeout: seconds an RPC call (a batch) may take.
        start_timeout: seconds the remote collectors may take to be built (and, when
            launched, the workers to join).

    The other arguments are TorchRL's, as for [`RayCollector`][aiocollect.RayCollector],
    and TorchRL's RPC keywords are taken at the values that mean what happens here
    (``launcher="mp"``, ``backend="gloo"``, ``slurm_kwargs=None``...); another value is a
    ``ValueError`` saying what to do instead.

    Raises:
        RuntimeError: RPC is already initialised here without ``worker_names``, is not
            initialised with ``worker_names``, or this process already launched a world.
        ValueError: ``num_collectors`` disagrees with ``worker_names``, or
            ``frames_per_batch`` does not split over ``num_collectors`` with ``sync=True``.
        OSError: ``master_port`` is taken (``errno.EADDRINUSE``, the message names the
            port), or ``master_addr`` is not an address of this machine.

    Examples:
        >>> from aiocollect import RPCCollector, GymEnv
        >>> collector = RPCCollector(create_env_fn=lambda: GymEnv("Pendulum-v1"), policy=policy,
        ...                          frames_per_batch=400, total_frames=100_000, num_collectors=4,
        ...                          sync=True)
        >>> for data in collector:            # data.shape == (4, 100)
        ...     train(data)
        ...     collector.update_policy_weights_()
        >>> collector.shutdown()

        Joining a torchrun world, on the rank that trains (the other ranks only run
        ``rpc.init_rpc(f"worker{rank}", ...)`` and ``rpc.shutdown()``):

        >>> rpc.init_rpc("trainer", rank=0, world_size=world)
        >>> collector = RPCCollector(make_env, policy, frames_per_batch=400, sync=True,
        ...                          worker_names=[f"worker{r}" for r in range(1, world)])
    """

    def __init__(
        self,
        create_env_fn: Any = None,
        policy: Any = None,
        *,
        frames_per_batch: int,
        total_frames: int = -1,
        device: Any = None,
        storing_device: Any = None,
        env_device: Any = None,
        policy_device: Any = None,
        max_frames_per_traj: int | None = None,
        init_random_frames: int | None = None,
        reset_at_each_iter: bool = False,
        postproc: Any = None,
        split_trajs: bool | None = None,
        exploration_type: InteractionType | str = InteractionType.RANDOM,
        track_policy_version: bool = False,
        replay_buffer: Any = None,
        progress: bool = False,
        trajs_per_batch: int | None = None,
        traj_format: str | None = None,
        trajs_per_write: int | None = None,
        collector_class: Any = "single",
        collector_kwargs: dict | list[dict] | None = None,
        num_workers_per_collector: int = 1,
        sync: bool = False,
        num_collectors: int | None = None,
        update_after_each_batch: bool = False,
        worker_names: list[str] | None = None,
        master_addr: str = "127.0.0.1",
        master_port: int | None = None,
        rpc_timeout: float = 300.0,
        start_timeout: float = 120.0,
        policy_factory: Any = None,
        tcp_port: int | None = None,
        **torchrl_options: Any,
    ):
        for name, value in (("rpc_timeout", rpc_timeout), ("start_timeout", start_timeout)):
            if positive_seconds(value) is None:  # (RPC's timeouts are numbers: None or inf is not one)
                raise ValueError(f"{name}={value!r}: give a positive, finite number of seconds (RPC's waits take "
                                 "no None).")
        options = remote_options(type(self).__name__, locals())
        master_port = _one_port(master_port, tcp_port)
        from torch.distributed import rpc

        num_collectors = _world_size(rpc, worker_names, num_collectors)
        num_collectors, payloads = plan_remotes(locals(), options)
        super().__init__(options, policy, num_collectors, sync, update_after_each_batch)
        self._rpc = rpc
        self._launched = worker_names is None
        self._names = list(worker_names) if worker_names is not None else [
            f"aiocollect_collector{i}" for i in range(num_collectors)]
        self._procs: list[subprocess.Popen] = []
        self._lifeline: int | None = None
        """The write end of the pipe the launched workers watch: closing it (or dying) ends them."""
        self._lost: set[int] = set()
        """The remote collectors whose RPC call failed: their process died (or is unreachable)."""
        self._rrefs: list[Any] = []
        self._joined_world = False
        self._addr, self._port = master_addr, master_port
        self._rpc_timeout, self._start_timeout = float(rpc_timeout), float(start_timeout)
        self._start(payloads)

    @property
    def master_port(self) -> int | None:
        """The TCP port the launched world met on (``None`` when joining a world).

        Given as ``master_port``, or the free port picked at construction when it was not.
        """
        return self._port if self._launched else None

    # ------------------------------------------------------------------ the transport

    def _launch(self, payloads: list[bytes]) -> list[tuple[int, int]]:
        rpc = self._rpc
        if self._launched:
            self._start_world()
        self._rrefs = [rpc.remote(name, _remote_collector, args=(payload, list(sys.path), switches()))
                       for name, payload in zip(self._names, payloads)]
        handles = [rref.rpc_async(timeout=self._start_timeout).info() for rref in self._rrefs]
        info = []
        for i, handle in enumerate(handles):
            try:
                info.append(handle.wait())
            except Exception as exc:  # noqa: BLE001 - any remote failure becomes a RemoteCollectorError
                error = self._error(i, exc)
                raise error from error.__cause__
        return info

    def _start_world(self) -> None:
        """Start the workers and join them: everything listens on ``master_addr`` only.

        The workers take ranks 0..n-1 and the driver the last one. Rank 0 hosts the
        rendezvous store, on a socket opened here (a taken port fails now, naming it) and
        handed to it: the port lives as long as worker 0 (gone at shutdown), not as long as
        this process, where torch would keep the store until exit. Each worker also gets the
        read end of the lifeline pipe whose write end this process holds: it exits when that
        closes (``_distributed.rpc_worker``)."""
        rpc = self._rpc
        world = self.num_collectors + 1
        listener = rpc_rendezvous.listen(self._addr, self._port or 0)
        self._port = listener.getsockname()[1]
        lifeline, self._lifeline = os.pipe()
        env = {**os.environ, **rpc_rendezvous.interface_env(self._addr)}
        env["PYTHONPATH"] = os.pathsep.join([_PACKAGE_ROOT, *filter(None, [env.get("PYTHONPATH")])])
        try:
            for rank, name in enumerate(self._names):
                fds = [lifeline, listener.fileno()] if rank == 0 else [lifeline]
                init = rpc_rendezvous.url(self._addr, self._port, self._start_timeout,
                                          fd=listener.fileno() if rank == 0 else None)
                self._procs.append(subprocess.Popen(
                    [sys.executable, "-m", "aiocollect._distributed.rpc_worker", name, str(rank), str(world), init,
                     str(lifeline), str(os.getpid())],
                    env=env, stdin=subprocess.DEVNULL, pass_fds=fds))
        finally:
            listener.close()  # worker 0 has it now
            os.close(lifeline)
        rpc_rendezvous.register()
        init = rpc_rendezvous.url(self._addr, self._port, self._start_timeout)
        options = rpc.TensorPipeRpcBackendOptions(init_method=init, rpc_timeout=self._start_timeout,
                                                  _transports=rpc_rendezvous.TRANSPORTS)
        _launched_worlds.append(init)
        with warnings.catch_warnings(), rpc_rendezvous.interfaces(self._addr):
            warnings.filterwarnings("ignore", message="You are using a Backend", category=UserWarning)
            rpc.init_rpc("aiocollect_driver", rank=world - 1, world_size=world, rpc_backend_options=options)
        self._joined_world = True

    def _submit(self, index: int, method: str, *args: Any) -> Any:
        return getattr(self._rrefs[index].rpc_async(timeout=self._rpc_timeout), method)(*args)

    def _on_done(self, handle: Any, callback: Callable[[BaseException | None], None]) -> None:
        def done(future):
            try:
                future.value()
            except Exception as exc:  # noqa: BLE001 - reported to the callback
                callback(exc)
                return
            callback(None)

        handle.add_done_callback(done)

    async def _result(self, index: int, handle: Any) -> Any:
        loop = asyncio.get_running_loop()
        result: asyncio.Future = loop.create_future()

        def settle(value: Any, exc: BaseException | None) -> None:
            if not result.done():
                result.set_exception(exc) if exc is not None else result.set_result(value)

        def done(future):
            try:
                value, exc = future.value(), None
            except Exception as error:  # noqa: BLE001 - raised in the loop
                value, exc = None, error
                self._lost.add(index)  # remote exceptions come back as values: the transport failed
            try:
                loop.call_soon_threadsafe(settle, value, exc)
            except RuntimeError:  # the loop is gone: nobody waits any more
                pass

        handle.add_done_callback(done)
        while True:  # a worker process that died answers nothing: watch it
            finished, _ = await asyncio.wait({result}, timeout=0.2)
            if finished:
                return result.result()
            proc = self._procs[index] if index < len(self._procs) else None
            if proc is not None and proc.poll() is not None:
                self._lost.add(index)
                raise CollectorError(f"the RPC worker process exited with code {proc.returncode} (a negative "
                                   "code is the signal that killed it)")

    def _where(self, index: int) -> str:
        return f"RPC worker {self._names[index]}"

    def _stop(self) -> None:
        """Close the remote collectors, leave the world, and end the launched workers; bounded.

        With every worker alive, the world shuts down gracefully (the workers' own
        ``rpc.shutdown()`` returns and they exit). A worker that died, or whose call failed,
        rules that out: a graceful shutdown waits for every member, so it would hang; the
        driver then leaves alone and the others are terminated. A killed worker's socket
        may close before its exit status can be collected, so a failed call counts as a
        death, and the driver waits a moment for such a process to be reaped."""
        rpc = self._rpc
        lost = set(self._lost)  # (a copy: RPC callbacks add to it from torch's threads)
        for i in lost:
            if i < len(self._procs):
                _wait(self._procs[i], 2.0)
        lost |= {i for i, p in enumerate(self._procs) if p.poll() is not None}
        if self._rrefs and rpc.api._is_current_rpc_agent_set():
            calls = []
            for i, rref in enumerate(self._rrefs):
                if i in lost:
                    continue
                try:
                    calls.append(rref.rpc_async(timeout=10).shutdown())
                except Exception:  # noqa: BLE001 - the world is going down anyway
                    pass
            for call in calls:
                try:
                    call.wait()
                except Exception:  # noqa: BLE001
                    pass
        self._rrefs = []
        graceful = not lost and self._joined_world  # (workers that never met the driver: no use waiting)
        if self._joined_world:
            self._joined_world = False
            graceful = self._leave(graceful)

        ladder = ((None, 10.0), (signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0))
        for sig, grace in ladder if graceful else ladder[1:]:
            running = [p for p in self._procs if p.poll() is None]
            if not running:
                break
            for p in running:
                if sig is not None:
                    p.send_signal(sig)
            deadline = time.monotonic() + grace
            for p in running:
                _wait(p, deadline - time.monotonic())
        self._procs = []
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None

    def _leave(self, graceful: bool, timeout: float = 15.0) -> bool:
        """Leave the world (``rpc.shutdown``), gracefully if asked and possible, within
        ``timeout`` seconds; returns whether it was graceful.

        It runs in a thread: torch's own timeout does not cover every wait in a shutdown
        (``agent.join`` waits for calls in flight). Past ``timeout``, the launched workers
        are killed, which ends those waits."""
        rpc, outcome = self._rpc, []

        def leave() -> None:
            if graceful:
                try:
                    rpc.shutdown(graceful=True, timeout=10)
                    outcome.append(True)
                    return
                except Exception:  # noqa: BLE001 - a member that left makes a graceful exit fail
                    pass
            try:
                rpc.shutdown(graceful=False)
            except Exception:  # noqa: BLE001 - left already
                pass
            outcome.append(False)

        thread = threading.Thread(target=leave, name="aiocollect-rpc-shutdown", daemon=True)
        thread.start()
        thread.join(timeout)
        if thread.is_alive():
            for p in self._procs:
                if p.poll() is None:
                    p.kill()
            thread.join(5.0)
            if thread.is_alive():
                warnings.warn("RPCCollector.shutdown(): torch.distributed.rpc did not shut down within "
                              f"{timeout + 5:.0f} s; its workers were killed and its shutdown is left running "
                              "in a daemon thread.",
                              RuntimeWarning, stacklevel=2)
            return False
        return outcome == [True]


def _wait(proc: subprocess.Popen, seconds: float) -> None:
    try:
        proc.wait(max(0.0, seconds))
    except subprocess.TimeoutExpired:
        pass

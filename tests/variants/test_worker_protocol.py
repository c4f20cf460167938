"""The engine <-> worker protocol: when it spins, and that a missed doorbell never hangs it."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import socket
import threading
import time

import pytest

from aiocollect import MultiAsyncCollector, MultiSyncCollector
from aiocollect._engine import scheduler as scheduler_module
from aiocollect._workers import pool as pool_module
from aiocollect._workers import protocol
from support.checks import check_batch, check_continuity
from support.envs import CloseRecordEnv, CounterEnv, SlowsDownEnv


def first_action(observation):
    """A policy (so one step per command): action 0."""
    return observation[..., 0].long() * 0


@pytest.mark.parametrize("policy", [first_action, None], ids=["steps", "runs"])
@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
def test_collection_goes_on_when_every_doorbell_is_missed(cls, policy, monkeypatch):
    """Spinning sides may miss a doorbell (store-buffer race); their timers must cover it.
    Here no doorbell is ever rung: the engine claims it never sleeps, the engine never
    rings a worker. Collection must still complete, only slower. (``policy=None``: random
    actions, in runs of steps, so fewer commands.)"""
    monkeypatch.setenv("AIOCOLLECT_SPIN", "1")
    rung = []

    def never_ring(self):
        rung.append(1)  # (asked to ring, the worker being asleep or not)

    def never_asleep(self, flag):
        for lane in self.lanes:
            lane.worker.control[protocol.E_ASLEEP] = 0

    monkeypatch.setattr(pool_module.Worker, "ring", never_ring)
    monkeypatch.setattr(scheduler_module.Scheduler, "_engine_asleep", never_asleep)
    fpb = 20 if cls is MultiSyncCollector else 10
    t0 = time.monotonic()
    with cls([lambda: CounterEnv(max_len=7)] * 2, policy, frames_per_batch=fpb, total_frames=3 * fpb) as c:
        batches = list(c)
    assert time.monotonic() - t0 < 30
    assert len(batches) == 3 and len(rung) >= (30 if policy else 6)
    for b in batches:
        check_batch(b if b.ndim == 1 else b.flatten(0, -2))
    if cls is MultiSyncCollector:
        check_continuity(batches[0], batches[1])


@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
def test_stale_doorbells_piling_up_in_a_socket_never_fail_a_worker(cls, monkeypatch):
    """A spinning worker that sees its command before it reads its socket leaves the
    doorbell unread; over a long run such bytes fill the socket's buffer. Ringing a full
    socket must not count as the worker's death (it did: ``BlockingIOError`` from
    ``send``). Here the engine rings on every post, and the worker spins, so it reads its
    socket seldom: the buffer fills within a few hundred steps."""
    monkeypatch.setenv("AIOCOLLECT_SPIN", "1")
    monkeypatch.setattr(protocol, "SPIN_S", 0.05)  # the workers rarely sleep, so rarely read
    original = pool_module.Worker.ring

    def always_ring(self):
        self.control[protocol.W_ASLEEP] = 1  # (the worker clears it when it wakes)
        original(self)

    monkeypatch.setattr(pool_module.Worker, "ring", always_ring)
    fpb = 2 * 500 if cls is MultiSyncCollector else 500
    with cls([lambda: CounterEnv(max_len=1000)] * 2, None, frames_per_batch=fpb, total_frames=4 * fpb) as c:
        batches = list(c)
    assert len(batches) == 4
    for b in batches:
        check_batch(b if b.ndim == 1 else b.flatten(0, -2))


@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
def test_a_worker_whose_socket_is_full_of_stale_doorbells_still_closes_at_shutdown(cls, tmp_path, caplog):
    """Stale doorbells (above) can fill the engine's end of a worker's socket, 278 one-byte
    sends on Linux, while the worker is not scheduled (a loaded machine). ``CLOSE`` then did
    not fit, was dropped, and the worker waited for it until the SIGTERM 5 s later, its envs
    never closed. Now the engine also shuts its end for writing: the worker reads the stale
    bytes, then the end-of-file, and closes its envs at once."""
    envs = [functools.partial(CloseRecordEnv, str(tmp_path), k) for k in range(4)]
    c = cls([envs[:2], envs[2:]], None, frames_per_batch=40 if cls is MultiSyncCollector else 20, total_frames=-1)
    next(iter(c))
    stopped = c._pool.processes[0]
    os.kill(stopped.pid, signal.SIGSTOP)  # (not scheduled, as on a loaded machine)
    try:
        full = 0
        with contextlib.suppress(BlockingIOError):
            while full < 100_000:
                stopped.sock.send(protocol.OK, socket.MSG_DONTWAIT)  # doorbells it does not read
                full += 1
        assert full < 100_000  # the buffer is full
    finally:
        threading.Timer(0.5, os.kill, (stopped.pid, signal.SIGCONT)).start()
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="aiocollect"):
        c.shutdown()
    assert time.monotonic() - t0 < 4  # (the SIGTERM came after 5 s)
    assert "SIGTERM" not in caplog.text
    assert CloseRecordEnv.unclosed(str(tmp_path)) == []  # the stopped worker's envs too


@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
def test_a_worker_in_the_middle_of_a_run_of_steps_stops_after_its_step_at_shutdown(cls, tmp_path, caplog):
    """With random actions a worker takes runs of steps, sized from its envs' last pace, and
    reads its socket only between runs. When the envs slow down (here from microseconds to
    0.3 s a step) the run under way can last minutes: ``shutdown()`` then waited 5 s for the
    worker, sent SIGTERM, and its envs were never closed. Now shutdown cuts every run first:
    the worker ends after the step it is taking, then reads ``CLOSE`` and closes its envs."""
    folder = str(tmp_path)
    envs = [functools.partial(SlowsDownEnv, folder, k) for k in range(4)]
    fpb = 2 * 2 * 5_000 if cls is MultiSyncCollector else 2 * 5_000
    c = cls([envs[:2], envs[2:]], None, frames_per_batch=fpb, total_frames=-1)
    it = iter(c)
    next(it)

    def collect():
        with contextlib.suppress(Exception):  # (the collection ends as shutdown() stops it)
            for _ in it:
                pass

    threading.Thread(target=collect, daemon=True).start()
    open(os.path.join(folder, "slow"), "w").close()
    deadline = time.monotonic() + 30
    while not os.path.exists(os.path.join(folder, "stepping")) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert os.path.exists(os.path.join(folder, "stepping"))
    time.sleep(0.1)  # (in the middle of a slow step of a run)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="aiocollect"):
        c.shutdown()
    assert time.monotonic() - t0 < 4.5  # (a step of its 2 envs: 0.6 s; the SIGTERM came after 5 s)
    assert "SIGTERM" not in caplog.text
    assert CloseRecordEnv.unclosed(folder) == []

"""The workers' futex doorbell (``aiocollect._workers.bell``, issue 54): a sleeper wakes when
its bit is rung, never misses a ring that came between its look for a command and its sleep,
sleeps through rings for other workers' bits, and the rings of a held round go out as one wake
when it is released. Threads play the workers here (a futex word works across threads as
across processes that map the same memory)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from aiocollect._workers import bell
from aiocollect._workers.shm import CONTROL_WORDS

pytestmark = pytest.mark.skipif(bell.futex() is None, reason="no futexes on this machine")


def control() -> np.ndarray:
    return np.zeros((2, CONTROL_WORDS), np.int64)


def sleep_in_thread(sleeper: bell.Sleeper, count: int, timeout: float) -> tuple[threading.Thread, dict]:
    result: dict = {}

    def run() -> None:
        t0 = time.monotonic()
        result["timed_out"] = sleeper.sleep(count, timeout)
        result["slept"] = time.monotonic() - t0

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def test_a_ring_of_its_bit_wakes_a_sleeper():
    call = bell.futex()
    block = control()
    engine, sleeper = bell.Bell(block, call), bell.Sleeper(block, 3, call)
    thread, result = sleep_in_thread(sleeper, sleeper.count(), 30.0)
    time.sleep(0.2)
    assert thread.is_alive()
    engine.ring(bell.bit(3))
    thread.join(10)
    assert not thread.is_alive() and result["timed_out"] is False and result["slept"] < 10


def test_a_ring_before_the_sleep_is_not_lost():
    """The count read before the look for a command says a ring came since: no sleep at all."""
    call = bell.futex()
    block = control()
    engine, sleeper = bell.Bell(block, call), bell.Sleeper(block, 0, call)
    count = sleeper.count()
    engine.ring(bell.bit(0))  # (between the worker's look and its sleep)
    t0 = time.monotonic()
    assert sleeper.sleep(count, 30.0) is False
    assert time.monotonic() - t0 < 10


def test_a_ring_for_another_worker_does_not_wake_a_sleeper():
    call = bell.futex()
    block = control()
    engine, sleeper = bell.Bell(block, call), bell.Sleeper(block, 1, call)
    thread, result = sleep_in_thread(sleeper, sleeper.count(), 0.5)
    time.sleep(0.1)
    engine.ring(bell.bit(2))
    thread.join(10)
    assert result["timed_out"] is True


def test_the_rings_of_a_held_round_go_out_together_at_its_release():
    call = bell.futex()
    block = control()
    engine = bell.Bell(block, call)
    sleepers = [bell.Sleeper(block, i, call) for i in range(3)]
    counts = [s.count() for s in sleepers]
    threads = [sleep_in_thread(s, c, 30.0) for s, c in zip(sleepers, counts)]
    time.sleep(0.2)
    engine.hold()
    engine.ring(bell.bit(0))
    engine.ring(bell.bit(2))
    time.sleep(0.2)
    assert all(t.is_alive() for t, _ in threads)  # (nothing rung while held)
    before = sleepers[0].count()
    engine.release()
    assert sleepers[0].count() == before + 1  # (one wake for both)
    for i in (0, 2):
        threads[i][0].join(10)
        assert threads[i][1]["timed_out"] is False
    engine.ring(bell.bit(1))  # (the third sleeps on: its bit was not rung; test 3 says so)
    threads[1][0].join(10)
    assert not threads[1][0].is_alive()


def test_close_wakes_every_sleeper_and_says_so():
    call = bell.futex()
    block = control()
    engine = bell.Bell(block, call)
    sleepers = [bell.Sleeper(block, i, call) for i in (0, 40)]
    threads = [sleep_in_thread(s, s.count(), 30.0) for s in sleepers]
    time.sleep(0.2)
    assert not any(s.closing for s in sleepers)
    engine.close()
    for thread, result in threads:
        thread.join(10)
        assert result["timed_out"] is False
    assert all(s.closing for s in sleepers)


def test_a_wait_the_kernel_refuses_sleeps_its_timeout_out_instead_of_spinning():
    """A futex word off its 4-byte alignment is refused (``EINVAL``) at once, as any wait
    failing for a reason that says nothing of the count: the sleeper then sleeps its timeout,
    at no CPU, rather than coming back at once to a worker loop that would sleep again."""
    call = bell.futex()
    raw = bytearray(2 + 2 * CONTROL_WORDS * 8)
    block = np.frombuffer(raw, np.int64, 2 * CONTROL_WORDS, offset=2).reshape(2, CONTROL_WORDS)
    sleeper = bell.Sleeper(block, 0, call)
    t0, cpu0 = time.monotonic(), time.process_time()
    for _ in range(3):
        assert sleeper.sleep(sleeper.count(), 0.1) is True
    assert time.monotonic() - t0 >= 0.29
    assert time.process_time() - cpu0 < 0.05


def test_no_bell_off_linux_on_x86_64_or_when_switched_off(monkeypatch):
    """macOS, and aarch64 (whose loads and stores may pass each other: see the module's
    docstring), get no futex and ring the workers' sockets; ``AIOCOLLECT_FUTEX=0`` too."""
    assert bell.wanted() is not None
    monkeypatch.setenv(bell.SWITCH, "0")
    assert bell.wanted() is None and bell.futex() is not None  # (the switch is the engine's)
    monkeypatch.delenv(bell.SWITCH)
    monkeypatch.setattr(bell.platform, "machine", lambda: "aarch64")
    assert bell.futex() is None
    monkeypatch.undo()
    monkeypatch.setattr(bell.sys, "platform", "darwin")
    assert bell.futex() is None and bell.wanted() is None

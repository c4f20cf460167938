"""The workers' futex doorbell (``aiocollect._workers.bell``) under the hang contract, with real
worker processes and real shared memory: no ring is lost across processes, more than 32
workers share bits and lose nothing, two collectors at once keep to their own words, a worker
killed while the engine rings is an error naming it within seconds, a worker whose engine
went without a word exits on its own, shutdown ends sleeping workers at once, and
``AIOCOLLECT_FUTEX=0`` (what macOS gets) collects on the sockets. The leak check of
``tests/variants/conftest.py`` runs after every test."""

from __future__ import annotations

import functools
import logging
import mmap
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from aiocollect import MultiAsyncCollector, MultiSyncCollector, WorkerError
from aiocollect._workers import bell
from aiocollect._workers.shm import CONTROL_WORDS
from support.checks import check_batch
from support.envs import CloseRecordEnv, CounterEnv
from support.procs import alive, wait_until

pytestmark = pytest.mark.skipif(bell.futex() is None, reason="no futexes on this machine")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def first_action(observation):
    """A policy (so one command, and one ring, per step): action 0."""
    return observation[..., 0].long() * 0


# A worker's loop as ``child._Worker._sleep`` runs it: the count, then the look for a command
# (word 0 of its line), then a sleep on that count; word 1 says the commands it saw. A sleep
# that runs out its 30 s lost a ring: exit code 3.
SLEEPER = textwrap.dedent(
    """
    import mmap, sys
    import numpy as np
    from aiocollect._workers import bell
    from aiocollect._workers.shm import CONTROL_WORDS
    fd, index, lines, commands = map(int, sys.argv[1:])
    block = np.frombuffer(mmap.mmap(fd, lines * CONTROL_WORDS * 8), np.int64).reshape(lines, CONTROL_WORDS)
    sleeper, mine = bell.Sleeper(block, index, bell.futex()), block[1 + index]
    mine[1] = -1  # (started)
    seen = 0
    while seen < commands:
        count = sleeper.count()
        if mine[0] != seen:
            seen = int(mine[0])
            mine[1] = seen
            continue
        if sleeper.sleep(count, 30.0):
            sys.exit(3)
    """
)


def test_forty_sleeping_processes_sharing_bits_lose_no_ring():
    """40 processes sleep on one word (workers ``i`` and ``i + 32`` share a bit); round after
    round the engine posts commands to some of them, rings their bits held into one wake, and
    waits for every one to see its command: a lost ring would leave one asleep for 30 s."""
    n, rounds = 40, 40
    lines = n + 1
    fd = os.memfd_create("aiocollect-test", os.MFD_CLOEXEC)
    procs: list[subprocess.Popen] = []
    try:
        os.ftruncate(fd, lines * CONTROL_WORDS * 8)
        block = np.frombuffer(mmap.mmap(fd, lines * CONTROL_WORDS * 8), np.int64).reshape(lines, CONTROL_WORDS)
        engine = bell.Bell(block, bell.futex())
        posts = [[i for i in range(n) if (i + r) % 3 or r % 2 == 0] for r in range(rounds)]
        commands = [sum(i in p for p in posts) for i in range(n)]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
        procs = [subprocess.Popen([sys.executable, "-c", SLEEPER, str(fd), str(i), str(lines), str(commands[i])],
                                  pass_fds=[fd], env=env) for i in range(n)]
        assert wait_until(lambda: (block[1:, 1] == -1).all(), timeout=60), "the sleepers did not start"
        time.sleep(0.2)  # (asleep)
        for r, posted in enumerate(posts):
            engine.hold()
            for i in posted:
                block[1 + i, 0] += 1
                engine.ring(bell.bit(i))
            engine.release()
            want = block[1:, 0].copy()
            if not wait_until(lambda want=want: (block[1:, 1] == want).all(), timeout=10):
                late = [i for i in range(n) if block[1 + i, 1] != want[i]]
                pytest.fail(f"round {r}: workers {late} slept through their ring")
        for p in procs:
            assert p.wait(timeout=10) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        os.close(fd)


def test_forty_workers_collect_with_shared_bits():
    """Workers 32..39 share their bits with 0..7: every step of every worker is rung (no
    spinning), and collection runs as with 3 workers."""
    fpb, batches = 40 * 8, 3
    with MultiSyncCollector([CounterEnv] * 40, first_action, frames_per_batch=fpb, total_frames=batches * fpb,
                            spin=False) as c:
        assert c._pool.bell is not None
        t0 = time.monotonic()
        got = list(c)
        assert time.monotonic() - t0 < 60
    assert len(got) == batches
    for b in got:
        check_batch(b.flatten(0, -2) if b.ndim > 2 else b)
        assert (b["next", "observation"][..., 0] > 0).any(-1).all()  # (every env stepped)


def test_two_collectors_at_once_keep_to_their_own_bells():
    """Two collectors in one process, collecting at the same time from two threads: each pool
    rings the word of its own segment, and neither waits on the other's."""
    made = [MultiSyncCollector([CounterEnv] * 3, first_action, frames_per_batch=30, total_frames=-1, spin=False),
            MultiAsyncCollector([CounterEnv] * 3, first_action, frames_per_batch=10, total_frames=-1, spin=False)]
    results: dict[int, object] = {}

    def collect(k: int) -> None:
        try:
            it = iter(made[k])
            results[k] = [next(it) for _ in range(20)]
        except BaseException as exc:  # noqa: BLE001 - asserted below
            results[k] = exc

    try:
        assert made[0]._pool.bell is not made[1]._pool.bell
        threads = [threading.Thread(target=collect, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "a collector hung"
    finally:
        for c in made:
            c.shutdown()
    for k in range(2):
        assert isinstance(results[k], list) and len(results[k]) == 20, results[k]
        for b in results[k]:
            check_batch(b)


@pytest.mark.usefixtures("worker_start")
@pytest.mark.parametrize("spin", [False, True], ids=["sleeping", "spinning"])
def test_shutdown_ends_workers_asleep_on_the_bell_at_once(spin, tmp_path, caplog):
    """Idle workers sleep on the futex (after a spin, or at once): ``shutdown()`` wakes them
    (``CLOSING``), they read ``CLOSE`` and close their envs, with no wait for ``SLEEP_S`` and no
    ``SIGTERM``."""
    envs = [functools.partial(CloseRecordEnv, str(tmp_path), k) for k in range(3)]
    c = MultiSyncCollector(envs, first_action, frames_per_batch=30, total_frames=-1, spin=spin)
    c.rollout()
    time.sleep(0.5)  # (every worker asleep on the word)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="aiocollect"):
        c.shutdown()
    assert time.monotonic() - t0 < 2
    assert "SIGTERM" not in caplog.text and "SIGKILL" not in caplog.text
    assert CloseRecordEnv.unclosed(str(tmp_path)) == []


def test_a_worker_killed_while_the_engine_rings_is_an_error_naming_it():
    """A worker killed in the middle of a collection where every step is rung: the engine's
    wakes for it go to nobody, harmlessly; its death is a ``WorkerError`` naming it within
    seconds, and the others are stopped."""
    c = MultiSyncCollector([CounterEnv] * 3, first_action, frames_per_batch=30, total_frames=-1, spin=False)
    pids = [w.pid for w in c.statistics().workers]
    c.rollout()
    killer = threading.Timer(0.3, os.kill, (pids[1], signal.SIGKILL))
    killer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(WorkerError, match=r"worker 1 .* killed by SIGKILL"):
            while time.monotonic() - t0 < 30:
                c.rollout()
        assert time.monotonic() - t0 < 5.3
        assert wait_until(lambda: not any(alive(p) for p in pids))
    finally:
        killer.cancel()
        c.shutdown()


@pytest.mark.usefixtures("worker_start")
def test_a_worker_whose_engine_went_without_a_word_exits_on_its_own():
    """The engine's ends of the sockets close while every worker sleeps on the word, with no
    wake and no signal (the engine thread lives on, so no ``PR_SET_PDEATHSIG``): each worker
    reads the end of the file at its next look (within ``SLEEP_S``) and exits."""
    c = MultiSyncCollector([CounterEnv] * 3, first_action, frames_per_batch=30, total_frames=-1, spin=False)
    try:
        pids = [w.pid for w in c.statistics().workers]
        c.rollout()
        time.sleep(0.3)
        t0 = time.monotonic()
        for w in c._pool.processes:
            w.sock.shutdown(socket.SHUT_RDWR)
        assert wait_until(lambda: not any(alive(p) for p in pids), timeout=5), "a worker slept on"
        assert time.monotonic() - t0 < bell.SLEEP_S + 2
    finally:
        c.shutdown()


def test_the_switch_collects_on_the_sockets(monkeypatch, tmp_path, caplog):
    """``AIOCOLLECT_FUTEX=0``, as a machine without futexes: the workers sleep on their sockets,
    woken by a byte, and close at once."""
    monkeypatch.setenv(bell.SWITCH, "0")
    envs = [functools.partial(CloseRecordEnv, str(tmp_path), k) for k in range(2)]
    c = MultiSyncCollector(envs, first_action, frames_per_batch=20, total_frames=-1, spin=False)
    assert c._pool.bell is None
    for _ in range(5):
        check_batch(c.rollout())
    time.sleep(0.3)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="aiocollect"):
        c.shutdown()
    assert time.monotonic() - t0 < 2 and "SIGTERM" not in caplog.text
    assert CloseRecordEnv.unclosed(str(tmp_path)) == []

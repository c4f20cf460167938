"""Faults only worker processes have: a worker killed by a signal, a worker that hangs in close()
(shutdown escalates), the main process dying; and bad input refused before any process starts.
The leak check of tests/variants/conftest.py runs after every test."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap
import time

import gymnasium as gym
import pytest

from aiocollect import MultiSyncCollector, WorkerError
from support.envs import CounterEnv, SleepyEnv, StubbornEnv
from support.procs import alive, children, wait_until

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.usefixtures("spin_mode")
def test_sigkilled_worker_is_reported_and_the_rest_stopped():
    c = MultiSyncCollector([lambda: SleepyEnv(0.001)] * 3, None, frames_per_batch=30, total_frames=-1)
    pids = [w.pid for w in c.statistics().workers]
    c.rollout()
    os.kill(pids[1], signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match=r"worker 1 .* killed by SIGKILL") as info:
        for _ in range(100):
            c.rollout()
    assert time.monotonic() - t0 < 5
    assert info.value.exitcode == -signal.SIGKILL
    assert wait_until(lambda: not any(alive(p) for p in pids))
    c.shutdown()


def test_shutdown_escalates_when_a_worker_hangs(caplog):
    c = MultiSyncCollector([functools.partial(StubbornEnv, os.getpid())] * 2, None, frames_per_batch=4, total_frames=-1)
    c.rollout()
    t0 = time.monotonic()
    c.shutdown(timeout=0.5)
    assert time.monotonic() - t0 < 4
    assert "SIGTERM" in caplog.text


def test_break_then_shutdown_leaves_nothing():
    with MultiSyncCollector([lambda: CounterEnv()] * 2, None, frames_per_batch=10, total_frames=-1) as c:
        for i, _ in enumerate(c):
            if i == 2:
                break
        c.rollout()  # still usable after a break


SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {tests!r})
    from aiocollect import MultiSyncCollector
    from support.envs import SleepyEnv
    c = MultiSyncCollector([lambda: SleepyEnv(0.001)] * 2, None, frames_per_batch=20, total_frames=-1)
    print(" ".join(str(w.pid) for w in c.statistics().workers), flush=True)
    {body}
    """
)


def _pids_gone(pids):
    return wait_until(lambda: not any(os.path.exists(f"/proc/{p}") and alive(p) for p in pids), timeout=5)


def _start_script(body: str) -> tuple[subprocess.Popen, list[int]]:
    """Run SCRIPT with ``body`` in a fresh interpreter; returns it and its workers' pids."""
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT.format(tests=TESTS, body=body)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, [int(p) for p in proc.stdout.readline().split()]


@pytest.mark.usefixtures("worker_start")
def test_main_process_dying_takes_its_workers():
    proc, pids = _start_script("c.rollout(); print('ready', flush=True); time.sleep(60)")
    assert proc.stdout.readline().strip() == "ready"
    proc.kill()
    proc.wait(timeout=10)
    assert _pids_gone(pids)


# --------------------------------------------------------------------------- bad input


def unpicklable_factory():
    return CounterEnv()


unpicklable_factory.lock = __import__("threading").Lock()


class _Unpicklable:
    def __init__(self):
        import threading

        self.lock = threading.Lock()

    def __call__(self):
        return CounterEnv()


@pytest.mark.parametrize(
    ("env_fn", "kwargs", "exc", "match"),
    [
        ([], {}, ValueError, "list of workers is empty"),
        ([lambda: CounterEnv(), lambda: gym.make("CartPole-v1")], {}, ValueError,
         r"create_env_fn\[1\] builds envs with spaces"),
        ([lambda: CounterEnv(), _Unpicklable()], {}, TypeError, r"create_env_fn\[1\] \(.*\) cannot be pickled"),
        ([lambda: CounterEnv()], dict(cat_results="concat"), ValueError, "cat_results='concat'"),
        ([lambda: CounterEnv()], dict(cat_results=3), ValueError, "cat_results=3"),
        ([CounterEnv()], {}, TypeError, "env instance"),
        (lambda: CounterEnv(), {}, TypeError, "a list with one entry per worker"),
        ([lambda: CounterEnv()], dict(preemptive_threshold=1.5), ValueError, "preemptive_threshold"),
        ([[lambda: CounterEnv()] * 2, lambda: CounterEnv()], {}, ValueError, "same number of envs"),
        ([lambda: CounterEnv()], dict(start_timeout=0), ValueError, r"start_timeout=0: give the seconds"),
        ([lambda: CounterEnv()], dict(start_timeout=float("nan")), ValueError, r"start_timeout=nan"),
    ],
)
def test_bad_input_rejected_before_any_process_starts(env_fn, kwargs, exc, match):
    before = children()
    kwargs = {"frames_per_batch": 12, **kwargs}
    with pytest.raises(exc, match=match):
        MultiSyncCollector(env_fn, None, **kwargs)
    assert children() == before



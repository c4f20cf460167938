"""Worker faults, cleanup and bad input: nothing hangs, nothing leaks."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time

import gymnasium as gym
import pytest

from aiocollect import Interruptor, MultiAsyncCollector, MultiSyncCollector, WorkerError
from support.envs import CounterEnv
from support.envs import SleepyEnv
from support.procs import alive, children, open_fds, shm_entries, wait_until


@pytest.fixture
def leak_check():
    """Snapshot workers, /dev/shm and open fds; after the test, all must be as before."""
    before = (children(), shm_entries(), open_fds())
    yield
    assert wait_until(lambda: not (children() - before[0])), f"workers left: {children() - before[0]}"
    assert shm_entries() == before[1]
    gc.collect()
    assert wait_until(lambda: not [f for f in open_fds() - before[2] if "memfd:aiocollect" in f or "socket" in f]), \
        open_fds() - before[2]


def exploding():
    return CounterEnv(fail_at=15)


@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
@pytest.mark.usefixtures("spin_mode")
def test_env_raising_in_a_worker_names_worker_env_and_traceback(cls, leak_check):
    fine = lambda: CounterEnv()  # noqa: E731
    c = cls([[fine, fine], [fine, exploding]], None, frames_per_batch=20, total_frames=-1)
    pids = [w.pid for w in c.statistics().workers]
    t0 = time.monotonic()
    with pytest.raises(WorkerError) as info:
        for _ in c:
            pass
    assert time.monotonic() - t0 < 5
    err = info.value
    assert err.worker == 1 and err.env == 1 and err.remote_type == "ValueError"
    assert "worker 1" in str(err) and "env 1" in str(err)
    assert "CounterEnv exploded on purpose" in str(err)
    assert "Traceback" in err.remote_traceback and "exploded on purpose" in err.remote_traceback
    assert wait_until(lambda: not any(alive(p) for p in pids)), "workers not stopped after the error"
    with pytest.raises(RuntimeError, match="failed earlier|shut down"):
        c.rollout()
    c.shutdown()


@pytest.mark.usefixtures("spin_mode")
def test_sigkilled_worker_is_reported_and_the_rest_stopped(leak_check):
    c = MultiSyncCollector([lambda: SleepyEnv(0.001)] * 3, None, frames_per_batch=30, total_frames=-1)
    pids = [w.pid for w in c.statistics().workers]
    c.rollout()
    os.kill(pids[1], signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match="worker 1 .* killed by SIGKILL") as info:
        for _ in range(100):
            c.rollout()
    assert time.monotonic() - t0 < 5
    assert info.value.exitcode == -signal.SIGKILL
    assert wait_until(lambda: not any(alive(p) for p in pids))
    c.shutdown()


@pytest.mark.usefixtures("spin_mode")
async def test_worker_error_through_the_async_face(leak_check):
    c = MultiSyncCollector([lambda: CounterEnv(), exploding], None, frames_per_batch=20, total_frames=-1)
    with pytest.raises(WorkerError, match="worker 1"):
        async with c:
            async for _ in c:
                pass


def test_shutdown_is_idempotent_and_bounded(leak_check):
    c = MultiAsyncCollector([lambda: SleepyEnv(0.001)] * 2, None, frames_per_batch=10, total_frames=-1)
    next(iter(c))
    t0 = time.monotonic()
    c.shutdown()
    c.shutdown()
    assert time.monotonic() - t0 < 3


# workers inherit the environment, so they see the test process's pid here
MAIN_PID = int(os.environ.setdefault("AIOCOLLECT_TEST_MAIN_PID", str(os.getpid())))


class StubbornEnv(SleepyEnv):
    """Its close() hangs in a worker: shutdown must escalate to SIGTERM/SIGKILL.

    (The collector also builds and closes one in this process to learn the spaces; that
    one closes normally.)
    """

    def close(self):
        if os.getpid() != MAIN_PID:
            time.sleep(60)


def test_shutdown_escalates_when_a_worker_hangs(leak_check, caplog):
    c = MultiSyncCollector([StubbornEnv] * 2, None, frames_per_batch=4, total_frames=-1)
    c.rollout()
    t0 = time.monotonic()
    c.shutdown(timeout=0.5)
    assert time.monotonic() - t0 < 4
    assert "SIGTERM" in caplog.text


def test_garbage_collected_collector_stops_its_workers(leak_check):
    c = MultiSyncCollector([lambda: CounterEnv()] * 2, None, frames_per_batch=10, total_frames=-1)
    pids = [w.pid for w in c.statistics().workers]
    c.rollout()
    del c
    gc.collect()
    assert wait_until(lambda: not any(alive(p) for p in pids))


def test_break_then_shutdown_leaves_nothing(leak_check):
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
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT.format(tests=os.path.dirname(__file__), body=body)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, [int(p) for p in proc.stdout.readline().split()]


def test_ctrl_c_during_sync_iteration_leaves_no_process():
    proc, pids = _start_script("print('collecting', flush=True)\nfor _ in c: pass")
    assert proc.stdout.readline().strip() == "collecting"
    time.sleep(0.3)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert time.monotonic() - t0 < 6
    assert "KeyboardInterrupt" in err and proc.returncode != 0
    assert _pids_gone(pids)


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
    "env_fn, kwargs, exc, match",
    [
        ([], {}, ValueError, "list of workers is empty"),
        ([lambda: CounterEnv(), lambda: gym.make("CartPole-v1")], {}, ValueError, r"create_env_fn\[1\] builds envs with spaces"),
        ([lambda: CounterEnv(), _Unpicklable()], {}, TypeError, r"create_env_fn\[1\] \(.*\) cannot be pickled"),
        ([lambda: CounterEnv()], dict(cat_results="concat"), ValueError, "cat_results='concat'"),
        ([lambda: CounterEnv()], dict(cat_results=3), ValueError, "cat_results=3"),
        ([lambda: CounterEnv()] * 3, dict(frames_per_batch=10), ValueError, "does not split evenly over the 3 envs"),
        ([CounterEnv()], {}, TypeError, "env instance"),
        (lambda: CounterEnv(), {}, TypeError, "a list with one entry per worker"),
        ([lambda: CounterEnv()], dict(preemptive_threshold=1.5), ValueError, "preemptive_threshold"),
        ([[lambda: CounterEnv()] * 2, lambda: CounterEnv()], {}, ValueError, "same number of envs"),
    ],
)
def test_bad_input_rejected_before_any_process_starts(env_fn, kwargs, exc, match):
    before = children()
    kwargs = {"frames_per_batch": 12, **kwargs}
    with pytest.raises(exc, match=match):
        MultiSyncCollector(env_fn, None, **kwargs)
    assert children() == before


def test_multiasync_rejects_preemption_and_uneven_batches():
    before = children()
    with pytest.raises(ValueError, match="preemptive_threshold"):
        MultiAsyncCollector([lambda: CounterEnv()], None, frames_per_batch=10, preemptive_threshold=0.5)
    with pytest.raises(ValueError, match=r"interruptor: .* no batch to cut short; use MultiSyncCollector"):
        MultiAsyncCollector([lambda: CounterEnv()], None, frames_per_batch=10, interruptor=Interruptor())
    assert children() == before
    with pytest.raises(ValueError, match="split evenly"):
        MultiAsyncCollector([[lambda: CounterEnv()] * 3], None, frames_per_batch=10)

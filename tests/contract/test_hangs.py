"""An env that never answers, the same in every variant: with ``step_timeout`` the collector
raises a ``StepTimeoutError`` naming the worker and the env within about ``step_timeout``,
whether the env is a coroutine env (its call is cancelled) or runs in a worker process (the
worker is killed, its Python stack in the error); and nothing is left behind. The variants
that step their envs in this process's thread cannot interrupt a step: they refuse the
argument."""

from __future__ import annotations

import os
import re
import time

import pytest

from aiocollect import EnvError, StepTimeoutError, WorkerError
from support.coroutine_envs import HangingEnv
from support.envs import CounterEnv
from support.procs import alive, wait_until

# workers inherit the environment, so they see the test process's pid here
MAIN_PID = int(os.environ.setdefault("AIOCOLLECT_TEST_MAIN_PID", str(os.getpid())))

TIMEOUT = 1.0


class StuckEnv(CounterEnv):
    """A ``CounterEnv`` whose third step never returns in a worker process (the collector
    also builds one in this process to learn the spaces; that one is never stepped)."""

    def step(self, action):
        if os.getpid() != MAIN_PID and self.total_steps >= 2:
            time.sleep(3600)
        return super().step(action)


def timed_out(variant, fns) -> StepTimeoutError | None:
    """The ``StepTimeoutError`` collecting over ``fns`` with ``step_timeout=TIMEOUT`` raises,
    within ``TIMEOUT + 2`` s, the shutdown after it within 3 s; ``None`` for the variants that
    step their envs in this thread, which refuse the argument."""
    if variant.envs in ("inline", "vector"):
        with pytest.raises(ValueError, match="step_timeout: these apply to coroutine envs"):
            variant(frames_per_batch=40, step_timeout=TIMEOUT)
        return None
    with variant(fns, frames_per_batch=40, total_frames=-1, step_timeout=TIMEOUT) as collector:
        t0 = time.monotonic()
        with pytest.raises(StepTimeoutError) as info:
            for _ in collector:
                assert time.monotonic() - t0 < 30, "no StepTimeoutError"
        elapsed = time.monotonic() - t0
        assert elapsed < TIMEOUT + 2, f"raised after {elapsed:.1f} s"
        t1 = time.monotonic()
    assert time.monotonic() - t1 < 3, "shutdown after the timeout was slow"
    return info.value


def test_an_env_that_never_answers_is_a_step_timeout_naming_worker_and_env(variant):
    k = variant.num_envs - 1
    err = timed_out(variant, [CounterEnv] * k + [HangingEnv if variant.coroutine else StuckEnv])
    if err is None:
        return
    assert isinstance(err, TimeoutError) and isinstance(err, EnvError) and isinstance(err, WorkerError)
    assert err.stuck_in == "env"  # (a policy that hangs in a worker: test_policy_in_workers.py)
    worker, env = variant.locate(k)
    assert err.worker == worker and f"worker {worker}" in str(err)
    assert f"step() within {TIMEOUT} s (step_timeout)" in str(err) and "raise step_timeout" in str(err)
    if variant.coroutine:
        assert err.env == env
        return
    # a worker process: named with its pid and its envs, killed, its stack in the error
    assert err.env in (None, env) and f"pid {err.pid}" in str(err)
    named = re.search(r"envs? (\d+)(?:\.\.(\d+))? of the collector", str(err))
    assert named and int(named[1]) <= k <= int(named[2] or named[1]), str(err)
    assert "in step" in err.remote_traceback and "test_hangs.py" in err.remote_traceback
    assert "Python stack of the worker" in str(err)
    assert wait_until(lambda: not alive(err.pid))


def test_every_env_hung_is_a_step_timeout_as_soon_as_one(variant):
    """Several hung workers cost no more than one: those whose commands are overdue too are
    killed at once, without the grace a ``CLOSE`` gets (it was 5 s more per stop)."""
    timed_out(variant, [HangingEnv if variant.coroutine else StuckEnv] * variant.num_envs)

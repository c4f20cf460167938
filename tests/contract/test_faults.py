"""Faults and lifecycle, the same in every variant: an env that raises, a policy that raises or
returns a NaN action, a coroutine env that hangs; shutdown twice, from another thread, by
garbage collection and by Ctrl-C; use after shutdown, after a fault, and from two places at once."""

from __future__ import annotations

import functools
import gc
import os
import re
import textwrap
import threading
import time

import pytest
from tensordict.nn import TensorDictModule

import aiocollect
from aiocollect import (
    CollectorBusyError,
    CollectorClosedError,
    CollectorFailedError,
    EnvError,
    PolicyError,
    StepTimeoutError,
)
from support.coroutine_envs import HangingEnv
from support.envs import CounterEnv, EchoBoxEnv, EnvRecorder, SleepyEnv, SlowStartEnv
from support.plain_modules import ArgmaxMLP, NaNAfterOutOfBounds
from support.procs import alive, children, interrupt_script, wait_until

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_an_env_that_raises_is_an_env_error_naming_worker_and_env(variant):
    k = variant.num_envs - 1  # the last env fails at its 5th step
    fns = [CounterEnv] * k + [functools.partial(CounterEnv, fail_at=5)]
    collector = variant(fns, frames_per_batch=40, total_frames=-1)
    t0 = time.monotonic()
    with pytest.raises(EnvError) as info:
        for _ in collector:
            pass
    assert time.monotonic() - t0 < 5
    err = info.value
    assert isinstance(err, aiocollect.WorkerError) and isinstance(err, aiocollect.CollectorError)
    worker, env = variant.locate(k)
    assert (err.worker, err.env) == (worker, env)
    assert f"worker {worker}" in str(err) and (env is None or f"env {env} of worker {worker}" in str(err))
    assert err.remote_type == "ValueError" and "exploded on purpose" in str(err)
    assert "Traceback" in err.remote_traceback and "in step" in err.remote_traceback
    assert isinstance(err.__cause__, ValueError) and "exploded on purpose" in str(err.__cause__)
    assert err.pid == os.getpid() or (variant.processes and err.pid != os.getpid())
    with pytest.raises(CollectorFailedError) as later:
        collector.rollout()
    assert later.value.__cause__ is err
    collector.shutdown()


async def test_an_env_error_on_the_async_face(variant):
    fns = [CounterEnv] * (variant.num_envs - 1) + [functools.partial(CounterEnv, fail_at=3)]
    async with variant(fns, frames_per_batch=40, total_frames=-1) as collector:
        with pytest.raises(EnvError, match="exploded on purpose"):
            async for _ in collector:
                pass
        with pytest.raises(CollectorFailedError):
            await collector.arollout()
        with pytest.raises(CollectorFailedError, match="failed earlier"):
            await collector.update_policy_weights()  # the async twin too: no weights taken after a fault


def test_weights_are_refused_after_a_fault(variant):
    """A collector whose env crashed collects nothing more: ``update_policy_weights_`` raises
    the same ``CollectorFailedError`` as every other call, rather than returning a new
    version that no frame will ever carry."""
    policy = TensorDictModule(ArgmaxMLP(3, 3), in_keys=["observation"], out_keys=["action"])
    fns = [CounterEnv] * (variant.num_envs - 1) + [functools.partial(CounterEnv, fail_at=3)]
    with variant(fns, policy, frames_per_batch=40, total_frames=-1) as collector:
        assert collector.update_policy_weights_() == 1  # (a policy with weights: each update is a version)
        with pytest.raises(EnvError) as info:
            for _ in collector:
                pass
        for args in [(), (policy,)]:
            with pytest.raises(CollectorFailedError, match="failed earlier") as later:
                collector.update_policy_weights_(*args)
            assert later.value.__cause__ is info.value
        assert collector.statistics().latest_policy_version == 1


def broken_policy(observation):
    raise ZeroDivisionError("the policy's own bug")


def test_a_policy_that_raises_comes_out_as_it_is(variant):
    collector = variant(policy=broken_policy, frames_per_batch=40, total_frames=-1)
    t0 = time.monotonic()
    with pytest.raises(ZeroDivisionError, match="the policy's own bug") as info:
        collector.rollout()
    assert time.monotonic() - t0 < 5
    frames = [frame.name for frame in info.traceback]
    assert "broken_policy" in frames, "the policy's own frame is not in the traceback"
    with pytest.raises(CollectorFailedError, match="failed earlier"):
        next(iter(collector))
    collector.shutdown()


def test_a_nan_action_is_a_policy_error_naming_the_env_and_no_env_gets_it(variant):
    """Issue 50 item 6: a NaN action reached the env (gymnasium's Pendulum returns a NaN reward
    then), and came out as an ``EnvError``, "returned a reward that is not a number". It is the
    policy's: a ``PolicyError`` naming the env, before any env is stepped with it, wherever the
    policy runs (a torch module: in the workers for ``MultiAsync-process``). The same env was
    given 5.0 before, outside its Box(-4, 4): a finite action goes to the env as it is (the
    policy's NaN answers the 5.0 the env echoes back)."""
    k = variant.num_envs - 1
    fns = [EchoBoxEnv] * k + [functools.partial(EchoBoxEnv, 7.0)]
    policy = TensorDictModule(NaNAfterOutOfBounds(), in_keys=["observation"], out_keys=["action"])
    with variant(fns, policy, frames_per_batch=8 * variant.num_envs, total_frames=-1) as collector:
        t0 = time.monotonic()
        with pytest.raises(aiocollect.CollectorError) as info:
            for _ in collector:
                assert time.monotonic() - t0 < 30, "no error"
        err = info.value
        assert isinstance(err, PolicyError) and not isinstance(err, EnvError), f"{type(err).__name__}: {err}"
        worker, env = (0, k) if variant.envs == "vector" else variant.locate(k)  # (a VectorEnv's env k)
        assert (err.worker, err.env) == (worker, env)
        assert str(err).startswith(f"the policy's action for env {env} of worker {worker} is not finite: [nan]. "
                                   "No env was stepped with it")
        in_workers = getattr(collector, "policy_in_workers", False)
        assert in_workers is variant.in_workers
        assert (err.pid == os.getpid()) is not in_workers  # (the process the policy ran in)
        if in_workers:  # (named by the copy of the policy in the worker that ran it)
            assert f"raised by the copy of the policy in worker {worker}" in "".join(err.__notes__)
        with pytest.raises(CollectorFailedError):
            collector.rollout()


def test_a_coroutine_env_that_hangs_is_a_step_timeout(variant):
    if variant.envs in ("inline", "vector"):
        with pytest.raises(ValueError, match="step_timeout: these apply to coroutine envs"):
            variant(frames_per_batch=40, step_timeout=0.2)
        return
    if variant.processes:
        return  # a worker process that hangs: contract/test_hangs.py
    k = variant.num_envs - 1
    fns = [CounterEnv] * k + [HangingEnv]
    with variant(fns, frames_per_batch=40, total_frames=-1, step_timeout=0.3) as collector:
        t0 = time.monotonic()
        with pytest.raises(StepTimeoutError) as info:
            collector.rollout()
        assert time.monotonic() - t0 < 3
    err = info.value
    assert isinstance(err, TimeoutError) and isinstance(err, EnvError)
    worker, env = variant.locate(k)
    assert (err.worker, err.env) == (worker, env)
    assert f"env {env} of worker {worker} (HangingEnv) did not answer step() within 0.3 s" in str(err)


def test_shutdown_twice_and_from_another_thread_is_bounded(variant):
    collector = variant(frames_per_batch=40, total_frames=-1)
    collector.rollout()
    pids = [w.pid for w in collector.statistics().workers if w.pid is not None]
    thread = threading.Thread(target=collector.shutdown)
    t0 = time.monotonic()
    thread.start()
    thread.join(10)
    collector.shutdown()
    assert time.monotonic() - t0 < 5
    assert not any(alive(pid) for pid in pids if wait_until(lambda: not any(alive(p) for p in pids)))
    assert all(not w.alive for w in collector.statistics().workers)


def test_shutdown_from_another_thread_ends_an_iteration_under_way(variant):
    slow = functools.partial(SleepyEnv, 0.002)
    collector = variant(slow, None, frames_per_batch=4000, total_frames=-1)
    timer = threading.Timer(0.5, collector.shutdown)
    timer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(CollectorClosedError, match="shut down"):
            for _ in collector:
                pass
    finally:
        timer.join()
    assert time.monotonic() - t0 < 5


def test_use_after_shutdown_is_a_collector_closed_error(variant):
    collector = variant(frames_per_batch=40, total_frames=-1)
    collector.shutdown()
    for use in (collector.rollout, lambda: next(iter(collector)), collector.start):
        with pytest.raises(CollectorClosedError, match="shut down; create a new collector"):
            use()


async def test_use_after_shutdown_on_the_async_face(variant):
    collector = variant(frames_per_batch=40, total_frames=-1)
    async with collector:
        await collector.arollout()
    with pytest.raises(CollectorClosedError):
        await collector.arollout()
    with pytest.raises(CollectorClosedError):
        async for _ in collector:
            pass


def test_garbage_collection_releases_everything(variant):
    recorder = EnvRecorder()
    collector = variant(recorder, frames_per_batch=40, total_frames=-1)
    collector.rollout()
    del collector
    gc.collect()
    # the leak check (contract/conftest.py) asserts no process, thread, fd or socket is left;
    # a Collector's envs are closed too (worker collectors build their envs from a copy of
    # the factory, in the worker or on the engine loop, so the recorder does not see them)
    if variant.cls.__name__ == "Collector":
        assert recorder.envs and all(env.closed for env in recorder.envs)


def test_two_iterations_at_once_are_refused(variant):
    slow = functools.partial(SleepyEnv, 0.005)
    collector = variant(slow, None, frames_per_batch=80, total_frames=-1)
    first = threading.Thread(target=lambda: next(iter(collector), None))
    first.start()
    deadline = time.monotonic() + 5
    while not collector._busy and time.monotonic() < deadline:
        time.sleep(0.005)
    with pytest.raises(CollectorBusyError, match="already collecting"):
        collector.rollout()
    first.join(20)
    collector.shutdown()


def test_iterating_while_start_runs_is_refused(variant):
    class Buffer:
        def extend(self, batch):
            pass

    collector = variant(frames_per_batch=40, total_frames=-1, replay_buffer=Buffer())
    collector.start()
    with pytest.raises(CollectorBusyError, match="in the background"):
        next(iter(collector))
    with pytest.raises(CollectorBusyError, match="already running"):
        collector.start()
    collector.async_shutdown()


CTRL_C = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    import functools
    from support.envs import SleepyEnv
    from support.variants import VARIANTS
    variant = next(v for v in VARIANTS if v.name == {name!r})
    c = variant(functools.partial(SleepyEnv, 0.002), None, frames_per_batch=4000, total_frames=-1)
    print("pids", *[w.pid for w in c.statistics().workers if w.pid is not None], flush=True)
    print("collecting", flush=True)
    for batch in c:
        pass
    """
)


@pytest.mark.usefixtures("zygote")  # (interrupt_script forks the script from it)
def test_ctrl_c_raises_keyboard_interrupt_and_leaves_nothing(variant):
    out, err, returncode = interrupt_script(CTRL_C.format(tests=TESTS, name=variant.name), preamble=1)
    assert "KeyboardInterrupt" in err and returncode != 0
    pids = [int(p) for p in out.split()[1:]]
    assert len(pids) == (variant.workers if variant.processes else 0)
    assert wait_until(lambda: not any(alive(pid) for pid in pids)), "a worker outlived Ctrl-C"


def test_a_worker_slower_to_start_than_start_timeout_is_named_and_stopped(variant):
    """``start_timeout`` bounds the start of worker processes: past it, a ``StartTimeoutError``
    (a ``TimeoutError``) names the workers that were not up, how long it waited and how to
    raise the bound, and every worker is stopped. Coroutine entries start at once; a
    ``Collector`` starts no worker and refuses the argument."""
    k = variant.num_envs - 1  # its worker sleeps 30 s building it (not in this process)
    fns = [CounterEnv] * k + [functools.partial(SlowStartEnv, os.getpid())]
    if variant.cls is aiocollect.Collector:
        with pytest.raises(ValueError, match=r"start_timeout=0\.5: .*starts no worker process.*num_collectors"):
            variant(fns, frames_per_batch=8, start_timeout=0.5)
        if variant.envs == "inline":  # with num_collectors, it goes to the worker collector built
            with pytest.raises(aiocollect.StartTimeoutError) as info:
                aiocollect.Collector(fns, None, num_collectors=len(fns), frames_per_batch=8, start_timeout=0.5)
            assert k in info.value.pending and "did not start within 0.5 s (start_timeout)" in str(info.value)
        return
    if not variant.processes:
        with variant(fns, frames_per_batch=8, total_frames=8, start_timeout=0.5) as collector:
            assert sum(1 for _ in collector) == 1
        return
    before = children()
    t0 = time.monotonic()
    with pytest.raises(aiocollect.StartTimeoutError) as info:
        variant(fns, frames_per_batch=8, start_timeout=0.5)
    assert time.monotonic() - t0 < 10
    err = info.value
    assert isinstance(err, TimeoutError) and isinstance(err, aiocollect.CollectorError)
    worker = variant.locate(k)[0]
    assert worker in err.pending and err.timeout == 0.5
    text = str(err)
    # "worker 1 (pid N) did not start", or "workers 0 (pid N), 1 (pid M) did not start" on a slow machine
    assert re.match(rf"workers? (\d+ \(pid \d+\), )*{worker} \(pid \d+\)", text), text
    assert "did not start within 0.5 s (start_timeout)" in text, text
    assert "overloaded" in text and "raise start_timeout" in text, text
    assert wait_until(lambda: children() == before), "a worker was left running"

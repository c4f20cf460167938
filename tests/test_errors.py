"""Bad input, faults and cleanup."""

from __future__ import annotations

import gc
import os
import textwrap
import time
import traceback

import gymnasium as gym
import pytest
import torch
import torch.nn as nn

from aiocollect import Collector, GymEnv
from support.envs import CounterEnv, EnvRecorder
from support.procs import interrupt_script
from support.procs import children

pytestmark = pytest.mark.usefixtures("no_thread_leak")

built = []


def counting_factory():
    built.append(1)
    return CounterEnv()


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(frames_per_batch=0), ValueError, "frames_per_batch must be positive"),
        (dict(frames_per_batch=-5), ValueError, "frames_per_batch must be positive"),
        (dict(frames_per_batch=2.5), TypeError, "frames_per_batch must be an integer"),
        (dict(frames_per_batch=True), TypeError, "frames_per_batch must be an integer"),
        (dict(frames_per_batch=10, total_frames=-3), ValueError, "total_frames must be positive, or -1"),
        (dict(frames_per_batch=10, total_frames=0), ValueError, "total_frames must be positive, or -1"),
        (dict(frames_per_batch=10, total_frames=25), ValueError, "total_frames=30 or 20"),
        (dict(frames_per_batch=10, device="gpu"), ValueError, "device='gpu' is not a device"),
        (dict(frames_per_batch=10, policy_device="cuda:7"), ValueError, "policy_device"),
        (dict(frames_per_batch=10, storing_device=3.0), TypeError, "storing_device"),
        (dict(frames_per_batch=10, replay_buffer=object()), TypeError, "replay_buffer must have an extend"),
        (dict(frames_per_batch=10, postproc=5), TypeError, "postproc must be a callable"),
        (dict(frames_per_batch=10, interruptor=object()), TypeError, "interruptor"),
        (dict(frames_per_batch=10, exploration_type="greedy"), ValueError, "exploration_type"),
        (dict(frames_per_batch=10, split_trajs="yes"), TypeError, "split_trajs"),
        (dict(frames_per_batch=10, create_env_kwargs=[1]), TypeError, "create_env_kwargs must be a dict"),
        (dict(frames_per_batch=10, max_frames_per_traj=1.5), TypeError, "max_frames_per_traj"),
        (dict(frames_per_batch=10, reset_at_each_iter=None), TypeError, "reset_at_each_iter"),
    ],
)
def test_bad_options_fail_before_any_env_is_built(kwargs, exc, match):
    built.clear()
    with pytest.raises(exc, match=match):
        Collector(counting_factory, None, **kwargs)
    assert built == []


@pytest.mark.parametrize(
    "env_fn, exc, match",
    [
        (42, TypeError, "create_env_fn: expected a callable"),
        ([], ValueError, "list of env factories is empty"),
        ([counting_factory, 3], TypeError, r"create_env_fn\[1\]"),
        (None, TypeError, "create_env_fn is required"),
    ],
)
def test_bad_create_env_fn(env_fn, exc, match):
    built.clear()
    with pytest.raises(exc, match=match):
        Collector(env_fn, None, frames_per_batch=10)
    assert built == []


def test_factory_returning_a_non_env_names_it():
    with pytest.raises(TypeError, match="create_env_fn: create_env_fn gave builtins.int, not a gymnasium env"):
        Collector(lambda: 3, None, frames_per_batch=10)


def test_non_callable_policy():
    built.clear()
    with pytest.raises(TypeError, match="policy must be"):
        Collector(counting_factory, policy=5, frames_per_batch=10)
    assert built == []


def test_frames_per_batch_not_divisible_by_envs_says_what_would():
    factory = EnvRecorder()

    with pytest.raises(ValueError, match="frames_per_batch=10 does not split evenly over 3 envs.*9 or 12"):
        Collector([factory] * 3, None, frames_per_batch=10)
    assert all(e.closed for e in factory.envs)


@pytest.mark.parametrize(
    "policy, exc, match",
    [
        (lambda obs: torch.zeros(obs.shape[0], 1, dtype=torch.int64), ValueError, "action: .*squeeze"),
        (lambda obs: torch.zeros(obs.shape[0]), TypeError, "action: .*integer"),
        (lambda obs: torch.full((obs.shape[0],), 3), ValueError, "action: .*outside"),
        (lambda obs: torch.full((obs.shape[0],), -1), ValueError, "action: .*outside"),
        (lambda obs: (torch.zeros(obs.shape[0]),), TypeError, "policy: a plain callable"),
    ],
)
def test_action_that_does_not_fit_names_action(policy, exc, match):
    c = Collector([lambda: CounterEnv()] * 2, policy, frames_per_batch=10)
    with pytest.raises(exc, match=match):
        next(iter(c))
    c.shutdown()


def test_box_action_shape_checked():
    c = Collector(lambda: GymEnv("Pendulum-v1"), lambda obs: torch.zeros(obs.shape[0], 2), frames_per_batch=10)
    with pytest.raises(ValueError, match=r"action: .*\[1, 2\].*expected \[1, 1\]"):
        next(iter(c))
    c.shutdown()


def test_env_exception_surfaces_with_original_traceback_sync():
    c = Collector(lambda: CounterEnv(fail_at=5), None, frames_per_batch=10)
    with pytest.raises(ValueError, match="exploded on purpose") as info:
        next(iter(c))
    tb = "".join(traceback.format_exception(info.value))
    assert "in step" in tb and "conftest.py" in tb
    with pytest.raises(RuntimeError, match="failed earlier"):
        next(iter(c))
    c.shutdown()


async def test_policy_exception_surfaces_async():
    def policy(obs):
        raise KeyError("policy broke")

    c = Collector(lambda: CounterEnv(), policy, frames_per_batch=10)
    with pytest.raises(KeyError, match="policy broke") as info:
        async for _ in c:
            pass
    assert "in policy" in "".join(traceback.format_exception(info.value))
    c.shutdown()


def test_garbage_collected_collector_closes_envs():
    factory = EnvRecorder()

    c = Collector(factory, None, frames_per_batch=10, total_frames=-1)
    next(iter(c))
    del c
    gc.collect()
    assert factory.envs[0].closed


def test_shutdown_while_collecting_in_background_is_bounded():
    class Buf:
        def extend(self, td):
            pass

    class Slow(CounterEnv):
        def step(self, action):
            time.sleep(0.001)
            return super().step(action)

    c = Collector(Slow, None, frames_per_batch=1000, total_frames=-1, replay_buffer=Buf())
    c.start()
    time.sleep(0.1)
    t0 = time.perf_counter()
    c.shutdown()
    assert time.perf_counter() - t0 < 2
    assert not c.is_running()


CTRL_C_SCRIPT = textwrap.dedent(
    """
    import sys, threading, time
    sys.path.insert(0, {tests!r})
    from support.envs import CounterEnv
    from aiocollect import Collector

    class Slow(CounterEnv):
        def step(self, action):
            time.sleep(0.01)
            return super().step(action)

    c = Collector(Slow, None, frames_per_batch=100000, total_frames=-1)
    print("collecting", flush=True)
    try:
        for batch in c:
            pass
    except KeyboardInterrupt:
        print("interrupted", [t.name for t in threading.enumerate() if t.name.startswith("aiocollect")], flush=True)
        raise
    """
)


def test_ctrl_c_during_sync_iteration_raises_and_leaves_nothing():
    out, err, returncode = interrupt_script(CTRL_C_SCRIPT.format(tests=os.path.dirname(__file__)))
    assert "interrupted []" in out  # the loop thread was stopped before the exception left the loop
    assert "KeyboardInterrupt" in err
    assert returncode != 0


def test_vector_env_without_partial_reset_gets_a_clear_error():
    class NoMask(gym.vector.SyncVectorEnv):
        def reset(self, *, seed=None, options=None):
            if options and "reset_mask" in options:
                raise NotImplementedError("no partial resets here")
            return super().reset(seed=seed, options=options)

    venv = NoMask([lambda: CounterEnv()] * 2)
    c = Collector(venv, None, frames_per_batch=40)
    c.set_seed(0)  # seeded, the two envs' episodes end apart (unseeded, they all ended together ~1 run in 100)
    with pytest.raises(RuntimeError, match="cannot reset a subset"):
        next(iter(c))
    c.shutdown()


def test_torchrl_env_gets_a_hint():
    torchrl_envs = pytest.importorskip("torchrl.envs")
    from aiocollect import MultiSyncCollector

    before = children()
    with pytest.raises(TypeError, match="instead of a TorchRL env"):
        Collector(lambda: torchrl_envs.GymEnv("CartPole-v1"), None, frames_per_batch=10)
    env = torchrl_envs.GymEnv("CartPole-v1")  # an instance is callable: it must not pass for a factory
    for make in (lambda: Collector(env, None, frames_per_batch=10),
                 lambda: Collector([env, env], None, frames_per_batch=10),
                 lambda: MultiSyncCollector([env], None, frames_per_batch=10),
                 lambda: MultiSyncCollector([[env]], None, frames_per_batch=10),
                 lambda: MultiSyncCollector([torchrl_envs.EnvCreator(lambda: torchrl_envs.GymEnv("CartPole-v1"))],
                                            None, frames_per_batch=10)):
        with pytest.raises(TypeError, match=r"create_env_fn(\[0\])* is a TorchRL object .* instead of a TorchRL env"):
            make()
    assert children() == before


def test_mismatched_spaces_in_a_list():
    with pytest.raises(ValueError, match="share their observation and action spaces"):
        Collector([lambda: gym.make("CartPole-v1"), lambda: gym.make("Pendulum-v1")], None, frames_per_batch=10)


def test_policy_returning_nothing_named_action():
    from tensordict.nn import TensorDictModule

    policy = TensorDictModule(nn.Linear(3, 1), in_keys=["observation"], out_keys=["act"])
    policy_seq = __import__("tensordict").nn.TensorDictSequential(policy)
    c = Collector(lambda: CounterEnv(), policy_seq, frames_per_batch=10)
    with pytest.raises(KeyError, match="action: the policy wrote"):
        next(iter(c))
    c.shutdown()

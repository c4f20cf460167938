"""Collector only: its sync and async faces (a running loop, a thread, uvloop), context managers,
background collection, statistics snapshots, and the checks of what it is given (factories,
actions, vector envs without partial resets, TorchRL envs)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
import warnings

import gymnasium as gym
import pytest
import torch
import torch.nn as nn

from aiocollect import Collector, CollectorStatistics, EnvError, GymEnv
from support.checks import check_batch
from support.envs import CounterEnv, EnvRecorder
from support.procs import children

pytestmark = pytest.mark.usefixtures("no_thread_leak")


def make(**kw):
    kw.setdefault("frames_per_batch", 20)
    kw.setdefault("total_frames", 100)
    return Collector([lambda: CounterEnv()] * 2, None, **kw)


def test_sync_with_shuts_down_also_on_error():
    factory = EnvRecorder()

    with pytest.raises(ZeroDivisionError), Collector(factory, None, frames_per_batch=10, total_frames=-1) as c:
        for _ in c:
            raise ZeroDivisionError
    assert factory.envs[0].closed
    with pytest.raises(RuntimeError, match="shut down"):
        next(iter(c))


async def test_async_with_and_async_for():
    factory = EnvRecorder()

    async with Collector(factory, None, frames_per_batch=10, total_frames=50) as c:
        shapes = [b.shape async for b in c]
    assert shapes == [torch.Size([10])] * 5
    assert factory.envs[0].closed


def test_sync_for_inside_a_running_loop_works_and_warns_that_it_blocks_it():
    """A thread whose event loop is running (as a Jupyter cell's: its real case, which does not
    warn, is in ``artifacts/test_notebooks.py``): the sync face still works, through the loop
    thread; written in an ``async def``, it blocks that loop, and says so."""

    async def cell():
        with make(total_frames=60) as c:
            return [b.shape for b in c]

    with pytest.warns(RuntimeWarning, match="blocks this thread's event loop"):
        assert asyncio.run(cell()) == [torch.Size([2, 10])] * 3


def _loop_warnings(caught) -> list:
    return [w for w in caught if issubclass(w.category, RuntimeWarning) and "event loop" in str(w.message)]


def test_a_for_in_an_async_def_warns_once_naming_async_for():
    """Issue 52: a plain ``for`` inside an ``async def`` blocked the caller's loop without a word
    (another task ran 0 times while it collected). It warns, once per collector, at the line
    of the ``for``, naming ``async for``; the other task still waits, as the warning says."""
    ticks = []

    async def ticker():
        while True:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.001)

    async def main():
        task = asyncio.create_task(ticker())
        await asyncio.sleep(0.01)
        c = make(total_frames=-1)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                before = len(ticks)
                for _ in c:  # (the line the warning points at)
                    break
                blocked = len(ticks) == before
                for _ in c.iterator():
                    break
                assert [b.numel() for _, b in zip(range(2), c)] == [20, 20]
        finally:
            task.cancel()
            c.shutdown()
        return caught, blocked

    caught, blocked = asyncio.run(main())
    [warning] = _loop_warnings(caught)
    assert warning.filename == __file__
    assert "in the async function main() blocks" in str(warning.message)
    assert "Use `async for batch in collector` there" in str(warning.message)
    assert blocked  # (what it warns of)
    # a second collector warns on its own
    async def again():
        with make(total_frames=20) as c, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            list(c)
        return caught

    assert len(_loop_warnings(asyncio.run(again()))) == 1


def test_a_for_outside_an_async_def_does_not_warn():
    """At the top level, in a thread, and in a plain function run by a loop's callback: no
    coroutine is blocked by its own code, so nothing to warn of (async for is not an option)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert [b.numel() for b in make(total_frames=40)] == [20, 20]
        t = threading.Thread(target=lambda: list(make(total_frames=20)))
        t.start()
        t.join(30)

        async def main():
            loop = asyncio.get_running_loop()
            done = loop.create_future()
            loop.call_soon(lambda: done.set_result(len(list(make(total_frames=20)))))
            return await done

        assert asyncio.run(main()) == 1
    assert _loop_warnings(caught) == []


def test_sync_for_in_a_thread():
    result = []
    t = threading.Thread(target=lambda: result.extend(b.numel() for b in make()))
    t.start()
    t.join(30)
    assert result == [20] * 5


def test_break_out_of_loop_leaves_no_thread_and_continues():
    c = make(total_frames=-1)
    for b in c:  # noqa: B007 - the batch the loop broke on
        break
    assert not [t for t in threading.enumerate() if t.name.startswith("aiocollect")]
    first = b
    second = next(iter(c))
    # trajectories go on across loops
    assert first["collector", "traj_ids"].max() <= second["collector", "traj_ids"].max()
    c.shutdown()


def test_sync_face_from_the_collectors_own_loop_points_to_async_for():
    holder = {}

    def postproc(td):
        holder["c"].rollout()  # blocking on the loop that runs us: must refuse

    c = make(postproc=postproc)
    holder["c"] = c
    with pytest.raises(RuntimeError, match="async for"):
        next(iter(c))
    c.shutdown()


def test_statistics_is_an_immutable_snapshot():
    c = make(max_frames_per_traj=3)
    s0 = c.statistics()
    batches = list(c)
    s1 = c.statistics()
    c.shutdown()
    assert isinstance(s1, CollectorStatistics)
    assert (s0.frames, s0.batches) == (0, 0)
    assert (s1.frames, s1.batches, s1.env_steps) == (100, 5, 100)
    # every done transition ended one trajectory (episodes are random, 2 to 11 steps, cut at 3)
    ended = sum(int(b["next", "done"].sum()) for b in batches)
    assert s1.completed_trajectories == ended >= 2 * (50 // 3)
    assert s1.frames_per_second > 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        s1.frames = 3


def test_endless_collector_has_no_len():
    c = make(total_frames=-1)
    with pytest.raises(TypeError, match="endless"):
        len(c)
    c.shutdown()


class ListBuffer:
    def __init__(self):
        self.items = []
        self.lock = threading.Lock()

    def extend(self, td):
        with self.lock:
            self.items.append(td.clone())

    def __len__(self):
        with self.lock:
            return sum(td.numel() for td in self.items)


def test_start_stops_by_itself_at_total_frames():
    rb = ListBuffer()
    c = make(replay_buffer=rb, total_frames=200)
    c.start()
    deadline = time.monotonic() + 10
    while c.is_running() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not c.is_running() and len(rb) == 200
    c.async_shutdown()


def test_background_error_surfaces_at_async_shutdown():
    rb = ListBuffer()
    c = Collector(lambda: CounterEnv(fail_at=30), None, frames_per_batch=10, total_frames=-1, replay_buffer=rb)
    c.start()
    deadline = time.monotonic() + 5
    while c.is_running() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not c.is_running()
    with pytest.raises(EnvError, match="exploded on purpose") as info:
        c.async_shutdown()
    assert isinstance(info.value.__cause__, ValueError)


def test_start_requires_replay_buffer():
    c = make()
    with pytest.raises(RuntimeError, match="replay_buffer"):
        c.start()
    c.shutdown()


async def test_async_rollout_and_sync_rollout():
    c = make()
    b = await c.arollout()
    check_batch(b)
    c.shutdown()
    c2 = make()
    check_batch(c2.rollout())
    c2.shutdown()


def test_sync_face_runs_on_uvloop_where_installed():
    uvloop = pytest.importorskip("uvloop")
    loops = []

    def policy(obs):
        loops.append(type(asyncio.get_running_loop()))
        return torch.zeros(obs.shape[0], dtype=torch.int64)

    c = Collector(lambda: CounterEnv(), policy, frames_per_batch=5, total_frames=5)
    list(c)
    c.shutdown()
    assert loops and all(issubclass(loop, uvloop.Loop) for loop in loops)


async def test_async_face_applies_split_postproc_and_replay_buffer():
    rb = ListBuffer()
    c = make(split_trajs=True, postproc=lambda td: td.set("seen", td["collector", "mask"]), replay_buffer=rb)
    out = [b async for b in c]
    c.shutdown()
    assert out == [None] * 5
    assert sum(int(td["collector", "mask"].sum()) for td in rb.items) == 100
    assert all(torch.equal(td["seen"], td["collector", "mask"]) for td in rb.items)


# --------------------------------------------------------------------------- what it is given


built = []


def counting_factory():
    built.append(1)
    return CounterEnv()


@pytest.mark.parametrize(
    ("env_fn", "exc", "match"),
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


def test_frames_per_batch_not_divisible_by_envs_is_rounded_up_with_a_warning_as_in_torchrl():
    with pytest.warns(UserWarning, match=r"frames_per_batch=10 does not split evenly over 3 envs: each batch "
                                         r"has 12 frames, rounded up as TorchRL does"):
        c = Collector([CounterEnv] * 3, None, frames_per_batch=10, total_frames=20, init_random_frames=5)
    with c:
        assert (c.frames_per_batch, c.total_frames, c.options.init_random_frames) == (12, 24, 12)
        assert [tuple(b.shape) for b in c] == [(3, 4), (3, 4)]


@pytest.mark.parametrize(
    ("policy", "exc", "match"),
    [
        (lambda obs: torch.full((obs.shape[0],), 3), ValueError, "action: .*outside"),
        (lambda obs: torch.full((obs.shape[0],), -1), ValueError, "action: .*outside"),
        (lambda obs: torch.full((obs.shape[0],), 0.5), TypeError, "action: .*not whole numbers"),
    ],
)
def test_action_that_does_not_fit_names_action(policy, exc, match):
    c = Collector([lambda: CounterEnv()] * 2, policy, frames_per_batch=10)
    with pytest.raises(exc, match=match):
        next(iter(c))
    c.shutdown()


@pytest.mark.parametrize(
    ("policy", "dtype", "shape", "extra"),
    [
        (lambda obs: torch.zeros(obs.shape[0], 1, dtype=torch.int64), torch.int64, (2, 5, 1), set()),
        (lambda obs: torch.zeros(obs.shape[0]), torch.float32, (2, 5), set()),
        (lambda obs: (torch.zeros(obs.shape[0], dtype=torch.int64), obs[:, 0]), torch.int64, (2, 5), {"output1"}),
    ],
)
def test_actions_a_discrete_env_can_take_are_stored_as_the_policy_wrote_them(policy, dtype, shape, extra):
    # issue 51: TorchRL stores what the policy writes ([n, 1] indices, whole floats, a tuple's
    # "action" and "output1"...); these were refused ("squeeze", "integer", "a plain callable")
    with Collector([lambda: CounterEnv()] * 2, policy, frames_per_batch=10, total_frames=10) as c:
        (batch,) = list(c)
    assert batch["action"].dtype == dtype and tuple(batch["action"].shape) == shape
    assert extra <= set(batch.keys())
    assert (batch["next", "observation"][..., 2] == 0).all()  # (CounterEnv echoes the action index it got)


def test_box_action_shape_checked():
    c = Collector(lambda: GymEnv("Pendulum-v1"), lambda obs: torch.zeros(obs.shape[0], 2), frames_per_batch=10)
    with pytest.raises(ValueError, match=r"action: .*\[1, 2\].*expected \[1, 1\]"):
        next(iter(c))
    c.shutdown()


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


def test_torchrl_env_instances_for_workers_and_other_torchrl_objects_say_what_to_pass():
    # TorchRL envs are env sources now (tests/integration/test_torchrl_envs.py); a worker still
    # builds its own envs, so an instance for a worker entry is refused, as a gymnasium one is
    torchrl_envs = pytest.importorskip("torchrl.envs")
    from aiocollect import MultiSyncCollector

    before = children()
    env = torchrl_envs.GymEnv("CartPole-v1")
    # (a TorchRL instance as a worker's entry is copied to its worker now, as in TorchRL:
    # tests/integration/test_torchrl_envs.py; inside a list of factories it is still refused)
    with pytest.raises(TypeError, match=r"create_env_fn\[0\]\[0\]: expected an env factory or an env id"):
        MultiSyncCollector([[env]], None, frames_per_batch=10)
    with pytest.raises(TypeError, match="but not an env"):
        Collector(torchrl_envs.StepCounter(), None, frames_per_batch=10)
    env.close()
    assert children() == before


def test_mismatched_spaces_in_a_list():
    with pytest.raises(ValueError, match="share their observation and action spaces"):
        Collector([lambda: gym.make("CartPole-v1"), lambda: gym.make("Pendulum-v1")], None, frames_per_batch=10)


def test_policy_returning_nothing_named_action():
    from tensordict.nn import TensorDictModule

    policy = TensorDictModule(nn.Linear(3, 1), in_keys=["observation"], out_keys=["act"])
    policy_seq = __import__("tensordict").nn.TensorDictSequential(policy)
    # its out_keys say it may write no action: one call at construction settles it
    with pytest.raises(KeyError, match=r"^policy: it wrote \['act'\] \(its out_keys are \['act'\]\), with no 'action'"):
        Collector(lambda: CounterEnv(), policy_seq, frames_per_batch=10)

    def act(td):  # declares no keys: its first call says what it wrote
        td["act"] = td["observation"][:, :1]
        return td

    c = Collector(lambda: CounterEnv(), act, frames_per_batch=10)
    with pytest.raises(KeyError, match="action: the policy wrote"):
        next(iter(c))
    c.shutdown()

"""Coroutine envs: stepped concurrently on the collector's loop, no barrier, the batching knobs,
cancellation of pending steps, a TCP game, mixing with gymnasium and thread envs, and coroutine
entries of the worker collectors mixed with process workers."""

from __future__ import annotations

import asyncio
import itertools
import os
import textwrap
import threading
import time

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from aiocollect import (
    AsyncEnv,
    Collector,
    EnvError,
    Interruptor,
    MultiAsyncCollector,
    MultiSyncCollector,
    StepTimeoutError,
    ThreadEnv,
    split_trajectories,
)
from support.checks import check_batch, check_continuity
from support.coroutine_envs import GameServer, LatencyEnv, PlainCounterEnv, SocketGameEnv
from support.procs import interrupt_script

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def factories(envs):
    return [lambda e=e: e for e in envs]


def act_on_obs(obs):
    """A deterministic policy: action = t mod 3 (a function of the observation only)."""
    return (obs[:, 1] % 3).long()


class RecordingPolicy:
    """Random Discrete(3) actions; records the batch size of every call."""

    def __init__(self):
        self.sizes = []

    def __call__(self, obs):
        self.sizes.append(obs.shape[0])
        return torch.randint(0, 3, (obs.shape[0],))


def test_batches_keep_the_layout_and_invariants_sync_face():
    envs = [LatencyEnv(i) for i in range(12)]
    with Collector(factories(envs), act_on_obs, frames_per_batch=12 * 10, total_frames=12 * 10 * 4,
                   max_frames_per_traj=8) as c:
        batches = list(c)
    assert len(batches) == 4
    for b in batches:
        assert b.shape == (12, 10) and b.names == [None, "time"]
        check_batch(b, step_count=8)
        # row i holds env i, and its actions came from its own observations
        assert torch.equal(b["observation"][:, :, 0], torch.arange(12.0)[:, None].expand(12, 10))
        assert torch.equal(b["action"], (b["observation"][:, :, 1] % 3).long())
    for prev, cur in itertools.pairwise(batches):
        check_continuity(prev, cur)
    assert all(e.closed for e in envs)  # shutdown() closed them
    assert len({i for e in envs for i in e.loop_ids}) == 1  # one loop for their whole life


async def test_async_face_uses_the_collectors_loop_and_closes_envs():
    envs = [LatencyEnv(i) for i in range(6)]
    async with Collector(factories(envs), None, frames_per_batch=60, total_frames=180) as c:
        batches = [b async for b in c]
    assert [tuple(b.shape) for b in batches] == [(6, 10)] * 3
    for b in batches:
        check_batch(b)
    mine = id(asyncio.get_running_loop())
    loops = {i for e in envs for i in e.loop_ids}
    assert len(loops) == 1 and mine not in loops  # the collector's own loop, not the caller's
    assert all(e.closed for e in envs)


def test_no_barrier_a_fast_env_is_not_held_back_by_a_slow_one():
    fast, slow = LatencyEnv(0, 0.001, 0.001, length=1000), LatencyEnv(1, 0.03, 0.03, length=1000)
    with Collector(factories([fast, slow]), None, frames_per_batch=2 * 10, total_frames=20) as c:
        (batch,) = list(c)
    check_batch(batch)
    assert len(fast.step_times) == len(slow.step_times) == 10
    # the fast env took its 10 steps before the slow one had taken 2 of its own
    assert fast.step_times[-1] < slow.step_times[1]


def test_same_seed_same_trajectories_whatever_the_timing():
    def run():
        envs = [LatencyEnv(i, 0.0005, 0.004, length=7) for i in range(8)]
        with Collector(factories(envs), act_on_obs, frames_per_batch=80, total_frames=160) as c:
            c.set_seed(11)
            return torch.cat([b["observation"] for b in c], dim=1)

    a, b = run(), run()
    assert torch.equal(a, b)


def test_split_trajs_and_interruptor():
    envs = [LatencyEnv(i, length=4) for i in range(4)]
    with Collector(factories(envs), None, frames_per_batch=40, total_frames=40, split_trajs=True) as c:
        (batch,) = list(c)
    assert batch["collector", "mask"].sum() == 40
    assert batch.shape[-1] <= 4

    interruptor = Interruptor()
    envs = [LatencyEnv(i, 0.002, 0.002) for i in range(3)] + [LatencyEnv(3, 0.05, 0.05)]
    with Collector(factories(envs), None, frames_per_batch=4 * 20, total_frames=-1, interruptor=interruptor) as c:
        threading.Timer(0.08, interruptor.stop_collection).start()
        batch = c.rollout()
    check_batch(batch)
    mask = batch["collector", "mask"]
    assert mask[3].sum() < mask[0].sum() <= 20  # the slow env was cut shorter
    assert (batch["collector", "traj_ids"][~mask] == -1).all()


def test_batching_knobs():
    envs = [LatencyEnv(i, 0.002, 0.002) for i in range(16)]
    policy = RecordingPolicy()
    with Collector(factories(envs), policy, frames_per_batch=16 * 10, total_frames=160, max_batch_size=5) as c:
        (batch,) = list(c)
    check_batch(batch)
    assert max(policy.sizes) <= 5 and sum(policy.sizes) == 160

    envs = [LatencyEnv(i, 0.0005, 0.006) for i in range(16)]
    policy = RecordingPolicy()
    with Collector(factories(envs), policy, frames_per_batch=16 * 10, total_frames=160, min_batch_size=8,
                   batch_timeout=1.0) as c:
        (batch,) = list(c)
    check_batch(batch)
    # a call waits for 8 ready envs unless nobody else is stepping: so calls take 8 or more
    # until fewer than 8 envs are left short of their 10 steps, and fewer from then on
    sizes = policy.sizes
    first_small = next((i for i, n in enumerate(sizes) if n < 8), len(sizes))
    assert all(n >= 8 for n in sizes[:first_small]) and all(n < 8 for n in sizes[first_small:]), sizes
    assert first_small >= 5, sizes  # (at least 90 of the 160 frames come before that point)


def test_step_timeout_names_the_env_and_cancels_every_pending_step():
    envs = [LatencyEnv(i, 0.01, 0.01) for i in range(5)]
    envs[3].hang_at = 4
    c = Collector(factories(envs), None, frames_per_batch=50, total_frames=-1, step_timeout=0.3)
    start = time.perf_counter()
    late = r"env 3 of worker 0 \(LatencyEnv\) did not answer step\(\).*step_timeout"
    with pytest.raises(StepTimeoutError, match=late):
        c.rollout()
    assert time.perf_counter() - start < 3
    time.sleep(0.05)
    assert sum(e.cancelled for e in envs) >= 1  # steps in flight were cancelled, not left running
    c.shutdown()
    assert all(e.closed for e in envs)


async def test_env_exception_names_the_env_and_cancelling_cancels_steps():
    envs = [LatencyEnv(i, 0.01, 0.01) for i in range(4)]
    envs[2].fail_at = 3
    async with Collector(factories(envs), None, frames_per_batch=40, total_frames=-1) as c:
        with pytest.raises(EnvError, match="env 2 broke") as info:
            await c.arollout()
        assert info.value.env == 2 and "env 2 of worker 0" in str(info.value)
        assert isinstance(info.value.__cause__, RuntimeError)

    # from their 3rd step on, the envs hang: once all four got there, each has a step pending
    envs = [LatencyEnv(i, 0.01, 0.01, hang_at=3) for i in range(4)]
    async with Collector(factories(envs), None, frames_per_batch=400, total_frames=-1) as c:
        task = asyncio.ensure_future(c.arollout())
        deadline = time.monotonic() + 10
        while not all(e.steps >= 3 for e in envs) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.05)
        assert sum(e.cancelled for e in envs) == 4  # every pending step
        for e in envs:
            e.hang_at = None
        batch = await c.arollout()  # the same batch goes on, the envs restart from a reset
        check_batch(batch)
        assert batch.shape == (4, 100) and (batch["collector", "traj_ids"] >= 0).all()  # nothing lost
        # two steps landed before the cut: the second ends its trajectory, truncated
        assert batch["next", "truncated"][:, 1, 0].all()
        ids = batch["collector", "traj_ids"]
        assert (ids[:, 2] != ids[:, 1]).all() and (ids[:, 1] == ids[:, 0]).all()


def test_a_game_over_a_real_tcp_socket():
    with GameServer() as server:
        envs = [SocketGameEnv(server.port) for _ in range(8)]
        policy = lambda obs: torch.full((obs.shape[0],), 2)  # always move right
        with Collector(factories(envs), policy, frames_per_batch=8 * 12, total_frames=8 * 24) as c:
            c.set_seed(0)
            batches = list(c)
        assert server.clients == 8
    assert all(e.closed for e in envs)
    for prev, cur in itertools.pairwise(batches):
        check_continuity(prev, cur)
    for b in batches:
        check_batch(b)
        x, nx = b["observation"][..., 0], b["next", "observation"][..., 0]
        assert torch.equal(nx, x + 1)  # the server moved each walker right by one
        assert torch.equal(b["next", "terminated"][..., 0], nx >= 5)
    starts = {int(np.random.default_rng(s).integers(-3, 4)) for s in range(8)}
    assert set(batches[0]["observation"][:, 0, 0].int().tolist()) == starts  # seeded resets


def test_mixed_with_gymnasium_envs_and_thread_envs():
    class ThreadedSleep(gym.Env):
        """A blocking step that releases the GIL (time.sleep): worth a thread."""

        observation_space = spaces.Box(-1e9, 1e9, (3,), np.float32)
        action_space = spaces.Discrete(3)
        active = 0
        peak = 0
        threads: set = set()
        lock = threading.Lock()

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return np.zeros(3, np.float32), {}

        def step(self, action):
            cls = type(self)
            with cls.lock:
                cls.active += 1
                cls.peak = max(cls.peak, cls.active)
                cls.threads.add(threading.get_ident())
            time.sleep(0.01)
            with cls.lock:
                cls.active -= 1
            return np.zeros(3, np.float32), 0.0, False, False, {}

    class Inline(gym.Env):
        observation_space = spaces.Box(-1e9, 1e9, (3,), np.float32)
        action_space = spaces.Discrete(3)

        def reset(self, *, seed=None, options=None):
            return np.ones(3, np.float32), {}

        def step(self, action):
            return np.ones(3, np.float32), 1.0, False, False, {}

    make = [lambda: LatencyEnv(0)] + [lambda: ThreadEnv(ThreadedSleep())] * 4 + [Inline]
    with Collector(make, None, frames_per_batch=6 * 5, total_frames=60) as c:
        batches = list(c)
        loop_thread = c._resources.loop.ident
    for b in batches:
        check_batch(b)
        assert b.shape == (6, 5)
    assert ThreadedSleep.peak >= 2  # thread envs stepped concurrently...
    assert loop_thread not in ThreadedSleep.threads  # ...in worker threads, not on the loop


def test_bad_input():
    class NoSpaces(AsyncEnv):
        async def reset(self, *, seed=None, options=None):
            return 0, {}

        async def step(self, action):
            return 0, 0.0, False, False, {}

    with pytest.raises(TypeError, match="observation_space"):
        Collector([NoSpaces], None, frames_per_batch=10)

    class SyncClose(LatencyEnv):
        def close(self):
            pass

    with pytest.raises(TypeError, match="async def close"):
        Collector([SyncClose], None, frames_per_batch=10)
    with pytest.raises(ValueError, match="min_batch_size=9 is larger"):
        Collector([LatencyEnv] * 2, None, frames_per_batch=10, max_batch_size=4, min_batch_size=9)
    with pytest.raises(ValueError, match="step_timeout"):
        Collector([LatencyEnv] * 2, None, frames_per_batch=10, step_timeout=0)


def test_split_trajectories_of_a_coroutine_batch_matches_the_lengths():
    envs = [LatencyEnv(i, length=3 + i) for i in range(3)]
    with Collector(factories(envs), None, frames_per_batch=30, total_frames=30) as c:
        (batch,) = list(c)
    trajs = split_trajectories(batch)
    lengths = sorted(trajs["collector", "mask"].sum(-1).tolist())
    assert sum(lengths) == 30 and max(lengths) <= 5


# ----------------------------------------------------------------------------- worker collectors


def stepped():
    return [e for e in LatencyEnv.made if e.steps]


def test_multisync_mixes_coroutine_entries_with_process_workers():
    LatencyEnv.made.clear()
    make = [[LatencyEnv] * 2, [lambda: LatencyEnv(7)] * 2, [PlainCounterEnv] * 2]
    with MultiSyncCollector(make, None, frames_per_batch=60, total_frames=180, max_frames_per_traj=6) as c:
        batches = list(c)
        workers = c.statistics().workers
    assert [w.pid is None for w in workers] == [True, True, False]  # coroutine entries: no process
    for b in batches:
        assert b.shape == (3, 2, 10)
        for part in b.unbind(0):
            check_batch(part, step_count=6)
        assert (b["observation"][1, :, :, 0] == 7).all() and (b["observation"][2, :, :, 0] == 99).all()
    for prev, cur in itertools.pairwise(batches):
        for p, q in zip(prev.unbind(0), cur.unbind(0)):
            check_continuity(p, q)
    assert len(stepped()) == 4 and all(e.closed for e in stepped())


def test_multiasync_a_slow_coroutine_entry_does_not_hold_back_a_fast_one():
    LatencyEnv.made.clear()
    make = [lambda: LatencyEnv(0, 0.001, 0.001, length=1000), lambda: LatencyEnv(1, 0.05, 0.05, length=1000)]
    with MultiAsyncCollector(make, None, frames_per_batch=10, total_frames=60) as c:
        batches = list(c)
    ids = [int(b["observation"][0, 0]) for b in batches]
    for b in batches:
        check_batch(b)
    assert ids.count(0) >= 5, ids  # the fast env's batches kept coming


CTRL_C_SCRIPT = textwrap.dedent(
    """
    import sys, threading
    sys.path.insert(0, {tests!r})
    from support.coroutine_envs import LatencyEnv
    from aiocollect import Collector

    envs = [LatencyEnv(i, 0.01, 0.02) for i in range(16)]
    try:
        with Collector([lambda e=e: e for e in envs], None, frames_per_batch=16 * 100000) as c:
            print("collecting", flush=True)
            for batch in c:
                pass
    except KeyboardInterrupt:
        threads = [t.name for t in threading.enumerate() if t.name.startswith("aiocollect")]
        print("interrupted", threads, sum(e.cancelled for e in envs), all(e.closed for e in envs), flush=True)
        raise
    """
)


@pytest.mark.usefixtures("zygote")  # (interrupt_script forks the script from it)
def test_ctrl_c_cancels_pending_steps_closes_envs_and_stops_the_loop():
    out, err, returncode = interrupt_script(CTRL_C_SCRIPT.format(tests=TESTS))
    words = out.split()
    assert words[0] == "interrupted" and words[1] == "[]", out  # no loop thread left
    assert int(words[2]) >= 1 and words[3] == "True", out  # pending steps cancelled, every env closed
    assert "KeyboardInterrupt" in err and returncode != 0




class VersionedPolicy(torch.nn.Module):
    """``act_on_obs`` as a module: weights to update, each update a new policy version."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, observation):
        return act_on_obs(observation)


@pytest.mark.parametrize("step_ahead", [False, True])
@pytest.mark.parametrize("face", ["for", "async for"])
def test_step_ahead_a_finished_env_steps_on_into_the_next_batch(face, step_ahead):
    fast, slow = LatencyEnv(0, 0.001, 0.001, length=1000), LatencyEnv(1, 0.01, 0.01, length=1000)
    c = Collector(factories([fast, slow]), VersionedPolicy(), frames_per_batch=2 * 10, total_frames=2 * 10 * 3,
                  step_ahead=step_ahead)

    async def collect():
        out = []
        async with c:
            async for batch in c:
                out.append(batch)
                c.update_policy_weights_()
        return out

    if face == "for":
        batches = []
        with c:
            for batch in c:
                batches.append(batch)
                c.update_policy_weights_()
    else:
        batches = asyncio.run(collect())
    assert [tuple(b.shape) for b in batches] == [(2, 10)] * 3
    for b in batches:
        check_batch(b)
        assert torch.equal(b["action"], (b["observation"][:, :, 1] % 3).long())
    for prev, cur in itertools.pairwise(batches):
        check_continuity(prev, cur)
    # never past total_frames: each env took its 30 steps, no more
    assert len(fast.step_times) == len(slow.step_times) == 30
    version = [b["collector", "policy_version"] for b in batches]
    assert all(bool((v[1] == v[1, 0]).all()) for v in version)  # the slow env: each batch one version
    if step_ahead:
        # the fast env took the first steps of the next batch before the slow one ended this one,
        # with the policy of this one (the version before the update)
        assert fast.step_times[10] < slow.step_times[9] and fast.step_times[20] < slow.step_times[19]
        assert version[1][0, 0] == version[0][1, 0] < version[1][1, 0]
    else:  # it waited for the slow one
        assert fast.step_times[10] > slow.step_times[9] and fast.step_times[20] > slow.step_times[19]
        assert all(bool((v == v[1, 0]).all()) for v in version)


def test_step_ahead_is_checked_up_front():
    envs = lambda: factories([LatencyEnv(i) for i in range(2)])
    with pytest.raises(TypeError, match="step_ahead must be True or False"):
        Collector(envs(), None, frames_per_batch=20, step_ahead="yes")
    with pytest.raises(ValueError, match="step_ahead=True: it applies to coroutine envs"):
        Collector([PlainCounterEnv] * 2, None, frames_per_batch=20, step_ahead=True)
    with pytest.raises(ValueError, match="step_ahead=True with interruptor"):
        Collector(envs(), None, frames_per_batch=20, step_ahead=True, interruptor=Interruptor())
    with pytest.raises(ValueError, match="step_ahead=True with reset_at_each_iter"):
        Collector(envs(), None, frames_per_batch=20, step_ahead=True, reset_at_each_iter=True)


async def test_step_ahead_a_cancelled_collection_resumes_with_every_invariant():
    envs = [LatencyEnv(i, 0.001, 0.002 * (i + 1), length=15) for i in range(4)]
    async with Collector(factories(envs), None, frames_per_batch=4 * 10, total_frames=-1, step_ahead=True) as c:
        batches = c.__aiter__()
        first = await batches.__anext__()
        with pytest.raises(asyncio.TimeoutError):  # cancelled mid-batch: the envs stepping restart from a reset
            await asyncio.wait_for(batches.__anext__(), 0.005)
        rest = [await batches.__anext__() for _ in range(4)]
    for b in [first, *rest]:
        assert tuple(b.shape) == (4, 10)
        check_batch(b)
    for prev, cur in itertools.pairwise(rest):
        check_continuity(prev, cur)


@pytest.mark.parametrize("face", ["for", "async for"])
def test_step_ahead_load_state_dict_drops_the_steps_taken_ahead(face):
    """After ``load_state_dict`` every env restarts from a reset with a new id, as without
    ``step_ahead``: the fast env's sealed batch taken ahead and the slow one's batch begun
    ahead are dropped, not delivered."""
    def run(step_ahead):
        fast, slow = LatencyEnv(0, 0.0005, 0.0005, length=1000), LatencyEnv(1, 0.01, 0.01, length=1000)
        c = Collector(factories([fast, slow]), act_on_obs, frames_per_batch=2 * 10, total_frames=-1,
                      step_ahead=step_ahead)

        async def collect():
            async with c:
                batches = c.__aiter__()
                await batches.__anext__()
                saved = c.state_dict()
                await batches.__anext__()
                c.load_state_dict(saved)
                return saved, await batches.__anext__(), c.state_dict()

        if face == "for":
            with c:
                it = iter(c)
                next(it)
                saved = c.state_dict()
                next(it)
                c.load_state_dict(saved)
                out = saved, next(it), c.state_dict()
        else:
            out = asyncio.run(collect())
        return out

    for step_ahead in (False, True):
        saved, batch, after = run(step_ahead)
        check_batch(batch)
        assert batch["observation"][:, :, 1].long().tolist() == [list(range(10))] * 2  # from a reset
        assert bool((batch["collector", "traj_ids"] >= saved["traj_pool"]["next_traj_id"]).all())
        assert after["frames"] == saved["frames"] + 20


@pytest.mark.parametrize("step_ahead", [False, True])
def test_set_seed_between_batches_starts_every_env_of_the_next_batch_from_its_seeded_reset(step_ahead):
    """As ``reset()``: with ``step_ahead``, the steps the fast env took ahead before
    ``set_seed`` are dropped (they were delivered first, from the old episode and seed)."""
    fast, slow = LatencyEnv(0, 0.0005, 0.0005, length=1000), LatencyEnv(1, 0.01, 0.01, length=1000)
    with Collector(factories([fast, slow]), act_on_obs, frames_per_batch=2 * 10, total_frames=-1,
                   step_ahead=step_ahead) as c:
        it = iter(c)
        first = next(it)
        time.sleep(0.05)  # (the fast env steps ahead meanwhile, with step_ahead)
        c.set_seed(123)
        batch = next(it)
    check_batch(batch)
    assert batch["observation"][:, :, 1].long().tolist() == [list(range(10))] * 2  # from the seeded reset
    assert bool((batch["collector", "traj_ids"] > first["collector", "traj_ids"].max()).all())
    assert [env.seeds[-1] for env in (fast, slow)] == [123, 124]


def test_step_ahead_reset_drops_the_trajectories_completed_ahead():
    """``reset()`` with ``trajs_per_batch``: no trajectory of the steps taken before it (ahead
    included) is delivered after it."""
    fast, slow = LatencyEnv(0, 0.0003, 0.0003, length=3), LatencyEnv(1, 0.01, 0.01, length=1000)
    with Collector(factories([fast, slow]), None, frames_per_batch=20, total_frames=-1, step_ahead=True,
                   trajs_per_batch=2) as c:
        it = iter(c)
        next(it)
        time.sleep(0.2)  # (the fast env completes trajectories ahead meanwhile)
        mark = c.state_dict()["traj_pool"]["next_traj_id"]
        c.reset()
        for _ in range(3):
            ids = next(it)["collector", "traj_ids"]
            assert bool((ids[ids >= 0] >= mark).all())

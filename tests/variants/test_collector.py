"""The sync and async faces, context managers, background collection and statistics."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time

import pytest
import torch

from aiocollect import Collector, CollectorStatistics
from support.checks import check_batch
from support.envs import CounterEnv, EnvRecorder

pytestmark = pytest.mark.usefixtures("no_thread_leak")


def make(**kw):
    kw.setdefault("frames_per_batch", 20)
    kw.setdefault("total_frames", 100)
    return Collector([lambda: CounterEnv()] * 2, None, **kw)


def test_sync_for_stops_at_total_frames_and_len():
    c = make()
    assert len(c) == 5
    batches = list(c)
    assert len(batches) == 5 and all(b.shape == (2, 10) for b in batches)
    assert list(c) == []  # exhausted: a new loop yields nothing
    c.shutdown()


def test_sync_with_shuts_down_also_on_error():
    factory = EnvRecorder()

    with pytest.raises(ZeroDivisionError):
        with Collector(factory, None, frames_per_batch=10, total_frames=-1) as c:
            for _ in c:
                1 / 0
    assert factory.envs[0].closed
    with pytest.raises(RuntimeError, match="shut down"):
        next(iter(c))


async def test_async_with_and_async_for():
    factory = EnvRecorder()

    async with Collector(factory, None, frames_per_batch=10, total_frames=50) as c:
        shapes = [b.shape async for b in c]
    assert shapes == [torch.Size([10])] * 5
    assert factory.envs[0].closed


def test_sync_for_inside_a_running_loop_like_jupyter():
    """A Jupyter cell runs in a thread whose event loop is running."""

    async def cell():
        with make(total_frames=60) as c:
            return [b.shape for b in c]

    assert asyncio.run(cell()) == [torch.Size([2, 10])] * 3


def test_sync_for_in_a_thread():
    result = []
    t = threading.Thread(target=lambda: result.extend(b.numel() for b in make()))
    t.start()
    t.join(30)
    assert result == [20] * 5


def test_break_out_of_loop_leaves_no_thread_and_continues():
    c = make(total_frames=-1)
    for b in c:
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


def test_concurrent_iteration_is_refused():
    gate = threading.Event()

    class Slow(CounterEnv):
        def step(self, action):
            gate.wait(5)
            return super().step(action)

    c = Collector(Slow, None, frames_per_batch=5, total_frames=-1)
    errors = []
    t = threading.Thread(target=lambda: next(iter(c)))
    t.start()
    time.sleep(0.2)

    async def second():
        try:
            await c.arollout()
        except RuntimeError as exc:
            errors.append(str(exc))

    asyncio.run(second())
    gate.set()
    t.join(10)
    c.shutdown()
    assert errors and "already collecting" in errors[0]


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


def test_shutdown_is_idempotent_and_bounded():
    c = make()
    next(iter(c))
    t0 = time.perf_counter()
    c.shutdown()
    c.shutdown()
    assert time.perf_counter() - t0 < 2


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


def test_replay_buffer_iteration_yields_none_and_fills_buffer():
    rb = ListBuffer()
    c = make(replay_buffer=rb)
    out = list(c)
    c.shutdown()
    assert out == [None] * 5 and len(rb) == 100
    for td in rb.items:
        check_batch(td)


def test_start_collects_in_background_then_async_shutdown():
    rb = ListBuffer()
    c = make(replay_buffer=rb, total_frames=-1)
    c.start()
    assert c.is_running()
    deadline = time.monotonic() + 10
    while len(rb) < 200 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(rb) >= 200
    with pytest.raises(RuntimeError, match="already collecting|background"):
        next(iter(c))
    with c.pause():
        n = len(rb)
        time.sleep(0.1)
        assert len(rb) == n  # nothing is written while paused
    started = time.monotonic()
    c.async_shutdown(timeout=5)
    # the cancellation reaches a hot in-process collection between two batches, not at the timeout
    assert time.monotonic() - started < 2.0
    assert not c.is_running()
    for td in rb.items[:5]:
        check_batch(td)


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
    with pytest.raises(ValueError, match="exploded on purpose"):
        c.async_shutdown()


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


async def test_async_face_statistics_and_len():
    async with make(max_frames_per_traj=3) as c:
        assert len(c) == 5
        n = sum([b.numel() async for b in c])
        stats = c.statistics()
    assert n == stats.frames == 100 and stats.batches == 5

"""Random actions in runs of steps (``policy=None``): a worker process is given several
columns at once, with every step's actions drawn in advance, and the engine books the
whole run when it completes (``rounds.RunRounds._post_runs``, ``runner.DrawnRuns``, ``Timelines.ran``).

The contract suite runs every collector with ``policy=None`` already; these tests pin
what is particular to runs: that they happen, that a run leaves the batches exactly as
steps one by one would, that the actions come from the seed alone (not from which
worker was ready first, nor from how steps were grouped into runs), and that a long run
of steps that are each quick is no hang for the watchdog.
"""

from __future__ import annotations

import asyncio
import functools
import time

import numpy as np
import pytest
import torch

from aiocollect import Collector, Interruptor, MultiAsyncCollector, MultiSyncCollector, RandomPolicy
from aiocollect._engine.timelines import Timelines
from aiocollect._workers import protocol
from support.checks import check_batch, check_continuity, rows
from support.envs import CounterEnv, FastThenSlow, SleepyEnv

pytestmark = pytest.mark.timeout(120)

WORKERS = [[CounterEnv] * 3] * 2


def commands_posted(collector) -> int:
    return sum(lane.worker.posted for lane in collector._scheduler.lanes)


@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
def test_random_actions_go_in_runs_that_keep_every_invariant(cls):
    fpb = 60 * (6 if cls is MultiSyncCollector else 3)
    with cls(WORKERS, None, frames_per_batch=fpb, total_frames=8 * fpb, max_frames_per_traj=5) as collector:
        batches = list(collector)
        commands = commands_posted(collector)
    assert len(batches) == 8
    for i, batch in enumerate(batches):
        check_batch(batch, step_count=5)
        b = rows(batch)
        # the env took the action the batch stores (CounterEnv echoes it)
        assert torch.equal(b["next", "observation"][..., 2].long(), b["action"])
        assert set(b["action"].unique().tolist()) == {0, 1, 2}
        if cls is MultiSyncCollector and i:  # (MultiAsync: a batch is whichever worker's came first)
            check_continuity(batches[i - 1], batch)
    # far fewer commands than steps (8 batches of 60 steps per env, 2 workers): each took
    # many steps per command
    assert commands < 8 * 60 * 2 / 4, commands


@pytest.mark.parametrize("face", ["for", "async for"])
def test_a_collectors_random_actions_go_in_runs_that_keep_every_invariant(face):
    # in-process envs too (``rounds.InlineRounds``): runs of steps taken right here, booked whole
    fpb = 3 * 60
    collector = Collector([CounterEnv] * 3, None, frames_per_batch=fpb, total_frames=8 * fpb, max_frames_per_traj=5)
    worker = collector._scheduler.lanes[0].worker
    posted, post = [], worker.post
    worker.post = lambda code, *args, **kwargs: (posted.append(code), post(code, *args, **kwargs))[1]

    async def collect():
        async with collector:
            return [batch async for batch in collector]

    if face == "for":
        with collector:
            batches = list(collector)
    else:
        batches = asyncio.run(collect())
    assert len(batches) == 8
    for i, batch in enumerate(batches):
        check_batch(batch, step_count=5)
        assert torch.equal(batch["next", "observation"][..., 2].long(), batch["action"])  # the action taken
        assert set(batch["action"].unique().tolist()) == {0, 1, 2}
        if i:
            check_continuity(batches[i - 1], batch)
    assert posted.count(protocol.RUN_CODE) and not posted.count(protocol.STEP_CODE)
    assert len(posted) < 8 * 60 / 4, len(posted)  # many steps per command


def test_a_collector_takes_no_runs_where_a_batch_may_be_cut_after_any_step():
    for kwargs in ({"interruptor": Interruptor()}, {"reset_when_done": False}):
        with Collector([CounterEnv] * 2, None, frames_per_batch=20, total_frames=40, **kwargs) as collector:
            assert not collector._scheduler.runs
            assert [b.numel() for b in collector] == [20, 20]


def test_a_run_books_what_steps_one_by_one_would():
    rng = np.random.default_rng(0)
    for trial in range(200):
        n, k, lo = int(rng.integers(1, 6)), int(rng.integers(1, 9)), int(rng.integers(0, 3))
        one_by_one = Timelines(lo + n + 2, reset_when_done=True, count_steps=bool(trial % 3))
        one_by_one.resets_done(0, np.arange(lo + n + 2))
        one_by_one.step_count[:] = rng.integers(0, 5, lo + n + 2)
        at_once = Timelines(lo + n + 2, reset_when_done=True, count_steps=one_by_one.count_steps)
        at_once.resets_done(0, np.arange(lo + n + 2))
        at_once.step_count[:] = one_by_one.step_count
        terminated, truncated = rng.random((k, n)) < 0.2, rng.random((k, n)) < 0.1
        ids, counts = [], []
        for j in range(k):
            ids.append(one_by_one.traj_ids[lo : lo + n].copy())
            counts.append(one_by_one.step_count[lo : lo + n].copy())
            one_by_one.stepped(lo, lo + n, terminated[j], truncated[j])
        ids.append(one_by_one.traj_ids[lo : lo + n].copy())
        counts.append(one_by_one.step_count[lo : lo + n].copy())
        got_ids, got_counts = at_once.ran(lo, lo + n, terminated, truncated)
        np.testing.assert_array_equal(got_ids, np.array(ids))
        if one_by_one.count_steps:
            np.testing.assert_array_equal(got_counts, np.array(counts))
        np.testing.assert_array_equal(at_once.traj_ids, one_by_one.traj_ids)
        np.testing.assert_array_equal(at_once.step_count, one_by_one.step_count)
        assert at_once.ids.next == one_by_one.ids.next
        assert at_once.completed_trajectories == one_by_one.completed_trajectories
        assert at_once.env_steps == one_by_one.env_steps


def test_a_streams_actions_do_not_depend_on_how_steps_are_grouped():
    import gymnasium as gym

    policy = RandomPolicy(gym.spaces.Discrete(5), seed=4)
    grouped = np.concatenate([policy.sample_steps(7, k, 3) for k in (1, 600, 2, 3000, 97)])
    policy.seed(4)
    singly = np.concatenate([policy.sample_steps(7, 1, 3) for _ in range(len(grouped))])
    np.testing.assert_array_equal(grouped, singly)
    other = policy.sample_steps(8, 100, 3)
    assert not np.array_equal(other, singly[:100]), "two streams drew the same actions"
    policy.seed(5)
    assert not np.array_equal(policy.sample_steps(7, 100, 3), singly[:100]), "the seed did not matter"


@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
def test_the_same_seed_gives_the_same_random_rollouts_whatever_the_timing(cls):
    def run(seed):
        workers = WORKERS if cls is MultiSyncCollector else WORKERS[:1]  # MultiAsync: one worker, one order
        with cls(workers, None, frames_per_batch=90 if cls is MultiSyncCollector else 45, total_frames=-1) as c:
            c.set_seed(seed)
            it = iter(c)
            out = [next(it) for _ in range(4)]
        return torch.stack([b["action"] for b in out]), torch.stack([b["observation"] for b in out])

    actions, observations = run(3)
    again = run(3)
    assert torch.equal(actions, again[0]) and torch.equal(observations, again[1])
    assert not torch.equal(actions, run(4)[0])


def test_a_run_longer_than_step_timeout_whose_steps_are_quick_is_no_hang():
    # runs grow to a whole batch (40 steps) while steps are quick; steps slow down midway
    # through the sixth, which then lasts 20 x 50 ms, over twice step_timeout: each step
    # done is a sign of life
    with MultiAsyncCollector([[functools.partial(FastThenSlow, max_len=50)]], None, frames_per_batch=40,
                             total_frames=-1, step_timeout=0.4) as collector:
        it = iter(collector)
        longest = 0
        while collector._scheduler.lanes[0].worker.env_steps < 220:
            longest = max(longest, collector._scheduler.lanes[0].run_steps)
            next(it)
        assert longest >= 40, f"runs did not grow to a whole batch ({longest} steps)"
        start = time.monotonic()
        slow = next(it)
        assert time.monotonic() - start > 1.5  # the slow steps were taken
    assert slow.numel() == 40


def test_a_cut_batch_stops_a_stragglers_run_after_the_step_under_way():
    # the straggler's runs grow to several 2 ms steps; each batch is cut once the two other
    # workers are done (40 steps of 0.5 ms), and its run stops after the step it is taking:
    # what it took is booked (and only that), so its row goes on from batch to batch, no gap
    fast = lambda: SleepyEnv(delay=0.0005, tag=0.0, length=1000)
    slow = lambda: SleepyEnv(delay=0.002, tag=1.0, length=1000)
    with MultiSyncCollector([fast, fast, slow], None, frames_per_batch=3 * 40, total_frames=-1,
                            preemptive_threshold=0.6) as collector:
        it = iter(collector)
        batches, longest = [], 0
        for _ in range(12):
            batches.append(next(it))
            longest = max(longest, collector._scheduler.lanes[2].run_steps)
        stats = collector.statistics()
    assert longest >= 3, f"the straggler's runs never grew ({longest} steps)"
    kept = [int(b["collector", "mask"][2].sum()) for b in batches]
    assert any(0 < k < 40 for k in kept), kept
    assert stats.workers[2].env_steps == sum(kept)  # booked = taken
    steps = torch.cat([b["observation"][2, :k, 1] for b, k in zip(batches, kept)])
    first = int(steps[0])
    assert steps.tolist() == list(range(first, first + len(steps))), "the straggler's row has a gap or a repeat"
    for b in batches:
        check_batch(b)


def test_a_collectors_run_stops_soon_after_its_env_slows_down():
    """An in-process run sized at the quick steps' pace stops after the step that takes it past
    ``RUN_LIMIT_S``, and the next is sized at its own pace: no command holds the event loop
    for long (before, a run of quick steps' length went on at 50 ms a step, for seconds)."""
    with Collector([FastThenSlow], None, frames_per_batch=240, total_frames=240) as collector:
        worker = collector._scheduler.lanes[0].worker
        took: list[tuple[float, int]] = []
        post = worker.post

        def timed_post(code, slot, col, count=1, local=False):
            t0 = time.perf_counter()
            post(code, slot, col, count, local)
            took.append((time.perf_counter() - t0, count))

        worker.post = timed_post
        for batch in collector:
            assert batch.numel() == 240
    assert sum(k for _, k in took) >= 240 - 1 and any(k > 1 for _, k in took)  # it took runs
    assert max(d for d, _ in took) < 0.3  # (at most ~2 slow steps; the old sizing gave seconds)


def test_set_seed_after_a_cut_collection_reseeds_the_rest_of_the_batchs_actions():
    """A collection cancelled midway leaves the rest of the batch's random actions drawn;
    ``set_seed`` then forgets them: the batch goes on with the new seed's actions, those a
    fresh batch after the same ``set_seed`` begins with."""
    steps = 20000

    async def collect(cut: bool):
        async with Collector([CounterEnv] * 3, None, frames_per_batch=3 * steps, total_frames=-1) as c:
            batches = c.__aiter__()
            t0 = 0
            if cut:
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(batches.__anext__(), 0.01)
                t0 = c._scheduler.lanes[0].t
            c.set_seed(5)
            return t0, await batches.__anext__()

    _, fresh = asyncio.run(collect(False))
    t0, cut = asyncio.run(collect(True))
    assert t0 < steps
    assert torch.equal(cut["action"][:, t0:], fresh["action"][:, : steps - t0])

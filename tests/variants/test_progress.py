"""progress=True: a tqdm bar with frames/s and the mean return of whole episodes."""

from __future__ import annotations

from aiocollect import Collector, MultiAsyncCollector
from aiocollect._collectors.progress import EpisodeReturns
from support.envs import SleepyEnv


def test_episode_returns_are_summed_across_batches_and_workers():
    returns = EpisodeReturns()
    # SleepyEnv: reward 1 per step, truncated after `length` steps; batches of 20 steps split episodes
    # MultiAsync owes no worker a share: under load one may deliver many batches before the other's
    # first, so it runs until both have finished episodes (bounded), not for a fixed frame count
    with MultiAsyncCollector([lambda: SleepyEnv(length=30), lambda: SleepyEnv(length=45)], None,
                             frames_per_batch=20, total_frames=-1) as c:
        assert c.statistics().mean_episode_return is None
        for i, batch in enumerate(c):
            returns.add(batch)
            assert set(returns.recent) <= {30.0, 45.0}  # whole episodes, never a piece of one
            if (i >= 24 and set(returns.recent) == {30.0, 45.0}) or i == 2000:
                break
        stats = c.statistics()
    assert returns.episodes >= 8
    assert set(returns.recent) == {30.0, 45.0}
    # the collector keeps the same account, without a progress bar
    assert stats.mean_episode_return == returns.mean


async def test_statistics_report_the_mean_episode_return_on_the_async_face_and_with_a_replay_buffer():
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    rb = ReplayBuffer(storage=LazyTensorStorage(1000))
    async with Collector([lambda: SleepyEnv(length=7)] * 2, None, frames_per_batch=20, total_frames=100,
                         replay_buffer=rb, postproc=lambda td: td.reshape(-1)) as c:
        async for nothing in c:
            assert nothing is None
        assert c.statistics().mean_episode_return == 7.0 and len(rb) == 100


def test_progress_bar_shows_frames_and_returns(capfd):
    with Collector([lambda: SleepyEnv(length=10)] * 2, None, frames_per_batch=40, total_frames=200,
                   progress=True) as c:
        for _ in c:
            pass
    err = capfd.readouterr().err
    assert "Collector" in err and "200/200" in err and "episode_return=10.0" in err


def test_unfinished_trajectories_are_not_kept_forever():
    """reset_at_each_iter abandons every env's trajectory at each batch: they never finish."""
    returns = EpisodeReturns(max_open=10)
    with Collector([lambda: SleepyEnv(length=1000)] * 4, None, frames_per_batch=8, total_frames=8 * 30,
                   reset_at_each_iter=True) as c:
        for batch in c:
            returns.add(batch)
            assert len(returns._partial) <= 10
        assert c.statistics().mean_episode_return is None  # none finished
    assert returns.episodes == 0
    newest = set(batch["collector", "traj_ids"].flatten().tolist())
    assert newest <= set(returns._partial)  # the open ones are the ones kept

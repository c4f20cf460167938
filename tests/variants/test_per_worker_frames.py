"""TorchRL's ``frames_per_batch`` as a list, one share per worker (its sota scripts pass
``[frames // workers] * workers``): the same batches as TorchRL's collectors give, compared on
the same envs; shares a ``MultiSyncCollector`` cannot give refused before any process starts
(issue 51)."""

from __future__ import annotations

import functools
import warnings

import gymnasium as gym
import pytest

import aiocollect
from support.procs import children

pytestmark = pytest.mark.usefixtures("leak_check")


cartpole = functools.partial(gym.make, "CartPole-v1")
"""(A partial of gymnasium's function, not a function of this module: a worker would import
this module to unpickle it, and torch with it, 2 to 3 s of CPU a worker; tests/README.md.)"""


def _torchrl_shapes(name, shares, total):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        collectors = pytest.importorskip("torchrl.collectors")
        from torchrl.envs import GymEnv
    collector = getattr(collectors, name)([lambda: GymEnv("CartPole-v1")] * len(shares), None,
                                          frames_per_batch=shares, total_frames=total)
    try:
        return [tuple(b.shape) for b in collector]
    finally:
        collector.shutdown()


@pytest.mark.parametrize(("name", "expected"), [("MultiSyncCollector", [(2, 10)] * 2),
                                                ("MultiAsyncCollector", [(20,)] * 2)])
def test_a_share_per_worker_gives_torchrl_s_batches(name, expected):
    # MultiSync: each worker its share, [workers, time]; MultiAsync: TorchRL's
    # frames_per_batch_worker() is the shares' sum, so each worker's batch is that many frames
    with getattr(aiocollect, name)([cartpole, cartpole], None, frames_per_batch=[10, 10],
                                   total_frames=40) as collector:
        shapes = [tuple(b.shape) for b in collector]
        assert collector.frames_per_batch == 20
        worker = collector.frames_per_batch_worker(worker_idx=1) if name == "MultiSyncCollector" \
            else collector.frames_per_batch_worker()
        assert worker == (10 if name == "MultiSyncCollector" else 20)
    assert shapes == expected
    assert _torchrl_shapes(name, [10, 10], 40) == expected


def test_shares_in_proportion_to_the_envs_are_taken():
    with aiocollect.MultiSyncCollector([[cartpole] * 3, [cartpole]], None, frames_per_batch=[12, 4],
                                       total_frames=16, cat_results=0) as collector:
        (batch,) = list(collector)
    assert batch.shape == (4, 4)  # 4 envs, 4 steps each


@pytest.mark.parametrize(("shares", "match"), [([15, 5], "different numbers of steps"),
                                               ([10, 10, 10], "one value per worker"),
                                               ([10, 0], "positive int")])
def test_shares_that_do_not_fit_are_refused_before_any_process_starts(shares, match):
    before = set(children())
    with pytest.raises(ValueError, match=match):
        aiocollect.MultiSyncCollector([cartpole, cartpole], None, frames_per_batch=shares, total_frames=40)
    assert set(children()) <= before

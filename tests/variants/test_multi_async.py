"""MultiAsyncCollector only: each batch is one worker's, a slow worker never holds back a fast
one, max_policy_lag bounds the staleness of every frame, and what it refuses (preemption, an
interruptor, uneven batches)."""

from __future__ import annotations

import functools
import threading
import time
import warnings

import numpy as np
import pytest
import torch
from tensordict.nn import TensorDictModule

from aiocollect import Interruptor, MultiAsyncCollector, MultiSyncCollector
from support.checks import check_batch
from support.envs import CounterEnv, IntObsEnv, SleepyEnv
from support.procs import children
from support.weights import check_versions, linear


@pytest.mark.usefixtures("spin_mode")
def test_multiasync_each_batch_is_one_workers():
    seen = []
    with MultiAsyncCollector([lambda: CounterEnv(max_len=8)] * 3, None, frames_per_batch=40,
                             total_frames=600) as collector:
        for data in collector:
            assert data.shape == (40,)
            check_batch(data)
            seen.append(data)
    assert len(seen) == 15
    ids = [set(d["collector", "traj_ids"].tolist()) for d in seen]
    # different workers never share trajectory ids; each batch continues one worker's envs
    owners = {}
    for k, batch_ids in enumerate(ids):
        for other in range(k):
            common = batch_ids & ids[other]
            if common:
                owners.setdefault(k, set()).add(other)
    assert sum(d.numel() for d in seen) == 600


@pytest.mark.usefixtures("spin_mode")
def test_slow_worker_never_holds_back_a_fast_one():
    fast = lambda: SleepyEnv(delay=0.002, tag=0.0)
    slow = lambda: SleepyEnv(delay=0.02, tag=1.0)
    with MultiAsyncCollector([fast, slow], None, frames_per_batch=20, total_frames=-1) as collector:
        tags, stamps = [], []
        for data in collector:
            tags.append(int(data["observation"][0, 0]))
            stamps.append(time.perf_counter())
            if len(tags) == 12:
                break
    # the slow worker needs ~0.4 s per batch, the fast one ~0.04 s
    assert tags.count(0) >= 9, tags
    fast_times = [t for t, tag in zip(stamps, tags) if tag == 0]
    gaps = np.diff(fast_times)
    assert np.median(gaps) < 0.2, gaps  # the fast worker's pace, not the slow one's


@pytest.mark.parametrize("lag", [0, 1])
def test_max_policy_lag_bounds_every_delivered_frame(lag):
    collector = MultiAsyncCollector([[IntObsEnv] * 2] * 2, linear(0.0), frames_per_batch=40,
                                    total_frames=40 * 24, max_policy_lag=lag)
    trainer = linear(0.0)
    with collector:
        for i, batch in enumerate(collector):
            newest = collector.statistics().latest_policy_version
            check_versions(batch)
            oldest = int(batch["collector", "policy_version"].min())
            assert newest - oldest <= lag, (i, newest, oldest)
            with torch.no_grad():
                for p in trainer.parameters():
                    p.fill_(newest + 1)
            collector.update_policy_weights_(trainer)  # after every batch, as a trainer would
        stats = collector.statistics()
    assert stats.max_policy_lag <= lag
    assert stats.latest_policy_version == 24
    if lag == 0:
        # with two workers collecting ahead, a bound of 0 must have dropped frames
        assert stats.stale_frames_dropped > 0


def test_without_a_bound_the_lag_is_reported():
    collector = MultiAsyncCollector([[IntObsEnv] * 2] * 2, linear(0.0), frames_per_batch=40, total_frames=40 * 12)
    trainer = linear(1.0)
    with collector:
        for _ in collector:
            collector.update_policy_weights_(trainer)
        stats = collector.statistics()
    assert stats.max_policy_lag >= 1 and stats.stale_frames_dropped == 0


def test_a_max_policy_lag_never_met_warns_instead_of_waiting_silently():
    """Weights published every millisecond while a worker takes ~80 ms to fill a batch: no
    batch can ever hold frames of only the last 2 versions. The collector drops frames and
    says so (once), within a second or so, rather than leaving the caller waiting with no word;
    once the trainer stops, a batch arrives, and the collector shuts down cleanly."""
    module = torch.nn.Linear(2, 1)
    with torch.no_grad():
        module.weight.zero_()
        module.bias.zero_()
    policy = TensorDictModule(module, in_keys=["observation"], out_keys=["action"])
    env = functools.partial(SleepyEnv, 0.002)  # 2 envs a worker, 20 steps each: ~80 ms a batch
    collector = MultiAsyncCollector([[env] * 2] * 2, policy, frames_per_batch=40, total_frames=-1, max_policy_lag=1)
    stop, warned_after = threading.Event(), []

    def lag_warnings():
        return [w for w in caught if issubclass(w.category, RuntimeWarning) and "max_policy_lag=1" in str(w.message)]

    def trainer():
        t0 = time.monotonic()
        while not stop.is_set() and time.monotonic() - t0 < 30:
            collector.update_policy_weights_()
            if lag_warnings():
                warned_after.append(time.monotonic() - t0)
                return
            time.sleep(0.001)

    with collector, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        thread = threading.Thread(target=trainer, daemon=True)
        thread.start()
        try:
            batch = collector.rollout()  # waits while the trainer publishes, as a user's loop would
        finally:
            stop.set()
            thread.join()
        stats = collector.statistics()
    assert warned_after and warned_after[0] < 15, "no warning while max_policy_lag dropped every frame"
    (warning,) = lag_warnings()
    message = str(warning.message)
    for advice in ("Raise max_policy_lag", "update_policy_weights_() less often", "smaller frames_per_batch",
                   "stale_frames_dropped", "no batch was delivered yet"):
        assert advice in message, message
    assert stats.stale_frames_dropped > MultiAsyncCollector.LAG_WARNING_BATCHES * 2 * 40
    assert batch.shape == (2, 20)
    assert not children()


def test_max_policy_lag_is_validated_before_any_process_starts():
    with pytest.raises(ValueError, match="max_policy_lag"):
        MultiAsyncCollector([IntObsEnv] * 2, None, frames_per_batch=10, max_policy_lag=-1)
    with pytest.raises(ValueError, match=r"max_policy_lag.*MultiAsyncCollector"):
        MultiSyncCollector([IntObsEnv] * 2, None, frames_per_batch=10, max_policy_lag=1)


def test_multiasync_rejects_preemption_and_rounds_uneven_batches_up():
    before = children()
    with pytest.raises(ValueError, match="preemptive_threshold"):
        MultiAsyncCollector([lambda: CounterEnv()], None, frames_per_batch=10, preemptive_threshold=0.5)
    with pytest.raises(ValueError, match=r"interruptor: .* no batch to cut short; use MultiSyncCollector"):
        MultiAsyncCollector([lambda: CounterEnv()], None, frames_per_batch=10, interruptor=Interruptor())
    assert children() == before
    with pytest.raises(ValueError, match=r"max_policy_lag with trajs_per_batch: .* use one or the other"):
        MultiAsyncCollector([lambda: CounterEnv()], None, frames_per_batch=10, max_policy_lag=2, trajs_per_batch=2)
    # a batch is one worker's: frames_per_batch is rounded up to split over any worker's envs
    with pytest.warns(UserWarning, match=r"frames_per_batch=10 does not split evenly over a worker's envs "
                                         r"\(\[2, 3\]\): each batch has 12 frames"):
        collector = MultiAsyncCollector([[lambda: CounterEnv()] * 3, [lambda: CounterEnv()] * 2], None,
                                        frames_per_batch=10)
    with collector:
        assert collector.frames_per_batch == 12
        assert {tuple(collector.rollout().shape) for _ in range(4)} <= {(3, 4), (2, 6)}

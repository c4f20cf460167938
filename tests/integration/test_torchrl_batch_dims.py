"""TorchRL envs with several batch dims (``batch_size=(5, 2)``: a batched env of batched envs),
run by aiocollect's collectors with only the import changed: batches of TorchRL's dims
(``[5, 2, time]``, ``[workers, 5, 2, time]``), the same values as TorchRL's collectors give on
the same env and policy, and the policy called with the env's own batch dims, as TorchRL calls it
(issue 51)."""

from __future__ import annotations

import warnings

import pytest
import torch

import aiocollect
from support.torchrl_marks import QUIET_TORCHRL

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    pytest.importorskip("torchrl")
    from torchrl import collectors as torchrl_collectors
    from torchrl.testing.mocking_classes import CountingEnv, CountingEnvCountPolicy, NestedCountingEnv

pytestmark = QUIET_TORCHRL

ONLY_HERE = {("collector", "policy_version")}


def counting():
    return CountingEnv(batch_size=(5, 2), max_steps=3)


def nested():
    return NestedCountingEnv(batch_size=(5, 2), nested_dim=3, max_steps=3)


def _policy(env):
    # (TorchRL's test policy writes the env's whole batch of actions, ignoring the TensorDict's)
    return CountingEnvCountPolicy(env.full_action_spec[env.action_key], env.action_key)


def _same(theirs, ours, ids=True):
    assert theirs.batch_size == ours.batch_size
    layout = {k: (v.shape, v.dtype) for k, v in theirs.items(True, True)}
    assert set(layout) <= set(ours.keys(True, True))
    assert set(ours.keys(True, True)) - set(layout) <= ONLY_HERE
    for key, (shape, dtype) in layout.items():
        assert (ours[key].shape, ours[key].dtype) == (shape, dtype), key
        if ids or key[0] != "collector":
            assert torch.equal(ours[key], theirs[key]), key


@pytest.mark.parametrize("make", [counting, nested], ids=["CountingEnv", "NestedCountingEnv"])
def test_collector_gives_torchrl_s_dims_and_values(make):
    policy = _policy(make())
    theirs = torchrl_collectors.Collector(make(), policy, frames_per_batch=40, total_frames=80)
    try:
        expected = list(theirs)
    finally:
        theirs.shutdown()
    with aiocollect.Collector(make(), policy, frames_per_batch=40, total_frames=80) as collector:
        got = list(collector)
    assert [b.batch_size for b in got] == [torch.Size([5, 2, 4])] * 2
    assert got[0].names == [None, None, "time"]
    for theirs_batch, ours in zip(expected, got):
        _same(theirs_batch, ours)
    if make is nested:
        assert got[0]["data"].batch_size == (5, 2, 4, 3)


@pytest.fixture(scope="module")
def torchrl_multisync():
    """TorchRL's MultiSyncCollector over two ``counting`` workers, 80 frames each: ``[2, 5, 2, 8]``
    (built once: its worker processes take seconds to start)."""
    theirs = torchrl_collectors.MultiSyncCollector([counting, counting], _policy(counting()), frames_per_batch=160,
                                                   total_frames=160, cat_results="stack")
    try:
        return next(iter(theirs))
    finally:
        theirs.shutdown()


@pytest.mark.xdist_group("torchrl-batch-dims")  # (one worker builds the fixture, once)
@pytest.mark.parametrize(("name", "kwargs", "shape"), [
    ("MultiSyncCollector", {"cat_results": "stack"}, (2, 5, 2, 8)),
    ("MultiSyncCollector", {"cat_results": 0}, (10, 2, 8)),
    ("MultiAsyncCollector", {}, (5, 2, 8)),
])
def test_worker_collectors_give_torchrl_s_dims(torchrl_multisync, name, kwargs, shape):
    # TorchRL's batches for each: the stacked one; joined along dim 0, [10, 2, 8] (worker 0's
    # envs first); MultiAsync, one worker's [5, 2, 8] (the env is deterministic)
    expected = {"stack": torchrl_multisync, 0: torchrl_multisync.reshape(10, 2, 8),
                None: torchrl_multisync[0]}[kwargs.get("cat_results")]
    frames = 160 if name == "MultiSyncCollector" else 80
    with getattr(aiocollect, name)([counting, counting], _policy(counting()), frames_per_batch=frames,
                                   total_frames=frames, **kwargs) as collector:
        (got,) = list(collector)
    assert tuple(got.batch_size) == shape == tuple(expected.batch_size)
    # (trajectory ids are numbered as episodes end, in either worker first: compared apart)
    _same(expected, got, ids=False)
    ids = got["collector", "traj_ids"].reshape(-1, shape[-1])  # a row per env: an episode per 4 frames
    assert (ids[:, :4] == ids[:, :1]).all() and (ids[:, 4:] != ids[:, :1]).all()
    assert ids[:, 0].unique().numel() == len(ids)  # no two envs share an id


def test_random_actions_for_each_env():
    with aiocollect.Collector(counting(), None, frames_per_batch=40, total_frames=40) as collector:
        batch = next(iter(collector))
    assert batch.batch_size == (5, 2, 4) and batch["action"].shape == (5, 2, 4, 1)

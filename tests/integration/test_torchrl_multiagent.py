"""TorchRL's multi-agent, nested-key and multi-key envs, run by aiocollect's collectors with only
the import changed, and their batches compared with TorchRL's on the same env and policy: the
same keys, shapes, dtypes and values, each group's own batch dims (``td["data"].batch_size ==
[T, 3]``), several action keys each checked and stored as the policy wrote it, rewards and done
flags per group, partial resets per done group (issue 51)."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch

import aiocollect
from support.torchrl_marks import QUIET_TORCHRL

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    torchrl = pytest.importorskip("torchrl")
    from torchrl.collectors import Collector as TorchRLCollector
    from torchrl.collectors import MultiSyncCollector as TorchRLMultiSync
    from torchrl.envs.utils import RandomPolicy as TorchRLRandomPolicy
    from torchrl.testing.mocking_classes import (
        CountingEnvCountPolicy,
        MultiAgentCountingEnv,
        MultiKeyCountingEnv,
        MultiKeyCountingEnvPolicy,
        NestedCountingEnv,
    )

pytestmark = QUIET_TORCHRL

ONLY_HERE = {("collector", "policy_version")}
"""The key aiocollect adds to every batch (``docs/migrating.md``)."""


def _layout(td):
    return {k: (tuple(v.shape), v.dtype) for k, v in td.items(True, True)}


def _groups(td):
    return {k: tuple(v.batch_size) for k, v in td.items(True) if hasattr(v, "batch_size")}


def assert_same_batches(theirs, ours, extra=frozenset(), ids=True):
    """Same keys (but ``extra``), shapes, dtypes, values and sub-TensorDict batch sizes."""
    assert set(_layout(ours)) - set(_layout(theirs)) == ONLY_HERE | set(extra)
    assert set(_layout(theirs)) <= set(_layout(ours))
    for key, (shape, dtype) in _layout(theirs).items():
        assert _layout(ours)[key] == (shape, dtype), key
        if key != ("collector", "traj_ids") or ids:
            assert torch.equal(theirs[key], ours[key]), key
    assert {k: v for k, v in _groups(ours).items() if k in _groups(theirs)} == _groups(theirs)


def _count_policy(env):
    return CountingEnvCountPolicy(env.full_action_spec[env.action_key], env.action_key)


def _both(make_env, policy, frames=20, total=60, **kwargs):
    theirs = TorchRLCollector(make_env(), policy, frames_per_batch=frames, total_frames=total, **kwargs)
    try:
        expected = torch.cat(list(theirs), -1)
    finally:
        theirs.shutdown()
    with aiocollect.Collector(make_env(), policy, frames_per_batch=frames, total_frames=total, **kwargs) as ours:
        got = torch.cat(list(ours), -1)
    return expected, got


@pytest.mark.parametrize(("nest_obs_action", "nest_done", "nest_reward"),
                         list(itertools.product([True, False], repeat=3)))
def test_nested_env_combinations_match_torchrl(nest_obs_action, nest_done, nest_reward):
    # TorchRL's test_collector_nested_env_combinations, batches compared over three batches
    # (episodes of 5 steps end and reset inside them)
    def make():
        return NestedCountingEnv(nest_obs_action=nest_obs_action, nest_done=nest_done, nest_reward=nest_reward)

    expected, got = _both(make, _count_policy(make()))
    assert_same_batches(expected, got)
    if nest_obs_action:
        assert got["data"].batch_size == got["next", "data"].batch_size == torch.Size([60, 3])


def test_nested_env_with_batch_dim_matches_torchrl():
    def make():
        return NestedCountingEnv(nested_dim=5, batch_size=(4,))

    expected, got = _both(make, _count_policy(make()), frames=20, total=40)
    assert_same_batches(expected, got)
    assert got["data"].batch_size == torch.Size([4, 10, 5])


def test_multi_key_env_matches_torchrl():
    """Three action keys (one-hot at the root, categorical and continuous in two groups),
    three rewards and four done groups."""
    policy = MultiKeyCountingEnvPolicy(MultiKeyCountingEnv().full_action_spec_unbatched, deterministic=True)
    expected, got = _both(lambda: MultiKeyCountingEnv(max_steps=4), policy, frames=12, total=36)
    assert_same_batches(expected, got)
    assert got["nested_2", "azione"].dtype == torch.float32 and got["action"].dtype == torch.bool
    # episodes of 4 steps: a reset per 5 frames, each a new trajectory
    assert got["collector", "traj_ids"].tolist() == [i // 5 for i in range(36)]
    assert got["next", "nested_1", "done"][4].all() and not got["nested_1", "done"][5].any()


def test_multi_agent_env_layout_matches_torchrl_and_random_actions_fill_every_key():
    def make():
        return MultiAgentCountingEnv(n_agents=3)

    policy = TorchRLRandomPolicy(make().full_action_spec)
    expected, got = _both(make, policy, frames=8, total=8)
    assert _layout(got) == {**_layout(expected), **{k: _layout(got)[k] for k in ONLY_HERE}}
    with aiocollect.Collector(make(), None, frames_per_batch=8, total_frames=8) as collector:
        batch = next(iter(collector))
    keys = collector.policy.out_keys
    assert keys == [("agents", f"agent_{i}", "action") for i in range(3)]
    for key in keys:
        assert batch[key].shape == (8, 1) and set(batch[key].unique().tolist()) <= {0, 1}
    assert _layout(batch) == _layout(got)


def _multi_key():
    return MultiKeyCountingEnv(max_steps=4)


def _multi_key_policy():
    return MultiKeyCountingEnvPolicy(MultiKeyCountingEnv().full_action_spec_unbatched, deterministic=True)


@pytest.fixture(scope="module")
def torchrl_multisync():
    """TorchRL's MultiSyncCollector over two ``MultiKeyCountingEnv`` workers: ``[2, 12]`` (built
    once: its worker processes take seconds to start)."""
    theirs = TorchRLMultiSync([_multi_key, _multi_key], _multi_key_policy(), frames_per_batch=24, total_frames=24,
                              cat_results="stack")
    try:
        return next(iter(theirs))
    finally:
        theirs.shutdown()


@pytest.mark.xdist_group("torchrl-multi-key")  # (one worker builds the fixture, once)
@pytest.mark.parametrize("cls", ["MultiSyncCollector", "MultiAsyncCollector"])
def test_worker_collectors_match_torchrl_multisync(torchrl_multisync, cls):
    policy, make, expected = _multi_key_policy(), _multi_key, torchrl_multisync
    collector = getattr(aiocollect, cls)([make, make], policy, frames_per_batch=24, total_frames=48,
                                         **({"cat_results": "stack"} if cls == "MultiSyncCollector" else {}))
    with collector:
        batches = list(collector)
        assert collector.policy_in_workers is False  # (several action keys: checked and packed here)
    if cls == "MultiSyncCollector":
        # trajectory ids are numbered as episodes end, in either worker first: compared apart
        assert_same_batches(expected, batches[0], ids=False)
    else:
        for batch in batches:  # one worker's [24] (TorchRL's: [2, 12]): it begins as TorchRL's first worker's
            assert batch.shape == (24,)
            assert_same_batches(expected[0], batch[:12], ids=False)


def test_a_policy_missing_an_action_key_is_named_before_collecting():
    def make():
        return MultiKeyCountingEnv()

    def only_root(td):
        return td.set("action", torch.zeros(*td.batch_size, 2, dtype=torch.bool))

    with pytest.raises(KeyError, match=r"'nested_1', 'action'.*'nested_2', 'azione'"), \
            aiocollect.Collector(make(), only_root, frames_per_batch=4, total_frames=4) as collector:
        next(iter(collector))


def test_an_action_that_does_not_fit_its_key_is_named():
    def make():
        return MultiAgentCountingEnv(n_agents=2)

    def policy(td):
        for i in range(2):
            td.set(("agents", f"agent_{i}", "action"), torch.full((*td.batch_size, 3), 1, dtype=torch.int8))
        return td

    with pytest.raises(ValueError, match=r"\('agents', 'agent_0', 'action'\).*shape \[1, 3\]"), \
            aiocollect.Collector(make(), policy, frames_per_batch=4, total_frames=4) as collector:
        next(iter(collector))


def test_random_frames_draw_every_action_key_laid_out_as_the_policy_writes_it():
    # init_random_frames: each key drawn in the policy's layout (the root action as one-hot
    # bool rows, as the policy writes it), so the random and the policy's batches match
    policy = MultiKeyCountingEnvPolicy(MultiKeyCountingEnv().full_action_spec_unbatched, deterministic=True)
    with aiocollect.Collector(MultiKeyCountingEnv(), policy, frames_per_batch=8, total_frames=16,
                              init_random_frames=8) as collector:
        random, acted = list(collector)
    assert _layout(random) == _layout(acted)
    assert (random["action"].sum(-1) == 1).all()  # one-hot rows
    assert not (random["nested_2", "azione"] == acted["nested_2", "azione"]).all()  # drawn, not the policy's
    assert ((random["nested_2", "azione"] >= 0) & (random["nested_2", "azione"] <= 100)).all()


def test_compact_obs_leaves_out_observations_only():
    # compact_obs drops ("next", obs) for the env's observations; the rewards and done flags
    # per group stay under "next", as in TorchRL's batches
    def make():
        return MultiAgentCountingEnv(n_agents=2)

    policy = TorchRLRandomPolicy(make().full_action_spec)
    expected, got = _both(make, policy, frames=8, total=8, compact_obs=True)
    assert set(_layout(got)) == set(_layout(expected)) | ONLY_HERE
    assert ("next", "agents", "agent_0", "reward") in got.keys(True, True)
    assert ("next", "agents", "agent_0", "observation") not in got.keys(True, True)


@pytest.mark.parametrize("option", [{"max_frames_per_traj": 4}, {"trajs_per_batch": 2}])
def test_options_no_group_flag_would_show_are_refused(option):
    # the collector's own resets (and whole trajectories) would end episodes that no
    # group's done flag shows: refused at construction, saying what to do instead
    with pytest.raises(ValueError, match=rf"{next(iter(option))}=.*per agent group.*StepCounter"):
        aiocollect.Collector(MultiAgentCountingEnv(n_agents=2), None, frames_per_batch=8, **option)


def test_set_truncated_needs_the_groups_truncated_flags():
    # set_truncated marks the groups' own truncated flags (as TorchRL's collector does: see
    # test_torchrl_sweep.py); an env without them is refused, as TorchRL refuses it
    with pytest.raises(ValueError, match=r"set_truncated=True.*no truncated flag.*add_truncated_keys"):
        aiocollect.Collector(MultiAgentCountingEnv(n_agents=2), None, frames_per_batch=8, set_truncated=True)
    with pytest.raises(RuntimeError, match="add_truncated_keys"):
        TorchRLCollector(MultiAgentCountingEnv(n_agents=2), None, frames_per_batch=8, total_frames=8,
                         set_truncated=True)

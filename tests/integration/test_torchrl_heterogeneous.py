"""Heterogeneous agents: TorchRL's ``HeterogeneousCountingEnv``, whose ``"lazy"`` group holds
three agents with entries and actions of different shapes, lazily stacked. aiocollect keeps
each agent's entries apart (each of a fixed shape) and gives the group back lazily stacked, to
the policy and in every batch (``aiocollect._envs.agents``). Compared with TorchRL's own
collectors on the same env and policy: TorchRL's ``TestHeterogeneousEnvsCollector`` cases, and
every entry of every agent equal (issue 51)."""

from __future__ import annotations

import warnings

import pytest
import torch

import aiocollect
from support.torchrl_marks import QUIET_TORCHRL

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    torchrl = pytest.importorskip("torchrl")
    from tensordict import LazyStackedTensorDict, assert_allclose_td
    from torchrl.collectors import Collector as TorchRLCollector
    from torchrl.data import NonTensor
    from torchrl.envs import InitTracker, TransformedEnv
    from torchrl.envs.utils import RandomPolicy as TorchRLRandomPolicy
    from torchrl.testing.mocking_classes import HeterogeneousCountingEnv, HeterogeneousCountingEnvPolicy

pytestmark = QUIET_TORCHRL


@pytest.mark.parametrize("batch_size", [(), (2,), (2, 1)])
@pytest.mark.parametrize("frames_per_batch", [4, 8, 16])
def test_torchrls_heterogeneous_env_case(batch_size, frames_per_batch):
    max_steps = 4
    # TorchRL's test_collector_heterogeneous_env, with only the import changed
    batch_size = torch.Size(batch_size)
    env = HeterogeneousCountingEnv(max_steps=max_steps - 1, batch_size=batch_size)
    policy = HeterogeneousCountingEnvPolicy(env.input_spec["full_action_spec"])
    with aiocollect.Collector(create_env_fn=env, policy=policy, frames_per_batch=frames_per_batch,
                              total_frames=100) as collector:
        td = next(iter(collector))
    collected_frames = frames_per_batch // batch_size.numel()
    assert isinstance(td["lazy"], LazyStackedTensorDict)
    assert td["lazy"].batch_size == (*batch_size, collected_frames, 3)
    for i in range(env.n_nested_dim):
        if collected_frames >= max_steps:
            agent_obs = td["lazy"][(0,) * len(batch_size)][..., i][f"tensor_{i}"]
            for _ in range(i + 1):
                agent_obs = agent_obs.mean(-1)
            assert (agent_obs == torch.arange(max_steps).repeat(collected_frames // max_steps)).all()
        assert (td["lazy"][..., i]["action"] == 1).all()


def _per_agent(td):
    """Every leaf of ``td``, a lazily stacked group's leaves agent by agent."""
    out = {}
    for group in ("lazy", ("next", "lazy")):
        stacked = td.get(group)
        for i in range(stacked.batch_size[-1]):
            for key, value in stacked[..., i].items(True, True):
                out[(group, i, key)] = value
    out.update(td.exclude("lazy", ("next", "lazy")).items(True, True))
    return out


@pytest.mark.parametrize("batch_size", [(), (2,), (2, 1)])
def test_every_agents_entries_equal_torchrls(batch_size):
    batches = {}
    for cls in (TorchRLCollector, aiocollect.Collector):
        env = HeterogeneousCountingEnv(max_steps=3, batch_size=batch_size)
        policy = HeterogeneousCountingEnvPolicy(env.input_spec["full_action_spec"])
        frames = 8 * max(1, torch.Size(batch_size).numel())
        collector = cls(env, policy, frames_per_batch=frames, total_frames=2 * frames)
        try:
            it = iter(collector)
            batches[cls] = torch.cat([next(it), next(it)], -1)  # (episodes of 4 steps: resets inside)
        finally:
            collector.shutdown()
    theirs, ours = batches[TorchRLCollector], batches[aiocollect.Collector]
    assert ours["lazy"].stack_dim == theirs["lazy"].stack_dim == len(batch_size) + 1
    assert ours.names == theirs.names
    a, b = _per_agent(theirs), _per_agent(ours)
    assert set(b) - set(a) == {("collector", "policy_version")}
    assert set(a) <= set(b)
    for key, value in a.items():
        assert (b[key].shape, b[key].dtype) == (value.shape, value.dtype), key
        assert torch.equal(b[key], value), key


def test_multi_collectors_agree_with_each_other_as_in_torchrl():
    # TorchRL's test_multi_collector_heterogeneous_env_consistency
    env = HeterogeneousCountingEnv(max_steps=3, batch_size=(10,))
    policy = HeterogeneousCountingEnvPolicy(env.input_spec["full_action_spec"])

    def env_fn():
        return TransformedEnv(HeterogeneousCountingEnv(max_steps=3, batch_size=(10,)), InitTracker())

    got = {}
    variants = ((aiocollect.MultiAsyncCollector, {}), (aiocollect.MultiSyncCollector, {"cat_results": "stack"}))
    for cls, kwargs in variants:
        with cls(create_env_fn=[env_fn], policy=policy, frames_per_batch=20, total_frames=100, **kwargs) as c:
            it = iter(c)
            got[cls] = [next(it), next(it)]
        assert got[cls][1].names[-1] == "time"
        with pytest.raises(AssertionError):
            assert_allclose_td(got[cls][0], got[cls][1])
    c1, c2 = got[aiocollect.MultiAsyncCollector]
    d1, d2 = got[aiocollect.MultiSyncCollector]
    assert_allclose_td(c1.unsqueeze(0), d1)
    assert_allclose_td(c2.unsqueeze(0), d2)


@pytest.mark.parametrize("name", ["Collector", "MultiSyncCollector", "MultiAsyncCollector", "AsyncCollector"])
@pytest.mark.parametrize("random", ["none", "torchrl"])
def test_random_actions_are_drawn_in_each_agents_own_space(name, random):
    env = HeterogeneousCountingEnv(max_steps=3, batch_size=(2,))
    policy = None if random == "none" else TorchRLRandomPolicy(env.full_action_spec)
    make = lambda: HeterogeneousCountingEnv(max_steps=3, batch_size=(2,))
    entry = make() if name == "Collector" else make if name == "AsyncCollector" else [make]
    with getattr(aiocollect, name)(entry, policy, frames_per_batch=16, total_frames=32) as c:
        batch = list(c)[-1]
    lazy = batch["lazy"]
    for i, size in enumerate((3, 2, 2)):
        action = lazy[..., i]["action"]
        assert action.shape[-1] == size
        assert action.abs().max() <= 1 and action.std() > 0
    # the env counted the agents' actions: a count rises while any agent's first action is nonzero
    assert (lazy[..., 0]["tensor_0"] > 0).any()


class InstructedAgents(HeterogeneousCountingEnv):
    """Each agent also sees a string of its own (a non-tensor entry inside the stacked group)."""

    def get_agent_obs_spec(self, i):
        spec = super().get_agent_obs_spec(i)
        spec["instruction"] = NonTensor(shape=(), example_data="x")
        return spec

    def _reset(self, tensordict=None, **kwargs):
        out = super()._reset(tensordict, **kwargs)
        for i, agent in enumerate(out["lazy"].tensordicts):
            agent.set_non_tensor("instruction", f"agent {i} reset")
        return out

    def _step(self, tensordict):
        out = super()._step(tensordict)
        for i, agent in enumerate(out["lazy"].tensordicts):
            agent.set_non_tensor("instruction", f"agent {i} count {int(self.count.flatten()[0])}")
        return out


def test_an_agents_non_tensor_entry_is_kept_as_in_torchrl():
    got = {}
    for cls in (TorchRLCollector, aiocollect.Collector):
        env = InstructedAgents(max_steps=3)
        collector = cls(env, HeterogeneousCountingEnvPolicy(env.input_spec["full_action_spec"]),
                        frames_per_batch=6, total_frames=6)
        try:
            got[cls] = next(iter(collector))
        finally:
            collector.shutdown()
    theirs, ours = got[TorchRLCollector], got[aiocollect.Collector]
    for group in ("lazy", ("next", "lazy")):
        for i in range(3):
            assert list(ours[group][..., i]["instruction"]) == list(theirs[group][..., i]["instruction"])
    assert list(ours["lazy"][..., 2]["instruction"])[:2] == ["agent 2 reset", "agent 2 count 1"]

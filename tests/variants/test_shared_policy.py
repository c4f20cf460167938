"""Which weights act (issue 18, items 4 and 5).

``Collector`` acts with the user's module itself, as TorchRL's does: an optimiser step
reaches the next batch without ``update_policy_weights_``, as a new policy version. The
worker collectors run a copy that only published updates change, and say so when the
user's module keeps changing with nothing published. Lazy modules work with both.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential

import aiocollect._policies.weights as weights_mod
from aiocollect import Collector, MultiSyncCollector
from aiocollect._policies.weights import FollowChannel, TorchWeights
from support.envs import IntObsEnv
from support.weights import check_versions, linear


def _versions(batch) -> set[int]:
    return set(batch["collector", "policy_version"].unique().tolist())


def _acts_with(policy, batch) -> bool:
    """Every action of ``batch`` is what ``policy``'s current weights give for its observation."""
    with torch.no_grad():
        expected = policy(TensorDict(observation=batch["observation"], batch_size=batch.shape))["action"]
    return torch.allclose(batch["action"], expected, atol=1e-5)


def _loss(policy, batch) -> torch.Tensor:
    out = policy(TensorDict(observation=batch["observation"], batch_size=batch.shape))["action"]
    return (out - batch["observation"].sum(-1, keepdim=True)).pow(2).mean()


@pytest.mark.parametrize("kind", ["dqn", "ppo"])
def test_collector_acts_with_the_module_the_user_trains(kind):
    """The tutorials' loop: collect, step an optimiser, collect; update_policy_weights_ is never called."""
    if kind == "dqn":  # a plain TensorDictModule (the runner's fast path), SGD
        policy = TensorDictModule(nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
        optim = torch.optim.SGD(policy.parameters(), lr=1e-3)
    else:  # a TensorDictSequential, fused Adam (which bumps no tensor version counter)
        policy = TensorDictSequential(
            TensorDictModule(nn.Linear(3, 4), in_keys=["observation"], out_keys=["hidden"]),
            TensorDictModule(nn.Linear(4, 1), in_keys=["hidden"], out_keys=["action"]),
        )
        optim = torch.optim.Adam(policy.parameters(), lr=1e-2, fused=True)
    with Collector([IntObsEnv] * 2, policy, frames_per_batch=20, total_frames=-1) as collector:
        assert collector.policy is policy  # no private copy
        batches = iter(collector)
        batch = next(batches)
        assert _versions(batch) == {0} and _acts_with(policy, batch)
        for step in range(1, 4):
            before = [p.detach().clone() for p in policy.parameters()]
            optim.zero_grad()
            _loss(policy, batch).backward()
            optim.step()
            assert any(not torch.equal(a, p) for a, p in zip(before, policy.parameters()))
            batch = next(batches)
            assert _acts_with(policy, batch), f"step {step}: the batch was not collected with the new weights"
            assert _versions(batch) == {step}, "each optimiser step is one new policy version"
        stats = collector.statistics()
        assert stats.policy_version == stats.latest_policy_version == 3


def test_collector_versions_are_honest_under_sharing():
    """Poison-style: the weights of version ``k`` are all ``k``, so each action shows the
    version that computed it; changes made in place, by update_policy_weights_ (into the
    user's module, as TorchRL does) or both, each count once, and no change counts none."""
    policy = linear(0.0)
    params = list(policy.parameters())
    with Collector([IntObsEnv] * 3, policy, frames_per_batch=30, total_frames=-1) as collector:
        assert check_versions(collector.rollout()) == {0}
        assert check_versions(collector.rollout()) == {0}  # nothing changed: no new version
        for k in range(1, 4):
            with torch.no_grad():
                for p in params:
                    p.fill_(k)  # an in-place change, no optimiser, no update call
            assert check_versions(collector.rollout()) == {k}
        with torch.no_grad():
            for p in params:
                p.fill_(4)
        assert collector.update_policy_weights_() == 4  # the change and the call: one version
        assert check_versions(collector.rollout()) == {4}
        assert collector.update_policy_weights_(linear(5.0)) == 5
        assert torch.equal(policy.module.weight, torch.full((1, 3), 5.0))  # loaded into the user's module
        assert check_versions(collector.rollout()) == {5}
        with torch.no_grad():
            for p in params:
                p.fill_(-1e9)  # poison the user's module...
        assert collector.update_policy_weights_(linear(6.0)) == 6  # ...then publish over it
        assert check_versions(collector.rollout()) == {6}
        stats = collector.statistics()
        assert stats.policy_version == stats.latest_policy_version == 6


def test_collector_with_a_lazy_module():
    """The first policy call initialises the user's lazy module (version 0, not a change);
    an optimiser step and update_policy_weights_ then work as for any module."""
    policy = TensorDictModule(nn.LazyLinear(1), in_keys=["observation"], out_keys=["action"])
    with Collector([IntObsEnv] * 2, policy, frames_per_batch=20, total_frames=-1) as collector:
        first = collector.rollout()
        assert policy.module.weight.shape == (1, 3)  # initialised by the collector's first call
        assert _versions(first) == {0} and _acts_with(policy, first)
        assert _versions(collector.rollout()) == {0}  # initialisation is not a new version
        optim = torch.optim.SGD(policy.parameters(), lr=1e-3)
        _loss(policy, first).backward()
        optim.step()
        batch = collector.rollout()
        assert _versions(batch) == {1} and _acts_with(policy, batch)
        trained = linear(2.0)
        assert collector.update_policy_weights_(trained) == 2
        batch = collector.rollout()
        assert _versions(batch) == {2} and _acts_with(trained, batch)


@pytest.mark.parametrize("first", ["update", "batch"])
def test_worker_collector_with_a_lazy_module(first, monkeypatch):
    """The copy of a lazy module takes the shapes of the first update, or initialises itself
    at its first call and then takes updates of the user's initialised module."""
    monkeypatch.setattr(weights_mod, "STALE_WARNING_S", 0.0)
    policy = TensorDictModule(nn.LazyLinear(1), in_keys=["observation"], out_keys=["action"])
    with MultiSyncCollector([IntObsEnv] * 2, policy, frames_per_batch=20, total_frames=-1) as collector:
        assert collector.policy is not policy
        if first == "update":
            with pytest.raises(ValueError, match="not initialised"):
                collector.update_policy_weights_()  # the user's module has no weights yet
            policy(TensorDict(observation=torch.zeros(1, 3), batch_size=[1]))  # the user's dry run
            assert collector.update_policy_weights_() == 1  # before the copy's first call
            batch = collector.rollout()
            assert collector.policy.module.weight.shape == (1, 3)
            assert _versions(batch) == {1} and _acts_with(policy, batch)
            return
        batch = collector.rollout()  # the copy initialises itself (its own random weights)
        assert _versions(batch) == {0}
        optim = torch.optim.SGD(policy.parameters(), lr=1e-3)
        _loss(policy, batch).backward()  # the user's module initialises
        optim.step()
        # the copy does not follow: it says so when nothing is ever published
        with pytest.warns(UserWarning, match="update_policy_weights_\\(\\) was never called"):
            batch = collector.rollout()
        assert _versions(batch) == {0} and not _acts_with(policy, batch)
        assert collector.update_policy_weights_() == 1  # the shapes match now: it loads
        batch = collector.rollout()
        assert _versions(batch) == {1} and _acts_with(policy, batch)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            optim.step()
            collector.rollout()
        assert not [w for w in caught if "never called" in str(w.message)]  # an update was published


def test_a_copy_follows_the_module_it_was_made_from():
    """``Collector``'s copy on another ``policy_device`` (here without a GPU: the channel alone)."""
    source = linear(0.0)
    own = copy.deepcopy(source)
    channel = FollowChannel(TorchWeights(own), source)
    assert not channel.shared and not channel.has_pending

    def fill(module, value):
        with torch.no_grad():
            for p in module.parameters():
                p.fill_(value)

    def apply():
        with channel.lock:
            if channel.has_pending:
                channel.apply_pending()
        return channel.version, own.module.weight[0, 0].item()

    fill(source, 1.0)
    assert apply() == (1, 1.0)  # the change is copied over, as a new version
    assert apply() == (1, 1.0)
    assert channel.publish(linear(5.0)) == 2
    assert apply() == (2, 5.0)  # published weights win until the module changes again
    fill(source, 2.0)
    assert apply() == (3, 2.0)
    assert source.module.weight[0, 0].item() == 2.0

"""A policy's own state, in every variant (issue 50 items 2 and 3): buffers that the policy
changes while it acts (a counter, ``BatchNorm``'s running statistics) and extra state
(``get_extra_state``).

The rule (``docs/guarantees.md``): a policy that changes its own state while acting acts in
one place, the main process, whatever the placement switch says; so ``collector.policy`` and
``state_dict()["policy_state_dict"]`` hold the state it acted with, and the batches are those
of one policy, as with central inference. Extra state is not versioned weights: updates
and checkpoints carry the parameters and buffers (as TorchRL's updates do).
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn as nn
from tensordict.nn import TensorDictModule

from support.envs import CounterEnv
from support.procs import wait_until

FPB = 40


class CountsRows(nn.Module):
    """Counts the rows it acted for in a buffer; the action depends on the count's parity, so
    copies that counted apart would act otherwise than the one policy."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 3)
        self.register_buffer("rows", torch.zeros((), dtype=torch.long))

    def forward(self, observation):
        self.rows += observation.shape[0]
        return (observation[:, 0].long() + self.rows) % 3


class Normalised(nn.Module):
    """``BatchNorm1d`` in front of a linear layer (built in eval mode: its statistics change
    once the user switches it to train mode)."""

    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm1d(3)
        self.linear = nn.Linear(3, 3)

    def forward(self, observation):
        n = observation.shape[0]  # (doubled: train mode needs two rows, a coroutine env's round may have one)
        doubled = torch.cat([observation, observation]) / 100
        return self.linear(self.norm(doubled))[:n].argmax(-1)


class WithExtraState(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 3)
        self.config = {"scale": 1.0}

    def forward(self, observation):
        return self.linear(observation * self.config["scale"]).argmax(-1)

    def get_extra_state(self):
        return dict(self.config)

    def set_extra_state(self, state):
        self.config = dict(state)


@pytest.fixture(params=["0", "1"], ids=["central", "in_workers"])
def switch(request, monkeypatch):
    """Both settings of the placement switch: neither moves a stateful policy."""
    monkeypatch.setenv("AIOCOLLECT_POLICY_IN_WORKERS", request.param)
    return request.param


def test_a_policy_counting_in_a_buffer_acts_in_one_place_and_its_checkpoints_see_the_count(variant, switch,
                                                                                          caplog):
    policy = TensorDictModule(CountsRows(), in_keys=["observation"], out_keys=["action"])
    with caplog.at_level(logging.WARNING, logger="aiocollect"):
        collector = variant(CounterEnv, policy, frames_per_batch=FPB, total_frames=3 * FPB)
    with collector:
        assert not getattr(collector, "policy_in_workers", False)
        if switch == "1" and variant.processes:  # the switch asked for the workers: it says why not
            assert "buffer 'module.rows' changed in a call" in caplog.text
        delivered = sum(batch.numel() for batch in collector)
        counted = int(collector.policy.module.rows)
        assert counted >= delivered  # (collectors that collect ahead acted for more)
        saved = collector.state_dict()["policy_state_dict"]
        assert int(saved["module.rows"]) >= counted  # (collectors ahead act on meanwhile)
        assert saved["module.linear.weight"].shape == (3, 3)


def test_batchnorm_acts_in_one_place_and_its_running_statistics_move_in_train_mode(variant, switch):
    policy = TensorDictModule(Normalised().eval(), in_keys=["observation"], out_keys=["action"])
    with variant(CounterEnv, policy, frames_per_batch=FPB, total_frames=-1) as collector:
        assert not getattr(collector, "policy_in_workers", False)
        norm = collector.policy.module.norm
        batches = iter(collector)
        next(batches)
        assert int(norm.num_batches_tracked) == 0  # eval mode: nothing moves
        collector.policy.train()
        collector.update_policy_weights_()
        next(batches), next(batches)
        tracked = int(norm.num_batches_tracked)
        assert tracked > 0 and norm.running_mean.abs().sum() > 0
        saved = collector.state_dict()["policy_state_dict"]
        assert int(saved["module.norm.num_batches_tracked"]) >= tracked


def test_a_policy_with_extra_state_collects_updates_and_checkpoints(variant):
    # (every collector failed at construction: AttributeError: 'dict' object has no attribute 'device')
    policy = TensorDictModule(WithExtraState(), in_keys=["observation"], out_keys=["action"])
    with variant(CounterEnv, policy, frames_per_batch=FPB, total_frames=-1) as collector:
        assert not getattr(collector, "policy_in_workers", False)
        batches = iter(collector)
        assert next(batches).numel() == FPB
        trained = WithExtraState()
        trained.config = {"scale": 2.0}
        version = collector.update_policy_weights_(TensorDictModule(trained, in_keys=["observation"],
                                                                    out_keys=["action"]))
        assert version == 1
        next(batches)  # (an update applies before the next policy call; read while the engine may copy)
        assert wait_until(lambda: torch.equal(collector.policy.module.linear.weight, trained.linear.weight))
        assert collector.policy.module.config == {"scale": 1.0}  # (extra state is not weights)
        saved = collector.state_dict()
        assert set(saved["policy_state_dict"]) == {"module.linear.weight", "module.linear.bias"}
        collector.update_policy_weights_(trained.state_dict(prefix="module."))  # (its extra state ignored)
        collector.load_state_dict(saved)
        assert next(batches).numel() == FPB


"""``policy_placement``: where the policy acts, as a keyword of the worker collectors (issue 53):
``"central"`` and ``"workers"`` are what runs whatever ``AIOCOLLECT_POLICY_IN_WORKERS`` says,
``"auto"`` leaves the choice to the collector (the variable forcing it, as a fallback), and
``"workers"`` for a policy the workers cannot run is a ``ValueError`` saying why, raised before
any worker process starts."""

from __future__ import annotations

import functools

import gymnasium as gym
import pytest
import torch
from tensordict.nn import TensorDictModule
from torch import nn

import aiocollect
from support.procs import children

pytestmark = pytest.mark.usefixtures("leak_check")


cartpole = functools.partial(gym.make, "CartPole-v1")
"""(A partial of gymnasium's function, not a function of this module: a worker would import
this module to unpickle it, and torch with it, 2 to 3 s of CPU a worker; tests/README.md.)"""


class Argmax(nn.Module):
    def __init__(self, norm: bool = False):
        super().__init__()
        self.net = nn.Sequential(nn.BatchNorm1d(4), nn.Linear(4, 2)) if norm else nn.Linear(4, 2)

    def forward(self, observation):
        return self.net(observation).argmax(-1)


def mlp(norm: bool = False):
    return TensorDictModule(Argmax(norm), in_keys=["observation"], out_keys=["action"])


@pytest.mark.parametrize(("choice", "forced", "in_workers"), [("central", "1", False), ("workers", "0", True),
                                                              ("auto", "1", True), ("auto", "0", False)])
def test_the_keyword_decides_and_the_variable_is_the_fallback(monkeypatch, choice, forced, in_workers):
    monkeypatch.setenv("AIOCOLLECT_POLICY_IN_WORKERS", forced)
    with aiocollect.MultiSyncCollector([cartpole, cartpole], mlp(), frames_per_batch=16, total_frames=16,
                                       policy_placement=choice) as collector:
        batch = next(iter(collector))
        assert collector.policy_in_workers is in_workers
        assert collector.worker_options.policy_placement == choice
    assert batch.batch_size == (2, 8)


@pytest.mark.parametrize(("policy", "why"), [
    (lambda observation: torch.zeros(len(observation), dtype=torch.int64), "not a torch module"),
    (mlp(norm=True), "running statistics"),
])
def test_workers_for_a_policy_they_cannot_run_says_why_before_any_worker_starts(policy, why):
    before = set(children())
    with pytest.raises(ValueError, match=rf"policy_placement='workers': the policy cannot act in the workers: .*{why}"):
        aiocollect.MultiAsyncCollector([cartpole, cartpole], policy, frames_per_batch=16, total_frames=16,
                                       policy_placement="workers")
    assert set(children()) <= before


def test_a_bad_value_names_the_keyword_and_the_values():
    with pytest.raises(ValueError, match=r"policy_placement='gpu': use 'auto' .* 'central' .* 'workers'"):
        aiocollect.MultiSyncCollector([cartpole], mlp(), frames_per_batch=16, policy_placement="gpu")

"""Policies TorchRL's collectors take, run by aiocollect's with only the import changed, and
their batches compared with TorchRL's on the same env: what the policy writes is stored as
written (an int64 action for a continuous env, an action without the batch dim from a policy
that ignores it), a module returning a tuple gets TorchRL's out keys, a module named after the
observation keys gets them by name, and a module TorchRL cannot wrap is its ``TypeError`` at
construction (issue 51)."""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
from torch import nn

import aiocollect
from support.torchrl_marks import QUIET_TORCHRL

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    torchrl = pytest.importorskip("torchrl")
    from tensordict.nn import TensorDictModule
    from torchrl.collectors import Collector as TorchRLCollector
    from torchrl.envs import GymEnv
    from torchrl.testing.mocking_classes import ContinuousActionVecMockEnv, CountingEnv, CountingEnvCountPolicy

pytestmark = QUIET_TORCHRL

pendulum = functools.partial(GymEnv, "Pendulum-v1")
ONLY_HERE = {"truncated", ("next", "truncated"), ("collector", "policy_version")}
"""aiocollect's keys TorchRL's batches lack (``docs/migrating.md``)."""


class IntegerAction(nn.Module):
    def forward(self, observation):
        return torch.ones((*observation.shape[:-1], 7), dtype=torch.int64)


class Wrappable(nn.Module):  # (TorchRL's test_collector ``WrappablePolicy``)
    def __init__(self, multiple_outputs: bool):
        super().__init__()
        self.multiple_outputs = multiple_outputs
        self.linear = nn.Linear(3, 1)

    def forward(self, observation):
        output = self.linear(observation)
        if self.multiple_outputs:
            return output, output.sum(), output.min(), output.max()
        return output


class Unwrappable(nn.Module):  # (TorchRL's ``UnwrappablePolicy``)
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 1)

    def forward(self, observation, other_stuff):
        return self.linear(observation), other_stuff.sum()


class ByName(nn.Module):
    """Arguments in another order than the env's observation keys: TorchRL passes them by name."""

    def forward(self, observation_orig, observation):
        return (observation_orig - 2 * observation).clamp(-1, 1)


def first_batch(collector) -> dict:
    try:
        for batch in collector:
            return batch
    finally:
        collector.shutdown()


def layout(batch) -> dict:
    return {k: (tuple(v.shape), v.dtype) for k, v in batch.items(True, True) if k not in ONLY_HERE}


def both(make_env, make_policy, frames: int = 8, **kwargs) -> tuple:
    torch.manual_seed(0)
    theirs = first_batch(TorchRLCollector(make_env, make_policy(), frames_per_batch=frames, total_frames=frames))
    torch.manual_seed(0)
    ours = first_batch(aiocollect.Collector(make_env, make_policy(), frames_per_batch=frames,
                                            total_frames=frames, **kwargs))
    return theirs, ours


def test_an_int64_action_for_a_continuous_env_is_stored_as_torchrl_stores_it():
    theirs, ours = both(ContinuousActionVecMockEnv,
                        lambda: TensorDictModule(IntegerAction(), ["observation"], ["action"]))
    assert layout(ours) == layout(theirs)
    assert ours["action"].dtype == torch.int64 and torch.equal(ours["action"], theirs["action"])


def test_an_int64_action_for_a_gymnasium_box_env_reaches_it_as_floats():
    import gymnasium as gym

    env_action = []

    class Recorder(gym.Wrapper):
        def step(self, action):
            env_action.append(action)
            return self.env.step(action)

    policy = TensorDictModule(lambda obs: torch.ones((*obs.shape[:-1], 1), dtype=torch.int64),
                              ["observation"], ["action"])
    batch = first_batch(aiocollect.Collector(lambda: Recorder(gym.make("Pendulum-v1")), policy,
                                             frames_per_batch=4, total_frames=4))
    assert batch["action"].dtype == torch.int64 and batch["action"].tolist() == [[1]] * 4
    assert all(a.dtype == "float32" and a.tolist() == [1.0] for a in env_action)


def test_a_policy_that_ignores_the_batch_dim_collects_as_under_torchrl():
    """``CountingEnvCountPolicy`` writes its spec's ``zero() + 1`` (shape ``[1]``) whatever
    the batch: TorchRL calls it per env; so does aiocollect, found at its first call."""
    theirs, ours = both(CountingEnv, lambda: CountingEnvCountPolicy(CountingEnv().action_spec))
    assert layout(ours) == layout(theirs)
    for key in ("action", "observation", ("next", "observation")):
        assert torch.equal(ours[key], theirs[key]), key
    with aiocollect.MultiSyncCollector([CountingEnv, CountingEnv], CountingEnvCountPolicy(CountingEnv().action_spec),
                                       frames_per_batch=8, total_frames=8, cat_results="stack") as collector:
        batch = first_batch(collector)
    assert batch["action"].shape == (2, 4, 1) and batch["action"].dtype == torch.int8
    assert batch["observation"][0, :, 0].tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("multiple_outputs", [True, False])
def test_a_module_returning_a_tuple_gets_torchrls_out_keys(multiple_outputs):
    theirs, ours = both(pendulum, lambda: Wrappable(multiple_outputs))
    assert layout(ours) == layout(theirs)
    assert ("output1" in ours) is multiple_outputs
    if multiple_outputs:  # (per env, as TorchRL calls the module on one env's observation)
        assert torch.allclose(ours["output1"], ours["action"][..., 0])


def test_a_module_named_after_the_observation_keys_gets_them_by_name():
    theirs, ours = both(ContinuousActionVecMockEnv, ByName)
    assert layout(ours) == layout(theirs)
    for batch in (theirs, ours):
        assert torch.equal(batch["action"], (batch["observation_orig"] - 2 * batch["observation"]).clamp(-1, 1))


@pytest.mark.parametrize("cls", [aiocollect.Collector, aiocollect.MultiSyncCollector])
def test_a_module_torchrl_cannot_wrap_is_a_type_error_at_construction(cls):
    match = "Arguments to policy.forward are incompatible with entries in"
    with pytest.raises(TypeError, match=r"Failed to wrap the policy"):
        TorchRLCollector(pendulum, Unwrappable(), frames_per_batch=8, total_frames=8)
    envs = pendulum if cls is aiocollect.Collector else [pendulum]
    with pytest.raises(TypeError, match=match):
        cls(envs, Unwrappable(), frames_per_batch=8, total_frames=8)

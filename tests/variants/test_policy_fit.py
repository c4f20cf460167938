"""A policy that does not take the envs' observations (``Linear(3, 1)`` on CartPole's four
numbers) is named as the policy, with the keys, shapes and dtypes it was given: at its first
call, in every collector; and where the policy would act in the workers, at construction,
before any worker process starts (issue 52)."""

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


def too_narrow():
    return TensorDictModule(nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])


def _notes(exc: BaseException) -> str:
    return "\n".join(getattr(exc, "__notes__", []))


@pytest.mark.parametrize("cls", ["Collector", "MultiSyncCollector", "MultiAsyncCollector"])
def test_the_first_call_names_the_policy_and_what_it_was_given(cls):
    entry = cartpole if cls == "Collector" else [cartpole, cartpole]
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied") as info, \
            getattr(aiocollect, cls)(entry, too_narrow(), frames_per_batch=8, total_frames=8) as collector:
        next(iter(collector))
    notes = _notes(info.value)
    assert "raised by the policy" in notes
    assert "'observation': [" in notes and ", 4] float32" in notes
    assert "first layer" in notes


def test_with_the_policy_for_the_workers_it_is_said_before_any_worker_starts(monkeypatch):
    monkeypatch.setenv("AIOCOLLECT_POLICY_IN_WORKERS", "1")
    before = set(children())
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied") as info:
        aiocollect.MultiSyncCollector([cartpole, cartpole], too_narrow(), frames_per_batch=8, total_frames=8)
    assert "before any worker starts" in _notes(info.value)
    assert "'observation': [2, 4] float32" in _notes(info.value)
    assert set(children()) <= before  # no worker process was started


def test_a_policy_that_fails_otherwise_still_fails_at_its_first_call(monkeypatch):
    # a failure that is not about its inputs' shapes (a policy that raises by design) is not
    # guessed at construction: it is raised where it happens, with the same note
    monkeypatch.setenv("AIOCOLLECT_POLICY_IN_WORKERS", "1")

    class Boom(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 2)

        def forward(self, observation):
            raise ArithmeticError("boom")

    policy = TensorDictModule(Boom(), in_keys=["observation"], out_keys=["action"])
    collector = aiocollect.MultiSyncCollector([cartpole, cartpole], policy, frames_per_batch=8, total_frames=8)
    with pytest.raises(ArithmeticError, match="boom") as info, collector:
        next(iter(collector))
    assert "raised by the policy" in _notes(info.value) and "first layer" not in _notes(info.value)


def test_an_error_on_zeros_that_is_not_about_shapes_does_not_stop_construction(monkeypatch):
    # a distribution validating its parameters fails on zeros (scale 0), with "shape" in its
    # message, and works on real observations: the probe must not take it for a misfit
    monkeypatch.setenv("AIOCOLLECT_POLICY_IN_WORKERS", "1")

    class Gaussian(nn.Module):
        def __init__(self):
            super().__init__()
            self.mean = nn.Linear(3, 1)

        def forward(self, observation):
            scale = observation[..., :1].abs() + (observation[..., :1] == 0) * 0  # 0 on zeros
            return torch.distributions.Normal(self.mean(observation), scale, validate_args=True).sample()

    policy = TensorDictModule(Gaussian(), in_keys=["observation"], out_keys=["action"])
    with aiocollect.MultiSyncCollector([lambda: gym.make("Pendulum-v1")] * 2, policy, frames_per_batch=8,
                                       total_frames=8) as collector:
        batch = next(iter(collector))
    assert batch["action"].shape == (2, 4, 1)

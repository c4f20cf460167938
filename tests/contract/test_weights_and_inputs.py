"""Weights and bad input, the same in every variant: the poison test on both faces, the async
twin, and every bad argument refused before any env is built or process started, with the same
rules for coroutine envs everywhere."""

from __future__ import annotations

import pytest
import torch

from support.envs import CounterEnv, IntObsEnv
from support.procs import children
from support.weights import Trainer, check_versions, linear, versions_while_training


@pytest.mark.parametrize("face", ["sync", "async"])
async def test_concurrent_updates_never_mix_versions(variant, face):
    collector = variant(IntObsEnv, linear(0.0), frames_per_batch=40, total_frames=40 * 30)
    await versions_while_training(collector, Trainer(collector), face)


async def test_the_async_twin_returns_once_the_weights_are_in_effect(variant):
    async with variant(IntObsEnv, linear(0.0), frames_per_batch=40, total_frames=-1) as collector:
        batch = await collector.arollout()
        assert (batch["collector", "policy_version"] == 0).all()
        assert await collector.update_policy_weights(linear(1.0)) == 1
        stats = collector.statistics()
        assert stats.policy_version == stats.latest_policy_version == 1
        assert torch.equal(collector.policy.module.weight, torch.full((1, 3), 1.0))
        async for batch in collector:
            if variant.collects_ahead and (batch["collector", "policy_version"] == 0).any():
                continue  # collected ahead, before the update
            assert (batch["collector", "policy_version"] == 1).all()
            check_versions(batch)
            break
    with pytest.raises(ValueError, match="worker_ids"):
        variant(IntObsEnv, linear(0.0), frames_per_batch=40).update_policy_weights_(worker_ids=[7])


BAD = [
    ({"frames_per_batch": 0}, ValueError, "frames_per_batch must be positive"),
    ({"frames_per_batch": 40, "max_frames_per_traj": 2.5}, TypeError, "max_frames_per_traj must be an integer"),
    ({"frames_per_batch": 40, "postproc": 3}, TypeError, "postproc must be a callable"),
    ({"frames_per_batch": 40, "replay_buffer": object()}, TypeError, "replay_buffer must have an extend"),
    ({"frames_per_batch": 40, "storing_device": "cuda:7"}, ValueError, "storing_device='cuda:7'"),
    ({"frames_per_batch": 40, "exploration_type": "greedy"}, ValueError, "exploration_type must be"),
    ({"frames_per_batch": 40, "reset_when_done": 1}, TypeError, "reset_when_done must be True or False"),
]


@pytest.mark.parametrize(("kwargs", "exc", "match"), BAD,
                         ids=[next(iter(k)) + str(i) for i, (k, _, _) in enumerate(BAD)])
def test_bad_arguments_are_refused_before_anything_starts(variant, kwargs, exc, match):
    before = children()
    with pytest.raises(exc, match=match):
        variant(**kwargs)
    assert children() == before, "a worker process was started for a collector that was refused"


def test_a_policy_that_is_not_callable_is_refused(variant):
    with pytest.raises(TypeError, match="policy"):
        variant(policy=42, frames_per_batch=40)


COROUTINE_ONLY = "these apply to coroutine envs"
NO_RESET_WHEN_DONE = ("reset_when_done=False: coroutine envs (aiocollect.AsyncEnv) are reset as soon as they "
                      "finish; a finished coroutine env cannot be stepped on. Remove the argument.")


@pytest.mark.parametrize("knob", [{"max_batch_size": 2}, {"min_batch_size": 2}, {"batch_timeout": 0.01},
                                  {"step_timeout": 1.0}])
def test_coroutine_knobs_follow_one_rule(variant, knob):
    """Given for other envs, a knob is refused with one message; for coroutine envs, a
    Collector shapes its per-env policy calls with it, a worker collector (whose entries
    step their envs together) refuses the three batching knobs, and every collector takes
    ``step_timeout`` (worker processes too: ``contract/test_hangs.py``)."""
    (name, _), = knob.items()
    if variant.processes and name == "step_timeout":
        with variant(frames_per_batch=40, total_frames=40, **knob) as collector:
            assert len(list(collector)) == 1
        return
    if not variant.coroutine:
        with pytest.raises(ValueError, match=f"{name}: {COROUTINE_ONLY}"):
            variant(frames_per_batch=40, **knob)
        return
    if variant.cls.__name__ != "Collector" and name != "step_timeout":
        with pytest.raises(ValueError, match=f"{name}: in a worker collector each entry of coroutine envs"):
            variant(frames_per_batch=40, **knob)
        return
    with variant(frames_per_batch=40, total_frames=40, **knob) as collector:
        assert len(list(collector)) == 1


def test_reset_when_done_false_is_refused_for_coroutine_envs_everywhere(variant):
    if not variant.coroutine:
        with variant(CounterEnv, frames_per_batch=40, total_frames=40, reset_when_done=False) as collector:
            batch = next(iter(collector))
        assert batch["done"].any() or not batch["next", "done"][..., :-1, :].any()  # flags carry over
        return
    with pytest.raises(ValueError) as info:
        variant(frames_per_batch=40, reset_when_done=False)
    assert str(info.value) == NO_RESET_WHEN_DONE

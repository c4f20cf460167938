"""What an env's ``step`` returns is checked at its first step, as gymnasium's env checker
does (coroutine envs at every step): numpy would store a reward of ``None`` as NaN and any
string flag as ``True``, silently."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from aiocollect import EnvError
from support.bad_step_envs import BadStepTypes, LateArrayReward, LateBadStepTypes, OldGymApi
from support.envs import EchoBoxEnv
from support.variants import VARIANTS

# Not the "vector" variant: a gymnasium VectorEnv converts its envs' values itself (None to NaN,
# strings to True) before aiocollect sees its arrays.
STEPPED_HERE = [v for v in VARIANTS if v.envs != "vector"]
over_variants = pytest.mark.parametrize("variant", STEPPED_HERE, ids=[v.name for v in STEPPED_HERE])


@over_variants
@pytest.mark.parametrize(("field", "value", "message"), [
    ("reward", None, r"step\(\) returned reward=None \(NoneType\); a gymnasium env returns a number"),
    ("reward", "1.0", r"step\(\) returned reward='1.0' \(str\)"),
    ("terminated", "False", r"step\(\) returned terminated='False' \(str\); a gymnasium env returns True or False"),
    ("terminated", None, r"step\(\) returned terminated=None"),
])
def test_a_step_value_of_the_wrong_type_is_an_env_error(variant, field, value, message):
    collector = variant(functools.partial(BadStepTypes, field, value), None, frames_per_batch=40)
    with pytest.raises(EnvError, match=message) as info:
        next(iter(collector))
    assert info.value.env is not None or info.value.worker is not None
    collector.shutdown()


@over_variants
@pytest.mark.parametrize("value", [1, np.float32(0.5), np.array(2.0), np.array([2.0]), np.array([[0.5]], np.float32)])
def test_numbers_of_any_kind_are_rewards(variant, value):
    """Scalars, 0-d arrays and one-element arrays (``np.array([r])``, as some envs return)."""
    with variant(functools.partial(BadStepTypes, "reward", value), None, frames_per_batch=40) as collector:
        batch = next(iter(collector))
    assert (batch["next", "reward"] == np.asarray(value).item()).all()


@over_variants
def test_a_reward_that_turns_into_an_array_later_is_an_error_that_says_so_or_taken_by_coroutines(variant):
    """Types are checked at an env's first step only (the step loop stays lean): a later
    change fails, with a note that says what happened. Coroutine envs are checked at every
    step, so there the one-element array is taken as at a first step."""
    collector = variant(LateArrayReward, None, frames_per_batch=40)
    if variant.coroutine:
        batch = next(iter(collector))
        collector.shutdown()
        assert (batch["next", "reward"][..., 0] == batch["next", "observation"][..., 0]).all()  # reward = step t
        return
    with pytest.raises(EnvError) as info:
        next(iter(collector))
    collector.shutdown()
    err = info.value
    text = str(err) + (err.remote_traceback or "")
    assert "checked at its first step only" in text and "a reward that became an array" in text, text


def collect_until_refused(variant, field, value, message) -> EnvError:
    """Collect from envs whose ``field`` turns into ``value`` after their 15th step: an
    ``EnvError`` matching ``message`` within two batches, and no bad value delivered."""
    collector = variant(functools.partial(LateBadStepTypes, field, value, after=15), None, frames_per_batch=40,
                        total_frames=400)
    delivered = 0
    with pytest.raises(EnvError, match=message) as info:
        for batch in collector:
            assert not torch.isnan(batch["next", "reward"]).any(), "a NaN reward was delivered"
            assert batch["next", "truncated"].view(torch.uint8).max() <= 1, "a flag of 2 was delivered"
            delivered += 1
    collector.shutdown()
    assert delivered < 2
    return info.value


@pytest.mark.parametrize(("value", "message"), [
    (None, r"returned a reward that is not a number \(None, or NaN\)|returned reward=None"),
    (float("nan"), r"returned a reward that is not a number \(None, or NaN\)|returned reward=nan"),
])
def test_a_reward_that_is_not_a_number_after_the_first_step_is_refused(variant, value, message):
    """Types are checked in full at an env's first step; a later reward of ``None`` (stored as
    NaN, as a VectorEnv stores it too) is found when the batch is built, before it is delivered."""
    err = collect_until_refused(variant, "reward", value, message)
    assert err.env is not None and err.worker is not None, str(err)


@over_variants
@pytest.mark.parametrize(("field", "value", "message"), [
    ("terminated", "False", r"invalid literal for int\(\) with base 10: 'False'|returned terminated='False'"),
    ("terminated", None, r"int\(\) argument must be .* not 'NoneType'|returned terminated=None"),
    ("truncated", 2, r"returned truncated=2, not a boolean|returned truncated=2"),
])
def test_a_flag_that_is_not_a_boolean_after_the_first_step_is_refused(variant, field, value, message):
    """A flag is stored as a byte by the workers: a string or ``None`` fails as it is stored
    (numpy would have stored ``"False"`` as True), another number when the batch is built.
    (Not for a VectorEnv: it turns the flags into booleans itself, before aiocollect sees them.)"""
    err = collect_until_refused(variant, field, value, message)
    assert err.env is not None, str(err)
    if field == "terminated" and not variant.coroutine:
        assert "checked at its first step only" in str(err) + (err.remote_traceback or "")


@over_variants
@pytest.mark.parametrize("value", [np.array([False]), np.array([0])])
def test_a_flag_may_be_a_one_element_array(variant, value):
    with variant(functools.partial(BadStepTypes, "terminated", value), None, frames_per_batch=40) as collector:
        batch = next(iter(collector))
    assert not batch["next", "terminated"].any()


@over_variants
@pytest.mark.parametrize(("which", "message"), [
    ("step", r"step\(\) returned a tuple of 4 value\(s\); a gymnasium env returns 5 values: \(obs, reward, "
             r"terminated, truncated, info\)\. An env written for the old gym API"),
    ("reset", r"reset\(\) returned ndarray \(not a tuple\); a gymnasium env returns 2 values: \(obs, info\)"),
])
def test_an_env_written_for_the_old_gym_api_gets_an_error_that_says_so(variant, which, message):
    collector = variant(functools.partial(OldGymApi, which), None, frames_per_batch=40)
    with pytest.raises(EnvError, match=message):
        next(iter(collector))
    collector.shutdown()


ALL = pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])


def bf16_actions(td):
    """Actions of a dtype numpy lacks, as an autocast policy returns them: 0.1 + 0.3 * step,
    which bfloat16 rounds (0.4 -> 0.40039...)."""
    a = (0.1 + 0.3 * td["observation"][:, :1]).to(torch.bfloat16)
    return td.set("action", a)


@ALL
def test_a_bfloat16_action_is_stored_as_it_is_and_the_envs_get_its_value(variant):
    collector = variant(EchoBoxEnv, bf16_actions, frames_per_batch=40, total_frames=40)
    with collector:
        (batch,) = list(collector)
    assert batch["action"].dtype == torch.bfloat16
    # the env echoes what it was given: bf16's value, widened, not the float32 0.1 + 0.3 t
    assert torch.equal(batch["next", "reward"], batch["action"].float())  # (rewards: [..., 1], as TorchRL)
    expected = (0.1 + 0.3 * batch["observation"][..., :1]).to(torch.bfloat16)
    assert torch.equal(batch["action"], expected)
    assert not torch.equal(expected.float(), 0.1 + 0.3 * batch["observation"][..., :1])  # (bf16 did round)

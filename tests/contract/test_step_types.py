"""What an env's ``step`` returns is checked at its first step, as gymnasium's env checker
does (coroutine envs at every step): numpy would store a reward of ``None`` as NaN and any
string flag as ``True``, silently."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from aiocollect import EnvError
from support.bad_step_envs import BadStepTypes
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
@pytest.mark.parametrize("value", [1, np.float32(0.5), np.array(2.0)])
def test_numbers_of_any_kind_are_rewards(variant, value):
    with variant(functools.partial(BadStepTypes, "reward", value), None, frames_per_batch=40) as collector:
        batch = next(iter(collector))
    assert (batch["next", "reward"] == float(value)).all()

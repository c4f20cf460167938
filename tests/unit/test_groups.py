"""The env groups, and two small parts, without an event loop.

``make_group`` and ``InProcessGroup`` (``_envs.group``) build and step the envs.
``IdPool`` (``_engine.timelines``) hands out trajectory ids; ``OutputSpec``
(``_engine.storage``) describes a policy output. (What ``Collector`` runs on, the
scheduler over an inline worker, is in ``test_inline_scheduler.py``; the storage in
``test_storage.py``, the per-env bookkeeping in ``test_timelines.py``.)
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from gymnasium.vector import SyncVectorEnv, VectorEnv

from aiocollect._engine.storage import OutputSpec
from aiocollect._engine.timelines import IdPool
from aiocollect._envs.build import make_group
from aiocollect._envs.group import InProcessGroup, VectorEnvGroup
from support.envs import StepEnv

# --------------------------------------------------------------------------- IdPool, OutputSpec


def test_id_pool_hands_out_increasing_ids():
    pool = IdPool(5)
    first = pool.take(3)
    assert first.tolist() == [5, 6, 7] and first.dtype == np.int64
    assert pool.take(0).tolist() == [] and pool.next == 8
    assert pool.take(2).tolist() == [8, 9]


def test_output_spec_of_numpy_and_torch_values_drops_the_env_dim():
    assert OutputSpec.of(np.zeros((4, 2, 3), np.float64)) == OutputSpec((2, 3), torch.float64)
    assert OutputSpec.of(torch.zeros(4, dtype=torch.int32)) == OutputSpec((), torch.int32)
    readonly = np.zeros((2, 5), np.float32)
    readonly.flags.writeable = False
    assert OutputSpec.of(readonly) == OutputSpec((5,), torch.float32)




# --------------------------------------------------------------------------- make_group, InProcessGroup


def test_make_group_of_a_list_is_batched_and_of_one_factory_is_not():
    group, batched = make_group([lambda: StepEnv(2), lambda: StepEnv(3)], None)
    assert isinstance(group, InProcessGroup) and batched is True and group.num_envs == 2
    assert [env.length for env in group.envs] == [2, 3]
    group.close()
    group, batched = make_group(StepEnv, {"length": 4})
    assert isinstance(group, InProcessGroup) and batched is False and group.envs[0].length == 4
    group.close()
    group, batched = make_group("CartPole-v1", None)
    assert batched is False and group.obs["observation"].shape == (1, 4)
    group.close()


def test_make_group_of_a_vector_env_is_batched():
    group, batched = make_group(lambda: SyncVectorEnv([StepEnv] * 3), None)
    assert isinstance(group, VectorEnvGroup) and batched is True and group.num_envs == 3
    group.close()


class _SingleSpacesOnly(VectorEnv):
    """A hand-written VectorEnv that sets what gymnasium asks of one (``num_envs`` and the
    ``single_*`` spaces) and not the batched ``observation_space``/``action_space``."""

    def __init__(self, spaces_set: bool = True):
        self.num_envs = 2
        if spaces_set:
            self.single_observation_space = spaces.Box(-1, 1, (3,), np.float32)
            self.single_action_space = spaces.Discrete(2)


def test_a_vector_env_needs_only_its_single_spaces():
    group, batched = make_group(_SingleSpacesOnly, None)
    assert isinstance(group, VectorEnvGroup) and batched and group.num_envs == 2
    with pytest.raises(TypeError, match=r"create_env_fn gave .*_SingleSpacesOnly, which has no "
                                        r"single_observation_space; a gymnasium VectorEnv sets "
                                        r"self.single_observation_space"):
        make_group(lambda: _SingleSpacesOnly(spaces_set=False), None)


def test_an_attribute_error_inside_a_space_property_is_not_taken_for_a_missing_space():
    class Typo(gym.Env):
        action_space = spaces.Discrete(2)

        @property
        def observation_space(self):
            return self.obsevation_spec  # a typo inside the property: the user needs that error

    with pytest.raises(AttributeError, match="obsevation_spec"):
        make_group(Typo, None)


@pytest.mark.parametrize(("create_env_fn", "message"), [
    ([StepEnv, lambda: SyncVectorEnv([StepEnv])], "create_env_fn[1] gave a VectorEnv"),
    ([StepEnv, lambda: 3], "create_env_fn[1] gave builtins.int, not a gymnasium env"),
    (lambda: "CartPole-v1", "create_env_fn gave builtins.str, not a gymnasium env"),
])
def test_make_group_rejects_factories_that_give_no_single_env(create_env_fn, message):
    with pytest.raises(TypeError) as info:
        make_group(create_env_fn, None)
    assert message in str(info.value)


def test_make_group_closes_the_envs_it_built_when_a_later_one_fails():
    built = []

    def factory():
        built.append(StepEnv())
        return built[-1]

    with pytest.raises(TypeError, match=r"create_env_fn\[2\]"):
        make_group([factory, factory, lambda: None], None)
    assert len(built) == 2 and all(env.closed for env in built)


def test_in_process_group_rejects_envs_with_different_spaces():
    other = StepEnv()
    other.action_space = spaces.Discrete(5)
    with pytest.raises(ValueError, match=r"create_env_fn: env 1 has spaces .* env 0 has"):
        InProcessGroup([StepEnv(), other])


def test_in_process_group_blames_the_env_that_raised():
    class Broken(StepEnv):
        def step(self, action):
            raise RuntimeError("boom")

    group = InProcessGroup([StepEnv(), StepEnv(), Broken()])
    group.reset_now(np.arange(3))
    with pytest.raises(RuntimeError, match="boom") as info:
        group.step_now(np.zeros(3, np.int64))
    assert info.value.env_index == 2
    assert "(raised by env 2 of the group)" in info.value.__notes__
    # the envs before it did step and wrote their rows
    assert group.obs["observation"][:, 0].tolist() == [1, 1, 0]


def test_a_vector_env_error_is_marked_as_coming_from_the_group_without_an_index():
    class Broken(StepEnv):
        def step(self, action):
            raise RuntimeError("vector boom")

    group = VectorEnvGroup(SyncVectorEnv([StepEnv, Broken]))
    group.reset_now(np.arange(2))
    with pytest.raises(RuntimeError, match="vector boom") as info:
        group.step_now(np.zeros(2, np.int64))
    assert info.value.env_index is None
    assert not getattr(info.value, "__notes__", [])
    group.close()


def test_in_process_group_resets_only_the_given_envs_with_their_seeds():
    group = InProcessGroup([StepEnv(tag=0), StepEnv(tag=1), StepEnv(tag=2)])
    group.reset_now(np.arange(3))
    group.step_now(np.array([1, 2, 3]))
    assert group.reward.tolist() == [11, 21, 31]
    group.reset_now(np.array([1]), seeds=[10, 11, 12])
    assert group.obs["observation"].tolist() == [[1, 0, -1], [0, 1, 11], [1, 2, -1]]

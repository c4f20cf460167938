"""The one writer of a policy's outputs (``_policies.output_writer``), used by the engine's
storage and by a worker's copy of the policy alike: fields laid out at a key's first call or
adopted from shared memory, blocks of rows (``write_block``) and rows each at its own column
(``write``), a part of each value, the checked action stored instead of the raw one, and the
checks every value passes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from aiocollect._envs.spaces import ActionCheck, NonFiniteAction
from aiocollect._policies.output_writer import OutputSpec, OutputWriter, env_actions

K, T, N = 2, 3, 4


def test_a_fields_layout_comes_from_its_first_call_and_a_block_goes_to_its_column():
    w = OutputWriter(K, T, N)
    out = {"action": torch.tensor([1, 0]), "logits": torch.arange(4.0).reshape(2, 2)}
    w.write_block(1, 2, 1, 3, out)
    assert w.specs == {"action": OutputSpec((), torch.int64), "logits": OutputSpec((2,), torch.float32)}
    assert w.arrays["logits"].shape == (K, T, N, 2) and w.tensors["logits"].shape == (K, T, N, 2)
    assert w.arrays["action"][1, 2].tolist() == [0, 1, 0, 0]
    assert w.arrays["logits"][1, 2, 1:3].tolist() == [[0.0, 1.0], [2.0, 3.0]]
    assert not w.arrays["logits"][0].any()  # (the other slot untouched)


def test_rows_each_at_their_own_column_and_a_part_of_each_value():
    w = OutputWriter(K, T, N)
    w.write((0, np.array([2, 0]), np.array([3, 1])), {"v": torch.tensor([7.0, 8.0])})
    assert w.arrays["v"][0, 2, 3] == 7.0 and w.arrays["v"][0, 0, 1] == 8.0
    w.write_block(1, 1, 0, 2, {"v": torch.tensor([1.0, 2.0, 3.0, 4.0])}, part=slice(2, 4))
    assert w.arrays["v"][1, 1, :2].tolist() == [3.0, 4.0]


def test_the_checked_action_is_stored_instead_of_the_policys():
    w = OutputWriter(K, T, N)
    w.write_block(0, 0, 0, 2, {"action": torch.tensor([0.0, 1.0])}, np.array([5, 6]))
    assert w.arrays["action"][0, 0, :2].tolist() == [5, 6]


def test_adopted_fields_are_written_in_place():
    shared = {"out0": np.zeros((K, T, N, 3), np.float32), "out1": np.zeros((K, T, N), np.int64)}
    w = OutputWriter(K, T, N)
    w.adopt([("logits", np.dtype(np.float32), (3,)), ("action", np.dtype(np.int64), ())], shared)
    w.write_block(1, 0, 2, 4, {"logits": torch.ones(2, 3), "action": torch.tensor([1, 1])})
    assert shared["out0"][1, 0, 2:].sum() == 6 and shared["out1"][1, 0].tolist() == [0, 0, 1, 1]


def test_a_value_that_changes_shape_or_kind_is_refused_with_its_name():
    w = OutputWriter(K, T, N)
    w.write_block(0, 0, 0, 2, {"v": torch.zeros(2, 3, dtype=torch.int32)})
    with pytest.raises(ValueError, match=r"v: the policy returned shape \[1\] per env here, \[3\]"):
        w.write_block(0, 1, 0, 2, {"v": torch.zeros(2, 1, dtype=torch.int32)})  # (numpy would broadcast it)
    with pytest.raises(TypeError, match="v: the policy returned dtype float32 here, int32"):
        w.write((0, np.array([1, 1]), np.array([0, 1])), {"v": torch.zeros(2, 3)})
    w.write_block(0, 1, 0, 2, {"v": torch.ones(2, 3, dtype=torch.int64)})  # (within its kind: cast)
    assert w.arrays["v"][0, 1, :2].tolist() == [[1, 1, 1]] * 2
    with pytest.raises(ValueError, match=r"v: the policy returned shape \[3, 3\] for 2 env"):
        w.write_block(0, 2, 0, 2, {"v": torch.ones(3, 3, dtype=torch.int32)}, rows=2)  # (rows checked: a worker's)
    with pytest.raises(TypeError, match="v: the policy returned a list; return a tensor"):
        w.write_block(0, 2, 0, 2, {"v": [[1, 1, 1]] * 2}, rows=2)


def test_a_dtype_numpy_lacks_gets_a_torch_field():
    w = OutputWriter(K, T, N)
    value = torch.tensor([[1.5], [2.5]], dtype=torch.bfloat16)
    w.write_block(0, 1, 0, 2, {"h": value})
    w.write((1, np.array([0, 2]), np.array([3, 2])), {"h": value})
    assert w.arrays["h"] is None and w.tensors["h"].dtype == torch.bfloat16
    assert w.tensors["h"][0, 1, :2, 0].tolist() == [1.5, 2.5] and w.tensors["h"][1, 2, 2, 0] == 2.5


def test_env_actions_checks_and_converts_as_the_envs_take_them():
    check = ActionCheck.for_space(spaces.Discrete(3))
    stored, to_env = env_actions(check, np.array([True, False]), 2)  # (booleans: stored as the indices)
    assert stored.dtype == check.dtype and stored.tolist() == to_env.tolist() == [1, 0]
    stored, to_env = env_actions(check, np.array([[0, 0, 1], [1, 0, 0]]), 2)  # (one-hot rows: indices to the envs)
    assert stored.shape == (2, 3) and to_env.tolist() == [2, 0]
    with pytest.raises(NonFiniteAction):
        env_actions(ActionCheck.for_space(spaces.Box(-1, 1, (1,))), np.array([[0.0], [np.nan]], np.float32), 2)

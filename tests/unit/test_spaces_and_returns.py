"""From gymnasium spaces to tensor layouts, and episode returns.

``_envs.spaces``: ``flatten_space`` (keys, shapes and dtypes of every supported space,
nested Dicts, the errors for the others), ``nest``/``get_path``, ``ObsWriter`` and
``ActionCheck`` (which actions pass, which fail and what the error says: a Box action that is
not finite too, naming its row; a finite one outside the bounds passes as it is).
``_collectors.progress.EpisodeReturns``: returns summed per trajectory id across batches,
the window of recent returns, and the cap on open trajectories.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces
from tensordict import TensorDict

from aiocollect._collectors.progress import EpisodeReturns
from aiocollect._envs.spaces import ActionCheck, Leaf, NonFiniteAction, ObsWriter, flatten_space, get_path, nest

# --------------------------------------------------------------------------- flatten_space


@pytest.mark.parametrize(("space", "shape", "dtype"), [
    (spaces.Box(-1, 1, (3,), np.float32), (3,), np.float32),
    (spaces.Box(0, 255, (2, 4, 4), np.uint8), (2, 4, 4), np.uint8),
    (spaces.Box(-1, 1, (), np.float64), (), np.float64),
    (spaces.Discrete(5), (), np.int64),
    (spaces.Discrete(3, start=-1), (), np.int64),
    (spaces.MultiDiscrete([2, 3, 4]), (3,), np.int64),
    (spaces.MultiDiscrete([[2, 3], [4, 5]]), (2, 2), np.int64),
    (spaces.MultiBinary(6), (6,), np.int8),
    (spaces.MultiBinary([2, 3]), (2, 3), np.int8),
])
def test_a_flat_space_is_one_leaf_under_the_default_key(space, shape, dtype):
    leaves = flatten_space(space, "observation", "observation_space")
    assert leaves == [Leaf((), "observation", shape, np.dtype(dtype), space)]
    assert flatten_space(space, "action", "action_space")[0].key == "action"


def test_a_nested_dict_becomes_nested_keys_in_the_dicts_order():
    space = spaces.Dict({
        "pos": spaces.Box(-1, 1, (2,), np.float64),
        "cell": spaces.Discrete(5),
        "nest": spaces.Dict({
            "t": spaces.Box(0, 9, (1,), np.float32),
            "deeper": spaces.Dict({"bits": spaces.MultiBinary(4), "md": spaces.MultiDiscrete([2, 3])}),
        }),
    })
    leaves = flatten_space(space, "observation", "observation_space")
    # gymnasium sorts a Dict's keys; the leaves follow that order, depth first
    assert [(leaf.path, leaf.key, leaf.shape, leaf.dtype) for leaf in leaves] == [
        (("cell",), "cell", (), np.dtype(np.int64)),
        (("nest", "deeper", "bits"), ("nest", "deeper", "bits"), (4,), np.dtype(np.int8)),
        (("nest", "deeper", "md"), ("nest", "deeper", "md"), (2,), np.dtype(np.int64)),
        (("nest", "t"), ("nest", "t"), (1,), np.dtype(np.float32)),
        (("pos",), "pos", (2,), np.dtype(np.float64)),
    ]
    assert leaves[0].space == spaces.Discrete(5)


_HINT = ("is not supported; use Box, Discrete, MultiDiscrete, MultiBinary or a Dict of those (wrap the env "
         "with gymnasium.wrappers.FlattenObservation to turn a Tuple space into a Box).")


@pytest.mark.parametrize(("space", "message"), [
    (spaces.Tuple([spaces.Discrete(2)]), f"observation_space: gymnasium space Tuple {_HINT}"),
    (spaces.Text(5), f"observation_space: gymnasium space Text {_HINT}"),
    (spaces.Dict({"a": spaces.Dict({"b": spaces.Tuple([spaces.Discrete(2)])})}),
     f"observation_space['a']['b']: gymnasium space Tuple {_HINT}"),
    (spaces.Dict({}), "observation_space is an empty Dict space; give the env at least one entry."),
    (spaces.Dict({"x": spaces.Box(0, 1, (1,)), "y": spaces.Dict({})}),
     "observation_space['y'] is an empty Dict space; give the env at least one entry."),
    (3, "observation_space must be a gymnasium.spaces.Space, got int"),
    ((spaces.Discrete(2),), "observation_space must be a gymnasium.spaces.Space, got tuple"),
])
def test_unsupported_spaces_are_rejected_naming_where_they_are(space, message):
    with pytest.raises(TypeError) as info:
        flatten_space(space, "observation", "observation_space")
    assert str(info.value) == message


def test_nest_and_get_path():
    assert nest({("next", "obs"): 1, "a": 2, ("next", "x", "y"): 3, ("b",): 4}) == {
        "next": {"obs": 1, "x": {"y": 3}}, "a": 2, "b": 4,
    }
    value = {"a": {"b": {"c": 7}}, "d": 1}
    assert get_path(value, ("a", "b", "c")) == 7
    assert get_path(value, ()) is value


# --------------------------------------------------------------------------- ObsWriter


def test_obs_writer_writes_a_flat_observation_per_env_and_batched():
    leaves = flatten_space(spaces.Box(-1, 1, (2,), np.float32), "observation", "obs")
    arrays = {"observation": np.zeros((3, 2), np.float32)}
    writer = ObsWriter(leaves, arrays)
    assert writer.flat and writer.flat_array is arrays["observation"]
    writer.write_one(1, np.array([0.5, -0.5]))
    assert arrays["observation"].tolist() == [[0, 0], [0.5, -0.5], [0, 0]]
    writer.write_one(np.array([0, 2]), np.array([[1, 2], [3, 4]]))
    assert arrays["observation"].tolist() == [[1, 2], [0.5, -0.5], [3, 4]]
    writer.write_all(np.full((3, 2), 9.0))
    assert (arrays["observation"] == 9).all()


def test_obs_writer_writes_nested_dict_observations_into_their_leaves():
    space = spaces.Dict({"pos": spaces.Box(-5, 5, (2,), np.float32),
                         "nest": spaces.Dict({"cell": spaces.Discrete(4)})})
    leaves = flatten_space(space, "observation", "obs")
    arrays = {leaf.key: np.zeros((2, *leaf.shape), leaf.dtype) for leaf in leaves}
    writer = ObsWriter(leaves, arrays)
    assert not writer.flat
    writer.write_one(1, {"pos": np.array([1.0, 2.0]), "nest": {"cell": 3}})
    assert arrays["pos"].tolist() == [[0, 0], [1, 2]]
    assert arrays[("nest", "cell")].tolist() == [0, 3]
    writer.write_all({"pos": np.array([[3.0, 4.0], [5.0, 5.0]]), "nest": {"cell": np.array([2, 1])}})
    assert arrays["pos"].tolist() == [[3, 4], [5, 5]]
    assert arrays[("nest", "cell")].tolist() == [2, 1]


def test_a_dict_with_one_entry_is_not_the_flat_case():
    leaves = flatten_space(spaces.Dict({"x": spaces.Discrete(3)}), "observation", "obs")
    arrays = {"x": np.zeros(2, np.int64)}
    writer = ObsWriter(leaves, arrays)
    assert not writer.flat
    writer.write_one(0, {"x": 2})
    assert arrays["x"].tolist() == [2, 0]


# --------------------------------------------------------------------------- ActionCheck


@pytest.mark.parametrize(("space", "action"), [
    (spaces.Discrete(3), np.array([0, 2], np.int64)),
    (spaces.Discrete(3, start=1), np.array([1, 3], np.int32)),
    (spaces.Discrete(256), np.array([255, 0], np.uint8)),
    (spaces.MultiDiscrete([3, 4]), np.array([[2, 3], [0, 0]], np.int64)),
    (spaces.MultiDiscrete([3, 4], start=[1, -2]), np.array([[3, 1], [1, -2]], np.int64)),
    (spaces.MultiBinary(3), np.array([[0, 1, 1], [1, 0, 0]], np.int8)),
    (spaces.MultiBinary(3), np.array([[True, False, True], [False, False, False]])),
    (spaces.Box(-1, 1, (2,), np.float32), np.array([[0.5, -0.5], [5.0, 0.0]], np.float32)),  # Box: no range check
    (spaces.Box(-1, 1, (2,), np.float32), np.zeros((2, 2), np.float64)),
])
def test_actions_that_fit_the_space_pass(space, action):
    ActionCheck.for_space(space)(action, 2)


@pytest.mark.parametrize(("space", "action", "to_env"), [
    # TorchRL stores what the policy writes, and its env takes it: so does the batch here; the envs
    # get the same values in the space's shape, cast to its dtype by their action array
    (spaces.Box(-1, 1, (2,), np.float32), np.array([[1, 0], [0, -1]], np.int64), [[1, 0], [0, -1]]),
    (spaces.Box(-1, 1, (1,), np.float32), np.array([0.5, -0.5], np.float32), [[0.5], [-0.5]]),
    (spaces.Box(-1, 1, (1, 1), np.float32), np.array([[0.5], [-0.5]], np.float32), [[[0.5]], [[-0.5]]]),
    (spaces.Discrete(3), np.array([[0], [2]], np.int64), [0, 2]),
    (spaces.Discrete(3), np.array([0.0, 2.0], np.float32), [0, 2]),
    (spaces.MultiBinary(1), np.array([1, 0], np.int8), [[1], [0]]),
])
def test_an_action_of_another_dtype_or_per_env_shape_is_stored_as_written(space, action, to_env):
    check = ActionCheck.for_space(space)
    assert check(action, 2) is action
    given = check.env_action(action)
    assert given.shape == (2, *check.shape) and given.tolist() == to_env


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_float_discrete_action_that_is_not_finite_is_refused_naming_its_row(bad):
    with pytest.raises(NonFiniteAction) as info:
        ActionCheck.for_space(spaces.Discrete(3))(np.array([1.0, bad]), 2)
    assert info.value.row == 1


def test_for_space_records_the_bounds_of_each_kind_of_space():
    check = ActionCheck.for_space(spaces.Discrete(4, start=2))
    assert (check.shape, check.dtype, check.low, check.high) == ((), np.dtype(np.int64), 2, 5)
    check = ActionCheck.for_space(spaces.MultiDiscrete([3, 4], start=[1, 0]))
    assert check.low.tolist() == [1, 0] and check.high.tolist() == [3, 3] and check.shape == (2,)
    check = ActionCheck.for_space(spaces.MultiBinary(2))
    assert (check.low, check.high, check.dtype) == (0, 1, np.dtype(np.int8))
    check = ActionCheck.for_space(spaces.Box(-1, 1, (3,), np.float32))
    assert (check.low, check.high, check.shape) == (None, None, (3,))


@pytest.mark.parametrize(("space", "action", "error", "message"), [
    (spaces.Discrete(3), np.array([0, 1, 2], np.int64), ValueError,
     "action: the policy returned shape [3] for 2 env(s), expected [2] for Discrete(3). Return one row per env: "
     "keep the first (batch) dim of the observations the policy is given."),
    (spaces.Discrete(3), np.array([[0, 1], [1, 0]], np.int64), ValueError,
     "action: the policy returned shape [2, 2] for 2 env(s), expected [2] for Discrete(3). A one-hot action has "
     "shape [num_envs, 3], one column per action. The policy gave 2 values per env: return one int64 index per "
     "env (an argmax over the 3 actions' scores, or a Categorical sample), or one-hot rows of 3 columns (a last "
     "layer with 3 outputs)."),
    (spaces.Box(-1, 1, (2,), np.float32), np.zeros(2, np.float32), ValueError,
     "action: the policy returned shape [2] for 2 env(s), expected [2, 2] for Box(-1.0, 1.0, (2,), float32). "
     "Return one action of shape [2] per env: a tensor of shape [2, 2] (reshape the policy's output to it)."),
    (spaces.Box(-1, 1, (2,), np.float32), np.zeros((2, 2), "U1"), TypeError,
     "action: the policy returned dtype <U1 for Box(-1.0, 1.0, (2,), float32); a Box action must be a "
     "real-valued tensor (floating-point, or integer)."),
    (spaces.Discrete(3), np.array([0.5, 1.0]), TypeError,
     "action: the policy returned dtype float64 for Discrete(3), with values that are not whole numbers; "
     "discrete actions are integer indices of shape [num_envs] (argmax, or a Categorical sample), or one-hot "
     "rows of shape [num_envs, n]; not float scores."),
    (spaces.Discrete(3), np.array([[0.0], [3.0]]), ValueError,
     "action: the policy returned values outside Discrete(3) (min 0.0, max 3.0; allowed 0..2)."),
    (spaces.Discrete(3), np.array([0, 3], np.int64), ValueError,
     "action: the policy returned values outside Discrete(3) (min 0, max 3; allowed 0..2)."),
    (spaces.Discrete(3, start=1), np.array([0, 1], np.int64), ValueError,
     "action: the policy returned values outside Discrete(3, start=1) (min 0, max 1; allowed 1..3)."),
    (spaces.Discrete(3), np.array([-1, 0], np.int64), ValueError,
     "action: the policy returned values outside Discrete(3) (min -1, max 0; allowed 0..2)."),
    (spaces.MultiDiscrete([3, 4]), np.array([[2, 4], [0, 0]], np.int64), ValueError,
     "action: the policy returned values outside MultiDiscrete([3 4]) (min 0, max 4; allowed [0 0]..[2 3])."),
    (spaces.MultiBinary(2), np.array([[0, 2], [1, 1]], np.int8), ValueError,
     "action: the policy returned values outside MultiBinary(2) (min 0, max 2; allowed 0..1)."),
])
def test_actions_that_do_not_fit_are_rejected_with_a_clear_error(space, action, error, message):
    with pytest.raises(error) as info:
        ActionCheck.for_space(space)(action, 2)
    assert type(info.value) is error
    assert str(info.value) == message


@pytest.mark.parametrize("size", [2, 40])  # (a small batch is summed in Python, a larger one tested by numpy)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_box_action_that_is_not_finite_is_refused_naming_its_row(bad, size):
    check = ActionCheck.for_space(spaces.Box(-1, 1, (2,), np.float32))
    action = np.full((size, 2), 5.0, np.float32)  # outside the bounds, finite: the envs get it as it is
    assert check(action, size) is action
    action[size - 2, 1] = bad
    action[size - 1, 0] = np.nan
    with pytest.raises(NonFiniteAction) as info:
        check(action, size)
    assert info.value.row == size - 2 and info.value.value == np.array2string(action[size - 2])
    assert str(bad) in info.value.value


def test_a_finite_action_whose_sum_overflows_passes():
    check = ActionCheck.for_space(spaces.Box(-np.inf, np.inf, (2,), np.float64))
    huge = np.full((2, 2), 1e308)  # (its sum is inf: then each value is tested)
    assert check(huge, 2) is huge


def test_a_multi_discrete_value_is_checked_against_its_own_column():
    check = ActionCheck.for_space(spaces.MultiDiscrete([2, 5]))
    check(np.array([[1, 4]]), 1)
    with pytest.raises(ValueError, match="values outside"):
        check(np.array([[2, 0]]), 1)  # 2 fits column 1's range but not column 0's


@pytest.mark.parametrize("size", [2, 65])
@pytest.mark.parametrize(("start", "n"), [(0, 2), (0, 6), (-3, 5), (100, 5), (-128, 3), (0, 300)])
@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int64, np.uint8, np.uint32, np.uint64, np.bool_])
def test_the_one_comparison_range_test_agrees_with_two_comparisons_at_every_edge(start, n, dtype, size):
    """``in_range`` reads ``action - low`` as unsigned: values just outside the range, the
    dtype's extremes (where the subtraction wraps) and bounds the dtype cannot hold; for a
    small batch (a list's max) and a large one (one numpy comparison)."""
    check = ActionCheck.for_space(spaces.Discrete(n, start=start))
    if dtype is np.bool_:
        candidates = [False, True]
    else:
        info = np.iinfo(dtype)
        near = range(start - 2, start + n + 2)
        extremes = {info.min, info.min + 1, info.max - 1, info.max}
        candidates = sorted(extremes | {v for v in near if info.min <= v <= info.max})
    for value in candidates:
        action = np.array([start if info_ok(start, dtype) else value] * (size - 1) + [value], dtype=dtype)
        expected = bool(((action >= start) & (action <= start + n - 1)).all())
        assert check.in_range(action) is expected, (value, action)
        if not expected:
            with pytest.raises(ValueError, match="values outside"):
                check(action, size)


def test_a_byte_swapped_integer_action_is_read_by_its_value():
    check = ActionCheck.for_space(spaces.Discrete(4))
    big_endian = np.array([1, 3], ">i4")
    assert check(big_endian, 2) is big_endian
    with pytest.raises(ValueError, match="values outside"):
        check(np.array([1, 4], ">i4"), 2)


def info_ok(value: int, dtype) -> bool:
    return dtype is not np.bool_ and np.iinfo(dtype).min <= value <= np.iinfo(dtype).max


def test_multi_discrete_one_hot_parts_side_by_side_step_the_envs_with_each_parts_index():
    check = ActionCheck.for_space(spaces.MultiDiscrete([2, 3], start=[0, 1]))
    assert (check.one_hot, check.parts) == (5, (2, 3))
    rows = np.array([[0, 1, 0, 0, 1], [1, 0, 1, 0, 0]], np.uint8)  # TorchRL's MultiOneHot layout
    assert check(rows, 2) is rows  # the batch keeps the rows
    assert check.env_action(rows).tolist() == [[1, 3], [0, 1]]  # start added
    indices = np.array([[1, 3], [0, 1]])
    assert check.env_action(check(indices, 2)) is indices
    tie = np.array([[0, 1, 0, 1, 1], [1, 1, 0, 0, 1]])  # several 1s in a part: the first is the index
    assert check.env_action(check(tie, 2)).tolist() == [[1, 2], [0, 3]]
    logits = np.array([[0.3, 2.7, -1.0, 0.5, 1.2], [-3.0, -0.5, 0.2, 0.1, 0.9]], np.float32)
    with pytest.warns(UserWarning, match=r"are not one-hot; they are read as TorchRL reads them"):
        assert check(logits, 2) is logits
    assert check.env_action(logits).tolist() == [[1, 3], [1, 1]]  # argmax of [0, 2], [0, 0, 1]; [-3, 0], [0, 0, 0]


def test_zero_envs_means_an_empty_action_passes():
    ActionCheck.for_space(spaces.Discrete(3))(np.zeros(0, np.int64), 0)


@pytest.mark.parametrize(("space", "message"), [
    (spaces.Dict({"a": spaces.Discrete(2)}), "action_space: Dict action spaces are not supported yet"),
    (spaces.Tuple([spaces.Discrete(2)]), "action_space: gymnasium space Tuple is not supported"),
])
def test_unsupported_action_spaces_are_rejected(space, message):
    with pytest.raises(TypeError) as info:
        ActionCheck.for_space(space)
    assert str(info.value).startswith(message)


# --------------------------------------------------------------------------- EpisodeReturns


def _batch(ids, reward, done, mask=None) -> TensorDict:
    ids = torch.tensor(ids, dtype=torch.int64)
    td = TensorDict({
        "collector": {"traj_ids": ids},
        "next": {"reward": torch.tensor(reward, dtype=torch.float32).reshape(*ids.shape, 1),
                 "done": torch.tensor(done, dtype=torch.bool).reshape(*ids.shape, 1)},
    }, batch_size=ids.shape)
    if mask is not None:
        td["collector", "mask"] = torch.tensor(mask, dtype=torch.bool)
    return td


def test_no_returns_until_an_episode_finishes():
    returns = EpisodeReturns()
    assert returns.mean is None and returns.episodes == 0
    returns.add(_batch([0, 0, 0], [1.0, 2.0, 3.0], [False, False, False]))
    assert returns.mean is None and returns.episodes == 0
    assert dict(returns._partial) == {0: 6.0}


def test_an_episode_is_summed_across_batches():
    returns = EpisodeReturns()
    returns.add(_batch([[0, 0, 0], [1, 1, 2]], [[1, 2, 3], [10, 20, 5]], [[0, 0, 0], [0, 1, 0]]))
    assert list(returns.recent) == [30.0] and returns.episodes == 1
    returns.add(_batch([[0, 0, 3], [2, 2, 2]], [[4, 5, 7], [6, 7, 8]], [[0, 1, 0], [0, 0, 1]]))
    assert list(returns.recent) == [30.0, 15.0, 26.0]  # ids 1, then 0 and 2 in id order
    assert returns.episodes == 3
    assert returns.mean == pytest.approx((30 + 15 + 26) / 3)
    assert dict(returns._partial) == {3: 7.0}


def test_batches_from_different_workers_arrive_in_any_order():
    a, b = EpisodeReturns(), EpisodeReturns()
    first = _batch([5, 5, 5], [1, 1, 1], [0, 0, 0])
    last = _batch([5, 5, 6], [2, 2, 4], [0, 1, 0])
    other = _batch([7, 7], [0.5, 0.5], [0, 1])
    for batch in (first, other, last):
        a.add(batch)
    for batch in (other, first, last):
        b.add(batch)
    assert sorted(a.recent) == sorted(b.recent) == [1.0, 7.0]


def test_masked_out_and_blank_frames_are_not_counted():
    returns = EpisodeReturns()
    # an interrupted batch: the tail is masked out, and blanked with id -1
    returns.add(_batch([[0, 0, -1], [1, 1, 1]], [[1, 2, 99], [3, 4, 50]], [[0, 1, 1], [0, 0, 1]],
                       mask=[[1, 1, 0], [1, 1, 0]]))
    assert list(returns.recent) == [3.0]
    assert dict(returns._partial) == {1: 7.0}
    returns.add(_batch([-1, -1], [5, 5], [1, 1]))  # no mask, but ids -1: nothing real
    assert list(returns.recent) == [3.0] and returns.episodes == 1


def test_the_marks_of_set_truncated_are_not_episode_ends():
    returns = EpisodeReturns()
    first = _batch([[0, 0, 0], [1, 1, 1]], [[1, 1, 1], [2, 2, 2]], [[0, 0, 1], [0, 0, 1]])
    first["next", "terminated"] = torch.tensor([[0, 0, 0], [0, 0, 1]], dtype=torch.bool).reshape(2, 3, 1)
    returns.add(first, set_truncated=True)
    assert list(returns.recent) == [6.0]  # env 1 terminated on the last step; env 0's episode goes on
    second = _batch([[0, 0, 2]], [[1, 1, 1]], [[0, 1, 1]])
    second["next", "terminated"] = torch.tensor([[0, 1, 0]], dtype=torch.bool).reshape(1, 3, 1)
    returns.add(second, set_truncated=True)
    assert list(returns.recent) == [6.0, 5.0] and returns.episodes == 2
    returns.add(first)  # without set_truncated, a done is an end
    assert list(returns.recent) == [6.0, 5.0, 3.0, 6.0]


def test_the_window_keeps_only_the_latest_returns():
    returns = EpisodeReturns(window=2)
    for tid, reward in enumerate([1.0, 2.0, 4.0]):
        returns.add(_batch([tid], [reward], [True]))
    assert list(returns.recent) == [2.0, 4.0]
    assert returns.mean == 3.0
    assert returns.episodes == 3


def test_open_trajectories_are_capped_forgetting_the_least_recently_extended():
    returns = EpisodeReturns(max_open=2)
    returns.add(_batch([[1, 1], [2, 2]], [[1, 1], [1, 1]], [[0, 0], [0, 0]]))
    returns.add(_batch([[1, 1], [3, 3]], [[1, 1], [1, 1]], [[0, 0], [0, 0]]))
    assert list(returns._partial) == [1, 3]  # 2 went longest without a new frame
    assert returns._partial[1] == 4.0
    returns.add(_batch([2, 2], [5, 5], [0, 1]))  # its first frames were forgotten
    assert list(returns.recent) == [10.0]


def test_batches_without_trajectory_ids_or_none_are_ignored():
    returns = EpisodeReturns()
    returns.add(None)
    returns.add(TensorDict({"next": {"reward": torch.ones(3, 1), "done": torch.ones(3, 1, dtype=torch.bool)}},
                           batch_size=[3]))
    assert returns.episodes == 0 and returns.mean is None and not returns._partial


def test_rewards_are_summed_in_double_precision():
    returns = EpisodeReturns()
    returns.add(_batch([0] * 4, [1e8, 1.0, 1.0, 1.0], [0, 0, 0, 1]))
    assert list(returns.recent) == [1e8 + 3]  # in float32 each +1 is lost: 1e8


def _reference_returns(batches) -> tuple[list[float], dict[int, float]]:
    """Returns summed per id, frame by frame: what ``EpisodeReturns`` must give."""
    partial: dict[int, float] = {}
    finished: list[float] = []
    for ids, reward, done in batches:
        ended = {tid for tid, d in zip(ids, done) if d and tid >= 0}
        for tid, r in zip(ids, reward):
            if tid >= 0:
                partial[tid] = partial.get(tid, 0.0) + float(r)
        finished += [partial.pop(tid) for tid in sorted(ended, key=list(dict.fromkeys(ids)).index)]
    return finished, partial


@pytest.mark.parametrize("seed", range(6))
def test_returns_match_a_frame_by_frame_sum_whatever_the_layout(seed):
    rng = np.random.default_rng(seed)
    envs, steps, batches = 4, 12, 5
    next_id, current = envs, list(range(envs))
    returns, seen = EpisodeReturns(), []
    for _ in range(batches):
        ids = np.empty((envs, steps), np.int64)
        done = rng.random((envs, steps)) < 0.15
        for e in range(envs):  # each env's row, in time order, a new id after each end
            for t in range(steps):
                ids[e, t] = current[e]
                if done[e, t]:
                    current[e], next_id = next_id, next_id + 1
        reward = rng.integers(-3, 4, (envs, steps)).astype(np.float32)
        if seed % 2:  # ids in two places of one batch: the first row again, at the end
            ids, done, reward = (np.concatenate([x, x[:1]], 0) for x in (ids, done, reward))
        seen.append((ids.reshape(-1), reward.reshape(-1), done.reshape(-1)))
        returns.add(_batch(ids.tolist(), reward.tolist(), done.tolist()))
    finished, partial = _reference_returns(seen)
    assert sorted(returns.recent) == pytest.approx(sorted(finished[-100:]))
    assert returns.episodes == len(finished)
    assert dict(returns._partial) == pytest.approx(partial)


@pytest.mark.parametrize("unchecked", [True, False])
def test_a_batch_tensordict_is_the_one_the_public_constructor_builds(unchecked, monkeypatch):
    from aiocollect._collectors import delivery as base

    flat = {"obs": torch.arange(6.0).reshape(2, 3), ("next", ("pos", "x")): torch.ones(2, 3, 1),
            ("collector", "traj_ids"): torch.zeros(2, 3, dtype=torch.int64)}
    if not unchecked:  # a tensordict without the unchecked constructor: the public one
        monkeypatch.setattr(base, "_UNCHECKED", None)
    td = base.batch_tensordict(nest(flat), torch.Size([2, 3]), torch.device("cpu"))
    expected = TensorDict(nest(flat), batch_size=[2, 3], device="cpu", names=[None, "time"])
    assert (td == expected).all() and td.device == expected.device
    assert set(td.keys(True, True)) == {"obs", ("next", "pos", "x"), ("collector", "traj_ids")}
    for sub in (td, td["next"], td["next", "pos"], td["collector"]):
        assert sub.batch_size == (2, 3) and sub.names == [None, "time"]
    assert td[0].batch_size == (3,) and td.reshape(-1).batch_size == (6,)


_MULTI_AGENT = {  # a multi-agent env's batch: groups with private entries, keys within keys, the engine's own
    ("agents", "observation"): torch.arange(24.0).reshape(2, 3, 4),
    ("agents", "_mask"): torch.ones(2, 3, dtype=torch.bool),
    ("next", ("agents", "observation")): torch.ones(2, 3, 4), ("next", ("agents", "reward")): torch.ones(2, 3, 1),
    "action": torch.zeros(2, 3, dtype=torch.int64), ("next", "done"): torch.zeros(2, 3, 1, dtype=torch.bool),
    "done": torch.zeros(2, 3, 1, dtype=torch.bool), ("collector", "traj_ids"): torch.zeros(2, 3, dtype=torch.int64)}


@pytest.mark.parametrize("device", [None, torch.device("cpu")])
def test_a_batch_from_flat_keys_is_the_one_nested_by_hand(device):
    from aiocollect._collectors.delivery import batch_tensordict, flat_batch_tensordict

    for _ in range(2):  # (the second from the tree worked out for the first)
        td = flat_batch_tensordict(_MULTI_AGENT, torch.Size([2, 3]), device)
        expected = batch_tensordict(nest(_MULTI_AGENT), torch.Size([2, 3]), device)
        assert list(td.keys(True)) == list(expected.keys(True))  # the order too
        for key in td.keys(True):
            got, want = td.get(key), expected.get(key)
            if isinstance(want, torch.Tensor):
                assert got is want, key  # the tensors themselves, not copies
            else:
                assert type(got) is type(want) and got.batch_size == want.batch_size, key
                assert got.names == want.names and got.device == want.device, key
        assert td.names == [None, "time"] and td.device == device
        td["next"].names = ["env", "time"]  # each TensorDict has its own names
        assert td.names == [None, "time"] and td["agents"].names == [None, "time"]


def test_private_keys_go_whatever_the_batch_is_made_of():
    from tensordict import LazyStackedTensorDict, NonTensorData

    from aiocollect._collectors.delivery import flat_batch_tensordict, without_private_keys

    def reference(td):  # every key that starts with "_", or sits under one that does
        keys = [k if isinstance(k, tuple) else (k,) for k in td.keys(True)]
        private = [k for k in keys if any(part.startswith("_") for part in k)]
        return td.exclude(*private)

    public = {k: v for k, v in _MULTI_AGENT.items() if k != ("agents", "_mask")}
    clean = flat_batch_tensordict(public, torch.Size([2, 3]), None)
    assert without_private_keys(clean) is clean  # none: the batch as it is
    batches = [flat_batch_tensordict(_MULTI_AGENT, torch.Size([2, 3]), None),
               flat_batch_tensordict({**public, "_dummy": torch.ones(2, 3)}, torch.Size([2, 3]), None)]
    agents = LazyStackedTensorDict(TensorDict(x=torch.ones(3), _h=torch.ones(3), batch_size=[3]),
                                   TensorDict(x=torch.ones(3), batch_size=[3]), stack_dim=0)
    batches.append(TensorDict(agents=agents, y=torch.ones(2, 3), batch_size=[2, 3]))  # heterogeneous agents
    batches.append(TensorDict(note=NonTensorData("a", batch_size=[2, 3]), y=torch.ones(2, 3), batch_size=[2, 3]))
    batches.append(LazyStackedTensorDict(*batches[0].unbind(0), stack_dim=0))
    for batch in batches:
        expected = reference(batch)
        got = without_private_keys(batch.clone(recurse=False) if type(batch) is TensorDict else batch)
        assert sorted(map(str, got.keys(True))) == sorted(map(str, expected.keys(True)))

"""The coroutine engine's rollout buffer and bookkeeping, and the env groups, without an event loop.

``RolloutBuffer`` (``_engine.buffer``): TorchRL's layout (keys, dtypes, shapes, the
``"time"`` dim), policy outputs, ``finish``/``finish_rows`` on short batches.
``IdPool`` (``_engine.timelines``) and ``TrajectoryBook`` (``_engine.coroutines``):
trajectory ids, resets, ``state_dict``. ``make_group`` and ``InProcessGroup``
(``_envs.group``) build and step the envs. (What ``Collector`` runs on in-process envs,
the scheduler over an inline worker, is in ``test_inline_scheduler.py``.)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces
from gymnasium.vector import SyncVectorEnv

from aiocollect._engine.buffer import OutputSpec, RolloutBuffer
from aiocollect._engine.coroutines import TrajectoryBook
from aiocollect._engine.timelines import IdPool
from aiocollect._envs.group import InProcessGroup, VectorEnvGroup, make_group
from aiocollect._envs.spaces import flatten_space
from support.envs import StepEnv

# --------------------------------------------------------------------------- RolloutBuffer layout

BOX = spaces.Box(-1, 1, (3,), np.float32)
DICT = spaces.Dict({"pos": spaces.Box(-1, 1, (2,), np.float64), "cell": spaces.Discrete(5),
                    "nest": spaces.Dict({"bits": spaces.MultiBinary(4)})})


def test_buffer_has_torchrls_keys_dtypes_and_shapes():
    outputs = {"action": OutputSpec((), torch.int64), ("policy", "logits"): OutputSpec((4,), torch.float32)}
    buf = RolloutBuffer(flatten_space(BOX, "observation", "obs"), outputs, num_envs=2, frames=5,
                        step_count=True, mask=True)
    td = buf.to_tensordict(batched=True, device=None)
    assert td.batch_size == torch.Size([2, 5])
    assert td.names == [None, "time"]
    layout = {k: (v.dtype, tuple(v.shape)) for k, v in td.items(include_nested=True, leaves_only=True)}
    assert layout == {
        "observation": (torch.float32, (2, 5, 3)),
        ("next", "observation"): (torch.float32, (2, 5, 3)),
        "action": (torch.int64, (2, 5)),
        ("policy", "logits"): (torch.float32, (2, 5, 4)),
        "done": (torch.bool, (2, 5, 1)),
        "terminated": (torch.bool, (2, 5, 1)),
        "truncated": (torch.bool, (2, 5, 1)),
        ("next", "done"): (torch.bool, (2, 5, 1)),
        ("next", "terminated"): (torch.bool, (2, 5, 1)),
        ("next", "truncated"): (torch.bool, (2, 5, 1)),
        ("next", "reward"): (torch.float32, (2, 5, 1)),
        ("collector", "traj_ids"): (torch.int64, (2, 5)),
        ("collector", "policy_version"): (torch.int64, (2, 5)),
        "step_count": (torch.int64, (2, 5, 1)),
        ("next", "step_count"): (torch.int64, (2, 5, 1)),
        ("collector", "mask"): (torch.bool, (2, 5)),
    }
    # the root flags and the mask start out false (the engine only writes them when needed)
    assert not td["done"].any() and not td["terminated"].any() and not td["truncated"].any()
    assert not td["collector", "mask"].any()


def test_buffer_without_step_count_or_mask_has_neither_key():
    buf = RolloutBuffer(flatten_space(BOX, "observation", "obs"), {"action": OutputSpec((), torch.int64)},
                        num_envs=1, frames=2, step_count=False, mask=False)
    keys = set(buf.to_tensordict(batched=True, device=None).keys(include_nested=True, leaves_only=True))
    assert not keys & {"step_count", ("next", "step_count"), ("collector", "mask")}
    assert buf.step_count is None and buf.next_step_count is None and buf.mask is None


def test_dict_observations_become_nested_keys_under_root_and_next():
    buf = RolloutBuffer(flatten_space(DICT, "observation", "obs"), {"action": OutputSpec((2,), torch.int64)},
                        num_envs=3, frames=4, step_count=False, mask=False)
    td = buf.to_tensordict(batched=True, device=None)
    for prefix in ((), ("next",)):
        assert td[(*prefix, "pos")].dtype == torch.float64 and td[(*prefix, "pos")].shape == (3, 4, 2)
        assert td[(*prefix, "cell")].dtype == torch.int64 and td[(*prefix, "cell")].shape == (3, 4)
        assert td[(*prefix, "nest", "bits")].dtype == torch.int8 and td[(*prefix, "nest", "bits")].shape == (3, 4, 4)
    assert "observation" not in td
    assert td["action"].shape == (3, 4, 2)


def test_to_tensordict_shares_memory_with_the_buffer_and_sets_the_device():
    buf = RolloutBuffer(flatten_space(BOX, "observation", "obs"), {"action": OutputSpec((), torch.int64)},
                        num_envs=2, frames=3, step_count=False, mask=False)
    td = buf.to_tensordict(batched=True, device=torch.device("cpu"))
    assert td.device == torch.device("cpu")
    buf.root_obs[0][1, 2] = [7.0, 8.0, 9.0]  # through the numpy view the engine writes with
    assert td["observation"][1, 2].tolist() == [7.0, 8.0, 9.0]
    assert td["observation"].data_ptr() == buf.tensors["observation"].data_ptr()


def test_unbatched_tensordict_is_the_first_env_over_time():
    buf = RolloutBuffer(flatten_space(BOX, "observation", "obs"), {"action": OutputSpec((), torch.int64)},
                        num_envs=1, frames=4, step_count=False, mask=False)
    buf.write_outputs(2, {"action": np.array([3])}, version=9)
    td = buf.to_tensordict(batched=False, device=None)
    assert td.batch_size == torch.Size([4])
    assert td.names == ["time"]
    assert td["action"][2] == 3 and td["collector", "policy_version"][2] == 9
    assert td["next", "reward"].shape == (4, 1)


# --------------------------------------------------------------------------- RolloutBuffer writes


def test_output_spec_of_numpy_and_torch_values_drops_the_env_dim():
    assert OutputSpec.of(np.zeros((4, 2, 3), np.float64)) == OutputSpec((2, 3), torch.float64)
    assert OutputSpec.of(torch.zeros(4, dtype=torch.int32)) == OutputSpec((), torch.int32)
    readonly = np.zeros((2, 5), np.float32)
    readonly.flags.writeable = False
    assert OutputSpec.of(readonly) == OutputSpec((5,), torch.float32)


def test_write_outputs_stores_numpy_and_torch_values_and_the_version():
    outputs = {"action": OutputSpec((), torch.int64), "logp": OutputSpec((), torch.float32),
               ("policy", "h"): OutputSpec((2,), torch.bfloat16)}  # bfloat16: no numpy view
    buf = RolloutBuffer(flatten_space(BOX, "observation", "obs"), outputs, num_envs=2, frames=3,
                        step_count=False, mask=False)
    assert ("policy", "h") not in buf.out_np or buf.out_np[("policy", "h")] is None
    buf.write_outputs(1, {"action": np.array([2, 3]), "logp": torch.tensor([-0.5, -1.5]),
                          ("policy", "h"): torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.bfloat16)}, version=4)
    td = buf.to_tensordict(batched=True, device=None)
    assert td["action"][:, 1].tolist() == [2, 3]
    assert td["logp"][:, 1].tolist() == [-0.5, -1.5]
    assert td["policy", "h"][:, 1].float().tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert td["collector", "policy_version"][:, 1].tolist() == [4, 4]


def test_write_outputs_at_writes_each_env_at_its_own_column():
    outputs = {"action": OutputSpec((), torch.int64), "h": OutputSpec((), torch.bfloat16)}
    buf = RolloutBuffer(flatten_space(BOX, "observation", "obs"), outputs, num_envs=3, frames=4,
                        step_count=False, mask=False)
    buf.tensors["action"].zero_()
    buf.tensors["h"].zero_()
    buf.tensors[("collector", "policy_version")].fill_(-1)
    rows, cols = np.array([0, 2]), np.array([3, 1])
    buf.write_outputs_at(rows, cols, {"action": np.array([5, 6]), "h": torch.tensor([1.5, 2.5], dtype=torch.bfloat16)},
                         version=7)
    td = buf.to_tensordict(batched=True, device=None)
    assert td["action"].tolist() == [[0, 0, 0, 5], [0, 0, 0, 0], [0, 6, 0, 0]]
    assert td["h"].float().tolist() == [[0, 0, 0, 1.5], [0, 0, 0, 0], [0, 2.5, 0, 0]]
    assert td["collector", "policy_version"].tolist() == [[-1, -1, -1, 7], [-1] * 4, [-1, 7, -1, -1]]


def test_an_output_missing_from_the_first_step_is_an_error_naming_the_key():
    buf = RolloutBuffer(flatten_space(BOX, "observation", "obs"), {"action": OutputSpec((), torch.int64)},
                        num_envs=1, frames=2, step_count=False, mask=False)
    with pytest.raises(KeyError, match="policy: wrote 'value' at this step but not on the batch's first step"):
        buf.write_outputs(1, {"action": np.array([0]), "value": np.array([1.0])}, version=0)


def _filled_buffer(num_envs=2, frames=4, mask=True):
    buf = RolloutBuffer(flatten_space(BOX, "observation", "obs"), {"action": OutputSpec((), torch.int64)},
                        num_envs=num_envs, frames=frames, step_count=True, mask=mask)
    for key, tensor in buf.tensors.items():
        if key not in ("done", "terminated", "truncated", ("collector", "mask")):
            tensor.copy_(torch.ones_like(tensor) if tensor.dtype == torch.bool
                         else torch.arange(1, frames + 1).expand(num_envs, frames)
                         .reshape(num_envs, frames, *([1] * (tensor.ndim - 2))).expand_as(tensor))
    buf.terminated[:] = False
    buf.truncated[:] = False
    buf.terminated[0, 1] = True
    buf.truncated[1, 0] = True
    return buf


def test_finish_derives_next_done_from_terminated_and_truncated():
    buf = _filled_buffer()
    buf.finish(4)
    td = buf.to_tensordict(batched=True, device=None)
    assert td["next", "done"][..., 0].tolist() == [[False, True, False, False], [True, False, False, False]]
    assert td["collector", "mask"].all()
    assert td["collector", "traj_ids"].tolist() == [[1, 2, 3, 4], [1, 2, 3, 4]]


def test_finish_with_fewer_valid_steps_blanks_the_tail_and_masks_it_out():
    buf = _filled_buffer()
    buf.finish(2)
    td = buf.to_tensordict(batched=True, device=None)
    assert td["collector", "mask"].tolist() == [[True, True, False, False]] * 2
    assert td["collector", "traj_ids"].tolist() == [[1, 2, -1, -1]] * 2
    assert td["collector", "policy_version"].tolist() == [[1, 2, -1, -1]] * 2
    assert td["action"].tolist() == [[1, 2, 0, 0]] * 2
    assert td["observation"][..., 0].tolist() == [[1, 2, 0, 0]] * 2
    assert td["next", "reward"][..., 0].tolist() == [[1, 2, 0, 0]] * 2
    assert td["step_count"][..., 0].tolist() == [[1, 2, 0, 0]] * 2
    assert td["next", "done"][..., 0].tolist() == [[False, True, False, False], [True, False, False, False]]


def test_finish_of_zero_steps_masks_everything_out():
    buf = _filled_buffer()
    buf.finish(0)
    td = buf.to_tensordict(batched=True, device=None)
    assert not td["collector", "mask"].any()
    assert (td["collector", "traj_ids"] == -1).all() and (td["observation"] == 0).all()


def test_finish_rows_blanks_each_env_after_its_own_count():
    buf = _filled_buffer(num_envs=3)
    buf.finish_rows(np.array([4, 1, 3]))
    td = buf.to_tensordict(batched=True, device=None)
    assert td["collector", "mask"].tolist() == [[True] * 4, [True, False, False, False], [True, True, True, False]]
    assert td["collector", "traj_ids"].tolist() == [[1, 2, 3, 4], [1, -1, -1, -1], [1, 2, 3, -1]]
    assert td["collector", "policy_version"].tolist() == [[1, 2, 3, 4], [1, -1, -1, -1], [1, 2, 3, -1]]
    assert td["observation"][..., 1].tolist() == [[1, 2, 3, 4], [1, 0, 0, 0], [1, 2, 3, 0]]
    assert td["next", "done"][0, :, 0].tolist() == [False, True, False, False]


def test_finish_rows_with_every_row_full_is_finish():
    buf = _filled_buffer()
    buf.finish_rows(np.array([4, 5]))
    td = buf.to_tensordict(batched=True, device=None)
    assert td["collector", "mask"].all()
    assert td["collector", "traj_ids"].tolist() == [[1, 2, 3, 4]] * 2
    assert td["next", "done"][..., 0].tolist() == [[False, True, False, False], [True, False, False, False]]


# --------------------------------------------------------------------------- IdPool, TrajectoryBook


def test_id_pool_hands_out_increasing_ids():
    pool = IdPool(5)
    first = pool.take(3)
    assert first.tolist() == [5, 6, 7] and first.dtype == np.int64
    assert pool.take(0).tolist() == [] and pool.next == 8
    assert pool.take(2).tolist() == [8, 9]


def test_books_sharing_a_pool_never_share_an_id():
    pool = IdPool(10)
    a, b = TrajectoryBook(2, pool), TrajectoryBook(3, pool)
    assert a.traj_ids.tolist() == [10, 11] and b.traj_ids.tolist() == [12, 13, 14]
    a.request_reset()  # fresh: every env already needs a reset, so no new ids
    assert a.traj_ids.tolist() == [10, 11]
    a.needs_reset[:] = False
    a.request_reset()
    b.needs_reset[:] = False
    b.request_reset()
    assert a.traj_ids.tolist() == [15, 16] and b.traj_ids.tolist() == [17, 18, 19]
    assert pool.next == 20


def test_a_fresh_book_needs_every_env_reset():
    book = TrajectoryBook(3, None)
    assert book.traj_ids.tolist() == [0, 1, 2]
    assert book.needs_reset.tolist() == [True, True, True]
    assert book.step_count.tolist() == [0, 0, 0]
    assert (book.completed_trajectories, book.env_steps) == (0, 0)
    assert book.state_dict() == {"next_traj_id": 3, "completed_trajectories": 0}


def test_request_reset_midway_starts_new_trajectories_that_do_not_count_as_completed():
    book = TrajectoryBook(3, None)
    book.needs_reset[:] = [False, True, False]
    book.step_count[:] = [4, 0, 2]
    book.request_reset(seeds=[7, 8, 9])
    assert book.traj_ids.tolist() == [3, 1, 4]  # env 1 had not started its trajectory yet
    assert book.step_count.tolist() == [0, 0, 0]
    assert book.needs_reset.all()
    assert book.completed_trajectories == 0
    assert book._seeds == [7, 8, 9]


def test_load_state_dict_continues_after_the_saved_ids():
    book = TrajectoryBook(2, None)
    book.load_state_dict({"next_traj_id": 40, "completed_trajectories": 6})
    assert book.traj_ids.tolist() == [40, 41]
    assert book.completed_trajectories == 6
    assert book.needs_reset.all()
    assert book.state_dict() == {"next_traj_id": 42, "completed_trajectories": 6}


def test_load_state_dict_never_moves_the_ids_back():
    pool = IdPool(100)
    book = TrajectoryBook(2, pool)
    book.load_state_dict({"next_traj_id": 5, "completed_trajectories": 1})
    assert book.traj_ids.tolist() == [102, 103]  # not 5, 6: 100, 101 were handed out already
    assert pool.next == 104


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

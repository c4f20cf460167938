"""``split_trajectories`` on hand-built batches: ``[T]`` and ``[N, T]``, with trajectory
ids or only done flags, with a mask already set; exact padded values and masks."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from aiocollect import split_trajectories
from aiocollect._engine.trajectories import TrajectoryAssembler


def _batch(ids: list, *, done: list | None = None, mask: list | None = None, with_ids: bool = True) -> TensorDict:
    """A batch shaped like ``ids`` whose ``obs`` is ``100 + flat frame index`` (so each frame
    is recognisable after splitting) and ``("next", "reward")`` is ``obs / 10``."""
    ids_t = torch.tensor(ids, dtype=torch.int64)
    shape = ids_t.shape
    obs = (100 + torch.arange(ids_t.numel(), dtype=torch.float32)).reshape(*shape, 1)
    td = TensorDict(
        {
            "obs": obs,
            "next": {
                "reward": obs / 10,
                "done": (torch.zeros(*shape, 1, dtype=torch.bool) if done is None
                         else torch.tensor(done, dtype=torch.bool)[..., None]),
            },
            "collector": {},
        },
        batch_size=shape,
    )
    if with_ids:
        td["collector", "traj_ids"] = ids_t
    if mask is not None:
        td["collector", "mask"] = torch.tensor(mask, dtype=torch.bool)
    td.refine_names(*([None] * (len(shape) - 1)), "time")
    return td


def test_a_single_env_batch_is_cut_at_each_new_id_and_zero_padded():
    batch = _batch([0, 0, 1, 1, 1, 2])
    out = split_trajectories(batch)
    assert out.batch_size == torch.Size([3, 3])
    assert out.names == [None, "time"]
    assert out["obs"][..., 0].tolist() == [[100, 101, 0], [102, 103, 104], [105, 0, 0]]
    assert out["collector", "traj_ids"].tolist() == [[0, 0, 0], [1, 1, 1], [2, 0, 0]]
    assert out["collector", "mask"].tolist() == [[True, True, False], [True, True, True], [True, False, False]]
    assert out["collector", "mask"].dtype == torch.bool
    assert torch.equal(out["next", "reward"], out["obs"] / 10)
    assert out["next", "done"].shape == (3, 3, 1)


def test_a_batch_of_envs_gives_one_row_per_trajectory_env_by_env():
    batch = _batch([[7, 7, 8, 8], [3, 3, 3, 3], [9, 10, 10, 10]])
    out = split_trajectories(batch)
    assert out.batch_size == torch.Size([5, 4])
    # order of first appearance, env by env (not sorted by id)
    assert out["collector", "traj_ids"][:, 0].tolist() == [7, 8, 3, 9, 10]
    assert out["obs"][..., 0].tolist() == [
        [100, 101, 0, 0],
        [102, 103, 0, 0],
        [104, 105, 106, 107],
        [108, 0, 0, 0],
        [109, 110, 111, 0],
    ]
    assert out["collector", "mask"].sum(1).tolist() == [2, 2, 4, 1, 3]
    assert out["collector", "mask"].tolist()[3] == [True, False, False, False]


def test_real_frames_sum_to_the_input_and_padding_is_zero():
    batch = _batch([[0, 0, 0, 1, 1], [2, 3, 3, 4, 4]])
    out = split_trajectories(batch)
    mask = out["collector", "mask"]
    assert int(mask.sum()) == batch.numel()
    assert torch.equal(out["obs"][mask].sort(0).values, batch["obs"].reshape(-1, 1))
    assert (out["obs"][~mask] == 0).all() and (out["next", "reward"][~mask] == 0).all()


def test_rows_that_are_each_one_whole_trajectory_come_back_as_they_are():
    batch = _batch([[4, 4, 4], [5, 5, 5]])
    out = split_trajectories(batch)
    assert out.batch_size == torch.Size([2, 3])
    assert out.names == [None, "time"]
    assert out["obs"][..., 0].tolist() == [[100, 101, 102], [103, 104, 105]]
    assert out["collector", "mask"].tolist() == [[True] * 3, [True] * 3]


def test_a_multisync_batch_whose_rows_are_each_one_whole_trajectory_is_made_trajectories_by_time():
    # [workers, envs, T] where no episode ended in the batch: it came back [2, 2, T] as it was
    batch = _batch([[[0, 0, 0], [1, 1, 1]], [[2, 2, 2], [3, 3, 3]]])
    out = split_trajectories(batch)
    assert out.batch_size == torch.Size([4, 3])
    assert out.names == [None, "time"]
    assert out["obs"][..., 0].tolist() == [[100, 101, 102], [103, 104, 105], [106, 107, 108], [109, 110, 111]]
    assert out["collector", "traj_ids"][:, 0].tolist() == [0, 1, 2, 3]
    assert out["collector", "mask"].all()


def test_a_single_env_batch_of_one_trajectory_gains_a_leading_dim():
    out = split_trajectories(_batch([6, 6, 6, 6]))
    assert out.batch_size == torch.Size([1, 4])
    assert out.names == [None, "time"]
    assert out["obs"][..., 0].tolist() == [[100, 101, 102, 103]]
    assert out["collector", "mask"].tolist() == [[True] * 4]


def test_frames_already_masked_out_are_dropped_first():
    # an interrupted batch: the tails were blanked (ids -1) and masked out
    batch = _batch([[0, 0, 1, -1], [2, 2, -1, -1]],
                   mask=[[True, True, True, False], [True, True, False, False]])
    out = split_trajectories(batch)
    assert out.batch_size == torch.Size([3, 2])
    assert out["collector", "traj_ids"].tolist() == [[0, 0], [1, 0], [2, 2]]
    assert out["obs"][..., 0].tolist() == [[100, 101], [102, 0], [104, 105]]
    assert out["collector", "mask"].tolist() == [[True, True], [True, False], [True, True]]


def test_a_fully_valid_mask_still_splits_rows_of_whole_trajectories():
    batch = _batch([[4, 4], [5, 5]], mask=[[True, True], [True, True]])
    out = split_trajectories(batch)
    assert out.batch_size == torch.Size([2, 2])
    assert out["obs"][..., 0].tolist() == [[100, 101], [102, 103]]
    assert out["collector", "mask"].all()


def test_without_ids_trajectories_are_cut_after_each_done():
    batch = _batch([0] * 5, done=[True, False, True, False, False], with_ids=False)
    out = split_trajectories(batch)
    assert out.batch_size == torch.Size([3, 2])
    assert out["collector", "traj_ids"].tolist() == [[0, 0], [1, 1], [2, 2]]
    assert out["obs"][..., 0].tolist() == [[100, 0], [101, 102], [103, 104]]
    assert out["collector", "mask"].tolist() == [[True, False], [True, True], [True, True]]


def test_without_ids_rows_are_numbered_one_after_the_other_and_never_share_a_trajectory():
    batch = _batch([[0] * 4, [0] * 4], done=[[False, True, False, False], [False, False, False, True]],
                   with_ids=False)
    out = split_trajectories(batch)
    assert out.batch_size == torch.Size([3, 4])
    assert out["collector", "traj_ids"].tolist() == [[0, 0, 0, 0], [1, 1, 0, 0], [2, 2, 2, 2]]
    assert out["obs"][..., 0].tolist() == [[100, 101, 0, 0], [102, 103, 0, 0], [104, 105, 106, 107]]
    assert out["collector", "mask"].sum(1).tolist() == [2, 2, 4]


def test_a_done_on_the_last_step_starts_no_empty_trajectory():
    batch = _batch([[0] * 3, [0] * 3], done=[[False, False, True], [False, False, True]], with_ids=False)
    out = split_trajectories(batch)
    assert out.batch_size == torch.Size([2, 3])
    assert out["collector", "traj_ids"].tolist() == [[0, 0, 0], [1, 1, 1]]
    assert out["collector", "mask"].all()


def test_custom_keys_put_the_mask_next_to_the_ids():
    td = TensorDict({"traj": torch.tensor([1, 1, 2]), "x": torch.tensor([1.0, 2.0, 3.0])}, batch_size=[3])
    out = split_trajectories(td, trajectory_key="traj")
    assert out["mask"].tolist() == [[True, True], [True, False]]
    assert out["x"].tolist() == [[1.0, 2.0], [3.0, 0.0]]

    td = TensorDict({("next", "ended"): torch.tensor([False, True, False]), "x": torch.tensor([1.0, 2.0, 3.0])},
                    batch_size=[3])
    out = split_trajectories(td, trajectory_key=("meta", "tid"), done_key="ended")  # ("next", "ended")
    assert out["meta", "tid"].tolist() == [[0, 0], [1, 0]]
    assert out["meta", "mask"].tolist() == [[True, True], [True, False]]
    assert out["x"].tolist() == [[1.0, 2.0], [3.0, 0.0]]


def test_keys_are_resolved_as_torchrl_does():
    # no "collector" entry: ids and mask at the root; done_key is read under "next"
    td = TensorDict({("next", "done"): torch.tensor([False, True, False]), "x": torch.tensor([1.0, 2.0, 3.0])},
                    batch_size=[3])
    out = split_trajectories(td, done_key="done")
    assert out["traj_ids"].tolist() == [[0, 0], [1, 0]] and out["mask"].tolist() == [[True, True], [True, False]]
    assert "collector" not in out.keys()  # noqa: SIM118 - root keys
    out = split_trajectories(td, prefix="meta")
    assert out["meta", "mask"].tolist() == [[True, True], [True, False]]


def test_as_nested_gives_each_trajectory_at_its_own_length():
    batch = _batch([[0, 0, 1], [2, 2, 2]], mask=[[True, True, True], [True, True, False]])
    out = split_trajectories(batch, as_nested=True)
    assert out.batch_size[0] == 3 and ("collector", "mask") not in out.keys(True)
    assert [t.tolist() for t in out["obs"][..., 0].unbind(0)] == [[100, 101], [102], [103, 104]]


def test_the_input_batch_is_not_modified():
    batch = _batch([[0, 0, 1], [2, 2, 2]], done=[[False, True, False], [False, False, False]], with_ids=False)
    before = batch.clone()
    split_trajectories(batch)
    assert ("collector", "traj_ids") not in batch.keys(True)
    assert ("collector", "mask") not in batch.keys(True)
    assert (batch == before).all()

    batch = _batch([[0, 0, 1], [2, 2, 2]])
    split_trajectories(batch)
    assert ("collector", "mask") not in batch.keys(True)
    assert batch["collector", "traj_ids"].tolist() == [[0, 0, 1], [2, 2, 2]]


# ---------------------------------------------------------------- TrajectoryAssembler


def _obs(td) -> list:
    return td["obs"][..., 0].tolist()


def test_assembler_joins_a_trajectory_across_batches_and_queues_it_once_done():
    assembler = TrajectoryAssembler()
    assembler.add(_batch([[0, 0, 0], [1, 1, 1]], done=[[0, 0, 0], [0, 0, 1]]))
    assert (assembler.ready, assembler.pending) == (1, 1)  # env 1's ended, env 0's goes on
    assembler.add(_batch([[0, 2, 2]], done=[[1, 0, 0]]))
    assert (assembler.ready, assembler.pending) == (2, 1)
    out = assembler.take(2, "padded")
    assert out.shape == (2, 4) and out.names == [None, "time"]
    assert _obs(out[0]) == [103, 104, 105, 0] and _obs(out[1]) == [100, 101, 102, 100]  # env 1 first: it ended first
    assert out["collector", "mask"].tolist() == [[True] * 3 + [False], [True] * 4]
    assert out["collector", "traj_ids"].tolist() == [[1, 1, 1, 0], [0, 0, 0, 0]]
    assert assembler.ready == 0


def test_assembler_cat_puts_the_trajectories_one_after_the_other():
    assembler = TrajectoryAssembler()
    assembler.add(_batch([0, 0, 1, 1, 1, 2], done=[0, 1, 0, 0, 1, 0]))
    out = assembler.take(5, "cat")  # only two are complete
    assert out.shape == (5,) and out.names == ["time"]
    assert _obs(out) == [100, 101, 102, 103, 104]
    assert out["next", "done"][:, 0].tolist() == [False, True, False, False, True]
    assert ("collector", "mask") not in out.keys(True)


def test_assembler_drops_masked_and_blanked_frames():
    assembler = TrajectoryAssembler()
    assembler.add(_batch([[0, 0, 0], [1, -1, -1]], done=[[0, 1, 0], [1, 0, 0]],
                         mask=[[True, True, False], [True, False, False]]))
    out = assembler.take(2, "cat")
    assert _obs(out) == [100, 101, 103] and assembler.pending == 0


def test_assembler_take_each_writes_per_write_trajectories_per_item_and_drop_partial_forgets():
    assembler = TrajectoryAssembler()
    assembler.add(_batch([0, 1, 2, 3, 4], done=[1, 1, 1, 0, 0]))
    assert assembler.pending == 2
    items = assembler.take_each(2)
    assert [_obs(i) for i in items] == [[100, 101], [102]]
    assembler.drop_partial()
    assert (assembler.ready, assembler.pending) == (0, 0)
    assembler.add(_batch([3, 4], done=[1, 1]))  # ids 3 and 4 start over: nothing kept from before
    assert [_obs(i) for i in assembler.take_each(None)] == [[100, 101]]


def test_assembler_clear_drops_the_trajectories_a_reset_cut_when_their_frames_arrive_later():
    assembler = TrajectoryAssembler()
    assembler.add(_batch([[5, 5], [6, 6]]))
    assembler.clear(cut=[5, 6])  # reset(): envs 0 and 1 start trajectories 7 and 8
    # a batch sealed before the reset arrives afterwards: 5 and 6 would never end
    assembler.add(_batch([[5, 5], [6, 6]]))
    assembler.add(_batch([[7, 7], [8, 8]], done=[[0, 1], [0, 0]]))
    assert (assembler.ready, assembler.pending) == (1, 1)  # 7 ended, 8 goes on: nothing of 5 or 6
    assert assembler.take(1, "cat")["collector", "traj_ids"].tolist() == [7, 7]


def test_assembler_clear_cuts_a_trajectory_begun_here_whose_end_arrives_later():
    """reset() drops what was begun; the rest of such a trajectory, in a batch collected before
    the reset (its env had already moved on to another id), is no whole trajectory."""
    assembler = TrajectoryAssembler()
    assembler.add(_batch([3, 3]))
    assembler.clear(cut=[4])  # the env is on trajectory 4 now: 3 ended in a batch not added yet
    assembler.add(_batch([3, 4], done=[1, 0]))
    assert (assembler.ready, assembler.pending) == (0, 0)


def test_assembler_cut_drops_the_pieces_here_and_those_to_come():
    assembler = TrajectoryAssembler()
    assembler.add(_batch([[1, 1], [2, 2]]))
    assembler.cut([1])
    assert assembler.pending == 1
    assembler.add(_batch([[1, 1], [2, 2]], done=[[0, 1], [0, 1]]))
    assert (assembler.ready, assembler.pending) == (1, 0)
    assert assembler.take(1, "cat")["collector", "traj_ids"].tolist() == [2, 2, 2, 2]


def test_assembler_state_holds_the_complete_trajectories_as_plain_tensors_and_restores_them():
    assembler = TrajectoryAssembler()
    assembler.add(_batch([0, 0, 1, 1, 1, 2], done=[0, 1, 0, 0, 1, 0]))
    assert (assembler.ready, assembler.pending, assembler.pending_frames) == (2, 1, 1)
    state = assembler.state_dict()
    assert state["lengths"] == [2, 3]
    assert all(isinstance(v, (dict, torch.Tensor)) for v in state["frames"].values())
    other = TrajectoryAssembler()
    other.add(_batch([7, 7]))  # under way: gone once restored (the envs restart)
    other.restore(TrajectoryAssembler.read_state(state))
    assert (other.ready, other.pending) == (2, 0)
    out = other.take(2, "padded")
    assert _obs(out[0]) == [100, 101, 0] and _obs(out[1]) == [102, 103, 104]
    assert TrajectoryAssembler().state_dict() is None


def test_assembler_read_state_refuses_what_is_not_a_saved_state():
    for bad in ({"lengths": [2]}, {"lengths": [], "frames": {}}, {"lengths": [3], "frames": {"x": torch.zeros(2)}}, 5):
        with pytest.raises(ValueError, match="'trajectories' is not what state_dict"):
            TrajectoryAssembler.read_state(bad)


def test_assembler_warns_once_when_trajectories_that_never_end_hold_too_much_memory(recwarn):
    assembler = TrajectoryAssembler()
    assembler.add(_batch([0, 0]))
    assembler.WARN_BYTES = 3 * assembler._pending_bytes
    for _ in range(2):
        assembler.add(_batch([0, 0]))
    assert not recwarn.list  # 3 pieces: at the bound, not past it
    assembler.add(_batch([0, 0]))
    assembler.add(_batch([0, 0]))
    warned = [w for w in recwarn.list if issubclass(w.category, RuntimeWarning)]
    assert len(warned) == 1
    assert "1 trajectories that have not ended (the longest has 8 frames)" in str(warned[0].message)
    assert "max_frames_per_traj" in str(warned[0].message)


def test_assembler_memory_count_goes_down_as_trajectories_end_or_are_cut():
    assembler = TrajectoryAssembler()
    assembler.add(_batch([[0, 0], [1, 1], [2, 2]]))
    one = assembler._pending_bytes // 3
    assembler.add(_batch([0, 0], done=[0, 1]))
    assembler.cut([1])
    assert assembler._pending_bytes == one
    assembler.clear()
    assert assembler._pending_bytes == 0 and assembler.pending_frames == 0


def test_trajectories_lazily_stacked_along_time_are_padded_frame_by_frame():
    # an env's entry of a dynamic shape: each frame has its own shape, so a short trajectory
    # gets frames of zeros shaped as its last, and the batch stays lazily stacked
    from tensordict import LazyStackedTensorDict

    from aiocollect._engine.trajectories import _padded

    def traj(length, tid):
        frames = [TensorDict({"obs": torch.full((t + 1,), float(t + 1)),
                              ("collector", "traj_ids"): torch.tensor(tid)}, []) for t in range(length)]
        return LazyStackedTensorDict.lazy_stack(frames, 0)

    out = _padded([traj(3, 0), traj(1, 1)], ("collector", "mask"))
    assert isinstance(out, LazyStackedTensorDict) and out.batch_size == (2, 3) and out.names == [None, "time"]
    assert out["collector", "mask"].tolist() == [[True, True, True], [True, False, False]]
    assert [out[0, t]["obs"].tolist() for t in range(3)] == [[1.0], [2.0, 2.0], [3.0, 3.0, 3.0]]
    assert [out[1, t]["obs"].tolist() for t in range(3)] == [[1.0], [0.0], [0.0]]

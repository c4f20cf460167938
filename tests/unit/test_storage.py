"""The rollout storage over a real shared-memory segment, both sides of it, in this process.

``WorkerRows`` (``_workers.rows``): a worker's rows of the storage, driven as a worker drives
them (``bind`` -> the group steps -> ``stepped`` -> ``bind`` at ``t + 1`` and reset the
finished envs -> ``were_reset``), with ``FakeGroup`` standing in for the env group: results
at ``[s, t]``, observations carried to ``[s, t + 1]``, ``max_frames_per_traj``, the reset
observations of finished envs at ``[s, t + 1]``, ``RESET`` commands.
``RolloutStorage`` (``_engine.storage``): ``policy_input`` views, ``write`` of the policy's
outputs, ``gather``/``write_rows`` for envs each at its own column (a ``Collector``'s
coroutine envs), ``batch`` (TorchRL's keys and ``[envs, T]`` layout, root flags, blanking, mask, a
copy), ``shift``.
"""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
import torch
from gymnasium import spaces

from aiocollect._engine.storage import OutputSpec, RolloutStorage, concat, host_empty
from aiocollect._envs.keyed import ENGINE_FLAGS
from aiocollect._envs.spaces import Leaf
from aiocollect._workers.rows import WorkerRows
from aiocollect._workers.shm import Layout, SharedArrays, create_segment

OBS = [(np.dtype(np.float32), (2,)), (np.dtype(np.int64), ())]
ACTION = (np.dtype(np.int64), ())
KEYS = ["pos", ("nested", "count")]
LEAVES = [
    Leaf(("pos",), "pos", (2,), np.dtype(np.float32), spaces.Box(-1e6, 1e6, (2,), np.float32)),
    Leaf(("nested", "count"), ("nested", "count"), (), np.dtype(np.int64), spaces.Discrete(1000)),
]
N, T, K = 4, 3, 2  # envs (two workers: rows 0:2 and 2:4), columns, slots


@pytest.fixture
def shared():
    layout = Layout.plan(OBS, ACTION, num_envs=N, num_lanes=2, columns=T, slots=K)
    fd = create_segment(layout.size)
    try:
        yield SharedArrays(layout, fd)
    finally:
        os.close(fd)


class FakeGroup:
    """Stands for a worker's env group. A step writes obs = the env's action (every leaf),
    reward 1 and the flags set in ``terminate``/``truncate``; a reset writes obs = -seed
    (-100 unseeded) for the envs reset and, as a group may, scribbles on the reward and
    flags it is bound to."""

    obs_leaves = LEAVES

    def __init__(self, num_envs: int):
        self.terminate = np.zeros(num_envs, bool)
        self.truncate = np.zeros(num_envs, bool)
        self.resets: list[tuple[list[int], list | None]] = []

    def bind(self, obs, reward, terminated, truncated, writer=None):
        self.obs, self.reward, self.terminated, self.truncated = obs, reward, terminated, truncated

    def step_now(self, action):
        for a in self.obs.values():
            a[:] = action.reshape(-1, *[1] * (a.ndim - 1))
        self.reward[:] = 1.0
        self.terminated[:] = self.terminate
        self.truncated[:] = self.truncate

    def reset_now(self, idx, seeds):
        self.resets.append(([int(i) for i in idx], seeds))
        for i in idx:
            value = -100 if seeds is None or seeds[i] is None else -seeds[i]
            for a in self.obs.values():
                a[i] = value
        self.reward[idx] = -5.0
        self.terminated[idx] = False
        self.truncated[idx] = False


def worker_rows(shared, lo=2, hi=4, *, max_frames_per_traj=None, reset_when_done=True):
    return WorkerRows(shared, lo, hi, KEYS, max_frames_per_traj=max_frames_per_traj,
                      reset_when_done=reset_when_done)


def step(rows: WorkerRows, group: FakeGroup, s: int, t: int):
    """A ``STEP`` command, as a worker carries it out; returns the envs it reset."""
    before = len(group.resets)
    rows.step(group, s, t)
    return np.array(group.resets[-1][0]) if len(group.resets) > before else None


def reset(rows: WorkerRows, group: FakeGroup, s: int, t: int):
    """A ``RESET`` command, as a worker carries it out; returns the envs reset and their seeds."""
    rows.reset(group, s, t)
    idx, seeds = group.resets[-1]
    return np.array(idx), seeds


# --------------------------------------------------------------------------- WorkerRows


def test_a_step_writes_its_results_at_its_column_and_carries_the_observations_over(shared):
    a = shared.arrays
    rows, group = worker_rows(shared, max_frames_per_traj=1000), FakeGroup(2)  # (counts kept for it)
    a["action"][:] = [3, 4, 5, 7]
    assert step(rows, group, 1, 1) is None
    assert a["next_obs0"][1, 1, 2:].tolist() == [[5, 5], [7, 7]]
    assert a["next_obs1"][1, 1, 2:].tolist() == [5, 7]
    assert a["reward"][1, 1, 2:].tolist() == [1.0, 1.0]
    assert a["obs0"][1, 2, 2:].tolist() == [[5, 5], [7, 7]]  # what the next step starts from
    assert a["obs1"][1, 2, 2:].tolist() == [5, 7]
    assert rows.step_count.tolist() == [1, 1]
    # nothing else: not the other worker's rows, nor other columns or slots
    for name, count in {"next_obs0": 4, "next_obs1": 2, "reward": 2, "obs0": 4, "obs1": 2}.items():
        assert np.count_nonzero(a[name]) == count, name
    assert not a["terminated"].any() and not a["truncated"].any()


def test_a_step_into_the_last_column_carries_over_to_column_t(shared):
    a = shared.arrays
    rows, group = worker_rows(shared, 0, 2), FakeGroup(2)
    a["action"][:] = [2, 6, 0, 0]
    step(rows, group, 0, T - 1)
    assert a["obs1"][0, T].tolist() == [2, 6, 0, 0]
    assert a["next_obs1"][0, T - 1].tolist() == [2, 6, 0, 0]


def test_finished_envs_are_reset_at_once_their_first_observation_going_to_the_next_column(shared):
    a = shared.arrays
    rows, group = worker_rows(shared, max_frames_per_traj=1000), FakeGroup(2)  # (counts kept for it)
    a["action"][0, 2:] = [5, 7]  # column 0's actions
    step(rows, group, 0, 0)
    group.truncate[:] = [False, True]
    a["action"][1, 2:] = [8, 9]
    finished = step(rows, group, 0, 1)
    assert finished.tolist() == [1]  # relative to the worker's rows
    assert group.resets == [([1], None)]
    assert a["next_obs1"][0, 1, 2:].tolist() == [8, 9]  # the final observation stays
    assert a["next_obs0"][0, 1, 3].tolist() == [9, 9]
    assert a["obs1"][0, 2, 2:].tolist() == [8, -100]  # the next episode's first one
    assert a["obs0"][0, 2, 3].tolist() == [-100, -100]
    # the reset's scribbles landed nowhere: the step's results are intact
    assert a["reward"][0, 1, 2:].tolist() == [1.0, 1.0]
    assert a["truncated"][0, 1, 2:].tolist() == [False, True]
    assert not a["reward"][0, 2].any() and not a["truncated"][0, 2].any()
    assert rows.step_count.tolist() == [2, 0]


def test_max_frames_per_traj_truncates_each_trajectory_after_k_steps(shared):
    a = shared.arrays
    rows, group = worker_rows(shared, max_frames_per_traj=2), FakeGroup(2)
    group.terminate[:] = [True, False]
    assert step(rows, group, 0, 0).tolist() == [0]  # env 0 terminates on its own
    group.terminate[:] = False
    assert step(rows, group, 0, 1).tolist() == [1]  # env 1's second step
    assert step(rows, group, 0, 2).tolist() == [0]  # env 0's second step since its reset
    assert step(rows, group, 1, 0).tolist() == [1]  # env 1's second step since its reset
    assert a["truncated"][0, :, 2:].tolist() == [[False, False], [False, True], [True, False]]
    assert a["terminated"][0, :, 2:].tolist() == [[True, False], [False, False], [False, False]]
    assert a["truncated"][1, 0, 2:].tolist() == [False, True]
    assert rows.step_count.tolist() == [1, 0]
    assert [r[0] for r in group.resets] == [[0], [1], [0], [1]]


def test_without_reset_when_done_nothing_is_reset_and_the_final_observation_carries_over(shared):
    a = shared.arrays
    rows, group = worker_rows(shared, max_frames_per_traj=2, reset_when_done=False), FakeGroup(2)
    a["action"][:, 2:] = [5, 7]  # every column's
    group.terminate[:] = [True, False]
    assert step(rows, group, 0, 0) is None
    assert step(rows, group, 0, 1) is None
    assert group.resets == []
    assert a["obs1"][0, 2, 2:].tolist() == [5, 7]
    assert a["terminated"][0, :2, 2:].tolist() == [[True, False], [True, False]]
    assert a["truncated"][0, :2, 2:].tolist() == [[False, False], [True, True]]  # still at k steps
    assert rows.step_count.tolist() == [2, 2]


def test_a_reset_command_resets_the_masked_envs_with_their_seeds_at_its_column(shared):
    a = shared.arrays
    rows, group = worker_rows(shared), FakeGroup(2)
    rows.step_count[:] = [4, 5]
    a["reset_mask"][:] = [True, False, True, True]  # what the main process writes
    a["seed_set"][:] = [True, False, False, True]
    a["seed"][:] = [1, 0, 0, 9]
    idx, seeds = reset(rows, group, 1, 2)
    assert idx.tolist() == [0, 1] and seeds == [None, 9]
    assert a["obs1"][1, 2].tolist() == [0, 0, -100, -9]
    assert a["obs0"][1, 2, 2:].tolist() == [[-100, -100], [-9, -9]]
    assert not a["obs1"][1, 3].any() and not a["next_obs1"].any()
    assert not a["reward"].any()  # a reset writes no results
    assert rows.step_count.tolist() == [0, 0]


def test_resets_without_a_seed_for_the_envs_reset_gives_none(shared):
    a = shared.arrays
    rows, group = worker_rows(shared), FakeGroup(2)
    rows.step_count[:] = [4, 5]
    a["reset_mask"][2:] = [False, True]
    a["seed_set"][2:] = [True, False]  # a seed for an env not reset this time
    a["seed"][2:] = [3, 0]
    idx, seeds = reset(rows, group, 0, 0)
    assert idx.tolist() == [1] and seeds is None
    assert a["obs1"][0, 0].tolist() == [0, 0, 0, -100]
    assert rows.step_count.tolist() == [4, 0]


# --------------------------------------------------------------------------- RolloutStorage


@pytest.fixture
def storage(shared):
    return RolloutStorage(shared, LEAVES, step_count=True)


def test_policy_input_is_a_view_of_the_shared_column(shared, storage):
    a = shared.arrays
    a["obs0"][1, 2] = np.arange(8, dtype=np.float32).reshape(4, 2)
    a["obs1"][1, 2] = [10, 11, 12, 13]
    obs = storage.policy_input(1, 2, 1, 3)
    assert list(obs) == KEYS
    assert obs["pos"].tolist() == [[2, 3], [4, 5]] and obs["pos"].dtype == torch.float32
    assert obs[("nested", "count")].tolist() == [11, 12] and obs[("nested", "count")].dtype == torch.int64
    assert obs["pos"].data_ptr() == a["obs0"][1, 2, 1:3].ctypes.data
    assert np.shares_memory(obs[("nested", "count")].numpy(), a["obs1"])
    a["obs1"][1, 2, 2] = 99  # a worker writes: the input sees it
    assert obs[("nested", "count")].tolist() == [11, 99]


@pytest.mark.parametrize("aligned", [False, True])
def test_policy_inputs_of_blocks_at_different_columns_are_joined_in_order(shared, storage, aligned):
    a = shared.arrays
    a["obs0"][0, 1] = np.arange(8, dtype=np.float32).reshape(4, 2)
    a["obs0"][0, 3] = -np.arange(8, dtype=np.float32).reshape(4, 2)
    a["obs1"][0, 1], a["obs1"][0, 3] = [10, 11, 12, 13], [20, 21, 22, 23]
    obs = storage.policy_inputs([(0, 1, 0, 2), (0, 3, 2, 4)], aligned=aligned)  # rows 0:2 at t=1, 2:4 at t=3
    assert list(obs) == KEYS
    assert obs["pos"].tolist() == [[0, 1], [2, 3], [-4, -5], [-6, -7]] and obs["pos"].dtype == torch.float32
    assert obs[("nested", "count")].tolist() == [10, 11, 22, 23]
    assert not np.shares_memory(obs["pos"].numpy(), a["obs0"])  # a copy: the workers write on
    if aligned:  # (what XLA reads in place: a JAX policy's inputs)
        assert all(t.data_ptr() % 64 == 0 for t in obs.values())


def test_write_puts_the_outputs_of_a_block_of_rows_at_its_column(storage):
    ids, counts = np.array([20, 21, 22, 23]), np.array([5, 6, 7, 8])
    out = {
        "action": torch.tensor([10, 11, 12, 13]),
        "logits": np.arange(12, dtype=np.float32).reshape(4, 3),
        "hidden": torch.tensor([[0.5, 1.5], [2.5, 3.5], [4.5, 5.5], [6.5, 7.5]], dtype=torch.bfloat16),
        "value": torch.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True),
    }
    storage.write(1, 0, 2, 4, out, 1, 3, ids, counts)  # rows 1:3 of the outputs go to envs 2:4
    assert storage.specs == {
        "action": OutputSpec((), torch.int64),
        "logits": OutputSpec((3,), torch.float32),
        "hidden": OutputSpec((2,), torch.bfloat16),
        "value": OutputSpec((), torch.float32),
    }
    assert storage.policy_version[1, 0].tolist() == [-1, -1, 3, 3]
    assert storage.traj_ids[1, 0].tolist() == [-1, -1, 22, 23]
    assert storage.step_count[1, 0].tolist() == [0, 0, 7, 8]
    assert not (storage.policy_version[0] != -1).any() and not (storage.policy_version[1, 1:] != -1).any()
    storage.write(1, 0, 0, 2, {k: v[2:] for k, v in out.items()}, 0, 4, ids, counts)
    b = storage.batch(1, 0, N, 1, np.full(N, 1), tuple(out), None, False)
    assert b["action"][:, 0].tolist() == [12, 13, 11, 12]
    assert b["logits"][:, 0].tolist() == [[6, 7, 8], [9, 10, 11], [3, 4, 5], [6, 7, 8]]
    assert b["hidden"].dtype == torch.bfloat16
    assert b["hidden"][:, 0].float().tolist() == [[4.5, 5.5], [6.5, 7.5], [2.5, 3.5], [4.5, 5.5]]
    assert b["value"][:, 0].tolist() == [3.0, 4.0, 2.0, 3.0] and not b["value"].requires_grad
    assert b[("collector", "policy_version")][:, 0].tolist() == [4, 4, 3, 3]


def test_gather_takes_each_env_at_its_own_column_as_a_copy(shared, storage):
    a = shared.arrays
    a["obs0"][1] = np.arange((T + 1) * N * 2, dtype=np.float32).reshape(T + 1, N, 2)
    a["obs1"][1] = 100 + np.arange((T + 1) * N).reshape(T + 1, N)
    obs = storage.gather(1, np.array([3, 0, 2]), np.array([0, 3, 1]))  # env 0 at 3, env 3 at 0, env 1 at 2
    assert list(obs) == KEYS
    assert obs[("nested", "count")].tolist() == [112, 103, 109]
    assert obs["pos"].tolist() == [[24, 25], [6, 7], [18, 19]] and obs["pos"].dtype == torch.float32
    a["obs1"][1, 3, 0] = -7
    assert obs[("nested", "count")][0] == 112  # a copy: later writes leave it alone


def test_write_rows_puts_row_j_of_the_outputs_at_env_j_and_its_column(storage):
    ids, counts = np.array([20, 21, 22, 23]), np.array([5, 6, 7, 8])
    rows, cols = np.array([2, 0, 3]), np.array([1, 2, 0])
    out = {
        "action": torch.tensor([10, 11, 12]),
        "logits": np.arange(6, dtype=np.float32).reshape(3, 2),
        "hidden": torch.tensor([0.5, 1.5, 2.5], dtype=torch.bfloat16)[:, None],
    }
    storage.write_rows(0, cols, rows, out, 6, ids, counts, np.array([10, 11, 12]))
    assert storage.specs["hidden"] == OutputSpec((1,), torch.bfloat16)
    version = storage.policy_version[0]
    assert [version[c, r] for c, r in zip(cols, rows)] == [6, 6, 6] and (version >= 0).sum() == 3
    assert [storage.traj_ids[0, c, r] for c, r in zip(cols, rows)] == [22, 20, 23]
    assert [storage.step_count[0, c, r] for c, r in zip(cols, rows)] == [7, 5, 8]
    b = storage.batch(0, 0, N, T, np.full(N, T), tuple(out), None, False)
    assert b["action"][2, 1] == 10 and b["action"][0, 2] == 11 and b["action"][3, 0] == 12
    assert b["logits"][0, 2].tolist() == [2, 3]
    assert b["hidden"][3, 0].float().tolist() == [2.5]


@pytest.mark.parametrize(("shape", "dtype"),
                         [((3, 5, 2), np.float32), ((7,), np.bool_), ((2, 3), np.int64), ((0, 4), np.uint8)])
def test_host_empty_is_a_64_byte_aligned_tensor_sharing_the_numpy_array(shape, dtype):
    tensor, view = host_empty(shape, dtype)
    assert tensor.shape == shape and view.shape == shape and view.dtype == dtype
    assert tensor.data_ptr() % 64 == 0  # JAX takes such a buffer without a copy
    view[...] = 1
    assert bool((tensor == 1).all())


def test_concat_is_torch_cat_into_an_aligned_tensor():
    parts = [torch.arange(6, dtype=torch.float32).reshape(3, 2), torch.ones(1, 2)]
    out = concat(parts)
    assert torch.equal(out, torch.cat(parts)) and out.data_ptr() % 64 == 0
    bf16 = [p.to(torch.bfloat16) for p in parts]  # numpy lacks it: torch.cat
    assert torch.equal(concat(bf16), torch.cat(bf16))


def test_batch_tensors_are_aligned_copies(shared, storage):
    fill(shared, storage, 0)
    b = storage.batch(0, 1, 3, T, np.full(2, T), ("action", "h"), None, True)
    assert all(t.data_ptr() % 64 == 0 for k, t in b.items() if t.numel() and k != "h" and t.is_contiguous())


def _spans(batch: dict) -> list[tuple[int, int]]:
    """The byte ranges of a batch's numpy-filled tensors (bfloat16 is torch's own copy)."""
    return sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())
                  for t in batch.values() if t.numel() and t.dtype != torch.bfloat16)


def test_every_batch_is_carved_out_of_one_block_its_first_included(shared, storage):
    fill(shared, storage, 0)
    first = storage.batch(0, 0, N, T, np.full(N, T), ("action",), None, False)
    for b in (first, storage.batch(0, 0, N, T, np.full(N, T), ("action",), None, False)):
        spans = _spans(b)
        assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))  # no field overlaps another
        assert all(start % 64 == 0 for start, _ in spans)
        assert spans[-1][1] - spans[0][0] < 64 * len(spans) + sum(end - start for start, end in spans)  # one block
    second = b
    assert all(torch.equal(first[k], second[k]) for k in first) and first["pos"].data_ptr() != second["pos"].data_ptr()
    # another layout (a mask, more outputs, short rows) has its own plan, and is as right
    more = storage.batch(0, 0, N, T, np.array([T, 1, T, 0]), ("action", "h"), np.zeros((3, N), bool), True)
    assert more[("collector", "mask")].tolist() == [[True] * 3, [True, False, False], [True] * 3, [False] * 3]
    assert more[("collector", "traj_ids")][1].tolist() == [110, -1, -1]
    assert more["done"].shape == (N, T, 1) and not more["done"][:, 0].any()
    assert len(storage._plans) == 2


def _reference_batch(st, s, lo, hi, frames, valid, keys, start_flags, mask, fresh=()) -> dict:
    """What ``storage.batch`` gives, built field by field in torch, in TorchRL's layout (the
    spec the batch plans keep)."""
    def take(x):
        x = x if isinstance(x, torch.Tensor) else torch.from_numpy(x)
        return x[s, :frames, lo:hi].transpose(0, 1).clone(memory_format=torch.contiguous_format)

    out = {}
    for key, x, nx in zip(st.keys, st.obs, st.next_obs):
        out[key], out[("next", key)] = take(x), take(nx)
    for key in keys:
        out[key] = take(st.outputs.tensors[key])
    term, trunc = take(st.terminated), take(st.truncated)
    nxt = {"reward": take(st.reward), "done": term | trunc, "terminated": term, "truncated": trunc}
    if st.engine_flags:
        for key, value in nxt.items():
            out[("next", key)] = value[..., None]
        for i, key in enumerate(("done", "terminated", "truncated")):
            root = torch.zeros_like(nxt[key])
            if start_flags is not None:
                root[:, 0], root[:, 1:] = torch.from_numpy(start_flags[i]), nxt[key][:, :-1]
                for t, envs in fresh:
                    root[torch.as_tensor(envs), t] = False
            out[key] = root[..., None]
        if "truncated" not in st.engine_flags:
            del out["truncated"], out[("next", "truncated")]
    for key in st.next_only:
        del out[key]
    out[("collector", "traj_ids")], out[("collector", "policy_version")] = take(st.traj_ids), take(st.policy_version)
    if st.step_count is not None:
        out["step_count"] = take(st.step_count)[..., None]
        out[("next", "step_count")] = take(st.next_step_count)[..., None]
    for i, v in enumerate(valid.tolist()):
        for key, tensor in out.items():
            tensor[i, v:] = -1 if key in (("collector", "traj_ids"), ("collector", "policy_version")) else 0
    if mask:
        out[("collector", "mask")] = torch.arange(frames)[None, :] < torch.from_numpy(valid)[:, None]
    return out


@pytest.mark.parametrize("flags", [ENGINE_FLAGS, ENGINE_FLAGS[:3], ()])
@pytest.mark.parametrize(("next_only", "step_count"), [(frozenset(), True), (frozenset({"pos"}), False)])
def test_a_batch_plan_gives_the_batch_built_field_by_field(shared, flags, next_only, step_count):
    storage = RolloutStorage(shared, LEAVES, step_count=True, entries=(next_only, flags, {}, ()))
    for s in range(K):
        fill(shared, storage, s)
    if not step_count:
        storage.step_count = storage.next_step_count = None
    rng = np.random.default_rng(len(flags))
    for _ in range(30):  # layouts and data at random: plans made, then reused on new data
        lo = int(rng.integers(0, N))
        hi, frames, s = int(rng.integers(lo + 1, N + 1)), int(rng.integers(1, T + 1)), int(rng.integers(K))
        keys = [(), ("action",), ("action", "h"), ("h",)][rng.integers(4)]
        valid = np.full(hi - lo, frames) if rng.random() < 0.5 else rng.integers(0, frames + 1, hi - lo)
        start = None if rng.random() < 0.5 else rng.random((3, hi - lo)) < 0.5
        fresh = []
        if start is not None and frames > 1:  # a reset began episodes later in the batch
            fresh.append((int(rng.integers(1, frames)), np.flatnonzero(rng.random(hi - lo) < 0.5)))
        mask = bool(rng.random() < 0.5)
        for name in ("reward", "terminated", "truncated", "obs0", "next_obs1"):
            x = shared.arrays[name]
            x[...] = (rng.random(x.shape) < 0.3) if x.dtype == bool else rng.integers(-5, 5, x.shape)
        args = (s, lo, hi, frames, valid, keys, start, mask)
        expected = _reference_batch(storage, *args, fresh)
        for empty in (None, host_empty):
            b = storage.batch(*args, empty=empty, fresh=fresh)
            assert list(b) == list(expected)  # the order too
            for key, want in expected.items():
                got = b[key]
                assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride(), key
                assert torch.equal(got, want), key
                assert got.dtype == torch.bfloat16 or not got.numel() or got.data_ptr() % 64 == 0, key


def fill(shared, storage, s: int, *, bf16: bool = True) -> None:
    """Every column of slot ``s``, as the workers and the main process would leave it:
    env ``n`` at column ``t`` holds ``10 n + t`` (plus offsets per field). Policy outputs:
    ``"action"`` (int64) and, with ``bf16``, ``"h"`` (bfloat16, which numpy lacks)."""
    a = shared.arrays
    nt = 10 * np.arange(N)[None, :] + np.arange(T)[:, None]  # [T, N]
    a["obs0"][s, :T] = np.stack([nt, -nt], axis=-1)
    a["obs0"][s, T] = -1
    a["obs1"][s, :T] = nt
    a["next_obs0"][s] = np.stack([nt + 0.5, -nt - 0.5], axis=-1)
    a["next_obs1"][s] = 1000 + nt
    a["reward"][s] = nt / 4
    a["terminated"][s, 1, 1] = True
    a["truncated"][s, 0, 3] = True
    a["terminated"][s, 2, 2] = a["truncated"][s, 2, 2] = True
    for t in range(T):
        out = {"action": torch.from_numpy(nt[t] + 500)}
        if bf16:
            out["h"] = torch.from_numpy(nt[t] / 2).to(torch.bfloat16)[:, None]
        storage.write(s, t, 0, N, out, 0, 7 + t, 100 + nt[t], nt[t] % 5)
    storage.next_step_count[s] = nt % 5 + 1


def tm(x: np.ndarray) -> list:
    """``[T, envs, ...]`` -> ``[envs, T, ...]``, as a list."""
    return np.swapaxes(x, 0, 1).tolist()


def test_batch_gives_torchrl_keys_shapes_and_values_envs_first(shared, storage):
    a = shared.arrays
    fill(shared, storage, 1)
    b = storage.batch(1, 1, 4, T, np.full(3, T), ("action", "h"), None, True)
    nxt = [("next", k) for k in ("reward", "done", "terminated", "truncated", "step_count")]
    assert set(b) == {*KEYS, ("next", "pos"), ("next", ("nested", "count")), "action", "h", *nxt,
                      "done", "terminated", "truncated", "step_count",
                      ("collector", "traj_ids"), ("collector", "policy_version"), ("collector", "mask")}
    assert b["pos"].shape == (3, T, 2) and b["pos"].tolist() == tm(a["obs0"][1, :T, 1:])
    assert b[("nested", "count")].tolist() == tm(a["obs1"][1, :T, 1:])
    assert b[("next", "pos")].tolist() == tm(a["next_obs0"][1, :, 1:])
    assert b[("next", ("nested", "count"))].tolist() == tm(a["next_obs1"][1, :, 1:])
    reward = b[("next", "reward")]
    assert reward.shape == (3, T, 1) and reward.dtype == torch.float32
    assert reward[..., 0].tolist() == tm(a["reward"][1, :, 1:])
    term, trunc = a["terminated"][1, :, 1:], a["truncated"][1, :, 1:]
    for key, expected in (("done", term | trunc), ("terminated", term), ("truncated", trunc)):
        assert b[("next", key)].shape == (3, T, 1) and b[("next", key)].dtype == torch.bool
        assert b[("next", key)][..., 0].tolist() == tm(expected), key
        assert b[key].shape == (3, T, 1) and not b[key].any(), key  # no start flags: all false
    assert b[("next", "done")][..., 0].tolist() == [[False, True, False], [False, False, True],
                                                     [True, False, False]]
    assert b[("collector", "traj_ids")].shape == (3, T)
    assert b[("collector", "traj_ids")].tolist() == tm(storage.traj_ids[1, :, 1:])
    assert b[("collector", "policy_version")].tolist() == [[7, 8, 9]] * 3
    assert b["step_count"][..., 0].tolist() == tm(storage.step_count[1, :, 1:])
    assert b[("next", "step_count")][..., 0].tolist() == tm(storage.next_step_count[1, :, 1:])
    assert b["action"].tolist() == tm(storage.traj_ids[1, :, 1:] + 400)
    assert b["h"].dtype == torch.bfloat16 and b["h"].shape == (3, T, 1)
    assert b[("collector", "mask")].dtype == torch.bool and b[("collector", "mask")].all()


def test_batch_root_flags_start_from_the_start_flags_then_follow_the_next_flags(shared, storage):
    fill(shared, storage, 0)
    start = np.array([[True, False], [False, False], [True, False]])  # done, terminated, truncated of envs 2, 3
    b = storage.batch(0, 2, 4, T, np.full(2, T), (), start, False)
    # env 2 finishes at column 2 (terminated and truncated), env 3 is truncated at column 0
    assert b["done"][..., 0].tolist() == [[True, False, False], [False, True, False]]
    assert b["terminated"][..., 0].tolist() == [[False, False, False], [False, False, False]]
    assert b["truncated"][..., 0].tolist() == [[True, False, False], [False, True, False]]
    assert ("collector", "mask") not in b and "action" not in b


def test_batch_blanks_the_columns_a_row_did_not_fill_and_masks_them(shared, storage):
    fill(shared, storage, 1)
    b = storage.batch(1, 0, 4, T, np.array([T, 1, 0, 2]), ("action", "h"), None, True)
    assert b[("collector", "mask")].tolist() == [[True] * 3, [True, False, False], [False] * 3,
                                                 [True, True, False]]
    assert b[("collector", "traj_ids")].tolist() == [[100, 101, 102], [110, -1, -1], [-1, -1, -1],
                                                     [130, 131, -1]]
    assert b[("collector", "policy_version")].tolist() == [[7, 8, 9], [7, -1, -1], [-1, -1, -1], [7, 8, -1]]
    assert b[("nested", "count")].tolist() == [[0, 1, 2], [10, 0, 0], [0, 0, 0], [30, 31, 0]]
    assert b[("next", "reward")][..., 0].tolist() == [[0, 0.25, 0.5], [2.5, 0, 0], [0, 0, 0], [7.5, 7.75, 0]]
    assert b["pos"][1, 1:].tolist() == [[0, 0], [0, 0]] and b["pos"][1, 0].tolist() == [10, -10]
    assert not b[("next", "done")][2].any() and not b[("next", "done")][1, 1:].any()
    assert b["action"].tolist() == [[500, 501, 502], [510, 0, 0], [0, 0, 0], [530, 531, 0]]
    assert b[("next", "step_count")][..., 0].tolist() == [[1, 2, 3], [1, 0, 0], [0, 0, 0], [1, 2, 0]]
    assert not b["h"][2].any()


@pytest.mark.parametrize("frames", [T, 2, 1])
def test_a_batch_is_a_copy_that_later_writes_to_the_storage_leave_alone(shared, storage, frames):
    fill(shared, storage, 1)
    b = storage.batch(1, 0, N, frames, np.full(N, frames), ("action", "h"), None, True)
    before = {k: v.clone() for k, v in b.items()}
    for x in shared.arrays.values():
        x[...] = 1
    for x in (storage.traj_ids, storage.policy_version, storage.step_count, storage.next_step_count):
        x[...] = 77
    for t in range(T):
        storage.write(1, t, 0, N, {"action": torch.full((N,), 9), "h": torch.full((N, 1), 9.0).bfloat16()},
                      0, 0, np.zeros(N, np.int64), np.zeros(N, np.int64))
    changed = [k for k, v in b.items() if not torch.equal(v, before[k])]
    assert changed == [], changed


@pytest.mark.parametrize("frames", [T, 1])
def test_blanking_a_batch_leaves_the_storage_alone(shared, storage, frames):
    fill(shared, storage, 1)
    arrays = {**shared.arrays, "traj_ids": storage.traj_ids, "policy_version": storage.policy_version}
    before = {k: v.copy() for k, v in arrays.items()}
    b = storage.batch(1, 0, N, frames, np.array([frames, 0, frames, 0]), ("action",), None, True)
    assert b[("collector", "traj_ids")][1].tolist() == [-1] * frames
    changed = [k for k, v in arrays.items() if not np.array_equal(v, before[k])]
    assert changed == [], changed


def test_shift_moves_the_kept_columns_of_its_rows_to_the_front(shared, storage):
    a = shared.arrays
    fill(shared, storage, 1, bf16=False)
    a["obs1"][1, T, :] = [-1, -2, -3, -4]  # the observation the next step starts from
    arrays = {**a, "traj_ids": storage.traj_ids, "policy_version": storage.policy_version,
              "step_count": storage.step_count, "next_step_count": storage.next_step_count}
    before = {k: v.copy() for k, v in arrays.items()}
    storage.shift(1, 1, 3, 1, T)  # forget column 0 of envs 1, 2
    assert a["obs1"][1, :, 1:3].tolist() == [[11, 21], [12, 22], [-2, -3], [-2, -3]]
    assert a["obs1"][1, :, 0].tolist() == [0, 1, 2, -1] and a["obs1"][1, :, 3].tolist() == [30, 31, 32, -4]
    assert a["next_obs1"][1, :2, 1:3].tolist() == [[1011, 1021], [1012, 1022]]
    assert storage.traj_ids[1, :2, 1:3].tolist() == [[111, 121], [112, 122]]
    assert storage.policy_version[1, :2, 1:3].tolist() == [[8, 8], [9, 9]]
    for name in ("obs0", "next_obs0", "reward", "terminated", "truncated", "step_count", "next_step_count"):
        x, old = arrays[name][1], before[name][1]
        assert np.array_equal(x[: T - 1, 1:3], old[1:T, 1:3]), name
        assert np.array_equal(x[:, [0, 3]], old[:, [0, 3]]), name  # other rows untouched
    for name, x in arrays.items():
        if x.ndim > 1:  # the storage fields, [K, ...]: the other slot is untouched
            assert np.array_equal(x[0], before[name][0]), name
    b = storage.batch(1, 1, 3, T - 1, np.full(2, T - 1), ("action",), None, False)
    assert b["action"].tolist() == [[511, 512], [521, 522]]


def test_shift_moves_outputs_of_a_dtype_numpy_lacks(shared, storage):
    fill(shared, storage, 0)  # "h" is bfloat16: kept as a tensor, not a numpy array
    storage.shift(0, 0, N, 2, T)
    b = storage.batch(0, 0, N, 1, np.full(N, 1), ("h",), None, False)
    assert b["h"][:, 0, 0].float().tolist() == [1.0, 6.0, 11.0, 16.0]  # (10 n + 2) / 2


# ---------------------------------------------------------------------------- runs


class CountingGroup(FakeGroup):
    """``FakeGroup`` calling ``hook(steps so far)`` after each step."""

    def __init__(self, num_envs: int, hook):
        super().__init__(num_envs)
        self.hook, self.steps = hook, 0

    def step_now(self, action):
        super().step_now(action)
        self.steps += 1
        self.hook(self.steps)


def posted_run(shared, count: int) -> tuple[np.ndarray, int]:
    """Lane 1's control line with a ``RUN`` of ``count`` steps posted, and its command word."""
    from aiocollect._workers import protocol

    control = shared.control[1]
    control[protocol.COUNT] = count
    word = control[protocol.CMD] = 1 * 4 + protocol.RUN_CODE
    return control, int(word)


def test_a_run_steps_column_after_column_with_each_columns_actions(shared):
    from aiocollect._workers import protocol

    a = shared.arrays
    control, word = posted_run(shared, T)
    a["action"][:, 2:] = [[1, 2], [3, 4], [5, 6]]
    group = CountingGroup(2, lambda steps: None)
    worker_rows(shared).run(group, 0, 0, control, word)
    assert group.steps == T and control[protocol.AT] == T
    assert a["next_obs1"][0, :, 2:].tolist() == [[1, 2], [3, 4], [5, 6]]
    assert a["obs1"][0, 1:, 2:].tolist() == [[1, 2], [3, 4], [5, 6]]  # each carried to the next column


@pytest.mark.parametrize("how", ["count", "command"])
def test_a_run_stops_after_the_step_under_way_when_cut_or_given_up(shared, how):
    from aiocollect._workers import protocol

    control, word = posted_run(shared, T)

    def engine(steps):  # while the first step is under way, the engine cuts the run or posts anew
        if steps == 1:
            if how == "count":
                control[protocol.COUNT] = 0
            else:
                control[protocol.CMD] = word + 4
    group = CountingGroup(2, engine)
    worker_rows(shared).run(group, 0, 0, control, word)
    assert group.steps == 1 and control[protocol.AT] == 1


def test_a_run_cut_before_it_began_takes_one_step_and_says_so(shared):
    # the engine read AT after DONE: a run that stepped nothing would leave the last run's AT there
    from aiocollect._workers import protocol

    control, word = posted_run(shared, T)
    control[protocol.AT] = 5  # the last run's
    control[protocol.COUNT] = 0  # cut before the worker looked
    group = CountingGroup(2, lambda steps: None)
    worker_rows(shared).run(group, 0, 0, control, word)
    assert group.steps == 1 and control[protocol.AT] == 1

"""What every variant's batches hold: TorchRL's layout and the invariants, on both faces, under
every batch option (total_frames, split_trajs, postproc, reset_at_each_iter,
max_frames_per_traj, init_random_frames, replay_buffer and start()), set_seed and state_dict."""

from __future__ import annotations

import functools
import gc
import itertools
import threading
import time
import traceback

import pytest
import torch

from aiocollect import CollectorBusyError
from support.checks import check_batch, check_continuity, rows
from support.envs import CounterEnv, DictEnv
from support.variants import VARIANTS

FPB = 40


async def collect(collector, face: str, count: int | None = None) -> list:
    """Batches from ``collector`` through ``face`` ("sync" or "async"), ``count`` at most."""
    out = []
    if face == "sync":
        for batch in collector:
            out.append(batch)
            if len(out) == count:
                break
    else:
        async for batch in collector:
            out.append(batch)
            if len(out) == count:
                break
    return out


def constant(action: int):
    def policy(observation):
        return torch.full(observation.shape[:-1], action, dtype=torch.int64)
    return policy


def check_rows_continue(variant, batches) -> None:
    """Consecutive batches continue each env's trajectories (for MultiAsync, a worker's batches
    may interleave with the other's: checked where two consecutive batches are the same worker's)."""
    for prev, cur in itertools.pairwise(batches):
        if variant.collects_ahead and variant.workers > 1:
            continue
        check_continuity(prev, cur)


def test_next_goes_on_with_the_iteration_and_gives_none_at_the_end(variant):
    """TorchRL's ``collector.next()``: the batches of one collection, shared with ``for``,
    counted towards ``total_frames``; ``None`` once they are collected."""
    with variant(frames_per_batch=FPB, total_frames=3 * FPB) as collector:
        first = collector.next()
        second = next(iter(collector))
        third = collector.next()
        for batch in (first, second, third):
            check_batch(batch)
            assert batch.shape == variant.batch_shape(FPB)
        check_rows_continue(variant, [first, second, third])
        assert collector.next() is None and collector.next() is None
        assert list(collector) == []
        assert collector.statistics().frames == 3 * FPB


async def test_layout_and_invariants_on_both_faces(variant):
    for face in ("sync", "async"):
        collector = variant(frames_per_batch=FPB, total_frames=4 * FPB)
        if face == "sync":
            with collector:
                batches = await collect(collector, "sync")
        else:
            async with collector:
                batches = await collect(collector, "async")
        assert len(batches) == 4, face
        for batch in batches:
            assert tuple(batch.shape) == variant.batch_shape(FPB), (face, batch.shape)
            assert batch.names[-1] == "time"
            check_batch(batch)
            assert batch["action"].dtype == torch.int64
        check_rows_continue(variant, batches)
        ids = [set(rows(b)["collector", "traj_ids"].flatten().tolist()) for b in batches]
        if variant.collects_ahead and variant.workers > 1:  # workers never share an id
            assert ids[0] != ids[1] or len(ids[0]) > 0


def test_a_batch_is_the_users_own_later_collection_never_changes_it(variant):
    """Batches are copied out of the collector's storage (shared memory for the worker
    collectors, reused batch after batch): one kept while collection goes on stays as it was,
    and writing into it changes nothing the collector delivers later."""
    with variant(frames_per_batch=FPB, total_frames=8 * FPB) as collector:
        it = iter(collector)
        first = next(it)
        kept = first.clone()
        first["observation"].fill_(-7.0)  # the user scribbles on their batch
        first["next", "observation"].fill_(-7.0)
        first["next", "reward"].fill_(-7.0)
        first["collector", "traj_ids"].fill_(-7)
        later = list(it)
    assert len(later) == 7
    assert (first["observation"] == -7).all()  # still theirs: not overwritten by later batches
    for batch in later:
        check_batch(batch)
        assert not (batch["observation"] == -7).any()
        assert not (batch["collector", "traj_ids"] == -7).any()
    check_batch(kept)


def test_nested_observations_and_multidiscrete_actions(variant):
    with variant(DictEnv, frames_per_batch=FPB, total_frames=2 * FPB) as collector:
        for batch in collector:
            check_batch(batch)
            assert batch["nest", "t"].shape == (*variant.batch_shape(FPB), 1)
            assert batch["next", "nest", "t"].shape == (*variant.batch_shape(FPB), 1)
            assert batch["pos"].dtype == torch.float64 and batch["cell"].dtype == torch.int64
            assert batch["action"].shape == (*variant.batch_shape(FPB), 2)


async def test_total_frames_len_and_statistics(variant):
    collector = variant(frames_per_batch=FPB, total_frames=3 * FPB)
    async with collector:
        assert len(collector) == 3
        before = collector.statistics()
        batches = await collect(collector, "async")
        assert len(batches) == 3
        assert await collect(collector, "async") == []  # exhausted
        stats = collector.statistics()
    assert (before.frames, before.batches) == (0, 0)
    assert (stats.frames, stats.batches) == (3 * FPB, 3)
    assert stats.env_steps >= 3 * FPB
    done = sum(int(b["next", "done"].sum()) for b in batches)
    assert stats.completed_trajectories >= done
    assert len(stats.workers) == (0 if variant.cls.__name__ == "Collector" else variant.workers)
    assert stats.mean_episode_return is not None


def test_split_trajs_gives_one_trajectory_per_row(variant):
    with variant(frames_per_batch=FPB, total_frames=FPB, split_trajs=True) as collector:
        batch = next(iter(collector))
    mask = batch["collector", "mask"]
    ids = batch["collector", "traj_ids"]
    assert mask.shape == ids.shape and mask.any(-1).all()
    for row_ids, row_mask in zip(ids, mask):
        assert row_ids[row_mask].unique().numel() == 1, f"a row holds two trajectories: ids {ids}, mask {mask}"
        assert row_mask[: int(row_mask.sum())].all()  # left-aligned
    assert int(mask.sum()) == FPB


def whole_trajectories(batch, traj_format: str) -> list:
    """The trajectories of a ``trajs_per_batch`` batch: its rows' real frames ("padded"), or
    its frames cut after each done step ("cat")."""
    if traj_format == "padded":
        assert batch.names == [None, "time"]
        mask = batch["collector", "mask"]
        for row in mask:  # left-aligned
            assert row[: int(row.sum())].all()
        return [row[m] for row, m in zip(batch, mask)]
    assert batch.ndim == 1
    ends = torch.nonzero(batch["next", "done"][:, 0]).flatten() + 1
    return list(batch.split(torch.diff(ends, prepend=torch.zeros(1, dtype=ends.dtype)).tolist(), 0))


def check_whole(traj, seen: set) -> None:
    """One trajectory of ``CounterEnv``, from its reset to its done step, never seen before."""
    obs, ids = traj["observation"], traj["collector", "traj_ids"]
    assert (obs[:, 0] == torch.arange(len(traj))).all(), "not from its reset, or frames out of order"
    assert (obs[:, 1] == obs[0, 1]).all() and (ids == ids[0]).all(), "two episodes in one trajectory"
    done = traj["next", "done"][:, 0]
    assert done[-1] and not done[:-1].any()
    assert int(ids[0]) not in seen, "a trajectory delivered twice"
    seen.add(int(ids[0]))


def test_trajs_per_batch_delivers_whole_trajectories_across_collections(variant):
    env = functools.partial(CounterEnv, max_len=30)  # up to 29 steps: longer than one collection
    # each format on half the variants (both are one code path after the collection)
    for traj_format in [("padded", "cat")[VARIANTS.index(variant) % 2]]:
        seen: set[int] = set()
        with variant(env, frames_per_batch=FPB, total_frames=5 * FPB, trajs_per_batch=3,
                     traj_format=traj_format) as collector:
            batches = list(collector)
        assert batches, traj_format
        for batch in batches:
            assert batch.names[-1] == "time"
            trajs = whole_trajectories(batch, traj_format)
            assert len(trajs) == 3
            for traj in trajs:
                check_whole(traj, seen)
        assert max(len(t) for b in batches for t in whole_trajectories(b, traj_format)) > FPB // 4


async def test_trajs_per_batch_writes_whole_trajectories_to_the_replay_buffer(variant):
    buffer = ListBuffer()
    env = functools.partial(CounterEnv, max_len=30)
    def tag(td):  # postproc: on each collected batch, before assembly, as in TorchRL
        td.set("tagged", torch.ones(td.shape))
        return td

    async with variant(env, frames_per_batch=FPB, total_frames=4 * FPB, trajs_per_batch=2,
                       replay_buffer=buffer, postproc=tag) as collector:
        assert [b async for b in collector] == [None] * 4
    assert all(item.ndim == 1 for item in buffer.items), "trajectories are written flat"
    assert all(item["tagged"].all() for item in buffer.items), "postproc was not applied"
    stored = torch.cat(buffer.items)
    assert 0 < len(stored) <= 4 * FPB and stored["next", "done"][-1, 0]
    seen: set[int] = set()
    for traj in whole_trajectories(stored, "cat"):
        check_whole(traj, seen)
    assert ("collector", "mask") not in stored.keys(True)


def test_postproc_is_applied_to_every_batch(variant):
    def tag(td):
        td.set("tagged", torch.ones(td.shape))
        return td

    with variant(frames_per_batch=FPB, total_frames=2 * FPB, postproc=tag) as collector:
        for batch in collector:
            assert batch["tagged"].all()


def test_private_keys_reach_postproc_and_are_dropped_from_the_batch_as_in_torchrl(variant):
    # issue 51: TorchRL's collectors drop entries whose key starts with "_" after postproc
    from tensordict.nn import TensorDictModule, TensorDictSequential

    policy = TensorDictSequential(
        TensorDictModule(lambda obs: (obs[..., 0] % 3).long(), in_keys=["observation"], out_keys=["action"]),
        TensorDictModule(lambda a: a.float(), in_keys=["action"], out_keys=["_dummy"]),
        TensorDictModule(lambda a: a.float(), in_keys=["action"], out_keys=[("nest", "_hidden")]))
    seen = []

    def look(td):
        seen.append({"_dummy", ("nest", "_hidden")} <= set(td.keys(True)))
        td.set("_from_postproc", torch.ones(td.shape))
        return td

    with variant(CounterEnv, policy, frames_per_batch=FPB, total_frames=2 * FPB, postproc=look) as collector:
        for batch in collector:
            keys = set(batch.keys(True))
            assert not {"_dummy", ("nest", "_hidden"), "_from_postproc"} & keys, keys
            assert "action" in keys and ("collector", "traj_ids") in keys
            check_batch(batch)
    assert seen and all(seen)


async def test_a_batch_says_the_device_torchrl_s_say(variant):
    # TorchRL 0.14's rule (its test_output_device): the storing device (or device), else the env's
    # and the policy's when both are given and the same, else None (issue 51 had made it cpu)
    async with variant(frames_per_batch=FPB, total_frames=FPB, split_trajs=True) as collector:
        assert [batch.device async for batch in collector] == [None]
    async with variant(frames_per_batch=FPB, total_frames=FPB, storing_device="cpu") as collector:
        assert [batch.device async for batch in collector] == [torch.device("cpu")]
    async with variant(frames_per_batch=FPB, total_frames=FPB, env_device="cpu", policy_device="cpu") as collector:
        assert [batch.device async for batch in collector] == [torch.device("cpu")]


def test_reset_at_each_iter_starts_every_batch_with_new_trajectories(variant):
    with variant(frames_per_batch=FPB, total_frames=3 * FPB, reset_at_each_iter=True) as collector:
        seen: set[int] = set()
        for batch in collector:
            b = rows(batch)
            assert (b["observation"][:, 0, 0] == 0).all(), "a batch did not start from a reset"
            first = set(b["collector", "traj_ids"][:, 0].tolist())
            assert not first & seen, "a trajectory went on across reset_at_each_iter"
            seen |= set(b["collector", "traj_ids"].flatten().tolist())
            check_batch(batch)


def test_max_frames_per_traj_truncates_and_counts_steps(variant):
    env = functools.partial(CounterEnv, max_len=50)
    with variant(env, frames_per_batch=FPB, total_frames=2 * FPB, max_frames_per_traj=3) as collector:
        for batch in collector:
            check_batch(batch, step_count=3)
            b = rows(batch)
            assert (b["next", "step_count"] <= 3).all()
            assert b["next", "truncated"].any()


def test_init_random_frames_come_from_the_random_policy(variant):
    with variant(None, constant(2), frames_per_batch=FPB, total_frames=6 * FPB,
                 init_random_frames=FPB) as collector:
        batches = list(collector)
    assert (batches[0]["action"] != 2).any(), "the first batch was not random"
    assert (batches[-1]["action"] == 2).all(), "the policy never took over"


def test_set_seed_reproduces_the_trajectories(variant):
    def run(until):
        policy = lambda observation: (observation[..., 1] % 3).to(torch.int64)
        with variant(policy=policy, frames_per_batch=FPB, total_frames=-1) as collector:
            assert collector.set_seed(7) == 7 + variant.num_envs  # the next free seed
            batches = []
            for batch in collector:
                batches.append(batch)
                if until(batches):
                    return batches

    if not variant.collects_ahead or variant.workers == 1:
        first, second = run(lambda b: len(b) == 4), run(lambda b: len(b) == 4)
        for a, b in zip(first, second):
            assert torch.equal(a["observation"], b["observation"]) and torch.equal(a["action"], b["action"])
        return

    # MultiAsync: which worker fills a batch first is a race (a loaded machine can starve one
    # for a while), so each run goes on until every env's first rows came, and those match.
    # Env k's first trajectory has id k: its first rows are the rows that start it.
    def first_rows(batches):
        found = {}
        for b in batches:
            r = rows(b)
            for i in range(r.shape[0]):
                traj = int(r["collector", "traj_ids"][i, 0])
                if traj < variant.num_envs and r["observation"][i, 0, 0] == 0:
                    found.setdefault(traj, r["observation"][i])
        return found

    def every_env_started(batches):
        return len(first_rows(batches)) == variant.num_envs or len(batches) >= 200

    a, b = first_rows(run(every_env_started)), first_rows(run(every_env_started))
    assert a.keys() == b.keys() == set(range(variant.num_envs))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_state_dict_round_trip_restores_counters_weights_and_ids(variant):
    from support.envs import IntObsEnv
    from support.weights import linear

    with variant(IntObsEnv, linear(0.0), frames_per_batch=FPB, total_frames=4 * FPB) as first:
        it = iter(first)
        seen = set()
        for _ in range(2):
            seen |= set(next(it)["collector", "traj_ids"].flatten().tolist())
        first.update_policy_weights_(linear(3.0))
        state = first.state_dict()
    assert state["frames"] == 2 * FPB and state["iter"] == 1  # TorchRL's: the last batch's index
    assert torch.equal(state["policy_state_dict"]["module.weight"], torch.full((1, 3), 3.0))
    with variant(IntObsEnv, linear(0.0), frames_per_batch=FPB, total_frames=4 * FPB) as second:
        second.load_state_dict(state)
        assert second.statistics().frames == 2 * FPB
        rest = list(second)
        assert torch.equal(second.policy.module.weight, torch.full((1, 3), 3.0))
    assert len(rest) == 2, "total_frames does not count on from the restored frames"
    for batch in rest:
        assert not set(batch["collector", "traj_ids"].flatten().tolist()) & seen, "a trajectory id was reused"
        valid = batch["collector", "policy_version"] >= 0
        assert torch.equal(batch["action"][..., 0][valid], (3.0 * (batch["observation"].sum(-1) + 1))[valid])


class ListBuffer:
    def __init__(self):
        self.items = []

    def extend(self, batch):
        self.items.append(batch)


def test_replay_buffer_iteration_and_background_collection(variant):
    buffer = ListBuffer()
    with variant(frames_per_batch=FPB, total_frames=2 * FPB, replay_buffer=buffer) as collector:
        assert list(collector) == [None, None]
    assert len(buffer.items) == 2

    buffer = ListBuffer()
    collector = variant(frames_per_batch=FPB, total_frames=-1, replay_buffer=buffer)
    collector.start()
    deadline = time.monotonic() + 20
    while len(buffer.items) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert collector.is_running() and collector.statistics().running_in_background
    with collector.pause():
        count = len(buffer.items)
        time.sleep(0.05)
        assert len(buffer.items) == count, "the buffer changed during pause()"
    # pause() blocks may nest (a helper that pauses on its own) or overlap (other threads):
    # collection resumes after the last one ends, not the first (it did)
    with collector.pause():
        count = len(buffer.items)
        with collector.pause():
            pass
        time.sleep(0.05)
        assert len(buffer.items) == count, "the buffer changed after an inner pause() ended"
    grew = []

    def pausing(seconds: float) -> None:
        with collector.pause():
            before = len(buffer.items)
            time.sleep(seconds)
            grew.append(len(buffer.items) - before)

    threads = [threading.Thread(target=pausing, args=(s,)) for s in (0.02, 0.1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert grew == [0, 0], "the buffer changed during a pause() another thread's pause() ended"
    t0 = time.monotonic()
    collector.async_shutdown()
    assert time.monotonic() - t0 < 5
    assert not collector.is_running()
    assert len(buffer.items) >= 3
    for batch in buffer.items:
        check_batch(batch)


class PausingBuffer(ListBuffer):
    """Calls the collector's ``pause()`` from its ``extend``: on the collector's own loop."""

    collector = None

    def extend(self, batch):
        super().extend(batch)
        with self.collector.pause():
            pass


def test_pause_from_a_callback_on_the_collectors_loop_is_refused_not_a_hang(variant):
    buffer = PausingBuffer()
    collector = buffer.collector = variant(frames_per_batch=FPB, total_frames=-1, replay_buffer=buffer)
    try:
        collector.start()
        deadline = time.monotonic() + 20
        while collector.is_running() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not collector.is_running(), "pause() from the loop hung the collection"
        with pytest.raises(CollectorBusyError, match=r"pause\(\) was called from the collector's own") as info:
            collector.async_shutdown()
        # (the error's frames, kept by the log record of its failure too, hold the collector
        # and so its one file descriptor: the leak check would see it)
        traceback.clear_frames(info.value.__traceback__)
    finally:
        collector.shutdown()
        buffer.collector = None
        del collector
        gc.collect()


def test_the_policys_action_is_stored_as_written_and_the_env_gets_it_in_its_space(variant):
    """As TorchRL stores what the policy writes: an int64 action for a continuous env, of
    shape ``[n]`` where the space is ``(1,)``, stays int64 ``[..., T]`` in the batch; the env
    gets it as float32 of shape ``(1,)`` (``EchoBoxEnv`` asserts the shape and echoes the value
    as its reward); a tuple's second output is TorchRL's ``"output1"``."""
    from support.envs import EchoBoxEnv
    from support.plain_modules import IntegerEcho

    with variant(EchoBoxEnv, IntegerEcho(), frames_per_batch=FPB, total_frames=FPB) as collector:
        for batch in collector:
            shape = variant.batch_shape(FPB)
            assert batch["action"].dtype == torch.int64 and tuple(batch["action"].shape) == shape
            assert batch["output1"].dtype == torch.float32 and tuple(batch["output1"].shape) == shape
            assert torch.equal(batch["next", "reward"][..., 0], batch["action"].float())
            assert torch.equal(batch["output1"], 2 * (batch["action"] - 1).float())

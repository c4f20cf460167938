"""Pipelining: a worker whose envs step in two parts, in turn (``WorkerSpec.parts``), gives
exactly the batches, counts and errors a worker stepping them all at once gives."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
from tensordict.nn import TensorDictModule

from aiocollect import EnvError, MultiAsyncCollector, MultiSyncCollector
from support.checks import check_batch
from support.envs import TAG, CounterEnv, TaggedCounter


class _Steps(nn.Module):
    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return (obs[..., 0] + obs[..., 1]).long() % 3


def deterministic_policy() -> TensorDictModule:
    """The action depends on the observation only, not on who else is in the policy call."""
    return TensorDictModule(_Steps(), in_keys=["observation"], out_keys=["action"])


def entries(workers: int, envs: int) -> list:
    return [[lambda w=w: TaggedCounter(w)] * envs for w in range(workers)]


FIELDS = ["observation", "action", ("next", "observation"), ("next", "reward"), ("next", "done"),
          ("next", "terminated"), ("next", "truncated"), ("collector", "mask")]


def content(batch) -> dict:
    return {k: batch[k].clone() for k in FIELDS if k in batch.keys(True)}


def collect(cls, pipeline: str, monkeypatch, workers: int, envs: int, per_worker: int,
            in_workers: str = "0") -> tuple[dict, dict]:
    """Batches by worker (MultiSync: one list), and the collector's state afterwards; the
    policy central (parts are for a central policy) or, ``in_workers="1"``, in the workers."""
    monkeypatch.setenv("AIOCOLLECT_PIPELINE", pipeline)
    monkeypatch.setenv("AIOCOLLECT_POLICY_IN_WORKERS", in_workers)
    steps = 7
    fpb = steps * envs * (workers if cls is MultiSyncCollector else 1)
    got: dict[int, list] = {}
    with cls(entries(workers, envs), deterministic_policy(), frames_per_batch=fpb) as c:
        assert c.policy_in_workers is (in_workers == "1")
        parts = {lane.index: len(lanes) for lanes in c._worker_lanes for lane in lanes}
        assert set(parts.values()) == ({2} if pipeline == "1" and in_workers == "0" else {1})
        c.set_seed(3)
        keys = [0] if cls is MultiSyncCollector else list(range(workers))
        for _, batch in zip(range(200), c):
            key = 0 if cls is MultiSyncCollector else int(batch["observation"][0, 0, 1].item()) // TAG
            got.setdefault(key, []).append(content(batch))
            check_batch(batch if batch.ndim == 2 else batch.flatten(0, 1))
            if all(len(got.get(k, [])) >= per_worker for k in keys):
                break
        state = c.state_dict()
        stats = c.statistics()
    return {k: v[:per_worker] for k, v in got.items()}, {"state": state, "stats": stats}


@pytest.mark.parametrize(("cls", "envs"), [(MultiSyncCollector, 2), (MultiSyncCollector, 3), (MultiAsyncCollector, 3)])
def test_parts_give_the_batches_whole_workers_give(cls, envs, monkeypatch):
    """(3 envs: parts of 2 and 1.) And the policy in the workers, each acting with its own
    copy in runs of steps, gives them too."""
    whole, whole_state = collect(cls, "0", monkeypatch, 2, envs, 3)
    for other, other_state in (collect(cls, "1", monkeypatch, 2, envs, 3),
                               collect(cls, "0", monkeypatch, 2, envs, 3, in_workers="1")):
        assert whole.keys() == other.keys()
        for key in whole:
            for a, b in zip(whole[key], other[key], strict=True):
                assert a.keys() == b.keys()
                for k in a:
                    assert torch.equal(a[k], b[k]), (key, k)
        if cls is MultiSyncCollector:  # (MultiAsync collects ahead, by its workers' pace)
            # a worker in parts counts its steps and trajectories once
            for w in (0, 1):
                a, b = whole_state["state"][f"worker{w}"], other_state["state"][f"worker{w}"]
                assert a["completed_trajectories"] == b["completed_trajectories"] > 0
                assert a["env_steps"] == b["env_steps"] == 3 * 7 * envs
            steps = [[w.env_steps for w in run["stats"].workers] for run in (whole_state, other_state)]
            assert steps[0] == steps[1]
            assert other_state["state"]["traj_pool"] == whole_state["state"]["traj_pool"]


@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
def test_an_env_of_a_second_part_is_named_by_its_index_in_the_worker(cls, monkeypatch):
    monkeypatch.setenv("AIOCOLLECT_PIPELINE", "1")
    fpb = 4 * 3 * (2 if cls is MultiSyncCollector else 1)
    bad = [lambda: CounterEnv(max_len=50)] * 2 + [lambda: CounterEnv(max_len=50, fail_at=3)]
    with pytest.raises(EnvError) as info, \
            cls([[lambda: CounterEnv(max_len=50)] * 3, bad], None, frames_per_batch=fpb) as c:
        for _ in c:
            pass
    assert (info.value.worker, info.value.env) == (1, 2)


def test_state_dict_round_trip_with_parts(monkeypatch):
    monkeypatch.setenv("AIOCOLLECT_PIPELINE", "1")
    with MultiSyncCollector(entries(2, 3), None, frames_per_batch=42) as c:
        for _, _ in zip(range(3), c):
            pass
        state = c.state_dict()
    with MultiSyncCollector(entries(2, 3), None, frames_per_batch=42) as c:
        c.load_state_dict(state)
        again = c.state_dict()
        batch = next(iter(c))
    for w in (0, 1):
        assert again[f"worker{w}"]["completed_trajectories"] == state[f"worker{w}"]["completed_trajectories"]
    assert batch["collector", "traj_ids"].min() >= state["traj_pool"]["next_traj_id"]
    assert np.all(batch["collector", "traj_ids"].numpy() >= 0)


@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
async def test_async_for_over_parts_gives_the_batches_of_plain_for_over_whole_workers(cls, monkeypatch):
    whole, _ = collect(cls, "0", monkeypatch, 1, 3, 3)  # one worker: MultiAsync's order is fixed
    monkeypatch.setenv("AIOCOLLECT_PIPELINE", "1")
    fpb = 7 * 3
    got = []
    async with cls(entries(1, 3), deterministic_policy(), frames_per_batch=fpb, total_frames=3 * fpb) as c:
        assert len(c._worker_lanes[0]) == 2
        c.set_seed(3)
        async for batch in c:
            got.append(content(batch))
    assert len(got) == 3
    for a, b in zip(whole[0], got, strict=True):
        for k in a:
            assert torch.equal(a[k], b[k]), k

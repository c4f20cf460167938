"""A round over process lanes at one slot but different columns (issue 54): their rows gathered
and their outputs written through index arrays (``WorkerRounds._act_rows``) must store exactly
what concatenating each lane's block and writing lane by lane (``_act_apart``) stores: the
policy's inputs, its outputs, the actions the envs take, ids, step counts, versions, and the
commands posted.

The workers are played by the test, as in ``test_block_harvest``: no process starts."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict.nn import InteractionType

from aiocollect._engine.lanes import READY, rows_and_columns
from aiocollect._engine.scheduler import Scheduler
from aiocollect._engine.storage import RolloutStorage
from aiocollect._engine.timelines import Timelines
from aiocollect._envs.group import InProcessGroup
from aiocollect._policies.runner import PolicyRunner
from aiocollect._workers import protocol
from aiocollect._workers.plan import WorkerSpec
from aiocollect._workers.pool import Worker
from aiocollect._workers.shm import Layout, SharedArrays
from support.envs import StepEnv

N, COLUMNS = 12, 6


def policy(observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Reads its inputs: the action says the observation's tag, a second output all of it."""
    return (observation[:, 1].long() % 4), observation * 2


def engine():
    """Two workers of 6 envs, each in two parts of 3 (one part of 6 for the second worker's
    second half would make them unequal: lanes of 3, 3, 2 and 4 rows)."""
    group = InProcessGroup([StepEnv(10, tag=i) for i in range(N)])
    check = group.check_action
    workers = [Worker(WorkerSpec(0, b"", 6, True, 0, 6, False, ((0, 3), (3, 6)))),
               Worker(WorkerSpec(1, b"", 6, True, 6, 12, False, ((6, 8), (8, 12))))]
    ports = [port for w in workers for port in w.ports]
    layout = Layout.plan([(leaf.dtype, leaf.shape) for leaf in group.obs_leaves], (check.dtype, check.shape), N,
                         len(ports), columns=COLUMNS, slots=2)
    shared = SharedArrays(layout, -1)
    seen = np.zeros(len(ports), np.int64)
    for k, port in enumerate(ports):
        port.control, port.line, port.seen = shared.control[k], k, seen
        port.control[protocol.W_ASLEEP] = 0  # (a worker awake: posting rings no socket)
    storage = RolloutStorage(shared, group.obs_leaves, step_count=True)
    timelines = Timelines(N, reset_when_done=True, count_steps=True)
    timelines.needs_reset[:] = False
    timelines.any_reset = False
    sched = Scheduler(storage, timelines, ports, check)
    for lane in sched.lanes:
        sched.begin(lane, COLUMNS, False)
    keys = [leaf.key for leaf in group.obs_leaves]
    group.close()
    from tensordict.nn import TensorDictModule

    module = TensorDictModule(policy, in_keys=["observation"], out_keys=["action", "doubled"])
    runner = PolicyRunner(module, keys, device=None, exploration_type=InteractionType.DETERMINISTIC)
    return sched, storage, runner


def fill(storage: RolloutStorage, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for x in storage.obs:
        x[...] = rng.integers(0, 100, x.shape)


@pytest.mark.parametrize("seed", range(6))
def test_rows_round_stores_what_the_lane_by_lane_round_stores(seed):
    rng = np.random.default_rng(seed)
    columns = rng.integers(0, COLUMNS, 4).tolist()
    chosen = sorted(rng.choice(4, size=int(rng.integers(2, 5)), replace=False).tolist())
    results = []
    for how in ("_act_rows", "_act_apart"):
        sched, storage, runner = engine()
        fill(storage, seed)
        sched.timelines.traj_ids[:] = np.arange(100, 100 + N)
        sched.timelines.step_count[:] = np.arange(N) * 3
        for lane, t in zip(sched.lanes, columns):
            lane.t = t
            lane.held = False
        ready = [sched.lanes[i] for i in chosen]
        getattr(sched.rounds, how)(ready, runner)
        assert all(lane.state is not READY for lane in ready) and sched.busy == len(ready)
        results.append((storage.action.copy(), storage.traj_ids.copy(), storage.step_count.copy(),
                        storage.policy_version.copy(),
                        {k: (v if v is not None else storage._out_t[k].numpy()).copy()
                         for k, v in storage._out_np.items()},
                        storage.control[:, [protocol.CMD, protocol.SLOT, protocol.COL]].copy()))
    (a_rows, ids_rows, sc_rows, v_rows, out_rows, ctl_rows), (a_apart, ids_apart, sc_apart, v_apart, out_apart,
                                                               ctl_apart) = results
    np.testing.assert_array_equal(a_rows, a_apart)
    np.testing.assert_array_equal(ids_rows, ids_apart)
    np.testing.assert_array_equal(sc_rows, sc_apart)
    np.testing.assert_array_equal(v_rows, v_apart)
    assert out_rows.keys() == out_apart.keys() == {"action", "doubled"}
    for key in out_rows:
        np.testing.assert_array_equal(out_rows[key], out_apart[key])
    np.testing.assert_array_equal(ctl_rows, ctl_apart)
    assert (ctl_rows[chosen, 0] & 3 == protocol.STEP_CODE).all()


def test_rows_and_columns_of_unequal_lanes():
    sched, _, _ = engine()
    for lane, t in zip(sched.lanes, (5, 0, 2, 3)):
        lane.t = t
    rows, cols = rows_and_columns(sched.lanes[1:])
    assert rows.tolist() == list(range(3, 12))
    assert cols.tolist() == [0] * 3 + [2] * 2 + [3] * 4

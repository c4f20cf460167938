"""The scheduler's harvest of process lanes (issue 54): every lane's completion read from the
control block at once (``Scheduler._harvest_block``), and lanes side by side that completed
the same step booked in one ``Timelines.stepped`` (``_take_all``). It must book exactly what
taking each lane in turn (``Scheduler.take`` after ``Port.completed``) books: trajectory ids,
step counts, finished trajectories, env steps, columns, and the order of full lanes.

The workers here are played by the test: it posts steps as the engine does, writes done
flags and the ``DONE`` word as a worker would, and never starts a process."""

from __future__ import annotations

import numpy as np
import pytest

from aiocollect._engine.lanes import READY, STEPPING
from aiocollect._engine.scheduler import Scheduler
from aiocollect._engine.storage import RolloutStorage
from aiocollect._engine.timelines import Timelines
from aiocollect._envs.group import InProcessGroup
from aiocollect._workers import protocol
from aiocollect._workers.plan import WorkerSpec
from aiocollect._workers.pool import Port, Worker
from aiocollect._workers.shm import Layout, SharedArrays
from support.envs import StepEnv

N, COLUMNS, FRAMES = 12, 6, 4


def engine(reset_when_done: bool):
    """Two workers of 6 envs, each in two parts of 3: four process lanes side by side."""
    group = InProcessGroup([StepEnv(10, tag=i) for i in range(N)])
    check = group.check_action
    workers = [Worker(WorkerSpec(0, b"", 6, True, 0, 6, False, ((0, 3), (3, 6)))),
               Worker(WorkerSpec(1, b"", 6, True, 6, 12, False, ((6, 9), (9, 12))))]
    ports = [port for w in workers for port in w.ports]
    layout = Layout.plan([(leaf.dtype, leaf.shape) for leaf in group.obs_leaves], (check.dtype, check.shape), N,
                         len(ports), columns=COLUMNS, slots=2)
    shared = SharedArrays(layout, -1)
    seen = np.zeros(len(ports), np.int64)
    for k, port in enumerate(ports):
        port.control, port.line, port.seen = shared.control[k], k, seen
        port.control[protocol.W_ASLEEP] = 0  # (a worker awake: posting rings no socket)
    storage = RolloutStorage(shared, group.obs_leaves, step_count=True)
    timelines = Timelines(N, reset_when_done=reset_when_done, count_steps=True)
    sched = Scheduler(storage, timelines, ports, check)
    full: list[tuple[int, int]] = []
    sched._on_full = lambda lane: full.append((lane.lo, lane.t))
    for lane in sched.lanes:
        sched.begin(lane, FRAMES, False)
    group.close()
    return sched, storage, full


def play(grouped: bool, reset_when_done: bool, seed: int):
    rng = np.random.default_rng(seed)
    sched, storage, full = engine(reset_when_done)
    assert all(isinstance(lane.worker, Port) for lane in sched.lanes)
    for _ in range(12):
        posted = False
        for lane in sched.lanes:
            if lane.t >= lane.frames:
                lane.t = 0  # (the next batch, in the same slot)
            if rng.random() < 0.8:  # (some lanes sit out a round, which splits the groups)
                lane.state = STEPPING
                sched.busy += 1
                lane.worker.post(protocol.STEP_CODE, lane.slot, lane.t)
                posted = True
        for lane in sched.lanes:  # each worker: the step's flags, then its DONE word
            if lane.state is STEPPING:
                s, t, lo, hi = lane.slot, lane.t, lane.lo, lane.hi
                storage.terminated[s, t, lo:hi] = rng.random(hi - lo) < 0.3
                storage.truncated[s, t, lo:hi] = rng.random(hi - lo) < 0.2
                lane.worker.control[protocol.DONE] = int(lane.worker.control[protocol.CMD]) >> 2
        if grouped:
            assert sched._harvest() is posted
            assert not sched._harvest(), "a completion is taken in once"
        else:
            for lane in sched.lanes:
                if lane.state is not READY and lane.worker.completed():
                    sched.take(lane)
        assert all(lane.state is READY for lane in sched.lanes) and sched.busy == 0
    tl = sched.timelines
    return (tl.traj_ids.tolist(), tl.step_count.tolist(), tl.completed_trajectories, tl.env_steps,
            [(lane.t, lane.completed_trajectories, lane.worker.env_steps) for lane in sched.lanes], full)


@pytest.mark.parametrize("reset_when_done", [True, False])
def test_the_block_harvest_books_what_taking_each_lane_in_turn_books(reset_when_done):
    for seed in range(40):
        assert play(True, reset_when_done, seed) == play(False, reset_when_done, seed), seed


def test_a_full_lane_whose_delivery_raises_leaves_its_neighbours_booked_once():
    sched, _, _ = engine(True)
    for lane in sched.lanes:
        lane.frames = 1  # (each step fills its lane)
        lane.state = STEPPING
        sched.busy += 1
        lane.worker.post(protocol.STEP_CODE, lane.slot, lane.t)
        lane.worker.control[protocol.DONE] = int(lane.worker.control[protocol.CMD]) >> 2

    def fails(lane):
        raise RuntimeError("delivery failed")

    sched._on_full = fails
    with pytest.raises(RuntimeError, match="delivery failed"):
        sched._harvest()
    assert [lane.t for lane in sched.lanes] == [1] * 4 and all(lane.state is READY for lane in sched.lanes)
    assert sched.busy == 0 and sched.timelines.env_steps == N
    sched._on_full = None
    assert not sched._harvest(), "nothing is booked twice"
    assert sched.timelines.env_steps == N

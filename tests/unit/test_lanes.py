"""The ``LaneWorker`` protocol (``_workers.lane``) and the round strategies (``_engine.rounds``).

Every kind of lane declares the protocol and its capabilities (never probed by the
scheduler), the scheduler picks one round strategy from its lanes, and the scheduler and
the step watchdog depend on the protocol, not on the pool that implements it. (What the
strategies do is the contract suite's business, and ``test_inline_scheduler.py``'s.) Whether a
lane acts with its worker's own copy of the policy is a capability too (``acts_locally``), and
the rounds ask the actor what it does, never its kind.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import pathlib

import numpy as np
import pytest
from gymnasium import spaces

import aiocollect
from aiocollect._engine.rounds import Batching, EnvQueueRounds, InlineRounds, RunRounds, WorkerRounds
from aiocollect._engine.scheduler import Scheduler
from aiocollect._engine.storage import RolloutStorage
from aiocollect._engine.timelines import Timelines
from aiocollect._envs.group import InProcessGroup
from aiocollect._workers.coroutine_lanes import EnvLane
from aiocollect._workers.coroutine_worker import CoroutineWorker
from aiocollect._workers.inline_worker import InlineWorker
from aiocollect._workers.lane import LaneOwner, LaneWorker, ProcessLane, ProcessWorker
from aiocollect._workers.plan import WorkerPlan, WorkerSpec
from aiocollect._workers.pool import Port, Worker, WorkerPool
from aiocollect._workers.shm import Layout, SharedArrays
from support.envs import StepEnv

ROOT = pathlib.Path(aiocollect.__file__).parent


def shared_for(group: InProcessGroup, columns: int = 4) -> SharedArrays:
    check = group.check_action
    layout = Layout.plan([(leaf.dtype, leaf.shape) for leaf in group.obs_leaves], (check.dtype, check.shape),
                         group.num_envs, 1, columns=columns, slots=1)
    return SharedArrays(layout, -1)


def group_of(n: int) -> InProcessGroup:
    return InProcessGroup([StepEnv(10, tag=i) for i in range(n)])


def spec(parts=((0, 2), (2, 4)), coroutine=False) -> WorkerSpec:
    return WorkerSpec(index=1, entry=b"", num_envs=4, batched=True, lo=0, hi=4, coroutine=coroutine, parts=parts)


def one_of_each() -> dict[type, LaneWorker]:
    group = group_of(2)
    worker = Worker(spec())
    return {
        Port: worker.ports[0],
        CoroutineWorker: CoroutineWorker(spec((), coroutine=True)),
        EnvLane: EnvLane(None, 3),
        InlineWorker: InlineWorker(group, shared_for(group), max_frames_per_traj=None, reset_when_done=True),
    }


# (in_process, takes_runs, synchronous, acts_locally) of each kind (a port acts locally once
# its pool gives its worker a copy of the policy: ``test_a_port_acts_locally_when_its_worker_has_the_policy``)
CAPABILITIES = {
    Port: (False, True, False, False),
    CoroutineWorker: (True, False, False, False),
    EnvLane: (True, False, False, False),
    InlineWorker: (True, True, True, False),
}


@pytest.mark.parametrize("kind", list(CAPABILITIES), ids=lambda k: k.__name__)
def test_every_kind_of_lane_declares_the_protocol_and_its_capabilities(kind):
    lane = one_of_each()[kind]
    assert LaneWorker in kind.__mro__  # declared, not merely shaped alike
    assert isinstance(lane, LaneWorker) and isinstance(lane.owner, LaneOwner)
    assert (lane.in_process, lane.takes_runs, lane.synchronous, lane.acts_locally) == CAPABILITIES[kind]
    assert "local" in inspect.signature(lane.post).parameters  # (what RunRounds passes: the protocol's)
    assert lane.num_envs == lane.hi - lane.lo and lane.env_steps == 0 and lane.error is None
    # what the scheduler once probed for is gone: capabilities say it
    for stub in ("runs", "sock", "alive") if kind is not CoroutineWorker else ("runs", "sock"):
        assert not hasattr(lane, stub), stub
    assert hasattr(lane, "control") == (not lane.in_process)


def test_only_lanes_that_take_runs_answer_for_runs():
    for kind, lane in one_of_each().items():
        if lane.takes_runs:
            continue
        with pytest.raises(NotImplementedError, match=kind.__name__):
            lane.steps_done()
        with pytest.raises(NotImplementedError):
            lane.cut_run()


def test_a_process_reports_for_its_ports_and_the_others_for_themselves():
    worker = Worker(spec())
    assert isinstance(worker, ProcessWorker) and ProcessWorker in Worker.__mro__
    assert [(p.lo, p.hi) for p in worker.ports] == [(0, 2), (2, 4)]
    for port in worker.ports:
        assert isinstance(port, ProcessLane) and port.owner is worker and port.posted == 0
        assert (port.index, port.pid, port.process) == (1, None, None)
    seen = []
    worker.ports[1].on_reply = seen.append  # set on a port: the worker's
    worker.fail(aiocollect.WorkerError("boom"))
    assert seen == [worker] and worker.ports[0].error is worker.error
    for kind, lane in one_of_each().items():
        if kind is not Port:
            assert lane.owner is lane


def scheduler(workers, **kw) -> Scheduler:
    group = group_of(sum(w.num_envs for w in workers))
    storage = RolloutStorage(shared_for(group), group.obs_leaves, step_count=False)
    timelines = Timelines(storage.num_envs, reset_when_done=True, count_steps=False)
    return Scheduler(storage, timelines, workers, group.check_action, **kw)


def test_the_scheduler_picks_one_round_strategy_from_its_lanes():
    group = group_of(2)
    inline = InlineWorker(group, shared_for(group), max_frames_per_traj=None, reset_when_done=True)
    assert type(scheduler([inline]).rounds) is InlineRounds
    ports = Worker(spec()).ports
    assert type(scheduler(ports).rounds) is WorkerRounds
    assert type(scheduler(ports, runs=True).rounds) is RunRounds
    lanes = [EnvLane(None, i) for i in range(3)]
    assert type(scheduler(lanes, batching=Batching()).rounds) is EnvQueueRounds
    with pytest.raises(ValueError, match="one env each"):
        scheduler([EnvLane(None, 1)], batching=Batching())
    with pytest.raises(ValueError, match="run_inline drives one inline lane, not 2"):
        asyncio.run(scheduler(ports).run_inline(lambda: None, lambda: False))
    with pytest.raises(NotImplementedError, match="WorkerRounds posts no runs"):
        scheduler(ports).rounds.book_run(scheduler(ports).lanes[0])


def test_a_port_acts_locally_when_its_worker_has_the_policy():
    plan = WorkerPlan((spec(parts=((0, 4),)),), spaces.Box(-1, 1, (3,)), spaces.Discrete(2))
    layout = Layout.plan([(np.dtype(np.float32), (3,))], (np.dtype(np.int64), ()), 4, 1)
    for policy in (None, {"policy": b""}):
        pool = WorkerPool(plan, layout, reset_when_done=True, policy=policy)
        try:
            assert [lane.acts_locally for lane in pool.lanes] == [policy is not None]
        finally:
            pool.kill_leftovers()


@pytest.mark.parametrize("module", ["_engine/scheduler.py", "_engine/rounds.py"])
def test_the_rounds_ask_the_actor_and_the_scheduler_asks_the_strategy(module):
    """What an actor, a lane or a strategy does is declared (``_policies.actor``): no kind
    strings, no ``isinstance`` of a strategy."""
    source = (ROOT / module).read_text()
    assert ".kind" not in source and "isinstance(self.rounds" not in source


def test_per_env_rounds_queue_the_lanes_in_the_order_they_became_ready():
    sched = scheduler([EnvLane(None, i) for i in range(3)], batching=Batching())
    lanes = sched.lanes
    for i in (2, 0, 1, 0):
        sched.begin(lanes[i], 2, False)
    assert sched.rounds.queue == [lanes[2], lanes[0], lanes[1]] and all(lane.queued for lane in lanes)


def imported_modules(path: pathlib.Path) -> set[str]:
    """The aiocollect modules ``path`` imports, at any level (``TYPE_CHECKING`` included)."""
    package = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join([*base, node.module] if node.module else base)
            found |= {target} | {f"{target}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return {m for m in found if m.startswith("aiocollect.")}


@pytest.mark.parametrize("module", ["_workers/watchdog.py", "_engine/scheduler.py", "_engine/rounds.py",
                                    "_engine/lanes.py", "_workers/lane.py"])
def test_the_scheduler_and_the_watchdog_know_lanes_by_the_protocol_not_by_the_pool(module):
    imported = imported_modules(ROOT / module)
    assert "aiocollect._workers.pool" not in imported
    if module != "_workers/lane.py":
        assert imported & {"aiocollect._workers.lane", "aiocollect._engine.lanes"}

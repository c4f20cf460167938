"""The contract, where it makes sense, for the distributed collectors: RayCollector on a local Ray
instance (``ray_cluster``) and RPCCollector in a process of its own (an RPC world is one per
process, and ``support.zygote`` forks it ready-imported). Layout on both faces, total_frames,
weights routed by ``worker_ids`` to the right remote collector, the same error types (a remote
env's ``EnvError`` is the ``__cause__`` of a ``RemoteCollectorError``), use after shutdown, bad
input before any actor starts."""

from __future__ import annotations

import functools
import gc
import json
import os
import textwrap

import pytest
import torch

from aiocollect import CollectorClosedError, CollectorError, EnvError, RemoteCollectorError
from support import zygote
from support.checks import check_batch, check_whole_episode
from support.envs import CounterEnv, TaggedIntObsEnv
from support.procs import leftovers, snapshot, wait_until
from support.weights import check_versions, linear

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.xdist_group("ray")  # one Ray instance at a time (scripts/test.sh runs pytest -n 2)
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def leak_check():
    """The contract's leak check without sockets: the Ray driver keeps its connections to the
    module's cluster open between tests (the RPC cases run in their own interpreter)."""
    before = snapshot()
    yield
    gc.collect()
    assert wait_until(lambda: not {k: v for k, v in leftovers(before).items() if "sockets" not in k})


def tagged(tag):
    return functools.partial(TaggedIntObsEnv, tag)


# three Ray collectors: 27 s on a quiet 2-core machine, past 120 s with one busy process beside the suite
@pytest.mark.timeout(300)
async def test_ray_layout_on_both_faces_and_total_frames(ray_cluster):
    from aiocollect import RayCollector

    with RayCollector(CounterEnv, None, frames_per_batch=40, total_frames=120, num_collectors=2, sync=True,
                      collector_class="single") as c:
        assert len(c) == 3
        batches = list(c)
        assert c.statistics().frames == 120
    assert [tuple(b.shape) for b in batches] == [(2, 20)] * 3
    for b in batches:
        check_batch(b)
    async with RayCollector(CounterEnv, None, frames_per_batch=40, total_frames=80, num_collectors=2,
                            sync=False, collector_class="single") as c:
        batches = [b async for b in c]
    assert len(batches) == 2 and all(tuple(b.shape) == (40,) for b in batches)
    for b in batches:
        check_batch(b)
    # trajs_per_batch: assembled here, over both remote collectors' batches (ids made global)
    with RayCollector(functools.partial(CounterEnv, max_len=30), None, frames_per_batch=40, total_frames=160,
                      num_collectors=2, sync=True, collector_class="single", trajs_per_batch=3) as c:
        trajs = list(c)
    assert trajs and all(b.shape[0] == 3 for b in trajs)
    ids = [int(row[mask][0]) for b in trajs for row, mask in zip(b["collector", "traj_ids"], b["collector", "mask"])]
    assert len(set(ids)) == len(ids)
    for b in trajs:
        for row, mask in zip(b, b["collector", "mask"]):
            t = row[mask]
            assert (t["observation"][:, 0] == torch.arange(len(t))).all() and t["next", "done"][-1, 0]


def test_ray_trajs_per_batch_drops_what_set_seed_cuts_instead_of_holding_it(ray_cluster):
    # the remote collectors' resets cut trajectories that never end; their ids used to stay
    # remote, so the driver held every cut piece for good (2 -> 62 pieces over 60 batches).
    # (sync here; the RPC case below is async: both transports assemble in the same base class)
    from aiocollect import RayCollector
    from support.episode_envs import EpisodeEnv

    make = functools.partial(EpisodeEnv, length=6, step_s=0.001)
    delivered, held = 0, []
    with RayCollector([make], None, frames_per_batch=20, total_frames=-1, num_collectors=2, sync=True,
                      collector_class="single", trajs_per_batch=2) as c:
        for i, batch in enumerate(c):
            for row, mask in zip(batch, batch["collector", "mask"]):
                check_whole_episode(row[mask])
                delivered += 1
            held.append(c._assembler.pending)
            if i % 2:
                c.set_seed(i)
            if i == 30:
                break
    assert delivered == 62
    # at most one trajectory under way per env (2), and one per env cut by a set_seed whose
    # ids have not come back with a batch yet
    assert max(held) <= 4, held


def test_ray_worker_ids_route_weights_to_the_named_remote_collector(ray_cluster):
    from aiocollect import RayCollector

    c = RayCollector([tagged(100), tagged(200)], linear(0.0), frames_per_batch=30, total_frames=-1,
                     collector_class="single", sync=False)
    try:
        versions = {100: set(), 200: set()}
        updated = False
        for i, batch in enumerate(c):
            check_versions(batch)
            tag = int(batch["observation"][0, 0])
            versions[tag] |= set(batch["collector", "policy_version"].unique().tolist())
            if i == 2:
                assert c.update_policy_weights_(linear(1.0), worker_ids=[1]) == 1
                updated = True
            if updated and 1 in versions[200] and versions[100] and i > 12:
                break  # (under load one remote collector can deliver every batch for a while)
            assert i < 200, "remote collector 1 never used the weights sent to it"
        assert versions[100] == {0}, "weights sent to remote collector 1 reached remote collector 0"
        assert 1 in versions[200]
    finally:
        c.shutdown()


def test_ray_errors_have_the_same_types(ray_cluster):
    from aiocollect import RayCollector

    c = RayCollector(functools.partial(CounterEnv, fail_at=25), None, frames_per_batch=10, total_frames=-1)
    with pytest.raises(RemoteCollectorError) as info:
        for _ in range(10):
            c.rollout()
    err = info.value
    assert isinstance(err, CollectorError) and err.index == 0
    cause = err.__cause__
    assert isinstance(cause, EnvError) and (cause.worker, cause.env) == (0, 0)
    assert isinstance(cause.__cause__, ValueError) and "exploded on purpose" in str(cause.__cause__)
    c.shutdown()
    c.shutdown()
    for use in (c.rollout, lambda: c.set_seed(1), c.update_policy_weights_):
        with pytest.raises(CollectorClosedError, match="shut down"):
            use()


def test_ray_bad_input_before_any_actor_starts():
    from aiocollect import RayCollector

    with pytest.raises(ValueError, match="frames_per_batch must be positive"):
        RayCollector(CounterEnv, None, frames_per_batch=0)
    with pytest.raises(ValueError, match="does not split over 3"):
        RayCollector(CounterEnv, None, frames_per_batch=10, num_collectors=3, sync=True)


RPC = textwrap.dedent(
    """
    import functools, json, sys
    sys.path.insert(0, {tests!r})
    from aiocollect import CollectorClosedError, EnvError, RPCCollector, RemoteCollectorError
    from support.checks import check_batch, check_whole_episode
    from support.envs import CounterEnv
    out = {{}}
    c = RPCCollector([CounterEnv, functools.partial(CounterEnv, fail_at=30)], None, frames_per_batch=20,
                     total_frames=-1, sync=True)
    batch = c.rollout()
    check_batch(batch)
    out["shape"] = list(batch.shape)
    try:
        for _ in range(20):
            c.rollout()
    except RemoteCollectorError as err:
        out["error"] = [err.index, type(err.__cause__).__name__, isinstance(err.__cause__, EnvError)]
    c.shutdown()
    c.shutdown()
    try:
        c.rollout()
    except CollectorClosedError:
        out["closed"] = True
    try:
        RPCCollector(CounterEnv, None, frames_per_batch=0)
    except ValueError as err:
        out["bad"] = "frames_per_batch" in str(err)
    print(json.dumps(out))
    """
)


def test_rpc_the_same_contract_in_a_fresh_interpreter():
    proc = zygote.run(RPC.format(tests=TESTS), timeout=110)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"shape": [2, 10], "error": [1, "EnvError", True], "closed": True, "bad": True}


RPC_CUT = textwrap.dedent(
    """
    import functools, json, sys
    sys.path.insert(0, {tests!r})
    from aiocollect import RPCCollector
    from support.checks import check_whole_episode
    from support.episode_envs import EpisodeEnv
    make = functools.partial(EpisodeEnv, length=6, step_s=0.001)
    c = RPCCollector([make, make], None, frames_per_batch=20, total_frames=-1, sync=False, trajs_per_batch=2)
    held, whole = [], 0
    for i, batch in enumerate(c):
        for row, mask in zip(batch, batch["collector", "mask"]):
            try:
                check_whole_episode(row[mask])
                whole += 1
            except AssertionError:
                pass
        held.append(c._assembler.pending)
        if i % 2:
            c.set_seed(i)
        if i == 20:
            break
    c.shutdown()
    print(json.dumps({{"whole": whole, "held": max(held)}}))
    """
)


def test_rpc_trajs_per_batch_drops_what_set_seed_cuts():
    # the same as the Ray case above, over torch RPC (which assembles in the same base class)
    proc = zygote.run(RPC_CUT.format(tests=TESTS), timeout=110)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["whole"] == 42 and out["held"] <= 4, out

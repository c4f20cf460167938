"""RayCollector on a real local Ray cluster: the seed example, both modes, weights, faults."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from tensordict.nn import TensorDictModule

from aiocollect import (
    Collector,
    CollectorError,
    EnvError,
    GymEnv,
    MultiSyncCollector,
    RayCollector,
    RemoteCollectorError,
    StartTimeoutError,
)
from support.checks import check_batch
from support.envs import CounterEnv, IntObsEnv
from support.procs import wait_until
from support.weights import check_versions, jax_linear_apply, linear, unpicklable_linear

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.xdist_group("ray")  # one Ray instance at a time (scripts/test.sh runs pytest -n 2)


def ray_processes() -> list[str]:
    out = subprocess.run(["ps", "-eo", "comm"], capture_output=True, text=True).stdout.split()
    return [p for p in out if p in ("raylet", "gcs_server")]


def alive(pid: int) -> bool:
    """``pid`` runs (a zombie, killed but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_the_ray_tests_run_on_one_worker(request):
    """Under ``pytest -n 2 --dist loadgroup`` (scripts/test.sh) the tests of the ``ray`` group run
    on one worker, one Ray instance at a time, because their node ids carry the group
    (``tests/conftest.py`` writes it where pytest-xdist's does not take)."""
    if getattr(request.config.option, "loadgroup", False):
        assert request.node.nodeid.endswith("@ray"), request.node.nodeid


def test_async_mode_counts_each_remote_collectors_steps_and_leaves_a_joined_cluster_running(ray_cluster):
    # which remote collector gets weights sent with worker_ids: tests/contract/test_distributed.py
    c = RayCollector([lambda: IntObsEnv()] * 2, linear(0.0), frames_per_batch=30, total_frames=-1,
                     collector_class="single", sync=False)
    try:
        for i, batch in enumerate(c):
            check_batch(batch)
            check_versions(batch)
            if i == 2:
                assert c.update_policy_weights_(linear(1.0)) == 1
            if i == 12:
                break
        stats = c.statistics()
        assert stats.latest_policy_version == 1
        # each remote collector's steps are its delivered frames, and they add up
        assert sum(w.env_steps for w in stats.workers) == stats.env_steps == stats.frames == 13 * 30
        pids = [w.pid for w in stats.workers]
    finally:
        c.shutdown(close_env=False)  # leaves envs of this process open, still stops the actors
    assert ray.is_initialized()  # it joined the cluster: it leaves it running
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{pid}") for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(os.path.exists(f"/proc/{pid}") for pid in pids)


async def test_async_face_and_the_async_twin(ray_cluster):
    c = RayCollector(lambda: IntObsEnv(), linear(0.0), frames_per_batch=40, total_frames=-1, num_collectors=2,
                     sync=True, collector_class="sync", num_workers_per_collector=2)
    try:
        batch = await c.arollout()
        assert batch.shape == (2, 2, 10) and (batch["collector", "policy_version"] == 0).all()
        assert await c.update_policy_weights(linear(1.0)) == 1
        assert c.statistics().policy_version == 1  # in effect on both actors
        async for batch in c:
            assert (batch["collector", "policy_version"] == 1).all()
            check_versions(batch)
            break
        stats = c.statistics()  # sync: each remote collector gave half of both batches
        assert [w.env_steps for w in stats.workers] == [40, 40] and stats.env_steps == 80
    finally:
        c.shutdown()


def test_a_jax_policy_travels_to_its_remote_collectors(ray_cluster):
    """A ``JaxPolicy`` pickles (its jitted function is made anew there) and its params updates
    reach every remote collector, versioned."""
    import numpy as np

    from aiocollect.jax import JaxPolicy

    c = RayCollector(lambda: IntObsEnv(), JaxPolicy(jax_linear_apply, {"v": np.float32(0.0)}), frames_per_batch=40,
                     total_frames=-1, num_collectors=2, sync=True)
    try:
        batch = c.next()
        assert (batch["collector", "policy_version"] == 0).all()
        assert c.update_policy_weights_({"v": np.float32(1.0)}) == 1
        batch = c.next()
        assert (batch["collector", "policy_version"] == 1).all()
        for row in batch.unbind(0):
            check_versions(row)
    finally:
        c.shutdown()


def test_policy_factories_are_called_in_their_remote_collectors(ray_cluster):
    """TorchRL's ``policy_factory``: one per remote collector, each called there (its policy
    cannot be pickled, and the factory refuses to run in this process); weights then go out
    with ``update_policy_weights_(weights)``."""
    factories = [functools.partial(unpicklable_linear, float(i), os.getpid()) for i in range(2)]
    c = RayCollector(lambda: IntObsEnv(), frames_per_batch=40, total_frames=-1, num_collectors=2, sync=True,
                     policy_factory=factories)
    try:
        batch = c.next()
        assert batch.shape[0] == 2 and (batch["collector", "policy_version"] == 0).all()
        for i, row in enumerate(batch.unbind(0)):  # row i: remote collector i, with factory i's policy
            check_batch(row)
            assert torch.equal(row["action"][..., 0], i * (row["observation"].sum(-1) + 1))
        assert c.update_policy_weights_() == 0  # no policy here: nothing to send
        assert c.update_policy_weights_(linear(2.0)) == 1
        batch = c.next()
        assert (batch["collector", "policy_version"] == 1).all()
        assert torch.equal(batch["action"][..., 0], 2 * (batch["observation"].sum(-1) + 1))
    finally:
        c.shutdown()


def test_the_drivers_switches_reach_the_remote_collectors(ray_cluster, monkeypatch):
    """``AIOCOLLECT_POLICY_IN_WORKERS`` set in the driver after the Ray instance started (its
    actors' processes never saw it) decides where a remote collector's policy runs, as it would
    here: with ``1`` in the remote collector's two worker processes, with ``0`` in the actor
    (the policy writes the id of the process that ran it)."""
    from support.plain_modules import PidPolicy

    policy = TensorDictModule(PidPolicy(), in_keys=["observation"], out_keys=["action", "pid"])
    pids = {}
    for value in ("1", "0"):
        monkeypatch.setenv("AIOCOLLECT_POLICY_IN_WORKERS", value)
        with RayCollector(CounterEnv, policy, frames_per_batch=16, total_frames=32, num_collectors=1, sync=True,
                          collector_class="sync", num_workers_per_collector=2) as c:
            pids[value] = {int(p) for batch in c for p in batch["pid"].reshape(-1)}
    assert len(pids["1"]) == 2, pids  # the remote collector's worker processes
    assert len(pids["0"]) == 1 and not pids["0"] & pids["1"], pids  # the actor's


def test_a_dead_actor_is_named_within_seconds(ray_cluster):
    c = RayCollector(lambda: IntObsEnv(), None, frames_per_batch=20, total_frames=-1, num_collectors=2, sync=True)
    try:
        c.rollout()
        pid = c.statistics().workers[1].pid
        os.kill(pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(RemoteCollectorError, match=r"remote collector 1 \(Ray actor") as info:
            for _ in range(100):
                c.rollout()
        assert time.monotonic() - start < 10
        assert info.value.index == 1 and info.value.pid == pid
    finally:
        c.shutdown()


def test_an_env_error_comes_back_with_the_remote_traceback(ray_cluster):
    c = RayCollector(lambda: CounterEnv(fail_at=25), None, frames_per_batch=10, total_frames=-1)
    try:
        with pytest.raises(RemoteCollectorError, match=r"remote collector 0 \(Ray actor .* ValueError: CounterEnv "
                                                       r"exploded on purpose") as info:
            for _ in range(10):
                c.rollout()
        cause = info.value.__cause__
        assert isinstance(cause, EnvError) and isinstance(cause.__cause__, ValueError)
        assert "exploded on purpose" in str(cause.__cause__)
        notes = "\n".join(getattr(cause, "__notes__", []))
        assert "remote traceback:" in notes and "support/envs.py" in notes and "in step" in notes
    finally:
        c.shutdown()


def test_bad_input_before_any_actor_starts():
    with pytest.raises(ValueError, match="collector_class"):
        RayCollector(lambda: IntObsEnv(), None, frames_per_batch=10, collector_class="parallel")
    with pytest.raises(TypeError, match="TorchRL's collector classes"):
        RayCollector(lambda: IntObsEnv(), None, frames_per_batch=10, collector_class=dict)
    with pytest.raises(ValueError, match="does not split over 3"):
        RayCollector(lambda: IntObsEnv(), None, frames_per_batch=10, num_collectors=3, sync=True)
    with pytest.raises(ValueError, match="distributed collector's own arguments"):
        RayCollector(lambda: IntObsEnv(), None, frames_per_batch=10, collector_kwargs={"total_frames": 5})
    with pytest.raises(ValueError, match="num_collectors"):
        RayCollector(lambda: IntObsEnv(), None, frames_per_batch=10, num_collectors=0)
    for bad in (0, -1, float("nan"), float("inf"), "60"):
        with pytest.raises(ValueError, match=r"start_timeout=.*a positive, finite number, or None"):
            RayCollector(lambda: IntObsEnv(), None, frames_per_batch=10, start_timeout=bad)
    assert MultiSyncCollector  # (imported for the "sync" class test above)


def test_actors_that_cannot_start_within_start_timeout_are_named_and_killed(ray_cluster):
    """An actor Ray cannot place (it asks for more CPUs than the cluster has) is a
    ``StartTimeoutError`` after ``start_timeout``, naming it, what it asks and what the cluster
    has (the constructor then kills every actor, as for any start-up failure)."""
    t0 = time.monotonic()
    with pytest.raises(StartTimeoutError) as info:
        RayCollector(lambda: IntObsEnv(), None, frames_per_batch=10, num_collectors=1,
                     remote_configs={"num_cpus": 64}, start_timeout=1)
    assert time.monotonic() - t0 < 30
    err = info.value
    assert isinstance(err, TimeoutError) and isinstance(err, CollectorError)
    assert (err.timeout, err.started, err.pending) == (1.0, (), (0,))
    text = str(err)
    assert "remote collector 0 of 1 did not start within 1 s (start_timeout)" in text, text
    assert "none was up" in text and "{'num_cpus': 64}" in text and "'CPU': 2.0" in text, text
    assert "raise start_timeout" in text, text


def test_a_ray_init_that_fails_or_exits_is_a_collector_error_naming_the_address(monkeypatch):
    """Ray exits (``SystemExit``) when it cannot reach a cluster's GCS, after about two minutes:
    that becomes a ``CollectorError`` saying where it tried, how long, and what to check."""
    def unreachable(**config):
        raise SystemExit(15)

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", unreachable)
    with pytest.raises(CollectorError, match=r"ray.init\(address='ray://nowhere:10001'.*\) exited \(SystemExit 15\) "
                                             r"after [\d.]+ s; no remote collector was started. Check that a Ray "
                                             r"cluster runs at 'ray://nowhere:10001'") as info:
        RayCollector(lambda: IntObsEnv(), None, frames_per_batch=10,
                     ray_init_config={"address": "ray://nowhere:10001"})
    assert isinstance(info.value.__cause__, SystemExit)


# ---------------------------------------------------------------------------- last: a cluster of its own


def test_seed_example_starts_a_local_cluster_and_stops_it(no_ray_instance):
    """The docstring's example, in a process where Ray is not initialised: it starts a local
    instance and stops it. (Last in this file: the tests before it share ``ray_cluster``'s
    instance, which ``no_ray_instance`` stops.)"""
    assert not ray.is_initialized()
    policy = TensorDictModule(nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
    collector = RayCollector(create_env_fn=lambda: GymEnv("Pendulum-v1"), policy=policy, frames_per_batch=400,
                             total_frames=40_000, num_collectors=4, sync=True, collector_class=Collector,
                             collector_kwargs={"max_frames_per_traj": 50},
                             remote_configs={"num_cpus": 1, "num_gpus": 0, "memory": 2 * 1024 ** 3},
                             update_after_each_batch=True)
    assert ray.is_initialized() and ray_processes()
    seen = set()
    for i, data in enumerate(collector):
        assert data.shape == (4, 100)
        for row in data.unbind(0):
            check_batch(row, step_count=50)
        versions = data["collector", "policy_version"]
        assert (versions == versions.flatten()[0]).all()  # on-policy: one version per sync batch
        seen.add(int(versions.flatten()[0]))
        if i == 4:
            break
    assert seen == {0, 1, 2, 3, 4}
    pids = [w.pid for w in collector.statistics().workers]
    # its actors run at this process's priority, not at Ray's nice 15 (a learner busy here
    # would starve them)
    assert [os.getpriority(os.PRIO_PROCESS, pid) for pid in pids] == [os.getpriority(os.PRIO_PROCESS, 0)] * 4
    node = ray._private.worker._global_node  # the processes of the instance it started
    cluster = {name: info.process.pid for name, infos in node.all_processes.items() for info in infos}
    assert {"raylet", "gcs_server"} <= set(cluster)
    collector.shutdown()
    assert not ray.is_initialized()  # it stopped the instance it started
    # its own processes, not every Ray process on the machine: another test process may run
    # its own instance meanwhile (a killed process not yet reaped counts as gone)
    # (the actors' worker processes go a moment after their raylet: wait for them too)
    cluster |= {f"actor {pid}": pid for pid in pids}
    assert wait_until(lambda: not [n for n, pid in cluster.items() if alive(pid)], timeout=20), \
        {n: pid for n, pid in cluster.items() if alive(pid)}

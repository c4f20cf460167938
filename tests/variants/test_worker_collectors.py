"""MultiSyncCollector and the worker collectors' own features: the seed examples in both spin
modes, preemptive_threshold, an interruptor, cat_results, ids and seeds over all workers,
workers that never import torch, weights and state by worker, and lambdas without a main guard."""

from __future__ import annotations

import functools
import sys

import gymnasium as gym
import pytest
import torch
import torch.nn as nn
from tensordict.nn import TensorDictModule

from aiocollect import Collector, GymEnv, Interruptor, MultiSyncCollector
from support.checks import check_batch, check_continuity
from support.envs import CounterEnv, SleepyEnv, TorchProbeEnv


def flat(td):
    """``[W, m, T]`` -> ``[W*m, T]`` for the batch checks."""
    return td.flatten(0, td.ndim - 2) if td.ndim > 2 else td


# (a partial: a function of this module would make every worker import it, and tensordict with it)
pendulum = functools.partial(GymEnv, "Pendulum-v1", device="cpu")


def linear_policy():
    return TensorDictModule(nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])


def test_seed_example_multisync_stack():
    """Seed 002's example, imports changed."""
    policy = linear_policy()
    collector = MultiSyncCollector(create_env_fn=[pendulum] * 4, policy=policy, frames_per_batch=400,
                                   total_frames=40_000, max_frames_per_traj=50, device="cpu",
                                   storing_device="cpu", cat_results="stack")
    prev = None
    for i, data in enumerate(collector):
        assert data.shape == (4, 100)
        assert data.names == [None, "time"]
        check_batch(data, step_count=50)
        if prev is not None:
            check_continuity(prev, data)
        prev = data
        collector.update_policy_weights_()
        if i == 4:
            break
    stats = collector.statistics()
    assert stats.frames == 2000 and [w.env_steps for w in stats.workers] == [500] * 4
    assert all(w.alive for w in stats.workers)
    collector.shutdown()
    assert not any(w.alive for w in collector.statistics().workers)


@pytest.mark.usefixtures("spin_mode")
async def test_seed_example_async_for_and_async_with():
    async with MultiSyncCollector([pendulum] * 2, linear_policy(), frames_per_batch=200,
                                  total_frames=1000, max_frames_per_traj=50) as collector:
        shapes = []
        async for data in collector:
            check_batch(data, step_count=50)
            shapes.append(tuple(data.shape))
    assert shapes == [(2, 100)] * 5


@pytest.mark.usefixtures("spin_mode")
def test_preemptive_threshold_masks_what_stragglers_did_not_collect():
    fast = lambda: SleepyEnv(delay=0.0, tag=0.0)
    slow = lambda: SleepyEnv(delay=0.05, tag=1.0)
    with MultiSyncCollector([fast, fast, slow], None, frames_per_batch=150, total_frames=-1,
                            preemptive_threshold=0.6) as collector:
        data = collector.rollout()
    assert data.shape == (3, 50)
    mask = data["collector", "mask"]
    assert mask[:2].all()
    # the straggler keeps what it collected before the cut (on a loaded machine that may be
    # nothing yet: its first reset can still be under way), as a prefix, and not all of it
    kept = int(mask[2].sum())
    assert kept < 50 and mask[2, :kept].all()
    assert (data["collector", "traj_ids"][2][~mask[2]] == -1).all()
    assert (data["next", "reward"][2][~mask[2]] == 0).all()
    check_batch(data)


@pytest.mark.parametrize("envs_per_worker", [1, 2])
def test_a_preempted_batch_along_time_leaves_out_the_steps_not_taken_as_torchrl(envs_per_worker):
    # issue 51: with cat_results=-1 the stragglers' untaken steps were kept, masked, with id
    # -1 in several places, and TorchRL's split_trajectories (which counts each id's frames)
    # failed; TorchRL leaves those steps out, and so do we now: every id's frames follow
    # each other and there is no mask
    fast = [lambda: SleepyEnv(delay=0.0, tag=0.0)] * envs_per_worker
    slow = [lambda: SleepyEnv(delay=0.05, tag=1.0)] * envs_per_worker
    with MultiSyncCollector([fast, fast, slow], None, frames_per_batch=60 * envs_per_worker, total_frames=-1,
                            preemptive_threshold=0.6, cat_results=-1) as collector:
        data = collector.rollout()
    assert ("collector", "mask") not in data.keys(True)
    ids = data["collector", "traj_ids"]
    assert (ids >= 0).all()
    assert data.shape[-1] < 60  # the straggler's steps not taken are left out
    assert data.shape[-1] >= 40  # the two fast workers' 20 steps each
    runs = ids.reshape(-1).unique_consecutive()
    assert len(runs) == len(ids.unique())  # each trajectory's frames together
    try:
        from torchrl.collectors.utils import split_trajectories as torchrl_split
    except ImportError:
        return
    trajs = torchrl_split(data.reshape(-1), prefix="collector")
    assert int(trajs["collector", "mask"].sum()) == data.numel()


def straggling_workers() -> MultiSyncCollector:
    """Two workers, the second sleeping 10 ms a step: 3 batches of 20 steps each."""
    fast = lambda: SleepyEnv(delay=0.0, tag=0.0)
    slow = lambda: SleepyEnv(delay=0.01, tag=1.0)
    return MultiSyncCollector([fast, slow], None, frames_per_batch=40, total_frames=120)


def check_straggler_wait(report) -> None:
    # each batch: 20 steps of the slow worker, 0.2 s of sleep at least; the fast one's 20 take
    # a millisecond or two, so nearly all of it is the wait (half of it: a loaded machine)
    assert report.batches == 3
    assert 3 * 0.2 * 0.5 <= report.straggler_seconds <= report.wait_seconds
    assert "for the slowest worker" in str(report)


def test_the_profile_counts_what_each_batch_waited_for_the_slowest_worker():
    """Every batch waits for its last worker: ``straggler_seconds`` is that wait, counted from
    the moment the first worker had its share (``preemptive_threshold`` is the way out)."""
    with straggling_workers() as collector:
        collector.enable_profile()
        for _ in collector:
            pass
        check_straggler_wait(collector.profile_report())


async def test_the_profile_counts_the_wait_for_the_slowest_worker_on_the_async_face():
    async with straggling_workers() as collector:
        collector.enable_profile()
        async for _ in collector:
            pass
        check_straggler_wait(collector.profile_report())


@pytest.mark.parametrize("cls", [Collector, MultiSyncCollector])
def test_an_interruptor_stopped_before_the_batch_gives_one_step_per_batch(cls):
    """As TorchRL's: a stopped interruptor cuts each batch after its first step, until restarted."""
    interruptor = Interruptor()
    interruptor.stop_collection()
    with cls([lambda: CounterEnv()] * 2, None, frames_per_batch=40, total_frames=-1,
             interruptor=interruptor) as collector:
        it = iter(collector)
        short = [next(it) for _ in range(2)]
        for b in short:
            mask = b["collector", "mask"]
            assert mask.shape == (2, 20) and mask[:, 0].any() and not mask[:, 1:].any()
        assert collector.statistics().frames == sum(int(b["collector", "mask"].sum()) for b in short)
        interruptor.start_collection()
        full = next(it)
        assert full["collector", "mask"].all()
        check_continuity(short[1][:, :1], full)


def test_cat_results_int_and_vector_env_and_lists():
    make = lambda: gym.make("CartPole-v1")
    with MultiSyncCollector([[make] * 3] * 2, None, frames_per_batch=60, total_frames=120,
                            cat_results=0) as c:
        for data in c:
            assert data.shape == (6, 10) and data.names == [None, "time"]
            check_batch(data)
    with MultiSyncCollector([lambda: gym.vector.SyncVectorEnv([make] * 2)] * 2, None,
                            frames_per_batch=40, total_frames=80) as c:
        for data in c:
            assert data.shape == (2, 2, 10) and data.names == [None, None, "time"]
            check_batch(flat(data))
    with MultiSyncCollector([lambda: CounterEnv()] * 2, None, frames_per_batch=40, total_frames=40,
                            cat_results=-1) as c:
        (data,) = list(c)
        assert data.shape == (40,)


@pytest.mark.usefixtures("spin_mode")
def test_trajectory_ids_unique_across_workers_and_batches():
    with MultiSyncCollector([[lambda: CounterEnv(max_len=5)] * 2] * 3, None, frames_per_batch=60,
                            total_frames=600) as c:
        prev, seen_ends = None, set()
        for data in c:
            b = flat(data)
            check_batch(b)
            if prev is not None:
                check_continuity(prev, b)
            prev = b
            ids = b["collector", "traj_ids"]
            ended = set(ids[b["next", "done"][..., 0]].tolist())
            assert not ended & seen_ends, "a finished trajectory id came back"
            seen_ends |= ended


def test_set_seed_counts_envs_over_all_workers():
    def first_obs(seed):
        with MultiSyncCollector([[lambda: CounterEnv()] * 2] * 2, None, frames_per_batch=8,
                                total_frames=-1) as c:
            assert c.set_seed(seed) == seed + 4  # the next free seed
            return c.rollout()["observation"].flatten(0, 1)[:, 0]
    a, b = first_obs(7), first_obs(7)
    assert torch.equal(a, b)
    expected = [CounterEnv().reset(seed=7 + k)[0][1] for k in range(4)]
    assert a[:, 1].tolist() == expected


@pytest.mark.cold_start  # (the warm launcher imports torch once, for the workers with a policy)
def test_workers_do_not_import_torch():
    with MultiSyncCollector([TorchProbeEnv] * 2, None, frames_per_batch=4, total_frames=4) as c:
        (data,) = list(c)
    assert (data["observation"] == 0).all()


def test_update_weights_state_dict_and_worker_ids():
    policy = linear_policy()
    c = MultiSyncCollector([pendulum] * 2, policy, frames_per_batch=20, total_frames=-1)
    try:
        with torch.no_grad():
            policy.module.weight.fill_(0.25)
        assert c.policy is not policy and not torch.equal(c.policy.module.weight, policy.module.weight)
        assert c.update_policy_weights_(worker_ids=[0, 1]) == 1
        assert c.update_policy_weights_(policy, worker_ids=1) == 2
        assert torch.equal(c.state_dict()["policy_state_dict"]["module.weight"], policy.module.weight)
        with pytest.raises(ValueError, match="worker_ids"):
            c.update_policy_weights_(worker_ids=5)
        c.rollout()
        state = c.state_dict()
        assert set(state) >= {"policy_state_dict", "worker0", "worker1", "frames", "iter", "traj_pool"}
        c2 = MultiSyncCollector([pendulum] * 2, linear_policy(), frames_per_batch=20, total_frames=-1)
        try:
            c2.load_state_dict(state)
            data = c2.rollout()
            assert torch.equal(c2.policy.module.weight, policy.module.weight)
            assert state["policy_version"] == 2 and c2.policy_version == 2  # the saved weights' version, as TorchRL's
            assert state["worker0"]["policy_version"] == state["worker1"]["policy_version"] == 2
            assert (data["collector", "policy_version"] == 2).all()
            assert data["collector", "traj_ids"].min() >= state["traj_pool"]["next_traj_id"]
        finally:
            c2.shutdown()
    finally:
        c.shutdown()


def test_lambdas_and_main_classes_without_main_guard(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "user_script.py"
    script.write_text(
        "import gymnasium as gym, numpy as np\n"
        "from aiocollect import MultiSyncCollector\n"
        "class Wrapped(gym.Wrapper):\n"
        "    pass\n"
        "scale = 3\n"
        "make = lambda: Wrapped(gym.make('CartPole-v1'))\n"
        "c = MultiSyncCollector([make] * 2, None, frames_per_batch=20 * scale, total_frames=120)\n"
        "print(sum(b.numel() for b in c))\n"
        "c.shutdown()\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "120"


def test_multisync_rounds_frames_per_batch_up_to_split_over_every_env_as_torchrl_does():
    with pytest.warns(UserWarning, match=r"frames_per_batch=10 does not split evenly over the 3 envs of 3 workers: "
                                         r"each batch has 12 frames"):
        collector = MultiSyncCollector([CounterEnv] * 3, None, frames_per_batch=10, total_frames=20)
    with collector:
        assert [tuple(b.shape) for b in collector] == [(3, 4), (3, 4)]


def _segment_mappings() -> list[tuple[str, int]]:
    """Each mapping of an aiocollect shared-memory segment in this process: its address range
    and its resident kB (``/proc/self/smaps``)."""
    found, current = [], None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5:  # (a mapping's first line: range, perms, offset...)
                current = head[0] if "memfd:aiocollect" in line else None
            elif current is not None and head[0] == "Rss:":
                found.append((current, int(head[1])))
    return found


def _segment_fds() -> list[str]:
    """The fds of aiocollect shared-memory segments this process has open."""
    import os

    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if "memfd:aiocollect" in os.readlink(f"/proc/self/fd/{fd}"):
                fds.append(fd)
        except OSError:  # (the listing's own fd, gone by now)
            continue
    return fds


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memfd segments are Linux's")
def test_a_collector_kept_after_shutdown_holds_no_part_of_its_shared_memory():
    """Its views stay valid (reading zeros), but neither a descriptor nor a mapping of the
    segment is left: a collector object that outlives its shutdown (kept by its caller, or by
    a traceback some library stored, as TorchRL's ``GymWrapper`` stores one the first time it is
    built) holds none of it."""
    before = {r for r, _ in _segment_mappings()}  # (another test's collector may not be collected yet)
    collector = MultiSyncCollector([[CounterEnv] * 4] * 2, None, frames_per_batch=8 * 200, total_frames=8 * 400)
    list(collector)
    mine = [(r, kb) for r, kb in _segment_mappings() if r not in before]
    assert len(mine) == 1 and mine[0][1] > 0  # the rollout storage, written
    assert not _segment_fds()  # (mapped with no descriptor of its own; the workers have theirs)
    storage = collector._scheduler.storage
    collector.shutdown()
    assert [r for r, _ in _segment_mappings() if r not in before] == []
    assert not _segment_fds()
    assert not storage.reward.any() and not storage.obs[0].any()  # (the views read zeros)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memfd segments are Linux's")
def test_with_the_policy_in_the_workers_only_its_weights_stay_mapped_after_shutdown():
    from support.gpu import argmax_policy

    policy = argmax_policy()
    before = {r for r, _ in _segment_mappings()}
    collector = MultiSyncCollector([[CounterEnv] * 4] * 2, policy, frames_per_batch=8 * 200, total_frames=8 * 400,
                                   policy_placement="workers")
    list(collector)
    weights = {k: v.clone() for k, v in collector.policy.state_dict().items()}
    [(_, running_kb)] = [(r, kb) for r, kb in _segment_mappings() if r not in before]
    collector.shutdown()
    left = [kb for r, kb in _segment_mappings() if r not in before]
    assert len(left) == 1 and left[0] < running_kb  # the weights' pages, not the rollout storage's
    assert all(torch.equal(v, collector.policy.state_dict()[k]) for k, v in weights.items())
    del collector
    import gc

    gc.collect()
    assert [r for r, _ in _segment_mappings() if r not in before] == []

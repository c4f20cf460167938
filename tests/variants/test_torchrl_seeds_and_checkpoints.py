"""``set_seed``'s return value and ``state_dict``/``load_state_dict`` with TorchRL's meaning.

* ``set_seed(seed)`` returns the seed to give the next collector or env (TorchRL's chaining
  idiom, ``seed = c1.set_seed(seed); c2.set_seed(seed)``): ``seed + num_envs``, so chained
  collectors never share a seed; ``seed`` itself with ``static_seed``.
* ``state_dict()["iter"]`` is TorchRL's (the index of the last batch, ``-1`` before the
  first); a checkpoint of an earlier aiocollect (``iter`` counting batches) still loads.
* ``load_state_dict`` checks the whole state before it changes anything: a TorchRL
  checkpoint, a missing or ill-typed entry, raise with the collector as it was.
"""

from __future__ import annotations

import copy
import gc

import gymnasium as gym
import pytest
import torch
import torch.nn as nn
from tensordict.nn import TensorDictModule

from aiocollect import Collector
from aiocollect._collectors.checkpoint import CHECKPOINT_FORMAT, read_checkpoint
from support.checks import rows
from support.envs import CounterEnv, IntObsEnv
from support.procs import leftovers, snapshot, wait_until
from support.torchrl_marks import QUIET_TORCHRL
from support.variants import VARIANTS
from support.weights import linear

pytestmark = QUIET_TORCHRL

FPB = 40
BY_NAME = {v.name: v for v in VARIANTS}
LOCAL_AND_WORKERS = [BY_NAME[n] for n in ("Collector-inline", "MultiSync-process", "MultiAsync-process")]


@pytest.fixture
def leak_check(request):
    """``tests/conftest.py``'s, but a test on the module's Ray instance may leave the Ray
    driver's sockets open (as in ``contract/test_distributed.py``)."""
    ray = "ray_cluster" in request.fixturenames
    before = snapshot()
    yield
    gc.collect()

    def left():
        return {k: v for k, v in leftovers(before).items() if not (ray and "sockets" in k)}

    assert wait_until(lambda: not left()), f"left behind: {left()}"


@pytest.fixture(params=VARIANTS, ids=[v.name for v in VARIANTS])
def variant(request):
    return request.param


@pytest.fixture(params=LOCAL_AND_WORKERS, ids=[v.name for v in LOCAL_AND_WORKERS])
def some_variant(request):
    """A ``Collector`` and the worker collectors with 2 workers."""
    return request.param


def start_of(seed: int) -> float:
    """``CounterEnv``'s first observation after ``reset(seed=seed)`` (its entry 1)."""
    return float(CounterEnv().reset(seed=seed)[0][1])


def first_starts(collector, num_envs: int) -> dict[int, float]:
    """Env ``k`` -> entry 1 of the first observation of its first trajectory (whose id is
    ``k``), whichever worker's batch it comes in."""
    found: dict[int, float] = {}
    for _, batch in zip(range(200), collector):
        r = rows(batch)
        for i in range(r.shape[0]):
            traj = int(r["collector", "traj_ids"][i, 0])
            if traj < num_envs and r["observation"][i, 0, 0] == 0:
                found.setdefault(traj, float(r["observation"][i, 0, 1]))
        if len(found) == num_envs:
            break
    return found


# ---------------------------------------------------------------------------- set_seed


def test_set_seed_returns_the_first_seed_its_envs_did_not_take(variant):
    n = variant.num_envs
    with variant(None, None, frames_per_batch=FPB, total_frames=-1) as collector:
        assert collector.set_seed(100) == 100 + n
        assert first_starts(collector, n) == {k: start_of(100 + k) for k in range(n)}


def test_chained_collectors_never_share_a_seed(some_variant):
    """TorchRL's idiom: the seed one collector returns seeds the next one."""
    n = some_variant.num_envs
    seed, used = 0, []
    for _ in range(2):
        with some_variant(None, None, frames_per_batch=FPB, total_frames=-1) as collector:
            given, seed = seed, collector.set_seed(seed)
            assert seed == given + n
            used.append(first_starts(collector, n))
    assert used[0] == {k: start_of(k) for k in range(n)}
    assert used[1] == {k: start_of(n + k) for k in range(n)}  # seeds n..2n-1: none of the first's


def test_static_seed_returns_the_seed_itself(some_variant):
    n = some_variant.num_envs
    with some_variant(None, None, frames_per_batch=FPB, total_frames=-1) as collector:
        assert collector.set_seed(5, static_seed=True) == 5
        assert first_starts(collector, n) == {k: start_of(5) for k in range(n)}


def test_set_seed_return_has_torchrls_meaning():
    """TorchRL returns a seed that differs from the one given, except with ``static_seed``."""
    pytest.importorskip("torchrl")
    from torchrl.collectors import Collector as TorchRLCollector
    from torchrl.envs import GymEnv

    theirs = TorchRLCollector(lambda: GymEnv("CartPole-v1"), None, frames_per_batch=10, total_frames=10)
    ours = Collector(lambda: gym.make("CartPole-v1"), None, frames_per_batch=10, total_frames=10)
    try:
        for c in (theirs, ours):
            assert c.set_seed(3, static_seed=True) == 3
            assert c.set_seed(3) != 3
    finally:
        theirs.shutdown()
        ours.shutdown()


# ---------------------------------------------------------------------------- iter


def test_iter_counts_as_torchrls():
    pytest.importorskip("torchrl")
    from torchrl.collectors import Collector as TorchRLCollector
    from torchrl.envs import GymEnv

    theirs = TorchRLCollector(lambda: GymEnv("CartPole-v1"), None, frames_per_batch=10, total_frames=40)
    ours = Collector(lambda: gym.make("CartPole-v1"), None, frames_per_batch=10, total_frames=40)
    try:
        seen = []
        for c in (theirs, ours):
            before = c.state_dict()["iter"]
            it = iter(c)
            next(it), next(it)
            seen.append((before, c.state_dict()["iter"], c.state_dict()["frames"]))
        assert seen[0] == seen[1] == (-1, 1, 20)
    finally:
        theirs.shutdown()
        ours.shutdown()


def test_iter_round_trips_and_counts_on(some_variant):
    with some_variant(IntObsEnv, None, frames_per_batch=FPB, total_frames=4 * FPB) as first:
        it = iter(first)
        next(it), next(it)
        state = first.state_dict()
    assert state["iter"] == 1 and state["aiocollect_format"] == CHECKPOINT_FORMAT
    with some_variant(IntObsEnv, None, frames_per_batch=FPB, total_frames=4 * FPB) as second:
        second.load_state_dict(state)
        assert second.state_dict()["iter"] == 1 and second.statistics().batches == 2
        assert len(list(second)) == 2
        assert second.state_dict()["iter"] == 3


def test_a_checkpoint_of_an_earlier_aiocollect_keeps_its_meaning(some_variant):
    """Before ``aiocollect_format``, ``iter`` counted the batches delivered."""
    with some_variant(IntObsEnv, linear(0.0), frames_per_batch=FPB, total_frames=4 * FPB) as first:
        it = iter(first)
        seen = set()
        for _ in range(2):
            seen |= set(next(it)["collector", "traj_ids"].flatten().tolist())
        old = first.state_dict()
    del old["aiocollect_format"]
    old["iter"] = 2  # the old meaning: two batches delivered
    with some_variant(IntObsEnv, linear(0.0), frames_per_batch=FPB, total_frames=4 * FPB) as second:
        second.load_state_dict(old)
        assert second.statistics().batches == 2 and second.statistics().frames == 2 * FPB
        assert second.state_dict()["iter"] == 1
        rest = list(second)
    assert len(rest) == 2
    assert not {i for b in rest for i in b["collector", "traj_ids"].flatten().tolist()} & seen


# ---------------------------------------------------------------------------- load_state_dict checks first


def weights_of(collector) -> dict:
    return {k: v.clone() for k, v in collector.policy.state_dict().items()}


def torchrl_like_checkpoint(policy) -> dict:
    """What a TorchRL 0.14 ``Collector.state_dict()`` holds (its trajectory pool: ``traj_id``)."""
    return {"policy_state_dict": policy.state_dict(), "env_state_dict": {}, "frames": 2 * FPB, "iter": 1,
            "traj_pool": {"traj_id": torch.tensor(3, dtype=torch.int32)}}


def test_a_torchrl_checkpoint_is_refused_before_anything_is_loaded(some_variant):
    with some_variant(IntObsEnv, linear(0.0), frames_per_batch=FPB, total_frames=2 * FPB) as collector:
        before = weights_of(collector)
        with pytest.raises(KeyError, match="not an aiocollect checkpoint") as info:
            collector.load_state_dict(torchrl_like_checkpoint(linear(7.0)))
        assert "next_traj_id" in str(info.value) and "TorchRL" in str(info.value)
        assert all(torch.equal(v, before[k]) for k, v in weights_of(collector).items())
        assert collector.statistics().frames == 0 and collector.state_dict()["iter"] == -1
        batches = list(collector)  # still whole: total_frames counts from 0, weights version 0
    assert len(batches) == 2
    assert all((b["collector", "policy_version"][b["collector", "policy_version"] >= 0] == 0).all() for b in batches)


@pytest.mark.parametrize(("change", "error", "match"), [
    (lambda s: s.pop("frames"), KeyError, "lacks frames"),
    (lambda s: s.pop("traj_pool"), KeyError, "lacks traj_pool"),
    (lambda s: s.__setitem__("frames", "many"), TypeError, "frames must be an int"),
    (lambda s: s.__setitem__("iter", -2), ValueError, "iter=-2"),
    (lambda s: s["traj_pool"].__setitem__("next_traj_id", 1.5), TypeError, "next_traj_id"),
    (lambda s: s.__setitem__("aiocollect_format", CHECKPOINT_FORMAT + 1), ValueError, "newer aiocollect"),
    (lambda s: s.__setitem__("worker0", 3), TypeError, "'worker0' must be a dict"),
], ids=["no-frames", "no-traj_pool", "frames-str", "iter-below-1", "traj-id-float", "newer", "bad-worker"])
def test_a_bad_checkpoint_changes_nothing(change, error, match):
    with Collector([IntObsEnv] * 2, linear(0.0), frames_per_batch=FPB, total_frames=-1) as source:
        next(iter(source))
        source.update_policy_weights_(linear(4.0))
        good = source.state_dict()
    with Collector([IntObsEnv] * 2, linear(0.0), frames_per_batch=FPB, total_frames=-1) as collector:
        bad = copy.deepcopy(good)
        change(bad)
        before = weights_of(collector)
        with pytest.raises(error, match=match):
            collector.load_state_dict(bad)
        assert all(torch.equal(v, before[k]) for k, v in weights_of(collector).items())
        assert collector.statistics().frames == 0 and collector.state_dict()["iter"] == -1
        collector.load_state_dict(good)  # the good one still loads whole
        assert collector.statistics().frames == FPB and collector.state_dict()["iter"] == 0
        collector.rollout()
        assert torch.equal(collector.policy.module.weight, torch.full((1, 3), 4.0))


def test_a_real_torchrl_checkpoint_is_refused_and_its_weights_load_alone():
    pytest.importorskip("torchrl")
    from torchrl.collectors import Collector as TorchRLCollector
    from torchrl.envs import GymEnv
    from torchrl.modules import ProbabilisticActor

    def actor():
        logits = TensorDictModule(nn.Linear(4, 2), in_keys=["observation"], out_keys=["logits"])
        return ProbabilisticActor(logits, in_keys=["logits"], distribution_class=torch.distributions.Categorical)

    torch.manual_seed(0)
    trained = actor()
    theirs = TorchRLCollector(lambda: GymEnv("CartPole-v1", categorical_action_encoding=True), trained,
                              frames_per_batch=20, total_frames=100)
    it = iter(theirs)
    next(it), next(it)
    checkpoint = theirs.state_dict()
    theirs.shutdown()
    assert "traj_id" in checkpoint["traj_pool"] and checkpoint["iter"] == 1

    ours = Collector(lambda: gym.make("CartPole-v1"), actor(), frames_per_batch=20, total_frames=100)
    try:
        before = weights_of(ours)
        with pytest.raises(KeyError, match="TorchRL collector's checkpoint"):
            ours.load_state_dict(checkpoint)
        assert all(torch.equal(v, before[k]) for k, v in weights_of(ours).items())
        assert ours.statistics().frames == 0
        ours.update_policy_weights_(checkpoint["policy_state_dict"])  # what the error suggests
        assert len(list(ours)) == 5  # total_frames counts from 0
        assert all(torch.equal(v, checkpoint["policy_state_dict"][k]) for k, v in weights_of(ours).items())
    finally:
        ours.shutdown()


# ---------------------------------------------------------------------------- the pure reader


def test_read_checkpoint_maps_both_formats_and_sums_workers():
    new = {"frames": 80, "iter": 1, "traj_pool": {"next_traj_id": torch.tensor(9)}, "aiocollect_format": 2,
           "worker0": {"completed_trajectories": 2}, "worker1": {"completed_trajectories": 3}}
    got = read_checkpoint(new, "MultiSyncCollector")
    assert (got.frames, got.batches, got.next_traj_id, got.completed_trajectories) == (80, 2, 9, 5)
    assert got.workers == {0: 2, 1: 3}
    old = {"frames": 80, "iter": 2, "traj_pool": {"next_traj_id": 9, "completed_trajectories": 4}}
    got = read_checkpoint(old, "Collector")
    assert (got.batches, got.completed_trajectories, got.workers) == (2, 4, {})
    fresh = {"frames": 0, "iter": -1, "traj_pool": {"next_traj_id": 0}, "aiocollect_format": 2}
    assert read_checkpoint(fresh, "Collector").batches == 0
    with pytest.raises(ValueError, match="iter=-1"):  # the old format never had -1
        read_checkpoint({**fresh, "aiocollect_format": 1}, "Collector")
    with pytest.raises(TypeError, match="state_dict"):
        read_checkpoint([("frames", 0)], "Collector")


# ---------------------------------------------------------------------------- RayCollector (the shared instance)


@pytest.mark.xdist_group("ray")
def test_ray_state_dict_is_a_list_per_remote_collector_and_loads_back(ray_cluster):
    """TorchRL's ``RayCollector.state_dict``: a list, one state per remote collector."""
    from aiocollect import RayCollector

    def make(policy):
        return RayCollector(IntObsEnv, policy, frames_per_batch=40, total_frames=-1, num_collectors=2, sync=True,
                            collector_class="single")

    with make(linear(2.0)) as first:
        it = iter(first)
        next(it), next(it)
        states = first.state_dict()
    assert isinstance(states, list) and len(states) == 2
    for state in states:  # each remote collector delivered two batches of 20 frames
        assert (state["frames"], state["iter"]) == (40, 1)
        assert torch.equal(state["policy_state_dict"]["module.weight"], torch.full((1, 3), 2.0))
    with make(linear(0.0)) as second:
        with pytest.raises(ValueError, match="3 states for 2"):
            second.load_state_dict(states + states[:1])
        with pytest.raises(KeyError, match=r"remote collector 1.*not an aiocollect checkpoint"):
            second.load_state_dict([states[0], torchrl_like_checkpoint(linear(7.0))])
        assert [s["iter"] for s in second.state_dict()] == [-1, -1]  # nothing was loaded anywhere
        second.load_state_dict(states)
        assert [(s["frames"], s["iter"]) for s in second.state_dict()] == [(40, 1), (40, 1)]
        batch = next(iter(second))
    assert (batch["collector", "policy_version"] == 1).all()
    assert torch.equal(batch["action"][..., 0], 2.0 * (batch["observation"].sum(-1) + 1))
    for index, state in enumerate(states):  # remote ids k become k * 2 + index: they go on after the saved ones
        assert (batch["collector", "traj_ids"][index] // 2 >= state["traj_pool"]["next_traj_id"]).all()

"""The policy in the workers (``_policies.actor``): each worker acts with its own copy of
the policy, and the batches are what central inference gives: every output the policy writes,
the version that computed each frame, new weights whole, seeds, errors and no leaks.

Each test runs over the worker collectors with process workers, the policy forced into the
workers (``AIOCOLLECT_POLICY_IN_WORKERS=1``) and, where the comparison matters, forced out.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
import torch.nn as nn
from tensordict.nn import TensorDictModule

from aiocollect import AsyncCollector, MultiAsyncCollector, MultiSyncCollector, StepTimeoutError
from aiocollect._collectors import placement as placement_module
from aiocollect._collectors.placement import placement as where_it_runs
from aiocollect._policies import weights_board
from aiocollect._workers.protocol import usable_cores
from support.envs import TAG, CounterEnv, HangingStepEnv, IntObsEnv, TaggedCounter
from support.plain_modules import ArgmaxMLP, HangsAtStep
from support.weights import Trainer, check_versions, linear, versions_while_training

COLLECTORS = [MultiSyncCollector, MultiAsyncCollector, AsyncCollector]


@pytest.fixture(params=["in_workers", "central"])
def placement(request, monkeypatch):
    monkeypatch.setenv("AIOCOLLECT_POLICY_IN_WORKERS", "1" if request.param == "in_workers" else "0")
    return request.param


@pytest.fixture
def in_workers(monkeypatch):
    monkeypatch.setenv("AIOCOLLECT_POLICY_IN_WORKERS", "1")


def build(cls, make, policy, **kwargs):
    """``cls`` over 2 workers x 2 envs (``AsyncCollector``: one worker of 2 envs)."""
    envs = [make] * 2 if cls is AsyncCollector else [[make] * 2] * 2
    return cls(envs, policy, **kwargs)


class TwoHeads(nn.Module):
    """Reads the observation: logits from a linear layer, the action their argmax."""

    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.linear = nn.Linear(3, 3)

    def forward(self, observation):
        logits = self.linear(observation)
        return logits, logits.argmax(-1)


def two_heads(seed: int = 0) -> TensorDictModule:
    return TensorDictModule(TwoHeads(seed), in_keys=["observation"], out_keys=["logits", "action"])


def flat(batch):
    """Every frame of a batch, ``[frames, ...]``."""
    return batch.reshape(-1)


@pytest.mark.parametrize("cls", COLLECTORS)
def test_every_output_is_the_policy_s_on_its_observation_and_new_weights_arrive_whole(cls, placement):
    """The batch holds each output the policy wrote, as the policy computes it from the
    frame's observation with the weights of the frame's version; after an update, frames
    of version 1 come from the new weights."""
    policy = two_heads(0)
    new = two_heads(1)
    by_version = {0: two_heads(0).module, 1: new.module}
    with build(cls, CounterEnv, policy, frames_per_batch=40, total_frames=40 * 8) as c:
        assert c.policy_in_workers is (placement == "in_workers")
        seen = set()
        for i, batch in enumerate(c):
            frames = flat(batch)
            assert set(frames.keys()) >= {"logits", "action"}
            assert frames["action"].dtype == torch.int64 and frames["logits"].dtype == torch.float32
            for version in frames["collector", "policy_version"].unique().tolist():
                part = frames[frames["collector", "policy_version"] == version]
                with torch.no_grad():
                    logits, action = by_version[version](part["observation"])
                torch.testing.assert_close(part["logits"], logits)
                assert torch.equal(part["action"], action)
                seen.add(version)
            if i == 1:
                assert c.update_policy_weights_(new) == 1
        assert seen == {0, 1}


@pytest.mark.parametrize(("cls", "face"), [(MultiSyncCollector, "async"), (MultiAsyncCollector, "sync"),
                                         (AsyncCollector, "sync")])
async def test_concurrent_updates_never_mix_versions_in_the_workers(cls, face, in_workers):
    """The poison test (``support.weights``) with each worker's own copy: a trainer publishes
    version after version and poisons its own copy at once; every frame's action is exactly
    its version's."""
    collector = build(cls, IntObsEnv, linear(0.0), frames_per_batch=40, total_frames=40 * 30)
    assert collector.policy_in_workers
    await versions_while_training(collector, Trainer(collector), face)


def test_max_policy_lag_holds_with_the_policy_in_the_workers(in_workers):
    """No delivered frame is more than ``max_policy_lag`` versions older than the newest
    published when its batch is delivered."""
    with MultiAsyncCollector([[IntObsEnv] * 2] * 2, linear(0.0), frames_per_batch=40, total_frames=40 * 20,
                             max_policy_lag=1) as c:
        assert c.policy_in_workers
        for i, batch in enumerate(c):
            latest = c.statistics().latest_policy_version
            assert batch["collector", "policy_version"].min().item() >= latest - 1, (i, latest)
            c.update_policy_weights_(linear(float(i + 1)))


class Noisy(nn.Module):
    """Draws its action from torch's generator: what a stochastic policy does."""

    def forward(self, observation):
        return torch.randint(0, 3, observation.shape[:1])


@pytest.mark.parametrize("cls", COLLECTORS)
def test_set_seed_makes_a_stochastic_policy_in_the_workers_repeat(cls, in_workers):
    """Each worker's batches, in order, repeat (MultiAsync interleaves the workers' batches
    as they fill, so they are compared worker by worker: ``TaggedCounter`` says whose)."""
    workers = 1 if cls is AsyncCollector else 2
    envs = [lambda: TaggedCounter(0)] * 2 if cls is AsyncCollector else \
        [[lambda w=w: TaggedCounter(w)] * 2 for w in range(workers)]

    def by_worker():
        policy = TensorDictModule(Noisy(), in_keys=["observation"], out_keys=["action"])
        got: dict[int, list] = {}
        with cls(envs, policy, frames_per_batch=40, total_frames=-1) as c:
            assert c.policy_in_workers
            c.set_seed(7)
            for batch in c:
                frames = flat(batch)
                for w in (frames["observation"][:, 1] // TAG).long().unique().tolist():
                    mine = frames[(frames["observation"][:, 1] // TAG).long() == w]
                    got.setdefault(w, []).append(mine["action"])
                if len(got) == workers and all(len(v) >= 2 for v in got.values()):
                    return {w: torch.cat(v[:2]) for w, v in got.items()}

    first, second = by_worker(), by_worker()
    assert first.keys() == second.keys() == set(range(workers))
    for w in first:
        assert torch.equal(first[w], second[w]), w
    assert len(torch.cat(list(first.values())).unique()) == 3  # (drawn, not constant)


class Explodes(nn.Module):
    """Fine on the collector's zeros, raises on the 5th observation it reads."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 3)
        self.calls = 0

    def forward(self, observation):
        if observation.abs().sum() > 0:
            self.calls += 1
            if self.calls >= 5:
                raise RuntimeError("the policy exploded on purpose")
        return self.linear(observation).argmax(-1)


@pytest.mark.parametrize("cls", COLLECTORS)
def test_a_policy_that_raises_in_a_worker_is_named_with_its_traceback_within_seconds(cls, in_workers):
    policy = TensorDictModule(Explodes(), in_keys=["observation"], out_keys=["action"])
    c = build(cls, CounterEnv, policy, frames_per_batch=40, total_frames=-1)
    assert c.policy_in_workers
    start = time.monotonic()
    with c, pytest.raises(RuntimeError, match="the policy exploded on purpose") as info:
        for _ in c:
            pass  # (the policy's own error, as central inference raises it)
    assert time.monotonic() - start < 30
    assert info.value.worker in (0, 1) and info.value.remote_type == "RuntimeError"
    note = "\n".join(info.value.__notes__)
    assert f"the copy of the policy in worker {info.value.worker}" in note
    assert "in forward" in note  # the traceback in the worker shows where


@pytest.mark.parametrize("hung", ["policy", "env"])
def test_a_policy_that_hangs_in_a_worker_is_a_step_timeout_naming_the_policy(hung, in_workers):
    """Issue 50 item 7: with the policy in the workers, a ``forward`` that never returns was a
    ``StepTimeoutError`` saying "fix the env's step()" over a stack in the policy. The worker
    says what it was running: the error (the same type, which is what callers catch) names
    the policy and what to fix, and ``stuck_in`` says which; an env that hangs there is still
    the env's. (With the policy in this process, ``step_timeout`` bounds the envs alone.)"""
    make, module = (CounterEnv, HangsAtStep()) if hung == "policy" else (HangingStepEnv, ArgmaxMLP(3, 3))
    policy = TensorDictModule(module, in_keys=["observation"], out_keys=["action"])
    with build(AsyncCollector, make, policy, frames_per_batch=40, total_frames=-1, step_timeout=1.0) as c:
        assert c.policy_in_workers
        start = time.monotonic()
        with pytest.raises(StepTimeoutError) as info:
            for _ in c:
                assert time.monotonic() - start < 30, "no StepTimeoutError"
    err = info.value
    assert isinstance(err, TimeoutError) and err.stuck_in == hung
    if hung == "policy":
        assert str(err).startswith("the policy did not return the actions for ")
        assert "fix the policy's forward()" in str(err) and "AIOCOLLECT_POLICY_IN_WORKERS=0" in str(err)
        assert "env's step" not in str(err)
        assert "in forward" in err.remote_traceback and "plain_modules.py" in err.remote_traceback
    else:
        assert "did not answer step() within 1.0 s" in str(err) and "fix the env's step()" in str(err)
        assert "policy" not in str(err).split("\n")[0]
        assert "in step" in err.remote_traceback and "envs.py" in err.remote_traceback


class GoesBad(nn.Module):
    """Right on the collector's zeros and for its first 4 real calls, then wrong in one way
    (``how``): nothing it writes late may reach a batch or an env unnoticed."""

    def __init__(self, how: str):
        super().__init__()
        self.linear = nn.Linear(3, 3)
        self.how, self.calls = how, 0

    def forward(self, observation):
        n = len(observation)
        action, extra = self.linear(observation).argmax(-1), torch.zeros(n, 2)
        if self.how == "indices after one-hot rows":  # (Discrete(3) takes either, not both)
            action = nn.functional.one_hot(action, 3)
        if observation.abs().sum() > 0:
            self.calls += 1
        if self.calls < 5:
            return action, extra
        if self.how == "out of range":
            return torch.full_like(action, 3), extra
        if self.how == "float action":
            return action.float(), extra
        if self.how == "fewer action rows":
            return action[:1], extra
        if self.how == "indices after one-hot rows":
            return action.argmax(-1), extra
        if self.how == "fewer rows":
            return action, torch.zeros(1, 2)
        if self.how == "other shape":  # (numpy would broadcast it into the storage's [n, 2])
            return action, torch.zeros(n, 1)
        return action, extra.to(torch.complex64)  # "other dtype" (numpy would drop the imaginary part)


LATE = {"out of range": (ValueError, r"action: the policy returned values outside Discrete\(3\)"),
        "float action": (TypeError, "action: the policy returned dtype float32 here, int64 at its first call"),
        "fewer action rows": (ValueError, r"action: the policy returned shape \[1\] for [24] env\(s\)"),
        "indices after one-hot rows": (ValueError, r"action: the policy returned shape \[\] per env here, \[3\] at its "
                                                   "first call"),
        "fewer rows": (ValueError, r"extra: the policy returned shape \[1, 2\] for [24] env\(s\)"),
        "other shape": (ValueError, r"extra: the policy returned shape \[1\] per env here, \[2\] at its first call"),
        "other dtype": (TypeError, "extra: the policy returned dtype complex64 here, float32 at its first call")}


@pytest.mark.parametrize("how", list(LATE))
def test_late_bad_outputs_are_named_as_central_inference_names_them(how, placement):
    """A policy whose outputs go wrong after its first calls fails the collection with the
    error central inference gives, wherever it runs."""
    policy = TensorDictModule(GoesBad(how), in_keys=["observation"], out_keys=["action", "extra"])
    c = build(MultiSyncCollector, CounterEnv, policy, frames_per_batch=40, total_frames=-1)
    assert c.policy_in_workers == (placement == "in_workers")
    error, message = LATE[how]
    start = time.monotonic()
    with c, pytest.raises(error, match=message):
        for _ in c:
            pass
    assert time.monotonic() - start < 30


async def test_late_bad_outputs_in_the_workers_are_named_through_the_async_face(in_workers):
    policy = TensorDictModule(GoesBad("other dtype"), in_keys=["observation"], out_keys=["action", "extra"])
    async with build(MultiAsyncCollector, CounterEnv, policy, frames_per_batch=40, total_frames=-1) as c:
        assert c.policy_in_workers
        error, message = LATE["other dtype"]
        with pytest.raises(error, match=message):
            async for _ in c:
                pass


class Recurrent(nn.Module):
    def forward(self, observation, hidden):
        return observation[:, :1].long().clamp(0, 2)[:, 0], hidden + 1


def test_policies_the_workers_cannot_run_stay_in_the_main_process(in_workers):
    """A recurrent policy (it writes the state the next step reads), a plain function and
    random actions: central, whatever the switch says; the collection works as before."""
    from aiocollect import RandomPolicy  # noqa: F401 - (random actions: policy=None)

    recurrent = TensorDictModule(Recurrent(), in_keys=["observation", "hidden"],
                                 out_keys=["action", ("next", "hidden")])
    with MultiSyncCollector([[CounterEnv] * 2] * 2, lambda obs: obs[:, 0].long().clamp(0, 2),
                            frames_per_batch=40, total_frames=40) as c:
        assert not c.policy_in_workers
        assert next(iter(c)).numel() == 40
    with MultiSyncCollector([[CounterEnv] * 2] * 2, None, frames_per_batch=40, total_frames=40) as c:
        assert not c.policy_in_workers
    assert where_it_runs(recurrent, num_workers=2, policy_device=None, compiled=False, runs=True) == "workers"
    # (its probe finds the ("next", ...) output: central; covered end to end by
    # tests/integration/test_recurrent_policies.py, which runs wherever the switch says)


def test_the_choice_follows_the_switch_the_cores_and_what_the_policy_can_do(monkeypatch):
    monkeypatch.delenv("AIOCOLLECT_POLICY_IN_WORKERS", raising=False)
    cores = usable_cores()
    policy = two_heads()
    choose = dict(policy_device=None, compiled=False, runs=True)
    assert where_it_runs(policy, num_workers=cores, **choose) == "workers"  # no core left for the engine
    assert where_it_runs(policy, num_workers=cores + 3, **choose) == "workers"
    assert where_it_runs(policy, num_workers=max(1, cores - 1), **choose) == ("measure" if cores > 1 else "workers")
    assert where_it_runs(policy, num_workers=cores, policy_device=None, compiled=True, runs=True) == "cannot"
    assert where_it_runs(policy, num_workers=cores, policy_device=None, compiled=False, runs=False) == "cannot"
    assert where_it_runs(lambda obs: obs, num_workers=cores, **choose) == "cannot"
    monkeypatch.setenv("AIOCOLLECT_POLICY_IN_WORKERS", "0")
    assert where_it_runs(policy, num_workers=cores, **choose) == "central"
    monkeypatch.setenv("AIOCOLLECT_POLICY_IN_WORKERS", "1")
    assert where_it_runs(policy, num_workers=1, **choose) == "workers"


class Waits(nn.Module):
    """Action 0 for every env after a sleep of ``ms`` per env of the call (``per_env``) or per
    call, divided by torch's threads (``threaded``: a call that threads speed up, as a large
    network's do). No weights: the sleep is the whole cost."""

    def __init__(self, ms: float, per_env: bool, threaded: bool):
        super().__init__()
        self.ms, self.per_env, self.threaded = ms, per_env, threaded

    def forward(self, observation):
        n = observation.shape[0]
        time.sleep(self.ms / 1000 * (n if self.per_env else 1) / (torch.get_num_threads() if self.threaded else 1))
        return torch.zeros(n, dtype=torch.long)


@pytest.fixture
def four_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(("policy", "expected"), [
    (Waits(1.0, per_env=True, threaded=False), True),  # 2 x 2 envs: 2 ms in a worker, 4 ms here
    (Waits(8.0, per_env=False, threaded=True), False),  # 8 ms on a worker's one thread, 2 ms on 4 here
], ids=["costs-per-env", "gains-from-threads"])
@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
def test_with_cores_to_spare_the_measured_costs_choose_where_the_policy_runs(cls, policy, expected,
                                                                             four_threads, monkeypatch):
    """With fewer workers than cores (16, here said to be), the collector times the policy in
    both places and picks the cheaper: a call that costs per env goes to the workers, one that
    threads on the free cores make 4x faster stays here. Either way the batch is the policy's,
    and torch's threads are as they were."""
    monkeypatch.delenv("AIOCOLLECT_POLICY_IN_WORKERS", raising=False)
    monkeypatch.setattr(placement_module, "usable_cores", lambda: 16)
    with build(cls, CounterEnv, TensorDictModule(policy, in_keys=["observation"], out_keys=["action"]),
               frames_per_batch=8, total_frames=16) as c:
        costs = c.placement_costs
        assert costs is not None and c.policy_in_workers is costs.in_workers is expected, costs
        per_call = 8.0 if policy.threaded else 2.0  # (ms, one worker's 2 envs on one thread)
        assert per_call / 1000 <= costs.worker_s < 10 * per_call / 1000
        assert costs.central_s >= (2.0 if policy.threaded else 4.0) / 1000
        assert torch.get_num_threads() == 4
        assert "in the workers" in str(costs) if expected else "here, batched" in str(costs)
        c.enable_profile()
        for batch in c:
            assert (batch["action"] == 0).all() and batch.numel() == 8
        report = c.profile_report()
    where = "in the workers" if expected else "here"
    assert report.policy_placement.startswith(f"{where} (measured: one worker's call ")
    assert f"the policy ran {where} (measured" in str(report)


@pytest.mark.parametrize("cheaper", ["workers", "here"])
def test_a_worker_split_in_halves_for_the_policy_here_steps_whole_once_the_policy_goes_to_it(cheaper, monkeypatch):
    """The plan splits a worker's envs in halves for a policy that may stay here (its call
    on one half overlaps the other half's steps); a policy the measure sends to the workers
    leaves nothing to overlap, so the worker steps its envs whole, and either way every
    frame is the policy's. (The measured costs are set here: which place wins is the
    previous test's.)"""
    from aiocollect._collectors import worker_collectors
    from aiocollect._policies.costs import Costs

    monkeypatch.delenv("AIOCOLLECT_POLICY_IN_WORKERS", raising=False)
    monkeypatch.setenv("AIOCOLLECT_PIPELINE", "1")
    monkeypatch.setattr(placement_module, "usable_cores", lambda: 16)
    costs = Costs(worker_s=1e-6, central_s=1.0) if cheaper == "workers" else Costs(worker_s=1.0, central_s=1e-6)
    monkeypatch.setattr(worker_collectors, "measure", lambda *args: costs)
    policy = two_heads()
    with MultiSyncCollector([[CounterEnv] * 8], policy, frames_per_batch=32, total_frames=64) as c:
        assert c.placement_costs is costs and c.policy_in_workers is (cheaper == "workers")
        assert len(c._worker_lanes[0]) == (1 if cheaper == "workers" else 2)
        for batch in c:
            flat_ = flat(batch)
            expected = policy.module(flat_["observation"])[1]
            assert torch.equal(flat_["action"], expected)


def _maps(pid: int, library: str) -> bool:
    with open(f"/proc/{pid}/maps") as f:
        return library in f.read()


@pytest.mark.cold_start  # (a warm launcher has imported torch once for all its workers)
@pytest.mark.parametrize("policy_kind", ["mlp", "random", "plain"])
def test_only_workers_given_the_policy_import_torch(policy_kind, in_workers):
    """The lean worker loads no torch; one with the policy does, and tensordict only where
    the policy needs it: not for a ``TensorDictModule`` over a plain module, whose worker is
    sent the module alone (its class here lives in a file that imports torch alone)."""
    from support.plain_modules import ArgmaxMLP

    policy = {"mlp": two_heads(), "random": None,
              "plain": TensorDictModule(ArgmaxMLP(3, 3), in_keys=["observation"], out_keys=["action"])}[policy_kind]
    with MultiSyncCollector([[CounterEnv] * 2] * 2, policy, frames_per_batch=40, total_frames=-1) as c:
        batch = next(iter(c))
        pids = [w.pid for w in c.statistics().workers]
        assert [_maps(pid, "libtorch") for pid in pids] == [policy_kind != "random"] * 2
        # (two_heads' class lives in this test file, which imports tensordict)
        assert [_maps(pid, "tensordict/_C") for pid in pids] == [policy_kind == "mlp"] * 2
    if policy_kind == "plain":
        with torch.no_grad():
            assert torch.equal(batch["action"], ArgmaxMLP(3, 3)(batch["observation"]))


def test_random_frames_come_first_then_the_workers_policy(in_workers):
    """``init_random_frames``: drawn in the main process (every output key, zeros but the
    action), then the workers' own policy, in one layout."""
    policy = two_heads(0)
    with MultiSyncCollector([[CounterEnv] * 2] * 2, policy, frames_per_batch=40, total_frames=160,
                            init_random_frames=80) as c:
        assert c.policy_in_workers
        batches = [flat(b) for b in c]
    module = two_heads(0).module
    for b in batches[:2]:
        assert (b["logits"] == 0).all()
    for b in batches[2:]:
        with torch.no_grad():
            logits, action = module(b["observation"])
        assert torch.equal(b["action"], action)
        torch.testing.assert_close(b["logits"], logits)
    assert np.array_equal(sorted(batches[0].keys()), sorted(batches[3].keys()))


class NormedHeads(nn.Module):
    """``TwoHeads`` after a BatchNorm in training mode: its forward changes its running stats."""

    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm1d(3)
        self.heads = TwoHeads(0)

    def forward(self, observation):
        return self.heads(self.norm(observation))


def test_weights_shared_memory_cannot_hold_keep_the_policy_here_and_the_probe_changes_nothing(in_workers,
                                                                                               monkeypatch):
    """bfloat16 weights stay central (numpy has no bfloat16); the probe that lays the outputs
    out and the calls that time the policy call one scratch copy of it, so a module whose
    forward changes its state is left as it was, by them and by a collector that measured."""
    from tensordict.nn import InteractionType

    from aiocollect._envs.spaces import ActionCheck, flatten_space
    from aiocollect._policies.costs import measure
    from aiocollect._policies.probe import probe, scratch_copy

    bf16 = TensorDictModule(nn.Linear(3, 3).to(torch.bfloat16), in_keys=["observation"], out_keys=["action"])
    assert where_it_runs(bf16, num_workers=8, policy_device=None, compiled=False, runs=True) == "cannot"
    module = NormedHeads()
    module.norm.running_mean.fill_(5.0)
    policy = TensorDictModule(module, in_keys=["observation"], out_keys=["logits", "action"])
    env = CounterEnv()
    leaves = flatten_space(env.observation_space, "observation", "observation_space")
    scratch = scratch_copy(policy)
    specs = probe(scratch, leaves, InteractionType.RANDOM, ActionCheck.for_space(env.action_space))
    assert specs == [("logits", np.dtype(np.float32), (3,)), ("action", np.dtype(np.int64), ())]
    rng, threads = torch.random.get_rng_state(), torch.get_num_threads()
    costs = measure(scratch, leaves, InteractionType.RANDOM, [2, 2], cores=8)  # (the choice's timing calls)
    assert costs is not None and costs.worker_s > 0 and costs.central_s > 0
    assert torch.equal(torch.random.get_rng_state(), rng) and torch.get_num_threads() == threads
    assert int(scratch.module.norm.num_batches_tracked) > 0  # (the calls were the copy's)
    assert torch.equal(module.norm.running_mean, torch.full((3,), 5.0))
    assert int(module.norm.num_batches_tracked) == 0
    # a collector that would choose by measuring (2 workers, 16 cores said to be there) finds
    # that the policy changes its own state (running statistics): it stays here, unmeasured,
    # and the check's calls were a scratch copy's too (issue 50 item 3)
    monkeypatch.delenv("AIOCOLLECT_POLICY_IN_WORKERS")
    monkeypatch.setattr(placement_module, "usable_cores", lambda: 16)
    with build(MultiSyncCollector, CounterEnv, policy, frames_per_batch=8, total_frames=8) as c:
        assert c.placement_costs is None and not c.policy_in_workers
        own = c.state_dict()["policy_state_dict"]  # (the collector's own copy, before any batch)
        assert torch.equal(own["module.norm.running_mean"], torch.full((3,), 5.0))
        assert int(own["module.norm.num_batches_tracked"]) == 0
    assert torch.equal(module.norm.running_mean, torch.full((3,), 5.0))
    assert int(module.norm.num_batches_tracked) == 0
    assert torch.equal(torch.random.get_rng_state(), rng) and torch.get_num_threads() == threads


@pytest.mark.parametrize("mode", ["DETERMINISTIC", "RANDOM"])
def test_a_probabilistic_actor_takes_the_interaction_type_in_the_workers(in_workers, mode):
    """A policy tensordict calls itself (a ``ProbabilisticActor``): the worker is sent it whole
    and sets the collector's ``exploration_type`` (sent by name) around its calls:
    ``DETERMINISTIC`` gives the distribution's mode, the argmax of the logits, at every frame;
    ``RANDOM`` samples, so some frames differ from it."""
    from tensordict.nn import InteractionType, ProbabilisticTensorDictModule, TensorDictSequential

    net = TensorDictModule(nn.Linear(3, 3), in_keys=["observation"], out_keys=["logits"])
    with torch.no_grad():  # flat logits: a sample is the argmax a third of the time. (Scaling the
        # weights down was not enough: CounterEnv's observations reach 1000, and with some
        # initial weights the samples were the argmax at 73 frames of 80.)
        net.module.weight.zero_()
        net.module.bias.zero_()
    dist = ProbabilisticTensorDictModule(in_keys=["logits"], out_keys=["action"],
                                         distribution_class=torch.distributions.Categorical)
    policy = TensorDictSequential(net, dist)
    with MultiSyncCollector([[CounterEnv] * 2] * 2, policy, frames_per_batch=40, total_frames=80,
                            exploration_type=InteractionType[mode]) as c:
        assert c.policy_in_workers
        batches = [flat(b) for b in c]
    argmax = torch.cat([b["logits"] for b in batches]).argmax(-1)
    actions = torch.cat([b["action"] for b in batches])
    with torch.no_grad():
        torch.testing.assert_close(torch.cat([b["logits"] for b in batches]),
                                   net.module(torch.cat([b["observation"] for b in batches])))
    if mode == "DETERMINISTIC":
        assert torch.equal(actions, argmax)
    else:
        assert (actions != argmax).sum() >= 20  # (about 2/3 of 80 frames; below 20 about once in 10^14 runs)


def test_a_ctrl_c_while_new_weights_are_copied_to_the_workers_neither_hangs_nor_tears_them(in_workers, monkeypatch):
    """``update_policy_weights_`` copies the weights into shared memory in the caller's thread,
    behind a sequence word the workers wait on while it is odd. A Ctrl-C between two tensors
    left it odd: every worker waited for good, the collection hung. Now the copy finishes
    before the interrupt propagates, and the next batches carry the new version, whole."""
    c = build(MultiSyncCollector, IntObsEnv, linear(0.0), frames_per_batch=40, total_frames=-1)
    with c:
        assert c.policy_in_workers
        it = iter(c)
        assert check_versions(next(it)) == {0}
        into, calls = weights_board._into, []

        def interrupted(dst, src):
            calls.append(1)
            if len(calls) == 2:  # (the second tensor: the first is copied already)
                raise KeyboardInterrupt
            into(dst, src)

        monkeypatch.setattr(weights_board, "_into", interrupted)
        with pytest.raises(KeyboardInterrupt):
            c.update_policy_weights_(linear(1.0))
        monkeypatch.setattr(weights_board, "_into", into)
        seen = set()
        for _ in range(3):
            seen |= check_versions(next(it))  # (a hang here is the bug: the suite's timeout names it)
        assert seen == {1}
        c.update_policy_weights_(linear(2.0))  # (the word is even again: the next copy is seen)
        assert check_versions(next(it)) == {2}


def test_an_update_is_in_effect_at_once_and_the_policy_keeps_it_past_shutdown(placement):
    """With the policy in the workers, an update is copied once, into the shared weights that
    the collector's own copy acts with: ``collector.policy`` and its checkpoint hold the new
    weights as the call returns, and still after ``shutdown()``, which hands the rollout
    storage's memory back but not the weights'."""
    c = build(MultiSyncCollector, CounterEnv, two_heads(0), frames_per_batch=8, total_frames=-1)
    with c:
        assert c.policy_in_workers is (placement == "in_workers")
        it = iter(c)
        next(it)
        new = two_heads(1)
        assert c.update_policy_weights_(new) == 1
        if placement == "in_workers":  # (central: loaded before the next call)
            assert torch.equal(c.policy.module.linear.weight, new.module.linear.weight)
        assert torch.equal(c.state_dict()["policy_state_dict"]["module.linear.weight"], new.module.linear.weight)
        frames = torch.cat([flat(next(it)) for _ in range(3)])
        frames = frames[frames["collector", "policy_version"] == 1]
        assert len(frames) and torch.equal(frames["logits"], new.module(frames["observation"])[0])
    assert torch.equal(c.policy.module.linear.weight, new.module.linear.weight)
    assert torch.equal(c.policy.module.linear.bias, new.module.linear.bias)


class IntBufferHead(nn.Module):
    """Logits ``observation * scale + k``: a float parameter and an int64 buffer."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(1.0))
        self.register_buffer("k", torch.tensor(0))

    def forward(self, observation):
        logits = observation * self.scale + self.k
        return logits, logits.argmax(-1)


def test_an_update_is_cast_to_the_policy_s_dtypes_wherever_it_acts(placement):
    """A float sent for an int buffer is cast as torch's ``copy_`` casts, in the workers as
    centrally (the workers' copy once raised numpy's cast error midway through the copy, with
    the parameters before it already in use under the old version)."""
    policy = TensorDictModule(IntBufferHead(), ["observation"], ["logits", "action"])
    with build(MultiSyncCollector, CounterEnv, policy, frames_per_batch=8, total_frames=-1) as c:
        assert c.policy_in_workers is (placement == "in_workers")
        it = iter(c)
        next(it)
        assert c.update_policy_weights_({"module.scale": torch.tensor(2.0), "module.k": torch.tensor(3.7)}) == 1
        frames = torch.cat([flat(next(it)) for _ in range(3)])
        frames = frames[frames["collector", "policy_version"] == 1]
        assert len(frames) and torch.equal(frames["logits"], frames["observation"] * 2.0 + 3)
        assert c.policy.module.k.dtype == torch.int64 and int(c.policy.module.k) == 3


class DropoutHead(nn.Module):
    """Logits through a dropout layer: in train mode no logit is what eval mode gives."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear, self.dropout = nn.Linear(3, 3), nn.Dropout(0.5)

    def forward(self, observation):
        logits = self.dropout(self.linear(observation / 100))
        return logits, logits.argmax(-1)


def test_the_train_or_eval_mode_reaches_the_workers_with_the_weights(placement):
    """Central inference calls the policy in the mode it is in; the workers' copies take the
    mode of each submodule with each update, so after ``policy.train()`` (or ``.eval()``) and
    ``update_policy_weights_()`` both places act alike (the copies kept the mode they were
    built with)."""
    policy = TensorDictModule(DropoutHead(), in_keys=["observation"], out_keys=["logits", "action"]).eval()
    reference = DropoutHead().eval()

    def eval_like(batch) -> torch.Tensor:
        frames = flat(batch)
        return torch.isclose(frames["logits"], reference(frames["observation"])[0]).all(-1)

    with build(MultiSyncCollector, CounterEnv, policy, frames_per_batch=40, total_frames=-1) as c:
        assert c.policy_in_workers is (placement == "in_workers")
        it = iter(c)
        assert eval_like(next(it)).all()
        c.policy.train()
        c.update_policy_weights_()
        assert not eval_like(next(it)).any()  # dropout acts: every logit row changed
        c.policy.eval()
        c.update_policy_weights_()
        assert eval_like(next(it)).all()


def test_a_policy_that_imports_tensordict_in_its_forward_gets_the_interaction_type(placement):
    """The workers set the collector's ``exploration_type`` (tensordict's interaction type)
    where tensordict is imported; a policy that imports it only in its ``forward`` read no
    interaction type at all in the workers (its first call now runs again under it)."""
    from support.plain_modules import LazyExplorer

    policy = TensorDictModule(LazyExplorer(), in_keys=["observation"], out_keys=["action", "sampled"])
    with build(MultiSyncCollector, CounterEnv, policy, frames_per_batch=40, total_frames=80,
               exploration_type="random") as c:
        assert c.policy_in_workers is (placement == "in_workers")
        sampled = torch.cat([flat(b)["sampled"] for b in c])
    assert sampled.numel() == 80 and (sampled == 1).all()


def test_a_policy_its_workers_cannot_load_is_named_as_the_policy_s_error_with_the_switch(in_workers, monkeypatch):
    """A policy whose class lives in a module made at run time pickles here but cannot be
    loaded in a worker: the constructor raised an ``EnvError`` as if an env had failed. It now
    raises the policy's own error, with a note naming the worker and the switch that keeps
    the policy in this process."""
    import sys
    import types

    module = types.ModuleType("made_at_run_time")
    exec("import torch\n"
         "class Head(torch.nn.Module):\n"
         "    def __init__(self):\n"
         "        super().__init__()\n"
         "        self.linear = torch.nn.Linear(3, 3)\n"
         "    def forward(self, observation):\n"
         "        return self.linear(observation).argmax(-1)\n", module.__dict__)
    monkeypatch.setitem(sys.modules, "made_at_run_time", module)
    policy = TensorDictModule(module.Head(), in_keys=["observation"], out_keys=["action"])
    start = time.monotonic()
    with pytest.raises(ModuleNotFoundError, match="made_at_run_time") as info:
        build(MultiSyncCollector, CounterEnv, policy, frames_per_batch=40, total_frames=40)
    assert time.monotonic() - start < 60
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "copy of the policy in worker" in notes and "AIOCOLLECT_POLICY_IN_WORKERS=0" in notes

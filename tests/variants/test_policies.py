"""Policies of every kind, exploration type, seeding against a hand-written gymnasium loop,
the forms a weight update takes, and weight updates during background collection."""

from __future__ import annotations

import threading
import time

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn as nn
from tensordict import TensorDict
from tensordict.nn import (
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
    TensorDictSequential,
)

from aiocollect import Collector, GymEnv, MultiAsyncCollector, MultiSyncCollector, RandomPolicy
from support.checks import check_batch
from support.coroutine_envs import LatencyEnv, PlainCounterEnv
from support.envs import CounterEnv, IntObsEnv
from support.weights import check_versions, linear


def cartpole_policy(obs):
    """Deterministic: push towards the pole's lean."""
    return (obs[..., 2] + 0.3 * obs[..., 3] > 0).long()


def hand_written_rollout(seed, steps):
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=seed)
    out = []
    for _ in range(steps):
        out.append(obs)
        a = int(cartpole_policy(torch.as_tensor(obs)))
        obs, _r, term, trunc, _ = env.step(a)
        if term or trunc:
            obs, _ = env.reset()
    return np.stack(out)


def test_set_seed_single_env_matches_hand_written_gymnasium_loop():
    c = Collector(lambda: gym.make("CartPole-v1"), cartpole_policy, frames_per_batch=150, total_frames=300)
    assert c.set_seed(7) == 8  # the next free seed
    obs = torch.cat([b["observation"] for b in c]).numpy()
    c.shutdown()
    np.testing.assert_array_equal(obs, hand_written_rollout(7, 300))


def test_set_seed_batched_env_i_uses_seed_plus_i():
    c = Collector([lambda: gym.make("CartPole-v1")] * 3, cartpole_policy, frames_per_batch=300, total_frames=300)
    assert c.set_seed(10) == 13
    (b,) = list(c)
    c.shutdown()
    for i in range(3):
        np.testing.assert_array_equal(b["observation"][i].numpy(), hand_written_rollout(10 + i, 100))


def test_static_seed_gives_every_env_the_same_seed():
    c = Collector([lambda: gym.make("CartPole-v1")] * 2, cartpole_policy, frames_per_batch=40, total_frames=40)
    assert c.set_seed(5, static_seed=True) == 5
    (b,) = list(c)
    c.shutdown()
    assert torch.equal(b["observation"][0], b["observation"][1])


def test_random_policy_is_reproducible_under_set_seed():
    def run():
        c = Collector([lambda: CounterEnv()] * 2, None, frames_per_batch=40, total_frames=80)
        c.set_seed(3)
        out = torch.stack([b["action"] for b in c])
        c.shutdown()
        return out

    a, b = run(), run()
    assert torch.equal(a, b) and a.unique().numel() == 3


@pytest.mark.parametrize("cls", [Collector, MultiSyncCollector])
def test_torch_manual_seed_repeats_the_random_frames_as_in_torchrl(cls):
    """Without ``set_seed``, the random actions (``policy=None``, ``init_random_frames``) are
    seeded from torch's global generator, as TorchRL draws them (``action_spec.rand()``): a
    TorchRL program that calls ``torch.manual_seed(0)`` repeats its random frames (they came
    from fresh entropy, so a seeded tutorial learned in a different number of frames each run)."""
    def run(seed, policy):
        torch.manual_seed(seed)
        envs = [CounterEnv] * 2 if cls is Collector else [[CounterEnv] * 2]
        with cls(envs, policy, frames_per_batch=40, total_frames=80, init_random_frames=80) as c:
            return torch.cat([b["action"].reshape(-1) for b in c])

    for policy in (None, lambda observation: torch.zeros(len(observation), dtype=torch.int64)):
        first = run(0, policy)
        assert first.unique().numel() == 3
        assert torch.equal(first, run(0, policy)) and not torch.equal(first, run(1, policy))


def test_set_seed_mid_run_restarts_trajectories():
    c = Collector(lambda: gym.make("CartPole-v1"), cartpole_policy, frames_per_batch=20, total_frames=-1)
    it = iter(c)
    first = next(it)
    c.set_seed(7)
    second = next(it)
    c.shutdown()
    np.testing.assert_array_equal(second["observation"].numpy(), hand_written_rollout(7, 20))
    assert second["collector", "traj_ids"][0] > first["collector", "traj_ids"].max()


def test_plain_module_callable_and_tensordict_callable_policies():
    lin = nn.Linear(3, 1)
    by_module = Collector(lambda: GymEnv("Pendulum-v1"), lin, frames_per_batch=20, total_frames=20)
    by_module.set_seed(0)
    (a,) = list(by_module)
    by_module.shutdown()
    # (recomputed a step at a time, as the collector called it: one matmul over all 20 rows may
    # round differently, past allclose's atol for actions near 0, as it did once in CI)
    assert torch.allclose(a["action"], torch.cat([lin(obs[None]) for obs in a["observation"]]).detach())

    def td_policy(tensordict):
        tensordict["action"] = lin(tensordict["observation"])
        tensordict["aux"] = tensordict["observation"].sum(-1)
        return tensordict

    by_td = Collector(lambda: GymEnv("Pendulum-v1"), td_policy, frames_per_batch=20, total_frames=20)
    by_td.set_seed(0)
    (b,) = list(by_td)
    by_td.shutdown()
    assert torch.equal(a["observation"], b["observation"]) and torch.allclose(a["action"], b["action"])
    assert torch.allclose(b["aux"], b["observation"].sum(-1))
    check_batch(b, policy_keys=("action", "aux"))

    numpy_policy = Collector(lambda: CounterEnv(), lambda obs: np.ones(obs.shape[0], np.int64),
                             frames_per_batch=10, total_frames=10)
    (c,) = list(numpy_policy)
    numpy_policy.shutdown()
    assert (c["action"] == 1).all()


def test_tensordict_module_fast_path_equals_generic_path():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    fast = TensorDictModule(net, in_keys=["observation"], out_keys=["logits"])
    argmax = TensorDictModule(lambda x: x.argmax(-1), in_keys=["logits"], out_keys=["action"])
    results = []
    for policy in (TensorDictSequential(fast, argmax), TensorDictSequential(fast, argmax, selected_out_keys=None)):
        c = Collector([lambda: gym.make("CartPole-v1")] * 2, policy, frames_per_batch=40, total_frames=40)
        c.set_seed(1)
        (b,) = list(c)
        c.shutdown()
        check_batch(b, policy_keys=("action", "logits"))
        results.append(b)
    assert torch.equal(results[0]["logits"], results[1]["logits"])
    # the fast path proper: a plain TensorDictModule producing the action directly
    mod = TensorDictModule(lambda x: net(x).argmax(-1), in_keys=["observation"], out_keys=["action"])
    c = Collector([lambda: gym.make("CartPole-v1")] * 2, mod, frames_per_batch=40, total_frames=40)
    c.set_seed(1)
    (b,) = list(c)
    c.shutdown()
    assert torch.equal(b["action"], results[0]["action"])


def categorical_actor():
    torch.manual_seed(0)
    net = TensorDictModule(nn.Linear(4, 2), in_keys=["observation"], out_keys=["logits"])
    dist = ProbabilisticTensorDictModule(
        in_keys=["logits"], out_keys=["action"], distribution_class=torch.distributions.Categorical,
        return_log_prob=True,
    )
    return ProbabilisticTensorDictSequential(net, dist)


@pytest.mark.parametrize("face", ["sync", "async"])
async def test_exploration_type_is_honoured(face):
    actor = categorical_actor()

    async def batch(exploration_type):
        c = Collector([lambda: gym.make("CartPole-v1")] * 2, actor, frames_per_batch=200, total_frames=200,
                      exploration_type=exploration_type)
        c.set_seed(0)
        if face == "sync":
            (b,) = list(c)
        else:
            (b,) = [x async for x in c]
        c.shutdown()
        return b

    mode = await batch("mode")
    assert torch.equal(mode["action"], mode["logits"].argmax(-1))
    random = await batch("random")
    assert not torch.equal(random["action"], random["logits"].argmax(-1))
    log_prob_keys = [k for k in random.keys() if "log_prob" in str(k)]  # noqa: SIM118 - a TensorDict
    assert log_prob_keys, random
    check_batch(random, policy_keys=("action", "logits", *log_prob_keys))


def test_the_policy_runs_without_grad_and_under_the_exploration_type_which_are_restored_after():
    """Grad mode and tensordict's interaction type are set around each policy call and put
    back after it, also when the policy raises."""
    from tensordict.nn import InteractionType
    from tensordict.nn.probabilistic import interaction_type

    from aiocollect._policies.runner import PolicyRunner

    seen = []

    def policy(obs):
        seen.append((torch.is_grad_enabled(), interaction_type()))
        if len(seen) == 2:
            raise RuntimeError("boom")
        return torch.zeros(len(obs), dtype=torch.long)

    runner = PolicyRunner(policy, ["observation"], device=None, exploration_type=InteractionType.MODE)
    obs = {"observation": torch.zeros(3, 4)}
    before = interaction_type()
    assert torch.is_grad_enabled()
    assert runner(obs, 3)["action"].shape == (3,)
    with pytest.raises(RuntimeError, match="boom"):
        runner(obs, 3)
    with torch.no_grad():  # a caller already without grad keeps it off
        runner(obs, 3)
        assert not torch.is_grad_enabled()
        def switches_grad_on(o):
            torch.set_grad_enabled(True)
            return torch.zeros(len(o), dtype=torch.long)

        sneaky = PolicyRunner(switches_grad_on, ["observation"], device=None, exploration_type=InteractionType.MODE)
        sneaky(obs, 3)  # a policy that switches grad on is not left to change the caller's mode
        assert not torch.is_grad_enabled()
    assert seen == [(False, InteractionType.MODE)] * 3
    assert runner.exploration_type is InteractionType.MODE
    assert torch.is_grad_enabled()
    assert interaction_type() == before


def test_update_policy_weights_copies_a_snapshot():
    collector_policy = TensorDictModule(nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
    trainer = TensorDictModule(nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
    c = Collector(lambda: GymEnv("Pendulum-v1"), collector_policy, frames_per_batch=10, total_frames=-1)
    assert c.update_policy_weights_(trainer) == 1
    expected = trainer.module.weight.detach().clone()
    with torch.no_grad():
        trainer.module.weight.fill_(123.0)  # the trainer goes on changing its copy
    b = next(iter(c))
    assert torch.allclose(b["action"], b["observation"] @ expected.T + trainer.module.bias.detach(), atol=1e-6)

    assert (b["collector", "policy_version"] == 1).all()

    assert c.update_policy_weights_(TensorDict.from_module(trainer)) == 2
    assert torch.equal(c.state_dict()["policy_state_dict"]["module.weight"], trainer.module.weight)
    # loaded into the user's module, as TorchRL's Collector does (it acts with that module)
    assert torch.equal(collector_policy.module.weight, trainer.module.weight)
    sd = {"module.weight": torch.zeros(1, 3), "module.bias": torch.ones(1)}
    c.update_policy_weights_(sd)
    b = next(iter(c))
    assert torch.equal(b["action"], torch.ones_like(b["action"]))
    with pytest.raises(ValueError, match="worker_ids"):
        c.update_policy_weights_(worker_ids=[3])
    c.shutdown()


def test_random_policy_as_a_module():
    policy = RandomPolicy(gym.spaces.Box(-2, 2, (3,), np.float32), seed=0)
    td = policy(TensorDict(batch_size=[4, 5]))
    assert td["action"].shape == (4, 5, 3) and (td["action"].abs() <= 2).all()


def test_devices_and_storing_device():
    c = Collector(lambda: GymEnv("Pendulum-v1"), None, frames_per_batch=10, total_frames=10, device="cpu",
                  storing_device="cpu", policy_device="cpu", env_device="cpu")
    (b,) = list(c)
    c.shutdown()
    assert b.device == torch.device("cpu")


@pytest.mark.parametrize("envs", ["gymnasium", "coroutine"])
def test_outputs_numpy_cannot_hold_are_stored_too(envs):
    """A bfloat16 output has no numpy view: it is written through torch, at the right columns."""
    def policy(td):
        t = td["observation"][:, 1]
        return td.set("action", torch.zeros(td.shape[0], dtype=torch.long)).set("t", t.to(torch.bfloat16))

    make = [PlainCounterEnv] * 3 if envs == "gymnasium" else [LatencyEnv] * 3
    with Collector(make, policy, frames_per_batch=30, total_frames=30) as c:
        (batch,) = list(c)
    assert batch["t"].dtype == torch.bfloat16
    assert torch.equal(batch["t"].float(), batch["observation"][..., 1])


@pytest.mark.parametrize("close_env", [True, False])
def test_shutdown_close_env_decides_only_about_the_envs(close_env):
    env = CounterEnv()
    collector = Collector(env, None, frames_per_batch=10, total_frames=20, progress=True)
    next(iter(collector))
    bar = collector._progress.bar
    collector.shutdown(close_env=close_env)
    assert env.closed is close_env
    assert bar.disable  # the progress bar is closed either way (tqdm disables a closed bar)
    with pytest.raises(RuntimeError, match="shut down"):
        next(iter(collector))


# --------------------------------------------------------------------------- weight updates

BACKGROUND = {
    "Collector": lambda policy, **kw: Collector([IntObsEnv] * 3, policy, **kw),
    "MultiAsync": lambda policy, **kw: MultiAsyncCollector([[IntObsEnv] * 3] * 2, policy, **kw),
}


def test_update_forms_and_versions():
    trainer = linear(2.0)
    with Collector([IntObsEnv] * 2, linear(0.0), frames_per_batch=8, total_frames=-1) as c:
        assert c.update_policy_weights_(trainer) == 1
        assert c.update_policy_weights_(TensorDict.from_module(trainer)) == 2
        assert c.update_policy_weights_(trainer.state_dict()) == 3
        # only the newest pending snapshot is applied: versions 1 and 2 are never used
        batch = c.rollout()
        assert (batch["collector", "policy_version"] == 3).all()
        assert torch.equal(batch["action"][..., 0], 2.0 * (batch["observation"].sum(-1) + 1))
        with pytest.raises(KeyError, match="missing"):
            c.update_policy_weights_({"module.weight": torch.zeros(1, 3)})
        with pytest.raises(KeyError, match="unexpected"):
            c.update_policy_weights_({**trainer.state_dict(), "extra": torch.zeros(1)})
        with pytest.raises(ValueError, match="shape"):
            c.update_policy_weights_({"module.weight": torch.zeros(2, 3), "module.bias": torch.zeros(1)})
        with pytest.raises(TypeError, match="expected a module"):
            c.update_policy_weights_(42)
        assert c.statistics().latest_policy_version == 3  # failed calls publish nothing


def test_none_takes_the_construction_policy_and_the_collector_owns_a_copy():
    policy = linear(0.0)
    with MultiSyncCollector([IntObsEnv] * 2, policy, frames_per_batch=20, total_frames=-1) as c:
        assert c.policy is not policy
        with torch.no_grad():
            for p in policy.parameters():
                p.fill_(3.0)  # an optimiser step on the user's object...
        batch = c.rollout()
        assert (batch["collector", "policy_version"] == 0).all()
        assert torch.equal(batch["action"], torch.zeros_like(batch["action"]))  # ...does not leak in
        assert c.update_policy_weights_() == 1  # TorchRL's usual call: take the given policy's weights
        batch = c.rollout()
        assert (batch["collector", "policy_version"] == 1).all()
        assert torch.equal(batch["action"][..., 0], 3.0 * (batch["observation"].sum(-1) + 1))


def test_random_policy_has_no_weights():
    with Collector([IntObsEnv], None, frames_per_batch=4, total_frames=-1) as c:
        assert c.update_policy_weights_() == 0
        with pytest.raises(TypeError, match="no weights"):
            c.update_policy_weights_(linear(1.0))
        assert (c.rollout()["collector", "policy_version"] == 0).all()


class ListBuffer:
    """The smallest replay buffer: keeps every batch it is given."""

    def __init__(self):
        self.batches, self.lock = [], threading.Lock()

    def extend(self, batch):
        with self.lock:
            self.batches.append(batch)


@pytest.mark.parametrize("variant", ["Collector", "MultiAsync"])
def test_updates_while_collecting_in_the_background(variant):
    rb = ListBuffer()
    collector = BACKGROUND[variant](linear(0.0), frames_per_batch=30, total_frames=-1, replay_buffer=rb)
    trainer = linear(0.0)
    versions = []
    try:
        collector.start()
        for k in range(1, 30):  # the training loop: sample, step, send the weights
            time.sleep(0.01)
            with torch.no_grad():
                for p in trainer.parameters():
                    p.fill_(k)
            versions.append(collector.update_policy_weights_(trainer))
    finally:
        collector.async_shutdown(timeout=5)
    assert versions == list(range(1, 30))
    seen = set()
    with rb.lock:
        assert len(rb.batches) >= 5
        for batch in rb.batches:
            seen |= check_versions(batch)
    assert len(seen) >= 3, seen


def test_a_compiled_module_is_a_policy_whose_updates_keep_their_versions():
    """``torch.compile`` (inductor, on the CPU here): the collector's copy of the compiled
    module acts, and weight updates, from a plain module or a compiled one (whose weights
    are named ``_orig_mod.*``), take effect with their versions, frame by frame."""
    policy = linear(0.0)
    policy.module = torch.compile(policy.module)
    with Collector([IntObsEnv] * 2, policy, frames_per_batch=20, total_frames=-1) as c:
        assert check_versions(c.rollout()) == {0}
        assert c.update_policy_weights_(linear(1.0)) == 1
        assert check_versions(c.rollout()) == {1}
        compiled = linear(2.0)
        compiled.module = torch.compile(compiled.module)
        assert c.update_policy_weights_(compiled) == 2
        assert check_versions(c.rollout()) == {2}

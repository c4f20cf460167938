"""Policies of every kind, exploration type, seeding, weights and state."""

from __future__ import annotations

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

from aiocollect import Collector, GymEnv, RandomPolicy
from support.checks import check_batch
from support.envs import CounterEnv
from support.coroutine_envs import LatencyEnv, PlainCounterEnv


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
        obs, r, term, trunc, _ = env.step(a)
        if term or trunc:
            obs, _ = env.reset()
    return np.stack(out)


def test_set_seed_single_env_matches_hand_written_gymnasium_loop():
    c = Collector(lambda: gym.make("CartPole-v1"), cartpole_policy, frames_per_batch=150, total_frames=300)
    assert c.set_seed(7) == 7
    obs = torch.cat([b["observation"] for b in c]).numpy()
    c.shutdown()
    np.testing.assert_array_equal(obs, hand_written_rollout(7, 300))


def test_set_seed_batched_env_i_uses_seed_plus_i():
    c = Collector([lambda: gym.make("CartPole-v1")] * 3, cartpole_policy, frames_per_batch=300, total_frames=300)
    assert c.set_seed(10) == 12
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
    assert torch.allclose(a["action"], lin(a["observation"]).detach())

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
            b = [x async for x in c][0]
        c.shutdown()
        return b

    mode = await batch("mode")
    assert torch.equal(mode["action"], mode["logits"].argmax(-1))
    random = await batch("random")
    assert not torch.equal(random["action"], random["logits"].argmax(-1))
    log_prob_keys = [k for k in random.keys() if "log_prob" in str(k)]
    assert log_prob_keys, random
    check_batch(random, policy_keys=("action", "logits", *log_prob_keys))


def test_update_policy_weights_copies_a_snapshot():
    collector_policy = TensorDictModule(nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
    trainer = TensorDictModule(nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
    c = Collector(lambda: GymEnv("Pendulum-v1"), collector_policy, frames_per_batch=10, total_frames=-1)
    given = collector_policy.module.weight.detach().clone()
    assert c.update_policy_weights_(trainer) == 1
    expected = trainer.module.weight.detach().clone()
    with torch.no_grad():
        trainer.module.weight.fill_(123.0)  # the trainer goes on changing its copy
    b = next(iter(c))
    assert torch.allclose(b["action"], b["observation"] @ expected.T + trainer.module.bias.detach(), atol=1e-6)

    assert (b["collector", "policy_version"] == 1).all()

    assert c.update_policy_weights_(TensorDict.from_module(trainer)) == 2
    assert torch.equal(c.state_dict()["policy_state_dict"]["module.weight"], trainer.module.weight)
    assert torch.equal(collector_policy.module.weight, given)  # the collector runs its own copy
    sd = {"module.weight": torch.zeros(1, 3), "module.bias": torch.ones(1)}
    c.update_policy_weights_(sd)
    b = next(iter(c))
    assert torch.equal(b["action"], torch.ones_like(b["action"]))
    with pytest.raises(ValueError, match="worker_ids"):
        c.update_policy_weights_(worker_ids=[3])
    c.shutdown()


def test_state_dict_round_trip_never_reuses_trajectory_ids():
    policy = TensorDictModule(nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
    c = Collector(lambda: GymEnv("Pendulum-v1"), policy, frames_per_batch=50, total_frames=500,
                  max_frames_per_traj=20)
    it = iter(c)
    first = next(it)
    state = c.state_dict()
    assert set(state) >= {"policy_state_dict", "env_state_dict", "frames", "iter"}
    assert state["frames"] == 50
    c.shutdown()

    fresh_policy = TensorDictModule(nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
    c2 = Collector(lambda: GymEnv("Pendulum-v1"), fresh_policy, frames_per_batch=50, total_frames=500,
                   max_frames_per_traj=20)
    c2.load_state_dict(state)
    loaded = c2.state_dict()["policy_state_dict"]
    assert torch.equal(loaded["module.weight"], state["policy_state_dict"]["module.weight"])
    assert torch.equal(loaded["module.weight"], policy.module.weight)
    assert c2.statistics().frames == 50
    batches = list(c2)
    c2.shutdown()
    assert len(batches) == 9
    later = torch.cat([b["collector", "traj_ids"] for b in batches])
    assert later.min() > first["collector", "traj_ids"].max()


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

"""TorchRL's own policies and replay buffers as the collectors' inputs.

* one-hot discrete actions, TorchRL's default encoding (a ``QValueActor`` with a ``OneHot``
  spec, a ``OneHotCategorical`` actor): the env gets the index, the batch keeps the rows;
* ``init_random_frames`` batches with every key the policy writes, so that a replay
  buffer holds one layout;
* a TorchRL ``ReplayBuffer`` gets frames, one per item, from every collector, without
  masked-out frames;
* TorchRL's ``RandomPolicy(action_spec)``, whose draw has the env's batch shape, acts for
  every env of a collector, in the spec's encoding.

Envs are ``CounterEnv``s: their observation's last entry is the action the env was given.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from tensordict.nn import ProbabilisticTensorDictModule, ProbabilisticTensorDictSequential, TensorDictModule
from torchrl.data import LazyTensorStorage, OneHot, ReplayBuffer
from torchrl.modules import QValueActor
from torchrl.objectives import DQNLoss

from aiocollect import Collector, Interruptor, MultiAsyncCollector, MultiSyncCollector
from support.envs import CounterEnv

MASK = ("collector", "mask")


def q_actor() -> QValueActor:
    """TorchRL's DQN actor over CounterEnv: one-hot ``"action"`` and ``"action_value"``."""
    torch.manual_seed(0)
    return QValueActor(torch.nn.Linear(3, 3), in_keys=["observation"], spec=OneHot(3))


def given(batch) -> torch.Tensor:
    """The index each env was stepped with (CounterEnv writes it into its next observation)."""
    return batch["next", "observation"][..., 2].long()


def assert_one_hot(action: torch.Tensor) -> None:
    assert ((action == 0) | (action == 1)).all() and (action.sum(-1) == 1).all()


def assert_contiguous(ids: torch.Tensor) -> None:
    """Each trajectory id occupies one run of consecutive frames."""
    starts = torch.cat([torch.ones(1, dtype=torch.bool), ids[1:] != ids[:-1]])
    assert len(ids[starts].unique()) == int(starts.sum()), f"a trajectory is split: {ids.tolist()}"


# --------------------------------------------------------------------------- one-hot actions


def test_a_qvalue_actor_steps_the_envs_with_indices_and_its_one_hot_rows_reach_a_dqn_loss():
    actor = q_actor()
    with Collector([CounterEnv] * 2, actor, frames_per_batch=20, total_frames=20) as collector:
        (batch,) = list(collector)
    action = batch["action"]
    assert action.shape == (2, 10, 3)
    assert action.dtype == actor(batch[:, 0].select("observation"))["action"].dtype  # as the actor wrote it
    assert_one_hot(action)
    assert torch.equal(given(batch), action.argmax(-1))
    assert torch.equal(action.argmax(-1), batch["action_value"].argmax(-1))
    loss = DQNLoss(actor, action_space="one-hot", delay_value=False)(batch)
    assert torch.isfinite(loss["loss"])


def test_one_hot_samples_of_a_space_that_starts_at_1_give_the_env_index_plus_start():
    uniform = torch.nn.Linear(3, 3)
    torch.nn.init.zeros_(uniform.weight)
    policy = ProbabilisticTensorDictSequential(
        TensorDictModule(uniform, in_keys=["observation"], out_keys=["logits"]),
        ProbabilisticTensorDictModule(in_keys=["logits"], out_keys=["action"],
                                      distribution_class=torch.distributions.OneHotCategorical),
    )

    def make():
        env = CounterEnv()
        env.action_space = spaces.Discrete(3, start=1)
        return env

    with Collector([make] * 2, policy, frames_per_batch=40, total_frames=40) as collector:
        (batch,) = list(collector)
    action = batch["action"]
    assert action.shape == (2, 20, 3) and action.dtype == torch.float32
    assert_one_hot(action)
    assert torch.equal(given(batch), action.argmax(-1) + 1)
    assert len(given(batch).unique()) > 1  # sampled, not constant


def test_a_tie_steps_the_env_with_its_first_one_and_other_rows_are_read_as_torchrl_does_with_a_warning():
    def tie_then_none(observation):  # a QValueModule's rows when action values tie: several 1s
        action = torch.zeros(observation.shape[0], 3)
        action[:, 1:] = 1
        if (observation[:, 0] >= 1).any():
            action[-1] = 0
        return action

    with Collector([CounterEnv] * 2, tie_then_none, frames_per_batch=2, total_frames=4) as collector:
        first = next(iter(collector))
        assert (given(first) == 1).all(), "a tie steps the env with the first 1, as TorchRL's argmax does"
        assert torch.equal(first["action"], torch.tensor([[[0.0, 1.0, 1.0]]] * 2)), "the rows are kept as written"
        with pytest.warns(UserWarning, match=r"^action: the policy's rows .* are not one-hot; they are read as"):
            second = next(iter(collector))
        assert given(second).tolist() == [[1], [0]], "a row of zeros is index 0, as TorchRL's argmax reads it"


# --------------------------------------------------------------------------- init_random_frames


def test_init_random_frames_batches_carry_every_key_the_policy_writes_as_torchrl_s_do():
    actor, calls = q_actor(), []
    actor.register_forward_hook(lambda *args: calls.append(1))
    with Collector([CounterEnv] * 2, actor, frames_per_batch=40, total_frames=80,
                   init_random_frames=40) as collector:
        collector.set_seed(0)
        random, greedy = list(collector)
    assert set(random.keys(True, True)) == set(greedy.keys(True, True))
    for key in greedy.keys(True, True):
        assert random[key].shape == greedy[key].shape and random[key].dtype == greedy[key].dtype, key
    # as in TorchRL: the policy ran once to find its layout, its outputs are zeros but
    # for the action, random in the policy's encoding (one-hot rows here)
    assert len(calls) == 1 + 20
    assert (random["action_value"] == 0).all() and (random["chosen_action_value"] == 0).all()
    assert_one_hot(random["action"])
    assert torch.equal(given(random), random["action"].argmax(-1))
    assert len(given(random).unique()) == 3
    assert torch.equal(greedy["action"].argmax(-1), greedy["action_value"].argmax(-1))


# --------------------------------------------------------------------------- replay buffers


@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
def test_worker_collectors_fill_a_torchrl_buffer_with_frames(cls):
    buffer = ReplayBuffer(storage=LazyTensorStorage(100))
    with cls([lambda: CounterEnv()] * 2, q_actor(), frames_per_batch=20, total_frames=60,
             replay_buffer=buffer) as collector:
        assert list(collector) == [None, None, None]
    assert len(buffer) == 60
    frames = buffer[:]
    assert frames.shape == (60,) and frames["observation"].shape == (60, 3)
    assert frames["action"].shape == (60, 3) and frames["action_value"].shape == (60, 3)
    assert_one_hot(frames["action"])
    assert torch.equal(given(frames), frames["action"].argmax(-1))
    for batch in frames.split(20):  # one env's frames after the other: trajectories are contiguous
        assert_contiguous(batch["collector", "traj_ids"])
    assert buffer.sample(8)["observation"].shape == (8, 3)


def test_masked_out_frames_and_split_trajectory_padding_stay_out_of_the_buffer():
    interruptor = Interruptor()
    interruptor.stop_collection()  # every batch ends after its first step, the rest masked out
    buffer = ReplayBuffer(storage=LazyTensorStorage(100))
    with Collector([CounterEnv] * 2, None, frames_per_batch=20, total_frames=-1, interruptor=interruptor,
                   replay_buffer=buffer) as collector:
        for _, nothing in zip(range(2), collector):
            assert nothing is None
    assert buffer[:].shape == (4,)  # 2 batches of 2 envs' first step
    assert MASK not in buffer[:].keys(True) and (buffer[:]["collector", "traj_ids"] >= 0).all()

    buffer = ReplayBuffer(storage=LazyTensorStorage(100))
    with Collector([CounterEnv] * 2, None, frames_per_batch=40, total_frames=40, split_trajs=True,
                   replay_buffer=buffer) as collector:
        collector.set_seed(1)
        list(collector)
    frames = buffer[:]
    assert frames.shape == (40,) and MASK not in frames.keys(True)
    assert (frames["collector", "traj_ids"] >= 0).all()
    assert_contiguous(frames["collector", "traj_ids"])


@pytest.mark.parametrize("cls", [Collector, MultiSyncCollector])
def test_torchrl_random_policy_draws_for_every_env_in_its_spec_encoding(cls):
    from torchrl.envs import GymEnv
    from torchrl.envs.utils import RandomPolicy

    spec = GymEnv("CartPole-v1").action_spec  # one unbatched env's: OneHot, shape [2]
    make = lambda: GymEnv("CartPole-v1")
    with cls([make, make], RandomPolicy(spec), frames_per_batch=40, total_frames=80) as collector:
        batches = list(collector)
    actions = torch.cat([b["action"].reshape(-1, 2) for b in batches])
    assert_one_hot(actions)
    assert 0.3 < actions[:, 1].float().mean() < 0.7, "not uniform"
    with Collector(CounterEnv, RandomPolicy(), frames_per_batch=20, total_frames=20) as collector:
        batch = next(iter(collector))  # no spec: drawn from the env's space, as TorchRL fills it from the env
    assert batch["action"].dtype == torch.int64 and set(batch["action"].tolist()) <= {0, 1, 2}


class EchoMultiEnv(gym.Env):
    """MultiDiscrete([3, 4]) actions; the observation is the last action the env was given."""

    observation_space = spaces.Box(-1, 10, (2,), np.float32)
    action_space = spaces.MultiDiscrete([3, 4])

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.full(2, -1, np.float32), {}

    def step(self, action):
        assert self.action_space.contains(np.asarray(action)), action
        return np.asarray(action, np.float32), 0.0, False, False, {}


def test_multi_one_hot_actions_step_a_multi_discrete_env_with_each_parts_index():
    from torchrl.data import MultiOneHot
    from torchrl.envs import GymWrapper
    from torchrl.envs.utils import RandomPolicy

    torch.manual_seed(0)
    with Collector(EchoMultiEnv, RandomPolicy(MultiOneHot([3, 4])), frames_per_batch=30, total_frames=60,
                   init_random_frames=30) as collector:
        batches = list(collector)  # the first from init_random_frames, drawn one-hot like the policy
    for batch in batches:
        rows = batch["action"].long()
        assert batch["action"].shape == (30, 7)
        assert_one_hot(rows[:, :3])
        assert_one_hot(rows[:, 3:])
        assert torch.equal(batch["next", "observation"].long(), torch.stack([rows[:, :3].argmax(1),
                                                                            rows[:, 3:].argmax(1)], 1))
    # a TorchRL env over that env, in TorchRL's default encoding: its action spec is MultiOneHot
    env = GymWrapper(EchoMultiEnv())
    assert type(env.action_spec).__name__ == "MultiOneHot"
    with Collector(lambda: GymWrapper(EchoMultiEnv()), RandomPolicy(env.action_spec), frames_per_batch=20,
                   total_frames=20) as collector:
        batch = next(iter(collector))
    rows = batch["action"].long()
    assert rows.shape == (20, 7)
    given_indices = torch.stack([rows[:, :3].argmax(1), rows[:, 3:].argmax(1)], 1)
    assert torch.equal(batch["next", "observation"].long(), given_indices)

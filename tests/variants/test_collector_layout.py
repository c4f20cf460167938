"""Batch layout and invariants, on several envs and options, through both faces."""

from __future__ import annotations

import itertools

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn as nn
from gymnasium.vector import AutoresetMode
from tensordict.nn import TensorDictModule

from aiocollect import Collector, GymEnv, Interruptor
from support.checks import check_batch, check_continuity, leaf_keys
from support.envs import CounterEnv, DictEnv, StepEnv


def collect(collector, n):
    out = []
    for i, batch in enumerate(collector):
        out.append(batch)
        if i + 1 == n:
            break
    return out


def test_readme_example_pendulum():
    policy = TensorDictModule(nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
    collector = Collector(
        create_env_fn=lambda: GymEnv("Pendulum-v1", device="cpu"), policy=policy,
        frames_per_batch=200, total_frames=10_000, device="cpu", max_frames_per_traj=50,
    )
    batches = collect(collector, 3)
    collector.shutdown()
    data = batches[0]
    assert data.shape == torch.Size([200]) and data.names == ["time"]
    assert leaf_keys(data) == sorted([
        ("action",), ("collector", "policy_version"), ("collector", "traj_ids"), ("done",), ("observation",),
        ("step_count",),
        ("terminated",), ("truncated",), ("next", "done"), ("next", "observation"),
        ("next", "reward"), ("next", "step_count"), ("next", "terminated"), ("next", "truncated"),
    ])
    assert data["action"].shape == (200, 1) and data["observation"].dtype == torch.float32
    assert data["step_count"].dtype == torch.int64
    for b in batches:
        check_batch(b, step_count=50)
    for prev, cur in itertools.pairwise(batches):
        check_continuity(prev, cur)
    # 50-step trajectories: ids 0,0,...,1,... with truncation every 50 steps
    assert data["next", "truncated"][..., 0].nonzero().flatten().tolist() == [49, 99, 149, 199]
    assert data["collector", "traj_ids"].unique().tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED])
def test_vector_env_any_autoreset_mode_has_no_fake_transitions(mode):
    venv = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 4, autoreset_mode=mode)
    collector = Collector(venv, None, frames_per_batch=400, total_frames=4000)
    batches = collect(collector, 10)
    collector.shutdown()
    for b in batches:
        assert b.shape == (4, 100)
        check_batch(b)
        # CartPole pays 1 per real step; a fake autoreset step would pay 0
        assert (b["next", "reward"] == 1).all()
        # no transition starts from a terminal state
        x, angle = b["observation"][..., 0], b["observation"][..., 2]
        assert (x.abs() <= 2.4).all() and (angle.abs() <= 0.2095).all()
    for prev, cur in itertools.pairwise(batches):
        check_continuity(prev, cur)
    assert sum(int(b["next", "done"].sum()) for b in batches) > 20


def test_same_step_vector_env_final_observation_is_terminal():
    venv = gym.vector.SyncVectorEnv([lambda: CounterEnv()] * 2, autoreset_mode=AutoresetMode.SAME_STEP)
    collector = Collector(venv, None, frames_per_batch=40, total_frames=40)
    (b,) = collect(collector, 1)
    collector.shutdown()
    check_batch(b)
    done = b["next", "done"][..., 0]
    # the final observation (not the reset one) is in ("next", "observation")
    assert (b["next", "observation"][..., 0][done] > 0).all()


def test_dict_observations_and_multidiscrete_actions():
    collector = Collector([DictEnv, DictEnv], None, frames_per_batch=40, total_frames=80)
    batches = collect(collector, 2)
    collector.shutdown()
    b = batches[0]
    assert b["pos"].dtype == torch.float64 and b["pos"].shape == (2, 20, 2)
    assert b["cell"].dtype == torch.int64 and b["cell"].shape == (2, 20)
    assert b["flags"].dtype == torch.int8 and b["flags"].shape == (2, 20, 3)
    assert b["md"].dtype == torch.int64 and b["md"].shape == (2, 20, 2)
    assert b["nest", "t"].shape == (2, 20, 1)
    assert b["action"].dtype == torch.int64 and b["action"].shape == (2, 20, 2)
    for x in batches:
        check_batch(x)
    check_continuity(*batches)
    # truncation by the env itself after 7 steps
    assert b["next", "truncated"][0, :, 0].nonzero().flatten().tolist()[:2] == [6, 13]


def test_box_multibinary_discrete_envs():
    class MB(gym.Env):
        observation_space = gym.spaces.Discrete(4)
        action_space = gym.spaces.MultiBinary(3)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.t = 0
            return 0, {}

        def step(self, action):
            assert action.shape == (3,) and set(np.unique(action)) <= {0, 1}
            self.t += 1
            return self.t % 4, 1.0, self.t == 5, False, {}

    collector = Collector(MB(), None, frames_per_batch=12, total_frames=24)
    batches = collect(collector, 2)
    collector.shutdown()
    b = batches[0]
    assert b.shape == (12,) and b["observation"].dtype == torch.int64 and b["observation"].shape == (12,)
    assert b["action"].dtype == torch.int8 and b["action"].shape == (12, 3)
    for x in batches:
        check_batch(x)
    check_continuity(*batches)


def test_env_id_string_and_create_env_kwargs():
    collector = Collector("CartPole-v1", None, frames_per_batch=50, total_frames=50,
                          create_env_kwargs={"max_episode_steps": 7})
    (b,) = collect(collector, 1)
    collector.shutdown()
    check_batch(b)
    assert b["next", "truncated"].any() or b["next", "terminated"].any()
    steps = torch.diff(torch.cat([torch.tensor([-1]), b["next", "done"][:, 0].nonzero().flatten()]))
    assert (steps <= 7).all()


def test_return_same_td_and_postproc():
    seen = []

    def postproc(td):
        seen.append(td.shape)
        td["extra"] = td["next", "reward"] * 2
        return td

    collector = Collector(lambda: CounterEnv(), None, frames_per_batch=10, total_frames=30, return_same_td=True,
                          postproc=postproc)
    batches = []
    for b in collector:
        batches.append(b)
        check_batch(b, policy_keys=("action", "extra"))
    collector.shutdown()
    assert batches[0] is batches[1] is batches[2]
    assert seen == [torch.Size([10])] * 3
    assert torch.equal(batches[0]["extra"], batches[0]["next", "reward"] * 2)


def test_set_truncated_marks_the_last_step_and_the_episodes_go_on():
    """As in TorchRL: the last step of each batch says truncated and done, and the envs step
    on, in the same trajectories (so episodes are not capped at a batch's length)."""
    collector = Collector([lambda: StepEnv(100)] * 2, None, frames_per_batch=10, total_frames=30,
                          set_truncated=True)
    batches = collect(collector, 3)
    collector.shutdown()
    for b in batches:
        assert b["next", "truncated"][:, -1].all() and b["next", "done"][:, -1].all()
        check_batch(b)
    for prev, cur in itertools.pairwise(batches):
        assert torch.equal(cur["collector", "traj_ids"][:, 0], prev["collector", "traj_ids"][:, -1])
        assert torch.equal(cur["observation"][:, 0], prev["next", "observation"][:, -1])
    assert batches[-1]["observation"][:, -1, 0].tolist() == [14.0, 14.0]  # step 14 of each 100-step episode


def test_reset_when_done_false_keeps_stepping_and_carries_flags():
    class Sticky(CounterEnv):
        def step(self, action):
            obs, r, _term, trunc, info = super().step(action)
            return obs, r, self.t >= self.length, trunc, info

    collector = Collector(lambda: Sticky(max_len=4), None, frames_per_batch=10, total_frames=10,
                          reset_when_done=False)
    (b,) = collect(collector, 1)
    collector.shutdown()
    done = b["next", "done"][:, 0]
    first = int(done.nonzero()[0])
    assert done[first:].all()                        # the env stays done
    assert b["done"][first + 1:, 0].all() and not b["done"][: first + 1].any()
    assert (b["collector", "traj_ids"] == 0).all()   # never reset: one trajectory


def test_init_random_frames_uses_random_policy_first():
    calls = []

    def policy(obs):
        calls.append(obs.shape[0])
        return torch.zeros(obs.shape[0], dtype=torch.int64)

    collector = Collector([lambda: CounterEnv()] * 2, policy, frames_per_batch=20, total_frames=60,
                          init_random_frames=25)  # rounded up to 2 batches
    batches = collect(collector, 3)
    collector.shutdown()
    assert len(calls) == 11  # the third batch ran the policy, and one probe of its outputs
    assert (batches[2]["action"] == 0).all()
    assert (batches[0]["action"] != 0).any() and (batches[1]["action"] != 0).any()


def test_interruptor_cuts_the_batch_and_masks_the_rest():
    interruptor = Interruptor()
    steps = []

    class Stopper(CounterEnv):
        def step(self, action):
            steps.append(1)
            if len(steps) == 8:  # 2 envs: the 4th step
                interruptor.stop_collection()
            return super().step(action)

    collector = Collector([Stopper, Stopper], None, frames_per_batch=20, total_frames=40, interruptor=interruptor)
    it = iter(collector)
    b = next(it)
    mask = b["collector", "mask"]
    assert mask.shape == (2, 10) and mask[:, :4].all() and not mask[:, 4:].any()
    assert (b["collector", "traj_ids"][:, 4:] == -1).all()
    check_batch(b)
    assert collector.statistics().frames == 8
    interruptor.start_collection()
    b2 = next(it)
    assert b2["collector", "mask"].all()
    check_continuity(b[:, :4], b2)
    collector.shutdown()

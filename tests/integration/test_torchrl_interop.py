"""TorchRL takes aiocollect batches as they are.

Every test here feeds an aiocollect batch to a piece of TorchRL (its collector's layout,
GAE, ClipPPOLoss, ReplayBuffer + SliceSampler, split_trajectories) and checks the result
against TorchRL's own output or against an independent reference computation.
torchrl is only imported by the tests, never by aiocollect.
"""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn as nn
from gymnasium import spaces
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

import aiocollect
from support.torchrl_marks import QUIET_TORCHRL

with warnings.catch_warnings():
    # torchrl warns about its own deprecations on import; keep that out of the report
    warnings.simplefilter("ignore", DeprecationWarning)
    torchrl = pytest.importorskip("torchrl")
    from torchrl.collectors import Collector as TorchRLCollector
    from torchrl.collectors.utils import split_trajectories as torchrl_split_trajectories
    from torchrl.data import LazyTensorStorage, ReplayBuffer, SliceSampler
    from torchrl.envs import GymEnv as TorchRLGymEnv
    from torchrl.envs import GymWrapper, SerialEnv
    from torchrl.modules import ProbabilisticActor, ValueOperator
    from torchrl.objectives import ClipPPOLoss
    from torchrl.objectives.value import GAE

pytestmark = QUIET_TORCHRL

GAMMA, LMBDA = 0.99, 0.95


# --------------------------------------------------------------------------- a custom env


class MixedDictEnv(gym.Env):
    """Dict observations with every supported leaf kind (nested too); MultiDiscrete actions.

    Episodes terminate after 3..6 steps (drawn at reset), so short batches hold several
    trajectories; the reward depends on the action so it is not constant.
    """

    metadata = {"render_modes": []}

    def __init__(self):
        self.observation_space = spaces.Dict(
            {
                "position": spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float64),
                "mode": spaces.Discrete(4),
                "switches": spaces.MultiBinary(3),
                "cell": spaces.MultiDiscrete([3, 5]),
                "sensors": spaces.Dict(
                    {
                        "velocity": spaces.Box(-5.0, 5.0, shape=(3,), dtype=np.float32),
                        "contact": spaces.Discrete(2),
                    }
                ),
            }
        )
        self.action_space = spaces.MultiDiscrete([2, 3])

    def _obs(self):
        rng = self.np_random
        return {
            "position": rng.uniform(-1, 1, size=2),
            "mode": int(rng.integers(4)),
            "switches": rng.integers(0, 2, size=3).astype(np.int8),
            "cell": rng.integers(0, [3, 5]).astype(np.int64),
            "sensors": {
                "velocity": rng.uniform(-5, 5, size=3).astype(np.float32),
                "contact": int(rng.integers(2)),
            },
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.length = int(self.np_random.integers(3, 7))
        return self._obs(), {}

    def step(self, action):
        action = np.asarray(action)
        assert self.action_space.contains(action), action
        self.t += 1
        reward = float(action[0] + 0.5 * action[1])
        return self._obs(), reward, self.t >= self.length, False, {}


# --------------------------------------------------------------------------- helpers

# name -> (aiocollect factory, TorchRL env factory)
ENVS = {
    "pendulum-box": (
        lambda: gym.make("Pendulum-v1"),
        lambda: TorchRLGymEnv("Pendulum-v1", categorical_action_encoding=True),
    ),
    "cartpole-discrete": (
        lambda: gym.make("CartPole-v1"),
        lambda: TorchRLGymEnv("CartPole-v1", categorical_action_encoding=True),
    ),
    "custom-dict-multidiscrete": (
        MixedDictEnv,
        lambda: GymWrapper(MixedDictEnv(), categorical_action_encoding=True),
    ),
    "frozenlake-discrete-obs": (
        lambda: gym.make("FrozenLake-v1"),
        lambda: TorchRLGymEnv("FrozenLake-v1", categorical_action_encoding=True),
    ),
}


def leaf_layout(td):
    """``{key: (dtype, shape)}`` for every leaf of ``td``."""
    return {
        k: (td.get(k).dtype, tuple(td.get(k).shape))
        for k in td.keys(include_nested=True, leaves_only=True)
    }


def first_batch(collector):
    try:
        return next(iter(collector))
    finally:
        collector.shutdown()


def aio_batch(create_env_fn, policy=None, *, frames, seed=0, **kwargs):
    collector = aiocollect.Collector(
        create_env_fn, policy, frames_per_batch=frames, total_frames=frames, **kwargs
    )
    collector.set_seed(seed)
    return first_batch(collector)


def cartpole_actor():
    """A ProbabilisticActor over CartPole's 2 actions, writing its log-prob."""
    return ProbabilisticActor(
        TensorDictModule(nn.Linear(4, 2), in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"],
        distribution_class=torch.distributions.Categorical,
        return_log_prob=True,
    )


# what aiocollect adds to TorchRL's layout: the policy version of every frame
OUR_EXTRA_KEYS = {("collector", "policy_version")}


def assert_same_layout(ours, theirs, what):
    ours_layout, theirs_layout = leaf_layout(ours), leaf_layout(theirs)
    assert set(ours_layout) >= OUR_EXTRA_KEYS
    assert ours_layout[("collector", "policy_version")] == (torch.int64, tuple(ours.batch_size))
    ours_layout = {k: v for k, v in ours_layout.items() if k not in OUR_EXTRA_KEYS}
    assert set(ours_layout) == set(theirs_layout), (
        f"{what}: leaf keys differ; only in aiocollect: {set(ours_layout) - set(theirs_layout)}, "
        f"only in TorchRL: {set(theirs_layout) - set(ours_layout)}"
    )
    for key, (dtype, shape) in theirs_layout.items():
        assert ours_layout[key] == (dtype, shape), (
            f"{what}: {key!r} is {ours_layout[key]} in aiocollect, ({dtype}, {shape}) in TorchRL"
        )
    assert ours.batch_size == theirs.batch_size, (what, ours.batch_size, theirs.batch_size)
    assert ours.names == theirs.names, (what, ours.names, theirs.names)
    assert ours.names[-1] == "time"


def numpy_gae(reward, value, next_value, done, terminated, gamma=GAMMA, lmbda=LMBDA):
    """Reference GAE over the last (time) axis, in float64.

    delta_t = r_t + gamma * V(s'_t) * (1 - terminated_t) - V(s_t)
    A_t     = delta_t + gamma * lmbda * (1 - done_t) * A_{t+1},  A_T = 0
    """
    reward, value, next_value = (np.asarray(x, np.float64) for x in (reward, value, next_value))
    not_done = 1.0 - np.asarray(done, np.float64)
    not_term = 1.0 - np.asarray(terminated, np.float64)
    adv = np.zeros_like(reward)
    running = np.zeros(reward.shape[:-1])
    for t in reversed(range(reward.shape[-1])):
        delta = reward[..., t] + gamma * next_value[..., t] * not_term[..., t] - value[..., t]
        running = delta + gamma * lmbda * not_done[..., t] * running
        adv[..., t] = running
    return adv, adv + value


def check_slices(sample, num_slices, source):
    """Each slice is one trajectory, and a contiguous run of that trajectory in ``source``."""
    slices = sample.reshape(num_slices, -1)
    src = source if source.ndim == 2 else source.unsqueeze(0)
    src_ids = src["collector", "traj_ids"]
    for s in range(num_slices):
        ids = slices["collector", "traj_ids"][s]
        assert (ids == ids[0]).all(), f"slice {s} mixes trajectories {ids.tolist()}"
        obs, next_obs = slices["observation"][s], slices["next", "observation"][s]
        assert torch.equal(next_obs[:-1], obs[1:]), f"slice {s}: next observation != following observation"
        assert not slices["next", "done"][s, :-1].any(), f"slice {s} crosses a done"
        # the slice is a contiguous piece of its trajectory as collected
        where = (src_ids == ids[0]).nonzero()
        traj_obs = src["observation"][where[:, 0], where[:, 1]]
        n = obs.shape[0]
        starts = [i for i in range(traj_obs.shape[0] - n + 1) if torch.equal(traj_obs[i : i + n], obs)]
        assert starts, f"slice {s} (trajectory {int(ids[0])}) is not a run of that trajectory in the batch"


# --------------------------------------------------------------------------- 1. layout


@pytest.mark.parametrize("env_name", list(ENVS))
@pytest.mark.parametrize("max_frames_per_traj", [None, 5], ids=["no-max", "max5"])
@pytest.mark.parametrize("batched", [False, True], ids=["single-env", "3-envs"])
def test_layout_matches_torchrl_collector(env_name, max_frames_per_traj, batched):
    """Same leaf keys, dtypes, shapes, batch size and names as TorchRL's Collector."""
    aio_factory, torchrl_factory = ENVS[env_name]
    frames = 24
    ours = aio_batch(
        [aio_factory] * 3 if batched else aio_factory,
        frames=frames, max_frames_per_traj=max_frames_per_traj,
    )
    torchrl_env = SerialEnv(3, torchrl_factory) if batched else torchrl_factory()
    theirs = first_batch(
        TorchRLCollector(
            torchrl_env, None, frames_per_batch=frames, total_frames=frames,
            max_frames_per_traj=max_frames_per_traj,
        )
    )
    assert ours.batch_size == ((3, 8) if batched else (24,))
    assert_same_layout(ours, theirs, f"{env_name}, max_frames_per_traj={max_frames_per_traj}, batched={batched}")


@pytest.mark.parametrize("traj_format", ["padded", "cat"])
def test_trajs_per_batch_layout_matches_torchrl_collector(traj_format):
    """``trajs_per_batch`` batches: TorchRL's keys, dtypes and names; rows (or runs) of whole
    trajectories, each ending on its only done step."""
    aio_factory, torchrl_factory = ENVS["cartpole-discrete"]
    kwargs = dict(frames_per_batch=32, total_frames=-1, trajs_per_batch=2, traj_format=traj_format)
    ours = first_batch(aiocollect.Collector(aio_factory, None, max_frames_per_traj=12, **kwargs))
    theirs = first_batch(TorchRLCollector(torchrl_factory(), None, max_frames_per_traj=12, **kwargs))
    ours_layout, theirs_layout = leaf_layout(ours), leaf_layout(theirs)
    assert set(ours_layout) - OUR_EXTRA_KEYS == set(theirs_layout)
    for key, (dtype, shape) in theirs_layout.items():  # lengths differ with the episodes drawn
        assert ours_layout[key][0] == dtype and len(ours_layout[key][1]) == len(shape), key
    if traj_format == "padded":
        # TorchRL's names follow the draw: ``tensordict.pad`` drops them when any trajectory is
        # padded (about one seed in six with these lengths), else its stack keeps ``"time"``.
        # Ours always name the time dimension, as its unpadded batches do.
        assert ours.names == [None, "time"]
        assert theirs.names in ([None, "time"], [None, None])
    else:
        assert ours.names == theirs.names
    done = ours["next", "done"][..., 0]
    if traj_format == "padded":
        assert ours.shape[0] == 2
        mask = ours["collector", "mask"]
        assert all(d[m][-1] and not d[m][:-1].any() for d, m in zip(done, mask))
    else:
        assert int(done.sum()) == 2 and done[-1]


def test_layout_matches_torchrl_collector_with_probabilistic_actor():
    """A policy's extra outputs (logits, log-prob) land where TorchRL's collector puts them."""
    torch.manual_seed(0)
    actor = cartpole_actor()
    ours = aio_batch([ENVS["cartpole-discrete"][0]] * 3, actor, frames=24)
    theirs = first_batch(
        TorchRLCollector(
            SerialEnv(3, ENVS["cartpole-discrete"][1]), actor, frames_per_batch=24, total_frames=24
        )
    )
    assert_same_layout(ours, theirs, "CartPole with a ProbabilisticActor")
    assert {"logits", "action"} <= set(ours.keys())


# --------------------------------------------------------------------------- 2. GAE


@pytest.mark.parametrize("batched", [False, True], ids=["single-env-[T]", "3-envs-[N,T]"])
def test_gae_on_aiocollect_batch_matches_reference(batched):
    torch.manual_seed(0)
    factory = ENVS["cartpole-discrete"][0]
    data = aio_batch(
        [factory] * 3 if batched else factory, frames=96, seed=1, max_frames_per_traj=15
    )
    term = data["next", "terminated"][..., 0]
    trunc_only = data["next", "truncated"][..., 0] & ~term
    # the batch must exercise both kinds of ends, or the check below proves little
    assert term.any() and trunc_only.any(), "seeded batch lacks terminated or truncated-only steps"

    value_net = TensorDictModule(nn.Linear(4, 1), in_keys=["observation"], out_keys=["state_value"])
    gae = GAE(gamma=GAMMA, lmbda=LMBDA, value_network=value_net)
    gae(data)
    reward_shape = data["next", "reward"].shape
    assert data["advantage"].shape == reward_shape
    assert data["value_target"].shape == reward_shape
    assert torch.isfinite(data["advantage"]).all() and torch.isfinite(data["value_target"]).all()

    with torch.no_grad():
        value = value_net.module(data["observation"])[..., 0].numpy()
        next_value = value_net.module(data["next", "observation"])[..., 0].numpy()
    adv, target = numpy_gae(
        data["next", "reward"][..., 0].numpy(), value, next_value,
        data["next", "done"][..., 0].numpy(), term.numpy(),
    )
    np.testing.assert_allclose(data["advantage"][..., 0].numpy(), adv, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(data["value_target"][..., 0].numpy(), target, rtol=1e-4, atol=1e-5)
    # where the episode terminated there is nothing to bootstrap: target == reward
    torch.testing.assert_close(data["value_target"][term], data["next", "reward"][term])


# --------------------------------------------------------------------------- 3. PPO loss


def test_clip_ppo_loss_on_batch_collected_with_probabilistic_actor():
    torch.manual_seed(0)
    actor = cartpole_actor()
    critic = ValueOperator(nn.Linear(4, 1), in_keys=["observation"])
    data = aio_batch([ENVS["cartpole-discrete"][0]] * 3, actor, frames=48, seed=2)
    loss_module = ClipPPOLoss(actor, critic)
    log_prob_key = loss_module.tensor_keys.sample_log_prob
    assert log_prob_key in data.keys(True), f"batch lacks the policy's {log_prob_key!r}: {list(data.keys(True))}"
    # the stored log-prob is that of the stored action under the stored logits
    expected = torch.distributions.Categorical(logits=data["logits"]).log_prob(data["action"])
    torch.testing.assert_close(data[log_prob_key], expected)

    GAE(gamma=GAMMA, lmbda=LMBDA, value_network=critic)(data)
    flat = data.reshape(-1)
    losses = loss_module(flat)
    total = sum(v for k, v in losses.items() if k.startswith("loss_"))
    assert torch.isfinite(total), losses
    # same weights as when collecting: the new/old probability ratio is exactly 1
    torch.testing.assert_close(losses["mean_ratio"], torch.tensor(1.0))
    total.backward()
    for name, module in (("actor", actor), ("critic", critic)):
        grads = [p.grad for p in module.parameters()]
        assert all(g is not None and torch.isfinite(g).all() for g in grads), name
        assert any(g.abs().sum() > 0 for g in grads), f"{name} got all-zero gradients"


# --------------------------------------------------------------------------- 4. ReplayBuffer


@pytest.mark.parametrize("batched", [False, True], ids=["single-env-ndim1", "3-envs-ndim2"])
def test_replay_buffer_slice_sampler_extend(batched):
    factory = ENVS["cartpole-discrete"][0]
    frames, num_slices = 96, 4
    data = aio_batch([factory] * 3 if batched else factory, frames=frames, seed=3, max_frames_per_traj=20)
    rb = ReplayBuffer(
        storage=LazyTensorStorage(frames, ndim=2 if batched else 1),
        sampler=SliceSampler(num_slices=num_slices, traj_key=("collector", "traj_ids")),
        batch_size=16,
    )
    rb.extend(data)
    assert len(rb) == frames
    torch.manual_seed(0)
    for _ in range(10):
        check_slices(rb.sample(), num_slices, data)


def test_replay_buffer_filled_by_collector():
    frames, num_slices = 48, 4
    rb = ReplayBuffer(
        storage=LazyTensorStorage(2 * frames, ndim=2),
        sampler=SliceSampler(num_slices=num_slices, traj_key=("collector", "traj_ids")),
        batch_size=16,
    )
    collector = aiocollect.Collector(
        [ENVS["cartpole-discrete"][0]] * 3, None, frames_per_batch=frames,
        total_frames=2 * frames, replay_buffer=rb,
    )
    collector.set_seed(4)
    try:
        yielded = list(collector)
    finally:
        collector.shutdown()
    assert yielded == [None, None]
    assert len(rb) == 2 * frames
    # the storage is time-first ([2 * T, N], from the batches' "time" name); reading it
    # back gives [N, 2 * T]: each env's frames of both batches, in time order
    assert rb.storage[:].shape == (2 * frames // 3, 3)
    stored = rb[:]
    assert stored.shape == (3, 2 * frames // 3)
    ids = stored["collector", "traj_ids"]
    assert (ids >= 0).all()
    # both batches were stored, each env's frames in time order: trajectories that cross
    # the batch boundary continue in the buffer
    done = stored["next", "done"][..., 0]
    same_traj = ~done[:, :-1]
    assert torch.equal(ids[:, 1:][same_traj], ids[:, :-1][same_traj])
    assert torch.equal(stored["next", "observation"][:, :-1][same_traj], stored["observation"][:, 1:][same_traj])
    torch.manual_seed(0)
    for _ in range(10):
        check_slices(rb.sample(), num_slices, stored)


# --------------------------------------------------------------------------- 5. split_trajectories


SPLIT_CASES = {
    # name: (create_env_fn, frames, max_frames_per_traj)
    "cartpole-single-env": (ENVS["cartpole-discrete"][0], 64, None),
    "cartpole-3-envs-max10": ([ENVS["cartpole-discrete"][0]] * 3, 60, 10),
    "custom-dict-3-envs": ([MixedDictEnv] * 3, 24, None),
    "pendulum-rows-are-whole-trajectories": ([ENVS["pendulum-box"][0]] * 3, 30, None),
    "pendulum-single-whole-trajectory": (ENVS["pendulum-box"][0], 10, None),
}


@pytest.mark.parametrize("case", list(SPLIT_CASES))
def test_split_trajectories_matches_torchrl(case):
    create_env_fn, frames, max_frames = SPLIT_CASES[case]
    data = aio_batch(create_env_fn, frames=frames, seed=5, max_frames_per_traj=max_frames)
    ours = aiocollect.split_trajectories(data)
    theirs = torchrl_split_trajectories(data)
    assert ours.batch_size == theirs.batch_size, (ours.batch_size, theirs.batch_size)
    assert ours.ndim == 2
    ours_keys = set(ours.keys(include_nested=True, leaves_only=True))
    theirs_keys = set(theirs.keys(include_nested=True, leaves_only=True))
    assert ours_keys == theirs_keys, (ours_keys ^ theirs_keys)
    assert ("collector", "mask") in ours_keys
    for key in theirs_keys:
        a, b = ours.get(key), theirs.get(key)
        assert a.dtype == b.dtype and a.shape == b.shape, (key, a.dtype, a.shape, b.dtype, b.shape)
        assert torch.equal(a, b), f"{key!r} differs between aiocollect and TorchRL"
    # the split is not trivial: mask count equals the frames, ids constant per row
    mask = ours["collector", "mask"]
    assert int(mask.sum()) == frames
    ids = ours["collector", "traj_ids"]
    assert all(ids[i][mask[i]].unique().numel() == 1 for i in range(ids.shape[0]))


@pytest.mark.parametrize("kwargs", [dict(done_key="done"), dict(trajectory_key="trajectory"), {}],
                         ids=["done_key", "trajectory_key", "defaults"])
def test_split_trajectories_takes_torchrl_s_arguments_and_keys(kwargs):
    """TorchRL's own docstring example: no "collector" entry, so the ids and mask go at the root."""
    obs = torch.cat([torch.arange(10), torch.arange(5)])
    done = torch.zeros(15, dtype=torch.bool)
    done[9] = True
    data = TensorDict({"obs": obs, ("next", "obs"): obs + 1, ("next", "done"): done,
                       "trajectory": torch.cat([torch.zeros(10, dtype=torch.int32), torch.ones(5, dtype=torch.int32)])},
                      batch_size=[15])
    ours, theirs = aiocollect.split_trajectories(data, **kwargs), torchrl_split_trajectories(data, **kwargs)
    assert set(ours.keys(True, True)) == set(theirs.keys(True, True))
    assert (ours == theirs).all()

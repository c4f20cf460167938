"""The seed tutorial's PPO loop, with TorchRL's modules and losses and aiocollect's collector.

TorchRL's actor (``ProbabilisticActor`` with a ``TanhNormal``), critic (``ValueOperator``),
``GAE``, ``ClipPPOLoss`` and replay buffer take aiocollect's batches as they are: the layout
is TorchRL's. What changes from the TorchRL version:

* the collector import (``aiocollect.MultiSyncCollector``), and no ``if __name__`` guard
  would be needed for it;
* envs are gymnasium envs, so the observation normalisation and clipping are gymnasium
  wrappers instead of TorchRL transforms;
* episode returns come from ``progress=True``'s bar rather than a ``RewardSum`` transform.

Pendulum-v1 stands in for the tutorial's HalfCheetah (MuJoCo is not needed).

    python examples/ppo_torchrl.py                  # 200k frames, a few minutes on 2 cores
    python examples/ppo_torchrl.py --frames 4096    # a smoke run
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from tensordict.nn import AddStateIndependentNormalScale, TensorDictModule
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import SamplerWithoutReplacement
from torchrl.envs import ExplorationType
from torchrl.modules import MLP, ProbabilisticActor, TanhNormal, ValueOperator
from torchrl.objectives import ClipPPOLoss, group_optimizers
from torchrl.objectives.value.advantages import GAE

from aiocollect import MultiSyncCollector

ENV_NAME = "Pendulum-v1"
N_WORKERS = 2
FRAMES_PER_BATCH = 2048  # total across all workers
MINI_BATCH_SIZE = 256
PPO_EPOCHS = 10


def make_env() -> gym.Env:
    env = gym.make(ENV_NAME)
    env = gym.wrappers.NormalizeObservation(env)
    env = gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10).astype(np.float32),
                                            env.observation_space)
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=200_000)
    args = parser.parse_args()
    torch.manual_seed(0)

    proof_env = make_env()
    obs_dim = proof_env.observation_space.shape[-1]
    act_dim = proof_env.action_space.shape[-1]
    low = torch.as_tensor(proof_env.action_space.low)
    high = torch.as_tensor(proof_env.action_space.high)

    policy_mlp = nn.Sequential(
        MLP(obs_dim, activation_class=nn.Tanh, out_features=act_dim, num_cells=[64, 64]),
        AddStateIndependentNormalScale(act_dim, scale_lb=1e-8),
    )
    actor = ProbabilisticActor(
        TensorDictModule(policy_mlp, in_keys=["observation"], out_keys=["loc", "scale"]),
        in_keys=["loc", "scale"],
        distribution_class=TanhNormal,
        distribution_kwargs={"low": low, "high": high, "tanh_loc": False},
        return_log_prob=True,
        default_interaction_type=ExplorationType.RANDOM,
    )
    critic = ValueOperator(MLP(obs_dim, activation_class=nn.Tanh, out_features=1, num_cells=[64, 64]),
                           in_keys=["observation"])
    adv_module = GAE(gamma=0.99, lmbda=0.95, value_network=critic, average_gae=False)
    loss_module = ClipPPOLoss(actor_network=actor, critic_network=critic, clip_epsilon=0.2, entropy_coeff=0.01,
                              critic_coeff=0.5, normalize_advantage=True)
    optim = group_optimizers(
        torch.optim.Adam(actor.parameters(), lr=3e-4, eps=1e-5),
        torch.optim.Adam(critic.parameters(), lr=3e-4, eps=1e-5),
    )

    total = -(-args.frames // FRAMES_PER_BATCH) * FRAMES_PER_BATCH
    # ── swap this line to scale: Collector, MultiSyncCollector, RayCollector ──
    collector = MultiSyncCollector(create_env_fn=[make_env] * N_WORKERS, policy=actor,
                                   frames_per_batch=FRAMES_PER_BATCH, total_frames=total,
                                   device="cpu", storing_device="cpu", progress=True)
    data_buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(FRAMES_PER_BATCH),
                                         sampler=SamplerWithoutReplacement(), batch_size=MINI_BATCH_SIZE)
    for data in collector:
        for _ in range(PPO_EPOCHS):
            with torch.no_grad():
                data = adv_module(data)
            data_buffer.extend(data.reshape(-1))
            for batch in data_buffer:
                optim.zero_grad(set_to_none=True)
                loss = loss_module(batch)
                (loss["loss_objective"] + loss["loss_critic"] + loss["loss_entropy"]).backward()
                torch.nn.utils.clip_grad_norm_(loss_module.parameters(), 0.5)
                optim.step()
        # synchronise the updated weights with the collector (returns at once)
        collector.update_policy_weights_()
    stats = collector.statistics()
    collector.shutdown()
    mean = stats.mean_episode_return  # of the last 100 episodes; None if none finished
    print(f"done: {stats.frames:,} frames, {stats.frames_per_second:,.0f} frames/s collecting, "
          f"mean episode return {mean if mean is None else round(mean, 1)}")


if __name__ == "__main__":
    main()

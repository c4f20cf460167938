# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
from __future__ import annotations

from typing import Any

import torch
import torch.nn
import torch.optim
from torchrl.data import Composite
from torchrl.envs import RewardSum, StepCounter, TransformedEnv
from torchrl.envs.libs.gym import GymEnv
from torchrl.modules import MLP, QValueActor
from torchrl.record import VideoRecorder


# ====================================================================
# Environment utils
# --------------------------------------------------------------------


def make_env(env_name="CartPole-v1", device="cpu", from_pixels=False):
    env = GymEnv(env_name, device=device, from_pixels=from_pixels, pixels_only=False)
    env = TransformedEnv(env)
    env.append_transform(RewardSum())
    env.append_transform(StepCounter())
    return env


def make_render_env(spec: Any):
    """Builds a CartPole environment suitable for ``rlrender``.

    Pixel rendering uses the Gymnasium classic-control renderer when
    ``rlrender --from-pixels`` is requested.
    """
    checkpoint = (
        spec.checkpoint if isinstance(getattr(spec, "checkpoint", None), dict) else {}
    )
    env_name = spec.env_kwargs.get(
        "env_name", checkpoint.get("env_name", "CartPole-v1")
    )
    return make_env(env_name, device=spec.device, from_pixels=spec.from_pixels)


# ====================================================================
# Model utils
# --------------------------------------------------------------------


def make_dqn_modules(proof_environment, device):

    # Define input shape
    input_shape = proof_environment.observation_spec["observation"].shape
    env_specs = proof_environment.specs
    num_outputs = env_specs["input_spec", "full_action_spec", "action"].space.n
    action_spec = env_specs["input_spec", "full_action_spec", "action"]

    # Define Q-Value Module
    mlp = MLP(
        in_features=input_shape[-1],
        activation_class=torch.nn.ReLU,
        out_features=num_outputs,
        num_cells=[120, 84],
        device=device,
    )

    qvalue_module = QValueActor(
        module=mlp,
        spec=Composite(action=action_spec).to(device),
        in_keys=["observation"],
    )
    return qvalue_module


def make_dqn_model(env_name, device):
    proof_environment = make_env(env_name, device=device)
    qvalue_module = make_dqn_modules(proof_environment, device=device)
    del proof_environment
    return qvalue_module


def make_render_policy(spec: Any):
    """Builds the DQN policy module for ``rlrender`` checkpoint loading."""
    checkpoint = spec.checkpoint if isinstance(spec.checkpoint, dict) else {}
    env_name = spec.policy_kwargs.get(
        "env_name", checkpoint.get("env_name", "CartPole-v1")
    )
    return make_dqn_model(env_name, device=spec.device)


# ====================================================================
# Evaluation utils
# --------------------------------------------------------------------


def eval_model(actor, test_env, num_episodes=3):
    test_rewards = torch.zeros(num_episodes, dtype=torch.float32)
    for i in range(num_episodes):
        td_test = test_env.rollout(
            policy=actor,
            auto_reset=True,
            auto_cast_to_device=True,
            break_when_any_done=True,
            max_steps=10_000_000,
        )
        test_env.apply(dump_video)
        reward = td_test["next", "episode_reward"][td_test["next", "done"]]
        test_rewards[i] = reward.sum()
    del td_test
    return test_rewards.mean()


def dump_video(module):
    if isinstance(module, VideoRecorder):
        module.dump()

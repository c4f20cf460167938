"""TorchRL's PPO tutorial ("Reinforcement Learning (PPO) with TorchRL", tutorials/sphinx-tutorials/
coding_ppo.py), as a user runs it: a ``TransformedEnv(GymEnv)`` with ``ObservationNorm`` (its stats
from ``init_stats``), ``DoubleToFloat`` and ``StepCounter``; a ``ProbabilisticActor`` and a
``ValueOperator``; a ``Collector`` with ``split_trajs=False``; a ``ReplayBuffer`` with
``SamplerWithoutReplacement`` refilled each epoch; ``GAE`` and ``ClipPPOLoss``; the tutorial's
epoch loop with gradient clipping, a cosine learning-rate schedule and its logs.

The tutorial's InvertedDoublePendulum needs mujoco: CartPole-v1 stands in, so the actor is a
``OneHotCategorical`` over logits instead of a ``TanhNormal`` over a ``NormalParamExtractor``;
sizes are cut to CI (2,400 frames in batches of 200, 64 cells, a larger learning rate). It
learns when the last 5 completed training episodes last on average at least twice as long as
the first 10 (a random CartPole policy lasts ~22 steps). Calibrated on TorchRL's collector over
torch seeds 0-9: the ratio was 3.3 to 11.6 (aiocollect's gave the same figures, seed for seed).
The deterministic evaluations are printed, not judged.
"""

import json
import multiprocessing
from collections import defaultdict

import torch
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.collectors import Collector
from torchrl.data.replay_buffers import ReplayBuffer
from torchrl.data.replay_buffers.samplers import SamplerWithoutReplacement
from torchrl.data.replay_buffers.storages import LazyTensorStorage
from torchrl.envs import Compose, DoubleToFloat, ObservationNorm, StepCounter, TransformedEnv
from torchrl.envs.libs.gym import GymEnv
from torchrl.envs.utils import ExplorationType, check_env_specs, set_exploration_type
from torchrl.modules import OneHotCategorical, ProbabilisticActor, ValueOperator
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

torch.manual_seed(0)

is_fork = multiprocessing.get_start_method() == "fork"
device = torch.device(0) if torch.cuda.is_available() and not is_fork else torch.device("cpu")
num_cells = 64  # number of cells in each layer
lr = 1e-2
max_grad_norm = 1.0

frames_per_batch = 200
# For a complete training, bring the number of frames up to 1M
total_frames = 2_400

sub_batch_size = 50  # cardinality of the sub-samples gathered from the current data in the inner loop
num_epochs = 4  # optimisation steps per batch of data collected
clip_epsilon = 0.2  # clip value for PPO loss
gamma = 0.99
lmbda = 0.95
entropy_eps = 1e-4

base_env = GymEnv("CartPole-v1", device=device)
base_env.set_seed(0)

env = TransformedEnv(
    base_env,
    Compose(
        # normalize observations
        ObservationNorm(in_keys=["observation"]),
        DoubleToFloat(),
        StepCounter(),
    ),
)
env.transform[0].init_stats(num_iter=500, reduce_dim=0, cat_dim=0)
print("normalization constant shape:", env.transform[0].loc.shape)

print("observation_spec:", env.observation_spec)
print("reward_spec:", env.reward_spec)
print("input_spec:", env.input_spec)
print("action_spec (as defined by input_spec):", env.action_spec)

check_env_specs(env)

rollout = env.rollout(3)
print("rollout of three steps:", rollout)
print("Shape of the rollout TensorDict:", rollout.batch_size)

actor_net = nn.Sequential(
    nn.LazyLinear(num_cells, device=device),
    nn.Tanh(),
    nn.LazyLinear(num_cells, device=device),
    nn.Tanh(),
    nn.LazyLinear(env.action_spec.shape[-1], device=device),
)
policy_module = TensorDictModule(actor_net, in_keys=["observation"], out_keys=["logits"])
policy_module = ProbabilisticActor(
    module=policy_module,
    spec=env.action_spec,
    in_keys=["logits"],
    distribution_class=OneHotCategorical,
    return_log_prob=True,
    # we'll need the log-prob for the numerator of the importance weights
)

value_net = nn.Sequential(
    nn.LazyLinear(num_cells, device=device),
    nn.Tanh(),
    nn.LazyLinear(num_cells, device=device),
    nn.Tanh(),
    nn.LazyLinear(1, device=device),
)
value_module = ValueOperator(module=value_net, in_keys=["observation"])

print("Running policy:", policy_module(env.reset()))
print("Running value:", value_module(env.reset()))

collector = Collector(
    env,
    policy_module,
    frames_per_batch=frames_per_batch,
    total_frames=total_frames,
    split_trajs=False,
    device=device,
)

replay_buffer = ReplayBuffer(
    storage=LazyTensorStorage(max_size=frames_per_batch),
    sampler=SamplerWithoutReplacement(),
)

advantage_module = GAE(gamma=gamma, lmbda=lmbda, value_network=value_module, average_gae=True, device=device)

loss_module = ClipPPOLoss(
    actor_network=policy_module,
    critic_network=value_module,
    clip_epsilon=clip_epsilon,
    entropy_bonus=bool(entropy_eps),
    entropy_coeff=entropy_eps,
    critic_coeff=1.0,
    loss_critic_type="smooth_l1",
)

optim = torch.optim.Adam(loss_module.parameters(), lr)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optim, total_frames // frames_per_batch, 0.0)

logs = defaultdict(list)
eval_str = ""

# We iterate over the collector until it reaches the total number of frames it was
# designed to collect:
for i, tensordict_data in enumerate(collector):
    # we now have a batch of data to work with. Let's learn something from it.
    for _ in range(num_epochs):
        # We'll need an "advantage" signal to make PPO work.
        # We re-compute it at each epoch as its value depends on the value
        # network which is updated in the inner loop.
        advantage_module(tensordict_data)
        data_view = tensordict_data.reshape(-1)
        replay_buffer.extend(data_view.cpu())
        for _ in range(frames_per_batch // sub_batch_size):
            subdata = replay_buffer.sample(sub_batch_size)
            loss_vals = loss_module(subdata.to(device))
            loss_value = loss_vals["loss_objective"] + loss_vals["loss_critic"] + loss_vals["loss_entropy"]

            # Optimization: backward, grad clipping and optimization step
            loss_value.backward()
            # this is not strictly mandatory but it's good practice to keep
            # your gradient norm bounded
            torch.nn.utils.clip_grad_norm_(loss_module.parameters(), max_grad_norm)
            optim.step()
            optim.zero_grad()

    logs["reward"].append(tensordict_data["next", "reward"].mean().item())
    cum_reward_str = f"average reward={logs['reward'][-1]: 4.4f} (init={logs['reward'][0]: 4.4f})"
    logs["step_count"].append(tensordict_data["step_count"].max().item())
    stepcount_str = f"step count (max): {logs['step_count'][-1]}"
    # CartPole's reward is 1 per step: how long the episodes last is what tells progress
    done = tensordict_data["next", "done"]
    logs["episode_length"].extend(tensordict_data["next", "step_count"][done].tolist())
    logs["lr"].append(optim.param_groups[0]["lr"])
    lr_str = f"lr policy: {logs['lr'][-1]: 4.4f}"
    if i % 10 == 0:
        # We evaluate the policy once every 10 batches of data.
        # Evaluation is rather simple: execute the policy without exploration
        # (take the expected value of the action distribution) for a given
        # number of steps (500, which is our env horizon).
        with set_exploration_type(ExplorationType.DETERMINISTIC), torch.no_grad():
            # execute a rollout with the trained policy
            eval_rollout = env.rollout(500, policy_module)
            logs["eval reward"].append(eval_rollout["next", "reward"].mean().item())
            logs["eval reward (sum)"].append(eval_rollout["next", "reward"].sum().item())
            logs["eval step_count"].append(eval_rollout["step_count"].max().item())
            eval_str = (
                f"eval cumulative reward: {logs['eval reward (sum)'][-1]: 4.4f} "
                f"(init: {logs['eval reward (sum)'][0]: 4.4f}), "
                f"eval step-count: {logs['eval step_count'][-1]}"
            )
            del eval_rollout
    print(", ".join([eval_str, cum_reward_str, stepcount_str, lr_str]))

    # We're also using a learning rate scheduler. Like the gradient clipping,
    # this is a nice-to-have but nothing necessary for PPO to work.
    scheduler.step()

collector.shutdown()

first = sum(logs["episode_length"][:10]) / 10
last = sum(logs["episode_length"][-5:]) / 5
print("RESULT " + json.dumps({
    "collector": type(collector).__module__,
    "learned": bool(last >= 2 * first),
    "first_episode_length": round(first, 1),
    "last_episode_length": round(last, 1),
    "eval_step_count": logs["eval step_count"],
    "batches": len(logs["reward"]),
}))

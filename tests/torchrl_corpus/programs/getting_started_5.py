"""TorchRL's "Get started with your own first training loop" (getting-started 5,
tutorials/sphinx-tutorials/getting-started-5.py), as a user runs it: DQN on CartPole with an
MLP Q-value policy (``QValueModule``) and an ``EGreedyModule``, a ``Collector`` with
``init_random_frames``, a ``ReplayBuffer`` on ``LazyTensorStorage``, ``DQNLoss``, ``SoftUpdate``
and Adam, 10 optimisation steps per batch; the loop stops once the buffer holds an episode
longer than 200 steps, the tutorial's definition of success. As in the tutorial, the collector
runs the greedy ``policy`` (exploration comes from the random frames only), and the greedy
policy is rolled out at the end (the tutorial records that rollout as a video; here only its
length is kept). Cut to CI size: 500 random frames (the tutorial's 5000), batches of 50 frames
(100), and a frame budget (``total_frames=10_000``) instead of an endless collector.

It learns when the loop stopped on success within the budget. Random play never gets there (no
episode over 150 steps in 20,000 random CartPole episodes; mean 22), and the original solved in
1,550-5,650 frames over seeds 0-29.
"""

import json

import torch

torch.manual_seed(0)

import time

from torchrl.envs import GymEnv, StepCounter, TransformedEnv

env = TransformedEnv(GymEnv("CartPole-v1"), StepCounter())
env.set_seed(0)

from tensordict.nn import TensorDictModule as Mod, TensorDictSequential as Seq

from torchrl.modules import EGreedyModule, MLP, QValueModule

value_mlp = MLP(out_features=env.action_spec.shape[-1], num_cells=[64, 64])
value_net = Mod(value_mlp, in_keys=["observation"], out_keys=["action_value"])
policy = Seq(value_net, QValueModule(spec=env.action_spec))
exploration_module = EGreedyModule(
    env.action_spec, annealing_num_steps=100_000, eps_init=0.5
)
policy_explore = Seq(policy, exploration_module)

from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, ReplayBuffer

init_rand_steps = 500
frames_per_batch = 50
optim_steps = 10
total_frames = 10_000
collector = Collector(
    env,
    policy,
    frames_per_batch=frames_per_batch,
    total_frames=total_frames,
    init_random_frames=init_rand_steps,
)
rb = ReplayBuffer(storage=LazyTensorStorage(100_000))

from torch.optim import Adam

from torchrl.objectives import DQNLoss, SoftUpdate

loss = DQNLoss(value_network=policy, action_space=env.action_spec, delay_value=True)
optim = Adam(loss.parameters(), lr=0.02)
updater = SoftUpdate(loss, eps=0.99)

from torchrl._utils import logger as torchrl_logger

total_count = 0
total_episodes = 0
episode_lengths = []  # the length of every episode the collector finished, in order
t0 = time.time()
for i, data in enumerate(collector):
    # Write data in replay buffer
    rb.extend(data)
    episode_lengths += data["next", "step_count"][data["next", "done"]].tolist()
    max_length = rb[:]["next", "step_count"].max()
    if len(rb) > init_rand_steps:
        # Optim loop (we do several optim steps
        # per batch collected for efficiency)
        for _ in range(optim_steps):
            sample = rb.sample(128)
            loss_vals = loss(sample)
            loss_vals["loss"].backward()
            optim.step()
            optim.zero_grad()
            # Update exploration factor
            exploration_module.step(data.numel())
            # Update target params
            updater.step()
            if i % 10:
                torchrl_logger.info(f"Max num steps: {max_length}, rb length {len(rb)}")
            total_count += data.numel()
            total_episodes += data["next", "done"].sum()
    if max_length > 200:
        break

t1 = time.time()

torchrl_logger.info(
    f"solved after {total_count} steps, {total_episodes} episodes and in {t1-t0}s."
)
collector.shutdown()

# The tutorial then records a video of the trained (not exploring) policy; here the same
# rollout, without the recorder, gives the length the greedy policy reaches
eval_env = TransformedEnv(GymEnv("CartPole-v1"), StepCounter())
eval_env.set_seed(0)
eval_length = eval_env.rollout(max_steps=1000, policy=policy).numel()

first = sum(episode_lengths[:10]) / 10
last = sum(episode_lengths[-10:]) / 10
solved = bool(max_length > 200)
print("RESULT " + json.dumps({
    "collector": type(collector).__module__,
    "learned": solved,
    "solved": solved,
    "max_length": int(max_length),
    "frames": len(rb),
    "episodes": len(episode_lengths),
    "first10_mean_length": first,
    "last10_mean_length": last,
    "eval_length": eval_length,
    "seconds": round(t1 - t0, 2),
}))

"""TorchRL's SAC reference implementation (sota-implementations/sac/sac.py with its utils.py and
config.yaml), as a user runs it: the train env a ``ParallelEnv(env_per_collector,
EnvCreator(...), serial_for_single=True)`` under ``InitTracker``, ``StepCounter``,
``DoubleToFloat`` and ``RewardSum``; a ``TanhNormal`` ``ProbabilisticActor`` over an ``MLP`` and
a ``NormalParamExtractor``, a Q ``ValueOperator``; a ``Collector`` with ``init_random_frames``,
seeded with ``set_seed``; a ``TensorDictReplayBuffer`` on a ``LazyTensorStorage`` (without its
prefetch threads, which cost seconds on 2 cores); ``SACLoss`` with a ``SoftUpdate`` target,
``group_optimizers``; sac.py's loop: a batch, ``update_policy_weights_()``, extend the buffer,
``utd_ratio`` updates per frame, episode rewards read at ``("next", "done")``, a deterministic
evaluation on the eval env.

Cut to CI: Pendulum-v1 stands in for HalfCheetah (mujoco is absent), with gravity 2.0 (a gym
keyword) so that it is solved in ~600 updates (at g=10, SAC needs ~2,600 updates, ~20 s of
TorchRL updates here); the config is a plain namespace (no hydra); smaller networks, a larger
learning rate, a smaller initial alpha and 800 frames. The deterministic evaluation (the mean
return of 2 episodes from fixed eval seeds, so the same start states) runs before training and
after the last batch; it learned when the last is at least 400 above the first. Calibrated on
TorchRL's collector over env seeds 42, 1-7: -720 to -1472 before, -17 to -757 after, a gain of
667 to 1310 (aiocollect's: a gain of 646 to 1384).
"""

import functools
import json
from types import SimpleNamespace as NS

import numpy as np
import torch
from tensordict import TensorDict
from tensordict.nn import InteractionType, TensorDictModule
from tensordict.nn.distributions import NormalParamExtractor
from torch import nn, optim
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.envs import Compose, DoubleToFloat, EnvCreator, ParallelEnv, TransformedEnv
from torchrl.envs.libs.gym import GymEnv, set_gym_backend
from torchrl.envs.transforms import InitTracker, RewardSum, StepCounter
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import MLP, ProbabilisticActor, ValueOperator
from torchrl.modules.distributions import TanhNormal
from torchrl.objectives import SoftUpdate, group_optimizers
from torchrl.objectives.sac import SACLoss

cfg = NS(
    # gravity 2.0 instead of 10: the pendulum can be pushed up without swinging, so SAC solves it
    # in a few hundred updates
    env=NS(name="Pendulum-v1", library="gymnasium", make_kwargs={"g": 2.0}, max_episode_steps=200, seed=42),
    collector=NS(total_frames=800, init_random_frames=300, frames_per_batch=200, device="cpu",
                 env_per_collector=1),
    replay_buffer=NS(size=100_000, prb=0, scratch_dir=None),
    optim=NS(utd_ratio=1.0, gamma=0.99, loss_function="l2", lr=1.0e-2, weight_decay=0.0, batch_size=128,
             target_update_polyak=0.99, alpha_init=0.1, adam_eps=1.0e-8),
    network=NS(hidden_sizes=[64, 64], activation="relu", default_policy_scale=1.0, scale_lb=0.1, device="cpu"),
    logger=NS(eval_iter=800, eval_episodes=2),
)


# ====================================================================
# Environment utils (utils.py)


def env_maker(cfg, device="cpu", from_pixels=False):
    lib = cfg.env.library
    with set_gym_backend(lib):
        return GymEnv(cfg.env.name, device=device, from_pixels=from_pixels, pixels_only=False,
                      **cfg.env.make_kwargs)


def apply_env_transforms(env, max_episode_steps=1000):
    transformed_env = TransformedEnv(
        env,
        Compose(
            InitTracker(),
            StepCounter(max_episode_steps),
            DoubleToFloat(),
            RewardSum(),
        ),
    )
    return transformed_env


def make_environment(cfg):
    """Make environments for training and evaluation."""
    partial = functools.partial(env_maker, cfg=cfg)
    parallel_env = ParallelEnv(cfg.collector.env_per_collector, EnvCreator(partial), serial_for_single=True)
    parallel_env.set_seed(cfg.env.seed)

    train_env = apply_env_transforms(parallel_env, cfg.env.max_episode_steps)

    trsf_clone = train_env.transform.clone()
    eval_env = TransformedEnv(
        ParallelEnv(cfg.collector.env_per_collector, EnvCreator(partial), serial_for_single=True),
        trsf_clone,
    )
    return train_env, eval_env


# ====================================================================
# Collector and replay buffer (utils.py)


def make_collector(cfg, train_env, actor_model_explore):
    """Make collector."""
    collector = Collector(
        train_env,
        actor_model_explore,
        init_random_frames=cfg.collector.init_random_frames,
        frames_per_batch=cfg.collector.frames_per_batch,
        total_frames=cfg.collector.total_frames,
        device=cfg.collector.device,
        compile_policy=False,
        cudagraph_policy=False,
    )
    collector.set_seed(cfg.env.seed)
    return collector


def make_replay_buffer(batch_size, buffer_size=1000000, device="cpu", prefetch=3):
    return TensorDictReplayBuffer(
        pin_memory=False,
        prefetch=prefetch,
        storage=LazyTensorStorage(buffer_size, device=device),
        batch_size=batch_size,
    )


# ====================================================================
# Model (utils.py)


def make_sac_agent(cfg, train_env, eval_env, device):
    """Make SAC agent."""
    in_keys = ["observation"]
    action_spec = train_env.action_spec_unbatched.to(device)

    actor_net = MLP(
        num_cells=cfg.network.hidden_sizes,
        out_features=2 * action_spec.shape[-1],
        activation_class=nn.ReLU,
        device=device,
    )
    dist_kwargs = {
        "low": action_spec.space.low,
        "high": action_spec.space.high,
        "tanh_loc": False,
    }
    actor_extractor = NormalParamExtractor(
        scale_mapping=f"biased_softplus_{cfg.network.default_policy_scale}",
        scale_lb=cfg.network.scale_lb,
    ).to(device)
    actor_net = nn.Sequential(actor_net, actor_extractor)
    actor_module = TensorDictModule(actor_net, in_keys=in_keys, out_keys=["loc", "scale"])
    actor = ProbabilisticActor(
        spec=action_spec,
        in_keys=["loc", "scale"],
        module=actor_module,
        distribution_class=TanhNormal,
        distribution_kwargs=dist_kwargs,
        default_interaction_type=InteractionType.RANDOM,
        return_log_prob=False,
    )

    qvalue_net = MLP(num_cells=cfg.network.hidden_sizes, out_features=1, activation_class=nn.ReLU, device=device)
    qvalue = ValueOperator(in_keys=["action"] + in_keys, module=qvalue_net)

    model = nn.ModuleList([actor, qvalue])

    # init nets
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        td = eval_env.fake_tensordict()
        td = td.to(device)
        for net in model:
            net(td)
    return model, model[0]


# ====================================================================
# SAC Loss (utils.py)


def make_loss_module(cfg, model):
    """Make loss module and target network updater."""
    loss_module = SACLoss(
        actor_network=model[0],
        qvalue_network=model[1],
        num_qvalue_nets=2,
        loss_function=cfg.optim.loss_function,
        delay_actor=False,
        delay_qvalue=True,
        alpha_init=cfg.optim.alpha_init,
    )
    loss_module.make_value_estimator(gamma=cfg.optim.gamma)
    target_net_updater = SoftUpdate(loss_module, eps=cfg.optim.target_update_polyak)
    return loss_module, target_net_updater


def make_sac_optimizer(cfg, loss_module):
    critic_params = list(loss_module.qvalue_network_params.flatten_keys().values())
    actor_params = list(loss_module.actor_network_params.flatten_keys().values())
    optimizer_actor = optim.Adam(actor_params, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay,
                                 eps=cfg.optim.adam_eps)
    optimizer_critic = optim.Adam(critic_params, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay,
                                  eps=cfg.optim.adam_eps)
    optimizer_alpha = optim.Adam([loss_module.log_alpha], lr=3.0e-4)
    return optimizer_actor, optimizer_critic, optimizer_alpha


# ====================================================================
# Training (sac.py)

device = torch.device(cfg.network.device)

torch.manual_seed(cfg.env.seed)
np.random.seed(cfg.env.seed)

train_env, eval_env = make_environment(cfg)
model, exploration_policy = make_sac_agent(cfg, train_env, eval_env, device)
loss_module, target_net_updater = make_loss_module(cfg, model)
collector = make_collector(cfg, train_env, exploration_policy)
# no prefetch threads (sac.py's default is 3): on 2 cores they cost ~3 s here, and make runs irreproducible
replay_buffer = make_replay_buffer(batch_size=cfg.optim.batch_size, buffer_size=cfg.replay_buffer.size,
                                   device=device, prefetch=None)
optimizer_actor, optimizer_critic, optimizer_alpha = make_sac_optimizer(cfg, loss_module)
optimizer = group_optimizers(optimizer_actor, optimizer_critic, optimizer_alpha)
del optimizer_actor, optimizer_critic, optimizer_alpha


def update(sampled_tensordict):
    # Compute loss
    loss_td = loss_module(sampled_tensordict)

    actor_loss = loss_td["loss_actor"]
    q_loss = loss_td["loss_qvalue"]
    alpha_loss = loss_td["loss_alpha"]

    (actor_loss + q_loss + alpha_loss).sum().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

    # Update qnet_target params
    target_net_updater.step()
    return loss_td.detach()


def evaluate():
    # the same eval seeds every time: the same start states, so returns compare
    rewards = []
    for k in range(cfg.logger.eval_episodes):
        eval_env.set_seed(cfg.env.seed + 1000 + k)
        with set_exploration_type(ExplorationType.DETERMINISTIC), torch.no_grad():
            eval_rollout = eval_env.rollout(
                cfg.env.max_episode_steps,
                model[0],
                auto_cast_to_device=True,
                break_when_any_done=True,
            )
        rewards.append(eval_rollout["next", "reward"].sum(-2).mean().item())
    return sum(rewards) / len(rewards)


eval_rewards = [evaluate()]
print(f"eval reward before training: {eval_rewards[0]:.1f}")

collected_frames = 0
init_random_frames = cfg.collector.init_random_frames
num_updates = int(cfg.collector.env_per_collector * cfg.collector.frames_per_batch * cfg.optim.utd_ratio)
eval_iter = cfg.logger.eval_iter
frames_per_batch = cfg.collector.frames_per_batch
train_rewards = []

collector_iter = iter(collector)
total_iter = len(collector)

for i in range(total_iter):
    tensordict = next(collector_iter)

    # Update weights of the inference policy
    collector.update_policy_weights_()

    current_frames = tensordict.numel()

    # Add to replay buffer
    tensordict = tensordict.reshape(-1)
    replay_buffer.extend(tensordict)

    collected_frames += current_frames

    # Optimization steps
    if collected_frames >= init_random_frames:
        losses = TensorDict(batch_size=[num_updates])
        for j in range(num_updates):
            sampled_tensordict = replay_buffer.sample()
            loss_td = update(sampled_tensordict).clone()
            losses[j] = loss_td.select("loss_actor", "loss_qvalue", "loss_alpha")

    episode_end = (
        tensordict["next", "done"] if tensordict["next", "done"].any() else tensordict["next", "truncated"]
    )
    episode_rewards = tensordict["next", "episode_reward"][episode_end]

    metrics_to_log = {}
    if len(episode_rewards) > 0:
        episode_length = tensordict["next", "step_count"][episode_end]
        metrics_to_log["train/reward"] = episode_rewards.mean().item()
        metrics_to_log["train/episode_length"] = (episode_length.sum() / len(episode_length)).item()
        train_rewards.extend(episode_rewards.tolist())
    if collected_frames >= init_random_frames:
        losses = losses.mean()
        metrics_to_log["train/q_loss"] = losses.get("loss_qvalue").item()
        metrics_to_log["train/actor_loss"] = losses.get("loss_actor").item()
        metrics_to_log["train/alpha"] = loss_td["alpha"].item()

    # Evaluation
    if abs(collected_frames % eval_iter) < frames_per_batch:
        eval_rewards.append(evaluate())
        metrics_to_log["eval/reward"] = eval_rewards[-1]
    print(collected_frames, {k: round(v, 3) for k, v in metrics_to_log.items()})

collector.shutdown()
if not eval_env.is_closed:
    eval_env.close()
if not train_env.is_closed:
    train_env.close()

print("RESULT " + json.dumps({
    "collector": type(collector).__module__,
    "learned": bool(len(eval_rewards) == 2 and eval_rewards[-1] >= eval_rewards[0] + 400),
    "eval_rewards": [round(r, 1) for r in eval_rewards],
    "train_episode_rewards": [round(r, 1) for r in train_rewards],
}))

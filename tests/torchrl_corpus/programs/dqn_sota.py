"""TorchRL's DQN on CartPole (sota-implementations/dqn/dqn_cartpole.py with its
utils_cartpole.py and config_cartpole.yaml), as a user runs it: ``make_env`` (GymEnv with
``RewardSum`` and ``StepCounter``), ``make_dqn_model`` (``QValueActor`` on an MLP), an
``EGreedyModule`` annealed by ``greedy_module.step``, a ``Collector`` with ``device``s,
``storing_device``, ``max_frames_per_traj=-1`` and ``init_random_frames``, a
``TensorDictReplayBuffer`` on ``LazyTensorStorage`` with prefetch, ``DQNLoss`` (l2) with
``HardUpdate`` target updates, Adam, a deterministic evaluation every ``test_interval`` frames
(``eval_model``) and ``collector.update_policy_weights_()`` after each batch. Hydra is replaced by
the same config as a namespace (and a seed); there is no logger (``logger.backend`` empty). Cut to
CI size: 3,000 frames in batches of 50 (the sota's 500,100 in 1,000), 300 random frames (10,000),
exploration annealed over 1,000 frames (250,000), 10 updates per batch (100) at lr 2e-3 (2.5e-4),
a buffer of 3,000 (10,000), target updates every 20 updates (50), one evaluation of 2 episodes.

It learns when the mean length of the last 10 training episodes (epsilon-greedy, eps 0.05) is at
least 60 steps: random play's mean is 22 (sd ~21 per episode), and the original reached 77-179
over seeds 0-15 (first 10 episodes: 18-32).
"""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import torch.nn
import torch.optim
import tqdm

from tensordict.nn import TensorDictSequential
from torchrl._utils import logger as torchrl_logger
from torchrl.collectors import Collector
from torchrl.data import Composite, LazyTensorStorage, TensorDictReplayBuffer
from torchrl.envs import ExplorationType, RewardSum, set_exploration_type, StepCounter, TransformedEnv
from torchrl.envs.libs.gym import GymEnv
from torchrl.modules import EGreedyModule, MLP, QValueActor
from torchrl.objectives import DQNLoss, HardUpdate


# ====================================================================
# Environment utils
# --------------------------------------------------------------------


def make_env(env_name="CartPole-v1", device="cpu", from_pixels=False):
    env = GymEnv(env_name, device=device, from_pixels=from_pixels, pixels_only=False)
    env = TransformedEnv(env)
    env.append_transform(RewardSum())
    env.append_transform(StepCounter())
    return env


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
        reward = td_test["next", "episode_reward"][td_test["next", "done"]]
        test_rewards[i] = reward.sum()
    del td_test
    return test_rewards.mean()


# ====================================================================
# config_cartpole.yaml, cut to CI size
# --------------------------------------------------------------------


def _namespace(d):
    return SimpleNamespace(**{k: _namespace(v) if isinstance(v, dict) else v for k, v in d.items()})


cfg = _namespace({
    "device": None,
    "seed": 0,
    "env": {"env_name": "CartPole-v1"},
    "collector": {
        "total_frames": 3_000,
        "frames_per_batch": 50,
        "eps_start": 1.0,
        "eps_end": 0.05,
        "annealing_frames": 1_000,
        "init_random_frames": 300,
    },
    "buffer": {"buffer_size": 3_000, "batch_size": 128},
    "logger": {"test_interval": 1_500, "num_test_episodes": 2},
    "optim": {"lr": 2e-3, "max_grad_norm": 10},
    "loss": {"gamma": 0.99, "hard_update_freq": 20, "num_updates": 10},
})


def main(cfg):

    device = cfg.device
    if device in ("", None):
        if torch.cuda.is_available():
            device = "cuda:0"
        else:
            device = "cpu"
    device = torch.device(device)
    torch.manual_seed(cfg.seed)

    # Make the components
    model = make_dqn_model(cfg.env.env_name, device)

    greedy_module = EGreedyModule(
        annealing_num_steps=cfg.collector.annealing_frames,
        eps_init=cfg.collector.eps_start,
        eps_end=cfg.collector.eps_end,
        spec=model.spec,
    )
    model_explore = TensorDictSequential(
        model,
        greedy_module,
    ).to(device)

    # Create the collector
    collector = Collector(
        create_env_fn=make_env(cfg.env.env_name, "cpu"),
        policy=model_explore,
        frames_per_batch=cfg.collector.frames_per_batch,
        total_frames=cfg.collector.total_frames,
        env_device="cpu",
        policy_device=device,
        storing_device="cpu",
        max_frames_per_traj=-1,
        init_random_frames=cfg.collector.init_random_frames,
    )
    collector.set_seed(cfg.seed)

    # Create the replay buffer
    replay_buffer = TensorDictReplayBuffer(
        pin_memory=False,
        prefetch=10,
        storage=LazyTensorStorage(
            max_size=cfg.buffer.buffer_size,
            device="cpu",
        ),
        batch_size=cfg.buffer.batch_size,
    )

    # Create the loss module
    loss_module = DQNLoss(
        value_network=model,
        loss_function="l2",
        delay_value=True,
    )
    loss_module.make_value_estimator(gamma=cfg.loss.gamma)
    loss_module = loss_module.to(device)
    target_net_updater = HardUpdate(
        loss_module, value_network_update_interval=cfg.loss.hard_update_freq
    )

    # Create the optimizer
    optimizer = torch.optim.Adam(loss_module.parameters(), lr=cfg.optim.lr)

    # Create the test environment
    test_env = make_env(cfg.env.env_name, "cpu")
    test_env.set_seed(cfg.seed + 1000)

    # Main loop
    collected_frames = 0
    start_time = time.time()
    num_updates = cfg.loss.num_updates
    batch_size = cfg.buffer.batch_size
    test_interval = cfg.logger.test_interval
    num_test_episodes = cfg.logger.num_test_episodes
    frames_per_batch = cfg.collector.frames_per_batch
    pbar = tqdm.tqdm(total=cfg.collector.total_frames)
    init_random_frames = cfg.collector.init_random_frames
    sampling_start = time.time()
    q_losses = torch.zeros(num_updates, device=device)
    train_episode_lengths = []
    test_rewards_log = []

    for i, data in enumerate(collector):

        log_info = {}
        sampling_time = time.time() - sampling_start
        pbar.update(data.numel())
        data = data.reshape(-1)
        current_frames = data.numel()
        replay_buffer.extend(data)
        collected_frames += current_frames
        greedy_module.step(current_frames)

        # Get and log training rewards and episode lengths
        episode_rewards = data["next", "episode_reward"][data["next", "done"]]
        if len(episode_rewards) > 0:
            episode_reward_mean = episode_rewards.mean().item()
            episode_length = data["next", "step_count"][data["next", "done"]]
            episode_length_mean = episode_length.sum().item() / len(episode_length)
            log_info.update(
                {
                    "train/episode_reward": episode_reward_mean,
                    "train/episode_length": episode_length_mean,
                }
            )
            train_episode_lengths += episode_length.tolist()

        if collected_frames < init_random_frames:
            continue

        # optimization steps
        training_start = time.time()
        for j in range(num_updates):
            sampled_tensordict = replay_buffer.sample(batch_size)
            sampled_tensordict = sampled_tensordict.to(device)
            loss_td = loss_module(sampled_tensordict)
            q_loss = loss_td["loss"]
            optimizer.zero_grad()
            q_loss.backward()
            optimizer.step()
            target_net_updater.step()
            q_losses[j].copy_(q_loss.detach())
        training_time = time.time() - training_start

        # Get and log q-values, loss, epsilon, sampling time and training time
        log_info.update(
            {
                "train/q_values": (data["action_value"] * data["action"]).sum().item()
                / frames_per_batch,
                "train/q_loss": q_losses.mean().item(),
                "train/epsilon": greedy_module.eps,
                "train/sampling_time": sampling_time,
                "train/training_time": training_time,
            }
        )

        # Get and log evaluation rewards and eval time
        with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
            prev_test_frame = ((i - 1) * frames_per_batch) // test_interval
            cur_test_frame = (i * frames_per_batch) // test_interval
            final = current_frames >= collector.total_frames
            if (i >= 1 and (prev_test_frame < cur_test_frame)) or final:
                model.eval()
                eval_start = time.time()
                test_rewards = eval_model(model, test_env, num_test_episodes)
                eval_time = time.time() - eval_start
                model.train()
                log_info.update(
                    {
                        "eval/reward": test_rewards,
                        "eval/eval_time": eval_time,
                    }
                )
                test_rewards_log.append(round(test_rewards.item(), 1))
                torchrl_logger.info(f"frames {collected_frames}: eval reward {test_rewards.item():.1f}")

        # update weights of the inference policy
        collector.update_policy_weights_()
        sampling_start = time.time()

    collector.shutdown()
    if not test_env.is_closed:
        test_env.close()
    end_time = time.time()
    execution_time = end_time - start_time
    torchrl_logger.info(f"Training took {execution_time:.2f} seconds to finish")

    first = sum(train_episode_lengths[:10]) / 10
    last = sum(train_episode_lengths[-10:]) / 10
    print("RESULT " + json.dumps({
        "collector": type(collector).__module__,
        "learned": last >= 60,
        "frames": collected_frames,
        "episodes": len(train_episode_lengths),
        "first10_mean_length": first,
        "last10_mean_length": last,
        "eval_rewards": test_rewards_log,
        "seconds": round(execution_time, 2),
    }))


if __name__ == "__main__":
    main(cfg)

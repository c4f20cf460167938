"""PPO on CartPole-v1 with an aiocollect collector: one readable file, no RL library.

The collector steps 8 envs in this process and calls the actor once per step for all of
them; each batch comes out as a ``[envs, T]`` TensorDict in TorchRL's layout, with the
log-probability and value the policy wrote. GAE and the clipped PPO loss are written out
below; after each optimisation phase the new weights go to the collector with
``update_policy_weights_()``, and every frame records the policy version that produced it
(``("collector", "policy_version")``: here each batch has exactly one).

    python examples/ppo_cartpole.py                  # until a mean return of 450: about 45 s on 2 cores
    python examples/ppo_cartpole.py --frames 4096    # a smoke run
    python examples/ppo_cartpole.py --save trained.pt2  # and keep the trained actor, for:
    aiocollect collect --env CartPole-v1 --policy trained.pt2 --workers 1 --frames 20000 --out eval

``--save PATH`` writes the trained actor (observation -> sampled action) as a ``torch.export``
program for a ``PATH`` ending in ``.pt2``, as TorchScript otherwise (deprecated by torch 2.13,
still read); ``aiocollect collect --policy PATH`` collects with it and prints an evaluation
(episode returns and lengths). The weights alone (``torch.save(Actor(model.actor).state_dict(),
PATH)``) load with ``--policy PATH --policy-factory ppo_cartpole:Actor``, run from ``examples/``.
"""

from __future__ import annotations

import argparse
import time
from collections import deque

import gymnasium as gym
import torch
import torch.nn as nn
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from aiocollect import Collector


class ActorCritic(nn.Module):
    """Samples an action and reports its log-probability and the state's value."""

    def __init__(self, obs_dim: int = 4, actions: int = 2, hidden: int = 64):
        super().__init__()
        self.actor = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                   nn.Linear(hidden, actions))
        self.critic = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                    nn.Linear(hidden, 1))

    def forward(self, obs: torch.Tensor):
        dist = torch.distributions.Categorical(logits=self.actor(obs))
        action = dist.sample()
        return action, dist.log_prob(action), self.critic(obs).squeeze(-1)

    def evaluate(self, obs: torch.Tensor, action: torch.Tensor):
        dist = torch.distributions.Categorical(logits=self.actor(obs))
        return dist.log_prob(action), dist.entropy(), self.critic(obs).squeeze(-1)


class Actor(nn.Module):
    """The trained policy on its own: observation -> action, sampled from the actor's logits
    (``Actor()`` builds the untrained network, into which a saved state dict loads)."""

    def __init__(self, logits: nn.Module | None = None):
        super().__init__()
        self.logits = logits if logits is not None else ActorCritic().actor

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        probs = self.logits(observation).softmax(-1)
        return torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1).reshape(probs.shape[:-1])


def save_actor(model: ActorCritic, path: str) -> None:
    """``model``'s actor as a ``torch.export`` program for a ``.pt2`` path, as TorchScript otherwise."""
    actor = Actor(model.actor).eval()
    if path.endswith(".pt2"):
        batch = torch.export.Dim("batch")  # any number of envs
        program = torch.export.export(actor, (torch.zeros(2, 4),), dynamic_shapes=({0: batch},))
        torch.export.save(program, path)
    else:
        torch.jit.script(actor).save(path)


def gae(batch: TensorDict, model: ActorCritic, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns for a ``[envs, T]`` batch (truncation bootstraps from the next value)."""
    reward = batch["next", "reward"][..., 0]
    terminated = batch["next", "terminated"][..., 0].float()
    done = batch["next", "done"][..., 0].float()
    value = batch["value"]
    with torch.no_grad():
        next_value = model.critic(batch["next", "observation"]).squeeze(-1)
    advantages = torch.zeros_like(reward)
    running = torch.zeros(reward.shape[0])
    for t in reversed(range(reward.shape[1])):
        delta = reward[:, t] + gamma * next_value[:, t] * (1 - terminated[:, t]) - value[:, t]
        running = delta + gamma * lam * (1 - done[:, t]) * running
        advantages[:, t] = running
    return advantages, advantages + value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=1_000_000, help="give up after this many frames")
    parser.add_argument("--target", type=float, default=450.0, help="stop at this mean return (last 20 episodes)")
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=256, help="steps per env per batch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", metavar="PATH", help="save the trained actor: a torch.export program for a .pt2 "
                                                       "PATH, TorchScript otherwise (for aiocollect collect --policy)")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    model = ActorCritic()
    policy = TensorDictModule(model, in_keys=["observation"], out_keys=["action", "log_prob", "value"])
    optim = torch.optim.Adam(model.parameters(), lr=2.5e-4, eps=1e-5)
    fpb = args.envs * args.steps
    collector = Collector([lambda: gym.make("CartPole-v1")] * args.envs, policy, frames_per_batch=fpb,
                          total_frames=-(-args.frames // fpb) * fpb)
    collector.set_seed(args.seed)

    returns, running = deque(maxlen=20), torch.zeros(args.envs)
    start, frames, mean = time.perf_counter(), 0, float("nan")
    for i, batch in enumerate(collector):
        frames += batch.numel()
        assert batch["collector", "policy_version"].unique().tolist() == [i]  # on-policy, one version
        reward, done = batch["next", "reward"][..., 0], batch["next", "done"][..., 0]
        for t in range(batch.shape[1]):  # episode returns, for the report
            running += reward[:, t]
            for env in done[:, t].nonzero().flatten().tolist():
                returns.append(float(running[env]))
                running[env] = 0
        mean = sum(returns) / len(returns) if returns else float("nan")
        print(f"batch {i:3d}  frames {frames:8,d}  mean return {mean:6.1f}  "
              f"{frames / (time.perf_counter() - start):7,.0f} frames/s (collection and training)", flush=True)
        if len(returns) == returns.maxlen and mean >= args.target:
            break

        advantages, targets = gae(batch, model, gamma=0.99, lam=0.95)
        flat = TensorDict({"obs": batch["observation"], "action": batch["action"], "log_prob": batch["log_prob"],
                           "adv": advantages, "target": targets}, batch_size=batch.shape).reshape(-1)
        for _ in range(4):  # epochs
            for idx in torch.randperm(flat.shape[0]).split(flat.shape[0] // 4):  # minibatches
                mb = flat[idx]
                log_prob, entropy, value = model.evaluate(mb["obs"], mb["action"])
                adv = (mb["adv"] - mb["adv"].mean()) / (mb["adv"].std() + 1e-8)
                ratio = (log_prob - mb["log_prob"]).exp()
                policy_loss = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean()
                loss = policy_loss + 0.5 * (value - mb["target"]).pow(2).mean() - 0.01 * entropy.mean()
                optim.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                optim.step()
        collector.update_policy_weights_()  # the new weights, for the next batch
    collector.shutdown()
    elapsed = time.perf_counter() - start
    print(f"done: mean return {mean:.1f} over the last {len(returns)} episodes after {frames:,} frames "
          f"in {elapsed:.1f} s")
    if args.save:
        save_actor(model, args.save)
        print(f"saved the actor to {args.save}: aiocollect collect --env CartPole-v1 --policy {args.save} "
              "--workers 1 --frames 20000 --out eval")


if __name__ == "__main__":
    main()

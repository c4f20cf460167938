"""Torch modules in a file that imports torch alone: a worker that unpickles one of them
(by reference to this module) imports nothing more, so a test can see what else it loads."""

from __future__ import annotations

import torch
from torch import nn


class ArgmaxMLP(nn.Module):
    """``argmax(linear(tanh(linear(observation))))``: a policy that reads the observation."""

    def __init__(self, n_obs: int, n_actions: int, hidden: int = 8, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(n_obs, hidden), nn.Tanh(), nn.Linear(hidden, n_actions))
        with torch.no_grad():
            for p in self.net.parameters():
                p.copy_(torch.randn(p.shape, generator=gen))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.net(observation).argmax(-1)


class PidPolicy(nn.Module):
    """Action 0 for every env, and the id of the process that ran the call (``"pid"`` with
    ``out_keys=["action", "pid"]``): which process acted for each frame."""

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        import os

        n = observation.shape[0]
        return torch.zeros(n, dtype=torch.int64), torch.full((n,), os.getpid(), dtype=torch.int64)


class LazyExplorer(nn.Module):
    """Samples its action under tensordict's ``RANDOM`` interaction type, takes the argmax
    otherwise, and imports tensordict in its ``forward`` (so a worker that unpickles it has
    not imported tensordict before its first call); ``sampled`` says which it did."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 3)
        with torch.no_grad():
            self.linear.weight.zero_()
            self.linear.bias.zero_()

    def forward(self, observation):
        from tensordict.nn.probabilistic import InteractionType, interaction_type

        logits = self.linear(observation)
        if interaction_type() == InteractionType.RANDOM:
            return torch.distributions.Categorical(logits=logits).sample(), torch.ones(len(logits))
        return logits.argmax(-1), torch.zeros(len(logits))


class NaNAfterOutOfBounds(nn.Module):
    """A continuous action of one column for ``EchoBoxEnv`` (bounds -4..4; obs[1]: the action it
    was last given, ``start`` at reset): 1.0 for an env that starts at 0; for one that starts at
    7, 5.0 (outside the bounds), then NaN once the env echoes the 5.0 it was given as it is."""

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        echo = observation[:, 1:2]
        return torch.where(echo == 7.0, 5.0, torch.where(echo == 5.0, float("nan"), 1.0))


class HangsAtStep(nn.Module):
    """Action 0 for every env (``CounterEnv``), but a call on an observation of step 2 of an
    episode or later never returns (the collector's calls on zeros, to probe it, do)."""

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        if (observation[:, 0] >= 2).any():
            import time

            time.sleep(3600)
        return torch.zeros(observation.shape[0], dtype=torch.int64)


class IntegerEcho(nn.Module):
    """For ``EchoBoxEnv`` (a ``Box`` action of shape ``(1,)``): an int64 action written
    without its last dim (``[n]``), one more than the step in the observation, and a tuple's
    second output, twice the step as a float (TorchRL's ``"output1"``)."""

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        step = observation[..., 0].round().long()
        return step + 1, (step * 2).float()

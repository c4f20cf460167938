"""An env whose observations say which episode they belong to: what the reset and checkpoint
cases of the contract suite read the batches with. (No torch here: worker processes import
this module to unpickle the env.)"""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class EpisodeEnv(gym.Env):
    """obs = [step within the episode, episode number (its resets so far), env tag].

    Episodes end (terminated) after ``length`` steps, and a step sleeps ``step_s``, so that
    a ``reset()`` or ``set_seed()`` asked for from another thread lands while steps are in
    flight. Two frames belong to one episode exactly when their ``obs[1]`` are equal, and a
    trajectory is whole when its steps count ``0, 1, 2...`` up to a terminated step.
    """

    metadata = {"render_modes": []}

    def __init__(self, length: int = 9, step_s: float = 0.0002, tag: int = 0):
        self.observation_space = spaces.Box(-1e9, 1e9, (3,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.length, self.step_s, self.tag = length, step_s, tag
        self.episode = -1
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        if self.step_s:
            time.sleep(self.step_s)
        self.t += 1
        return self._obs(), 1.0, self.t >= self.length, False, {}

    def _obs(self) -> np.ndarray:
        return np.array([self.t, self.episode, self.tag], np.float32)

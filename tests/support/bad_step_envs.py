"""Envs whose ``step`` returns values of the wrong type (worker processes unpickle them from here)."""

from __future__ import annotations

from support.envs import CounterEnv


class BadStepTypes(CounterEnv):
    """``CounterEnv`` whose ``step`` returns ``reward`` or ``terminated`` replaced by ``value``."""

    def __init__(self, field: str, value):
        super().__init__()
        self.field, self.value = field, value

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if self.field == "reward":
            reward = self.value
        else:
            terminated = self.value
        return obs, reward, terminated, truncated, info

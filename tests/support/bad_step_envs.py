"""Envs whose ``step`` returns values of the wrong type (worker processes unpickle them from here)."""

from __future__ import annotations

import numpy as np

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


class OldGymApi(CounterEnv):
    """``CounterEnv`` written for the old gym API: ``which="step"`` returns ``(obs, reward,
    done, info)``, ``which="reset"`` returns the observation alone."""

    def __init__(self, which: str):
        super().__init__()
        self.which = which

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        return obs if self.which == "reset" else (obs, info)

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if self.which == "step":
            return obs, reward, terminated or truncated, info
        return obs, reward, terminated, truncated, info


class LateArrayReward(CounterEnv):
    """``CounterEnv`` whose reward becomes a one-element array (``np.array([r])``) after
    its first ``after`` steps."""

    def __init__(self, after: int = 3):
        super().__init__()
        self.after = after

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if self.total_steps > self.after:
            reward = np.array([reward], np.float32)
        return obs, reward, terminated, truncated, info


class LateBadStepTypes(BadStepTypes):
    """``BadStepTypes`` whose ``field`` (``"reward"``, ``"terminated"`` or ``"truncated"``) turns
    into ``value`` only after its first ``after`` steps: past the first-step type check."""

    def __init__(self, field: str, value, after: int = 30):
        super().__init__(field, value)
        self.after = after

    def step(self, action):
        obs, reward, terminated, truncated, info = CounterEnv.step(self, action)
        if self.total_steps > self.after:
            if self.field == "reward":
                reward = self.value
            elif self.field == "terminated":
                terminated = self.value
            else:
                truncated = self.value
        return obs, reward, terminated, truncated, info

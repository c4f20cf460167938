"""Helpers for the worker tests: envs that live in worker processes, leak probes."""

from __future__ import annotations

import os
import sys
import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class SleepyEnv(gym.Env):
    """Box obs [env tag, step]; each step sleeps ``delay`` seconds."""

    def __init__(self, delay: float = 0.0, tag: float = 0.0, length: int = 50):
        self.observation_space = spaces.Box(-1e6, 1e6, (2,), np.float32)
        self.action_space = spaces.Box(-1, 1, (1,), np.float32)
        self.delay, self.tag, self.length = delay, tag, length

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([self.tag, 0], np.float32), {}

    def step(self, action):
        if self.delay:
            time.sleep(self.delay)
        self.t += 1
        return np.array([self.tag, self.t], np.float32), 1.0, False, self.t >= self.length, {}


class TorchProbeEnv(gym.Env):
    """Its observation says whether torch was imported in the process stepping it."""

    def __init__(self):
        self.observation_space = spaces.Box(0, 1, (1,), np.float32)
        self.action_space = spaces.Discrete(2)

    def _obs(self):
        return np.array([float("torch" in sys.modules)], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs(), {}

    def step(self, action):
        return self._obs(), 0.0, False, False, {}


def children() -> set[int]:
    """Pids of this process's live (non-zombie) env workers."""
    me, out = os.getpid(), set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] != "Z" and _is_worker(entry):
            out.add(int(entry))
    return out


def _is_worker(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"aiocollect._workers.child" in f.read()
    except OSError:
        return False


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm"))


def open_fds() -> set[str]:
    return {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")}


def wait_until(cond, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


class IntObsEnv(gym.Env):
    """Small integer observations (as float32) and an unbounded 1-d action: a linear
    policy's action is then exact in float32, so it shows which weights computed it."""

    def __init__(self, length: int = 30):
        self.observation_space = spaces.Box(-1e6, 1e6, (3,), np.float32)
        self.action_space = spaces.Box(-np.inf, np.inf, (1,), np.float32)
        self.length = length

    def _obs(self):
        return self.np_random.integers(0, 10, 3).astype(np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), float(action[0]), False, self.t >= self.length, {}

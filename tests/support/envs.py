"""Gymnasium envs for the tests, each built to make one property visible in the batches.

Envs that worker processes step live here, or in another module that does not import torch: a
worker unpickles a class (or a function) of a test module by importing that module, and the
test module imports torch and tensordict, 2 to 3 s of every worker's start."""

from __future__ import annotations

import os
import sys
import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class CounterEnv(gym.Env):
    """A deterministic env whose observations say where they come from.

    obs = [step within the episode, first value drawn at reset, last action]. Episodes
    end (terminated) after a length drawn at reset from the env's RNG, so seeding shows
    in the observations. ``closed`` records ``close()`` calls.
    """

    metadata = {"render_modes": []}

    def __init__(self, max_len: int = 12, fail_at: int | None = None):
        self.observation_space = spaces.Box(-1e6, 1e6, (3,), np.float32)
        self.action_space = spaces.Discrete(3)
        self.max_len = max_len
        self.fail_at = fail_at
        self.closed = False
        self.total_steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.start = float(self.np_random.integers(0, 1000))
        self.length = int(self.np_random.integers(2, self.max_len))
        return np.array([0, self.start, -1], np.float32), {}

    def step(self, action):
        assert self.action_space.contains(action), action
        self.total_steps += 1
        if self.fail_at is not None and self.total_steps >= self.fail_at:
            raise ValueError("CounterEnv exploded on purpose")
        self.t += 1
        obs = np.array([self.t, self.start, int(action)], np.float32)
        return obs, float(self.t), self.t >= self.length, False, {}

    def close(self):
        self.closed = True


class EnvRecorder:
    """An env factory that keeps every env it made (``recorder.envs``), to check closing."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.envs: list[CounterEnv] = []

    def __call__(self) -> CounterEnv:
        self.envs.append(CounterEnv(**self.kwargs))
        return self.envs[-1]


class DictEnv(gym.Env):
    """Dict observations of every supported leaf type; MultiDiscrete actions."""

    def __init__(self):
        self.observation_space = spaces.Dict(
            {
                "pos": spaces.Box(-1, 1, (2,), np.float64),
                "cell": spaces.Discrete(5),
                "flags": spaces.MultiBinary(3),
                "md": spaces.MultiDiscrete([2, 3]),
                "nest": spaces.Dict({"t": spaces.Box(0, 1000, (1,), np.float32)}),
            }
        )
        self.action_space = spaces.MultiDiscrete([3, 4])

    def _obs(self):
        o = self.observation_space.sample()
        o["nest"]["t"] = np.array([self.t], np.float32)
        return o

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        assert self.action_space.contains(np.asarray(action)), action
        self.t += 1
        return self._obs(), 0.5, False, self.t >= 7, {}


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


class StubbornEnv(SleepyEnv):
    """Its close() hangs in any process but ``main_pid``'s: in a worker, shutdown must escalate
    to SIGTERM/SIGKILL. (The collector also builds and closes one in the main process to learn
    the spaces; that one closes normally.)"""

    def __init__(self, main_pid: int):
        super().__init__()
        self.main_pid = main_pid

    def close(self):
        if os.getpid() != self.main_pid:
            time.sleep(60)


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


class TaggedIntObsEnv(IntObsEnv):
    """``IntObsEnv`` whose first observation entry is always ``tag``: says which collector a frame came from."""

    def __init__(self, tag: int, length: int = 30):
        super().__init__(length)
        self.tag = tag

    def _obs(self):
        obs = super()._obs()
        obs[0] = self.tag
        return obs


TAG = 10_000


class TaggedCounter(CounterEnv):
    """``CounterEnv`` whose episode starts carry ``tag * TAG``: a batch says which worker made it."""

    def __init__(self, tag: int, max_len: int = 9):
        super().__init__(max_len=max_len)
        self.tag = tag

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        self.start += self.tag * TAG
        obs[1] = self.start
        return obs, info


class StepEnv(gym.Env):
    """obs = [step in episode, tag, seed of the last reset (-1: none)];
    reward = 10 * action + step; terminated once ``step >= length``. ``interrupt_at``: the
    step that raises ``KeyboardInterrupt`` instead, once (as Ctrl-C would, mid-step)."""

    def __init__(self, length: int = 3, tag: float = 0.0, interrupt_at: int | None = None):
        self.observation_space = spaces.Box(-1e6, 1e6, (3,), np.float32)
        self.action_space = spaces.Discrete(4)
        self.length, self.tag, self.interrupt_at = length, tag, interrupt_at
        self.seed_seen = -1
        self.resets = 0
        self.closed = False

    def _obs(self):
        return np.array([self.t, self.tag, self.seed_seen], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.resets += 1
        self.seed_seen = -1 if seed is None else seed
        return self._obs(), {}

    def step(self, action):
        if self.interrupt_at is not None and self.t + 1 == self.interrupt_at:
            self.interrupt_at = None
            raise KeyboardInterrupt
        self.t += 1
        return self._obs(), float(10 * int(action) + self.t), self.t >= self.length, False, {}

    def close(self):
        self.closed = True


class SlowCounterEnv(CounterEnv):
    """``CounterEnv`` with long episodes and a step of 0.5 ms: a Ctrl-C lands mid-batch."""

    def __init__(self):
        super().__init__(max_len=400)

    def step(self, action):
        time.sleep(0.0005)
        return super().step(action)


class HangingStepEnv(CounterEnv):
    """A ``CounterEnv`` whose third step never returns. For worker processes only: the
    collector builds one in the main process to learn the spaces, and never steps it."""

    def step(self, action):
        if self.total_steps >= 2:
            time.sleep(3600)
        return super().step(action)


class BadObsEnv(CounterEnv):
    """``CounterEnv`` whose 3rd observation of each episode is ``bad``: ``"none"`` (``None``),
    ``"narrow"`` (one number where the space says three; numpy would broadcast it) or
    ``"list"`` (a list of float64s: converts exactly, so it is fine)."""

    def __init__(self, bad: str = "none"):
        super().__init__(max_len=100)
        self.bad = bad

    def step(self, action):
        obs, *rest = super().step(action)
        if self.bad == "list":
            return obs.astype(np.float64).tolist(), *rest
        if self.t != 3:
            return obs, *rest
        return (None if self.bad == "none" else obs[:1]), *rest


class UnprintableError(Exception):
    """An exception whose ``__str__`` raises."""

    def __str__(self):
        raise RuntimeError("__str__ fails")


class HostileEnv(CounterEnv):
    """``CounterEnv`` whose step ``fail_at`` raises something hard to report: ``how`` is
    ``"unprintable"`` (``UnprintableError``), ``"huge"`` (a ``ValueError`` of 50 MB),
    ``"exit"`` (``sys.exit(3)``) or ``"interrupt"`` (``KeyboardInterrupt``)."""

    def __init__(self, how: str, fail_at: int = 3):
        super().__init__(max_len=100)
        self.how, self.fail_at_step = how, fail_at

    def step(self, action):
        if self.total_steps + 1 >= self.fail_at_step:
            if self.how == "unprintable":
                raise UnprintableError
            if self.how == "huge":
                raise ValueError("x" * 50_000_000)
            if self.how == "exit":
                sys.exit(3)
            if self.how == "interrupt":
                raise KeyboardInterrupt
        return super().step(action)


class CloseRaisesEnv(CounterEnv):
    """``CounterEnv`` whose ``close()`` raises."""

    def close(self):
        raise RuntimeError("close failed on purpose")


class CloseRecordEnv(CounterEnv):
    """``CounterEnv`` that leaves a file in ``folder`` when it is built (``K.ID.built``) and
    another when its ``close()`` is reached (``K.ID.closed``; ``K``: the ``tag`` given,
    ``ID``: this instance's), in whatever process it lives; with ``fail``, its ``close()``
    then raises. Every env built must be closed, whatever the others' ``close()`` did."""

    def __init__(self, folder: str, tag: int, fail: bool = False):
        super().__init__()
        import uuid

        self.mark = os.path.join(folder, f"{tag}.{uuid.uuid4().hex}")
        self.fail = fail
        open(f"{self.mark}.built", "w").close()

    def close(self):
        open(f"{self.mark}.closed", "w").close()
        if self.fail:
            raise RuntimeError(f"close of env {os.path.basename(self.mark).split('.')[0]} failed on purpose")

    @staticmethod
    def unclosed(folder: str) -> list[str]:
        """The envs built in ``folder`` whose ``close()`` was never reached (``K.ID``)."""
        names = os.listdir(folder)
        return sorted(n[:-6] for n in names if n.endswith(".built") and n[:-6] + ".closed" not in names)


class SlowsDownEnv(CloseRecordEnv):
    """``CloseRecordEnv`` whose steps take ``delay`` seconds each once a file ``slow`` exists
    in ``folder`` (it leaves ``stepping`` there at its first slow step): an env that slows
    down after the engine sized its runs of steps from its fast pace."""

    def __init__(self, folder: str, tag: int, delay: float = 0.3):
        super().__init__(folder, tag)
        self.folder, self.delay = folder, delay

    def step(self, action):
        if os.path.exists(os.path.join(self.folder, "slow")):
            open(os.path.join(self.folder, "stepping"), "w").close()
            time.sleep(self.delay)
        return super().step(action)


class StrictCloseEnv(CounterEnv):
    """``CounterEnv`` whose ``step`` raises once it is closed (as many real envs do), each
    step sleeping ``step_s``: an env that must not be closed while it is being stepped."""

    def __init__(self, step_s: float = 0.001):
        super().__init__(max_len=50)
        self.step_s = step_s

    def step(self, action):
        if self.closed:
            raise RuntimeError("step() on a closed env")
        time.sleep(self.step_s)
        return super().step(action)

    def close(self):
        self.closed = True


class SlowStartEnv(CounterEnv):
    """``CounterEnv`` that sleeps ``delay`` seconds in its constructor, but only in a worker
    process (not in ``main_pid``, where the collector builds one to read the spaces): a
    worker that takes that long to start."""

    def __init__(self, main_pid: int, delay: float = 30.0):
        super().__init__()
        if os.getpid() != main_pid:
            time.sleep(delay)


class NoSpacesEnv(gym.Env):
    """A custom env that never sets its spaces."""

    closed = False

    def reset(self, *, seed=None, options=None):
        return np.zeros(3, np.float32), {}

    def step(self, action):
        return np.zeros(3, np.float32), 0.0, False, False, {}

    def close(self):
        NoSpacesEnv.closed = True


class EchoBoxEnv(gym.Env):
    """A continuous action, echoed: reward = the action the env was given, as a float32,
    and obs = [step in episode, that action] (``[0, start]`` at reset). Episodes of 5 steps."""

    def __init__(self, start: float = 0.0):
        self.observation_space = spaces.Box(-1e6, 1e6, (2,), np.float32)
        self.action_space = spaces.Box(-4.0, 4.0, (1,), np.float32)
        self.start = start

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0, self.start], np.float32), {}

    def step(self, action):
        assert isinstance(action, np.ndarray) and action.shape == (1,), action
        self.t += 1
        a = float(np.float32(action[0]))
        return np.array([self.t, a], np.float32), a, self.t >= 5, False, {}


class FastThenSlow(CounterEnv):
    """Quick steps (so that runs grow long), then 50 ms steps from the 220th on
    (``variants/test_random_runs.py``)."""

    def step(self, action):
        if self.total_steps >= 220:
            time.sleep(0.05)
        return super().step(action)


class TorchDrawEnv(gym.Env):
    """Observes one number drawn from torch's global generator as the env was built: envs in
    different processes that draw alike share their generator's state."""

    def __init__(self):
        import torch

        self.draw = float(torch.randint(0, 2**24, ()).item())
        self.observation_space = spaces.Box(-1e9, 1e9, (3,), np.float32)
        self.action_space = spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.array([self.draw, 0, 0], np.float32), {}

    def step(self, action):
        return np.array([self.draw, 0, 0], np.float32), 0.0, False, False, {}

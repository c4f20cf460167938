"""Shared test envs and the batch-invariant checker."""

from __future__ import annotations

import threading

import gymnasium as gym
import numpy as np
import pytest
import torch
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


def leaf_keys(td, prefix=()):
    return sorted(
        (k if isinstance(k, tuple) else (k,))
        for k in td.keys(include_nested=True, leaves_only=True)
    )


def obs_keys_of(td, policy_keys=("action",)):
    skip = {"done", "terminated", "truncated", "step_count", "collector", "next", *policy_keys}
    return [k for k in td.keys(include_nested=True, leaves_only=True)
            if (k if isinstance(k, str) else k[0]) not in skip]


def check_batch(td, *, reset_when_done=True, step_count=None, policy_keys=("action",)):
    """Assert TorchRL's layout and aiocollect's invariants on one batch ``[T]`` or ``[N, T]``."""
    assert td.names[-1] == "time"
    b = td if td.ndim == 2 else td.unsqueeze(0)
    n, T = b.shape
    done = b["next", "done"][..., 0]
    term = b["next", "terminated"][..., 0]
    trunc = b["next", "truncated"][..., 0]
    assert b["next", "done"].dtype == torch.bool and b["next", "done"].shape == (n, T, 1)
    assert b["next", "reward"].dtype == torch.float32 and b["next", "reward"].shape == (n, T, 1)
    assert torch.equal(done, term | trunc)
    for flag in ("done", "terminated", "truncated"):
        assert b[flag].shape == (n, T, 1)
        if reset_when_done:
            assert not b[flag].any(), f"root {flag} set although envs reset when done"
    ids = b["collector", "traj_ids"]
    assert ids.dtype == torch.int64 and ids.shape == (n, T)
    for key in policy_keys:
        assert key in b.keys(True)
    obs = obs_keys_of(b, policy_keys)
    assert obs, "no observation keys"
    valid = b.get(("collector", "mask"), torch.ones(n, T, dtype=torch.bool))
    versions = b["collector", "policy_version"]
    assert versions.dtype == torch.int64 and versions.shape == (n, T)
    assert (versions[valid] >= 0).all() and (versions[~valid] == -1).all()
    # a policy version never goes back in time within an env's row
    for i in range(n):
        row = versions[i][valid[i]]
        assert (row[1:] >= row[:-1]).all(), row
    for i in range(n):
        for t in range(T - 1):
            if not (valid[i, t] and valid[i, t + 1]):
                continue
            if not done[i, t]:
                assert ids[i, t] == ids[i, t + 1], (i, t)
                for k in obs:
                    nk = ("next", *(k if isinstance(k, tuple) else (k,)))
                    assert torch.equal(b[nk][i, t], b[k][i, t + 1]), (k, i, t)
                if step_count:
                    assert b["next", "step_count"][i, t] == b["step_count"][i, t + 1]
            elif reset_when_done:
                assert ids[i, t + 1] != ids[i, t], (i, t)
                assert not (ids[:, : t + 1] == ids[i, t + 1]).any(), "trajectory id reused"
                if step_count:
                    assert b["step_count"][i, t + 1] == 0
    # rows never share a trajectory
    rows = [set(ids[i][valid[i]].tolist()) for i in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            assert not rows[i] & rows[j], "two envs share a trajectory id"
    if step_count:
        sc, nsc = b["step_count"][..., 0], b["next", "step_count"][..., 0]
        assert torch.equal((nsc - sc)[valid], torch.ones_like(sc)[valid])
        assert (nsc[valid] <= step_count).all()
        assert torch.equal(trunc[valid] | term[valid], done[valid])
        hit = (nsc == step_count) & valid
        assert trunc[hit].all() or (term | trunc)[hit].all()


def check_continuity(prev, cur):
    """The first frame of ``cur`` continues the last one of ``prev`` unless it was done."""
    p = prev if prev.ndim == 2 else prev.unsqueeze(0)
    c = cur if cur.ndim == 2 else cur.unsqueeze(0)
    obs = obs_keys_of(c)
    for i in range(p.shape[0]):
        last_id, first_id = p["collector", "traj_ids"][i, -1], c["collector", "traj_ids"][i, 0]
        if p["next", "done"][i, -1, 0]:
            assert first_id != last_id
            assert first_id > p["collector", "traj_ids"].max() or first_id not in p["collector", "traj_ids"]
        else:
            assert first_id == last_id
            for k in obs:
                nk = ("next", *(k if isinstance(k, tuple) else (k,)))
                assert torch.equal(p[nk][i, -1], c[k][i, 0])


@pytest.fixture
def no_thread_leak():
    """Fails the test if an aiocollect loop thread outlives it."""
    yield
    for _ in range(100):
        alive = [t for t in threading.enumerate() if t.name.startswith("aiocollect")]
        if not alive:
            return
        threading.Event().wait(0.02)
    raise AssertionError(f"threads left behind: {alive}")


@pytest.fixture(params=["spin", "sleep"])
def spin_mode(request, monkeypatch):
    """Run a worker test both ways the engine and its workers wait for each other:
    spinning on shared memory, and sleeping on the socket (see aiocollect._workers.protocol)."""
    monkeypatch.setenv("AIOCOLLECT_SPIN", "1" if request.param == "spin" else "0")
    return request.param


def interrupt_script(script: str) -> tuple[str, str, int]:
    """Run ``script`` in a fresh interpreter; once it prints "collecting", wait 0.5 s and
    send SIGINT (Ctrl-C). Asserts it exits within 5 s; returns ``(stdout, stderr, returncode)``."""
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "collecting"
    time.sleep(0.5)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert time.monotonic() - t0 < 5, "Ctrl-C took too long"
    return out, err, proc.returncode

"""``RandomPolicy``: uniform actions from a gymnasium action space, batched.

It is a ``TensorDictModuleBase`` writing ``"action"``, so it drops in wherever a policy
does; collectors use it when ``policy=None`` and for the ``init_random_frames``. Actions
for all envs come from one numpy call per step (not one ``space.sample()`` per env), from
its own generator: ``RandomPolicy(space, seed=0)`` replays the same actions.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from tensordict import NestedKey, TensorDictBase
from tensordict.nn import TensorDictModuleBase

from .._envs.keyed import KeyedActions, action_check
from .._envs.spaces import encode_one_hot, one_hot_parts


class RandomPolicy(TensorDictModuleBase):
    """Samples uniformly from ``action_space`` for every env of a batch.

    A ``TensorDictModuleBase`` that writes ``"action"``, so it drops in wherever a policy
    does. Collectors use one when ``policy=None`` and for the first ``init_random_frames``
    frames; there the engine asks it for actions directly (one numpy call per step for all
    envs, drawn in blocks of about 4096 actions), without building a TensorDict. Its
    generator is its own: ``RandomPolicy(space, seed=0)`` replays the same actions, and a
    collector's ``set_seed(s)`` reseeds its random policy with ``s``.

    ``Discrete`` and ``MultiDiscrete`` actions are int64 (``start`` included), ``MultiBinary``
    int8, bounded float ``Box`` uniform in its bounds; unbounded or integer boxes use
    gymnasium's own sampler. The action space of a TorchRL env with a ``OneHot`` (or
    ``MultiOneHot``) action spec says so, and its actions are drawn as int64 one-hot rows
    (the parts side by side), the encoding TorchRL's ``RandomPolicy`` draws from that spec.

    Args:
        action_space: the gymnasium space of *one* env's action.
        seed: seed of the policy's own generator (``None``: fresh entropy).

    Examples:
        >>> import gymnasium as gym
        >>> from aiocollect import RandomPolicy
        >>> policy = RandomPolicy(gym.spaces.Discrete(3), seed=0)
        >>> policy.sample(4).shape
        (4,)
    """

    def __init__(self, action_space: spaces.Space, seed: int | None = None):
        super().__init__()
        self.action_space = action_space
        self.in_keys: list[NestedKey] = []
        self._keyed = action_space if isinstance(action_space, KeyedActions) else None
        """The env's action keys and their spaces, for an env with several (``_envs.keyed``)."""
        self.out_keys = list(self._keyed.keys) if self._keyed is not None else ["action"]
        self._shape = action_check(action_space).shape
        self._one_hot = one_hot_parts(action_space)
        """``(widths, starts)`` where the env's spec is one-hot (draws are encoded), else ``None``."""
        self.seed(seed)

    def seed(self, seed: int | None) -> None:
        """Restart the generator from ``seed``.

        Args:
            seed: the new seed (``None``: fresh entropy). The action space's own generator
                is reseeded too.
        """
        self.action_space.seed(seed)
        if self._keyed is not None:  # one policy per action key, each in its space's encoding
            self._parts = [RandomPolicy(part, None if seed is None else seed + i)
                           for i, part in enumerate(self._keyed.parts)]
        self._draws = _Draws(self.action_space, self._shape, np.random.default_rng(seed))
        self._entropy = np.random.SeedSequence(seed).entropy
        self._streams: dict[int, _Draws] = {}

    def sample(self, num_envs: int) -> np.ndarray:
        """A batch of random actions, one per env.

        Args:
            num_envs: how many actions.

        Returns:
            A numpy array ``[num_envs, *action_shape]`` (``[num_envs, sum(widths)]`` one-hot
            rows for a one-hot env).
        """
        return self.encode(self._draws.next(num_envs))

    def sample_outputs(self, num_envs: int, like: dict | None = None) -> dict:
        """A batch of random actions as a policy writes them: ``{"action": ...}``, or one
        entry per action key for an env with several.

        Args:
            num_envs: how many actions.
            like: a policy's outputs for as many envs: each action is drawn laid out as
                the policy's (``sample_like``), the other entries kept.

        Returns:
            A dict of numpy arrays (tensors where ``like``'s are).
        """
        if self._keyed is None:
            if like is None:
                return {"action": self.sample(num_envs)}
            return {**like, "action": self.sample_like(like["action"], num_envs)}
        out = dict(like or {})
        for key, part in zip(self._keyed.keys, self._parts):
            out[key] = part.sample(num_envs) if like is None else part.sample_like(like[key], num_envs)
        return out

    @property
    def one_hot(self) -> bool:
        """Whether the draws are one-hot rows (the env's TorchRL spec is one-hot): then the
        envs are given their indices, as for a policy's one-hot action."""
        return self._one_hot is not None

    def encode(self, drawn: np.ndarray) -> np.ndarray:
        """Actions as drawn (what the envs are given) in the encoding a batch stores: as they
        are, or one-hot rows where the env's TorchRL spec is one-hot.

        Args:
            drawn: actions ``[..., *action_shape]``, e.g. ``sample_steps``'s.

        Returns:
            ``drawn`` itself, or its int64 one-hot rows ``[..., sum(widths)]``.
        """
        return drawn if self._one_hot is None else encode_one_hot(drawn, *self._one_hot)

    def sample_steps(self, stream: int, steps: int, num_envs: int) -> np.ndarray:
        """``steps`` batches of actions in a row, from generator ``stream`` of this policy.

        For collectors whose workers take several steps per command (``policy=None``): each
        worker's envs draw from a stream of their own, derived from the seed, so the actions
        an env is given depend neither on how its steps are grouped nor on which worker
        happened to be ready first. ``seed`` restarts every stream.

        Args:
            stream: which stream (a collector uses its worker's first row).
            steps: how many steps.
            num_envs: actions per step.

        Returns:
            A numpy array ``[steps, num_envs, *action_shape]``: what the envs are given (indices
            for a one-hot env too; ``encode`` gives what the batch stores).
        """
        draws = self._streams.get(stream)
        if draws is None:
            rng = np.random.default_rng(np.random.SeedSequence(self._entropy, spawn_key=(stream,)))
            draws = self._streams[stream] = _Draws(self.action_space, self._shape, rng)
        return draws.steps(num_envs, steps)

    def sample_like(self, action: np.ndarray | torch.Tensor, num_envs: int) -> np.ndarray | torch.Tensor:
        """A batch of random actions laid out as ``action``, a policy's batched action.

        For ``init_random_frames``, whose batches must look like the policy's: the draw
        takes ``action``'s dtype (and type: a tensor for a tensor), and where ``action`` is
        one-hot rows (``[num_envs, n]`` for a ``Discrete`` space, ``[num_envs, sum(nvec)]``
        for a ``MultiDiscrete`` one), it is one-hot rows too.
        An ``action`` of neither layout is returned as it is, for the action check to name.

        Args:
            action: the policy's action for the same ``num_envs`` envs.
            num_envs: how many actions.

        Returns:
            A numpy array, or a CPU tensor if ``action`` is a tensor.
        """
        drawn = self._draws.next(num_envs)  # indices: encoded below as the policy's action is
        shape, space = tuple(action.shape), self.action_space
        if shape == (num_envs, *self._shape):
            if str(action.dtype) in ("bool", "torch.bool"):
                return drawn  # boolean indices: the action check stores them as int64
        elif isinstance(space, spaces.Discrete) and shape == (num_envs, int(space.n)):
            rows = np.zeros(shape, np.int64)
            rows[np.arange(num_envs), drawn - space.start] = 1
            drawn = rows
        elif (isinstance(space, spaces.MultiDiscrete) and space.nvec.ndim == 1
              and shape == (num_envs, int(space.nvec.sum()))):  # TorchRL's MultiOneHot: parts side by side
            rows = np.zeros(shape, np.int64)
            offsets = np.concatenate([[0], np.cumsum(space.nvec)[:-1]])
            rows[np.arange(num_envs)[:, None], offsets + drawn - space.start] = 1
            drawn = rows
        elif shape[:1] == (num_envs,) and math.prod(shape[1:]) == math.prod(self._shape):
            drawn = drawn.reshape(shape)  # the policy's per-env shape, as many values (``ActionCheck``)
        else:
            return action
        if isinstance(action, torch.Tensor):
            return torch.from_numpy(drawn).to(action.dtype)
        return drawn.astype(action.dtype, copy=False)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Write a random ``"action"`` for every element of ``tensordict``'s batch.

        Args:
            tensordict: any TensorDict; its batch size sets how many actions are drawn.

        Returns:
            ``tensordict``, with ``"action"`` of shape ``[*batch_size, *action_shape]`` (on
            its device, if it has one).
        """
        batch = tensordict.batch_size
        n = int(np.prod(batch)) if len(batch) else 1
        if self._keyed is not None:
            for key, drawn in self.sample_outputs(n).items():
                action = torch.from_numpy(drawn).reshape(*batch, *drawn.shape[1:])
                tensordict.set(key, action.to(tensordict.device) if tensordict.device else action)
            return tensordict
        drawn = self.sample(n)
        action = torch.from_numpy(drawn).reshape(*batch, *drawn.shape[1:])
        tensordict.set("action", action.to(tensordict.device) if tensordict.device else action)
        return tensordict

    def __repr__(self) -> str:
        return f"RandomPolicy({self.action_space})"


class _Draws:
    """Actions drawn in blocks of about 4096 (one numpy call each), handed out a batch at
    a time: a numpy call costs microseconds, about as much as a CartPole step.

    A plain object, not part of the module: setting an attribute on an ``nn.Module`` costs
    microseconds too, and this one's counter changes at every step.
    """

    def __init__(self, space: spaces.Space, shape: tuple[int, ...], rng: np.random.Generator):
        self.space, self.shape, self.rng = space, shape, rng
        self.pools: dict[int, list] = {}
        """Per batch size (a scheduler's rounds alternate between a few): [draws, next index]."""

    def next(self, num_envs: int) -> np.ndarray:
        return self.steps(num_envs, 1)[0]

    def steps(self, num_envs: int, steps: int) -> np.ndarray:
        """The next ``steps`` batches at once, ``[steps, num_envs, ...]``: the same actions
        however the steps are grouped (the blocks drawn are the same)."""
        parts = []
        while steps:
            entry = self.pools.get(num_envs)
            if entry is None or entry[1] == len(entry[0]):
                entry = self.pools[num_envs] = [self._draw(max(1, 4096 // max(num_envs, 1)), num_envs), 0]
            i = entry[1]
            j = entry[1] = min(len(entry[0]), i + steps)
            parts.append(entry[0][i:j])
            steps -= j - i
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _draw(self, blocks: int, num_envs: int) -> np.ndarray:
        space, rng, size = self.space, self.rng, (blocks, num_envs, *self.shape)
        if isinstance(space, spaces.Discrete):
            return rng.integers(space.start, space.start + space.n, size=size, dtype=np.int64)
        if isinstance(space, spaces.MultiDiscrete):
            return rng.integers(space.start, space.start + space.nvec, size=size, dtype=np.int64)
        if isinstance(space, spaces.MultiBinary):
            return rng.integers(0, 2, size=size, dtype=np.int8)
        if isinstance(space, spaces.Box) and space.is_bounded("both") and space.dtype.kind == "f":
            return rng.uniform(space.low, space.high, size=size).astype(space.dtype, copy=False)
        # unbounded or integer boxes: gymnasium's sampler knows their distributions
        flat = [space.sample() for _ in range(blocks * num_envs)]
        return np.stack(flat).reshape(size)


def _stacked(spec: Any) -> bool:
    """Whether a TorchRL spec holds a lazily stacked group (agents of different shapes)."""
    keys = getattr(spec, "keys", None)
    return keys is not None and any(type(spec[k]).__name__.startswith("Stacked") for k in keys(True))


def is_torchrl_random(policy: object) -> bool:
    """Whether ``policy`` is TorchRL's ``RandomPolicy`` (found by name: torchrl is not imported)."""
    cls = type(policy)
    return cls.__name__ == "RandomPolicy" and cls.__module__.startswith("torchrl.")


class SpecRandomPolicy(TensorDictModuleBase):
    """TorchRL's ``RandomPolicy(action_spec)`` made to act for a batch of envs.

    TorchRL's ``RandomPolicy`` writes ``action_spec.rand()``: one draw of the *env's* spec,
    whose shape is the env's batch shape (``[]`` for one ``GymEnv``, ``[4]`` for a
    ``SerialEnv(4)``) and then the action's. A collector here calls its policy once for all
    its envs, so this drops the spec's batch dims and draws ``[num_envs]`` actions in the
    spec's own encoding (one-hot rows for a ``OneHot`` spec, as TorchRL's envs expect).

    Args:
        spec: the TorchRL ``action_spec`` (a ``Composite`` is drawn whole, as TorchRL does).
        action_key: where a leaf spec's draw goes.
        event_ndim: how many trailing dims of a leaf ``spec`` are one action's.
    """

    def __init__(self, spec, action_key, event_ndim: int):
        super().__init__()
        composite = hasattr(spec, "keys")
        for _ in range(len(spec.shape) - (0 if composite else event_ndim)):
            spec = spec[0]
        self.spec, self.composite, self.action_key = spec, composite, action_key
        self.in_keys: list[NestedKey] = []
        self.out_keys = list(spec.keys(True, True)) if composite else [action_key]

    @classmethod
    def wrap(cls, policy, action_space: spaces.Space) -> TensorDictModuleBase:
        """The collector's stand-in for TorchRL's ``policy``: drawn from its spec, or, for a
        ``RandomPolicy()`` without one, from ``action_space`` (TorchRL fills the spec from
        the env; here the env's space is the same thing)."""
        spec = policy.action_spec
        if spec is None or _stacked(spec):  # (heterogeneous agents: each agent's own space, _envs.agents)
            return RandomPolicy(action_space)
        one_hot = "OneHot" in type(spec).__name__
        return cls(spec, policy.action_key, 1 if one_hot else len(action_space.shape or ()))

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        draw = self.spec.rand(tensordict.batch_size)
        if self.composite:
            return tensordict.update(draw)
        return tensordict.set(self.action_key, draw)

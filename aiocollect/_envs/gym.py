"""``GymEnv``: the thin gymnasium adapter.

``GymEnv("CartPole-v1", device="cpu", render_mode=None)`` is ``gymnasium.make`` with one
extra piece of information, the device the env's tensors should live on. It *is* a
gymnasium env (a ``gymnasium.Wrapper``), so it can be used, wrapped and stepped like any
other; the collectors step the env inside it directly, so the adapter costs nothing per
step. Any plain gymnasium env works just as well wherever a ``GymEnv`` does.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym


class GymEnv(gym.Wrapper):
    """A gymnasium env made from an id (or wrapped from an instance), with a device.

    ``GymEnv("CartPole-v1")`` is ``gymnasium.make("CartPole-v1")`` plus one piece of
    information, the device the env's data should go to: the drop-in for TorchRL's
    ``GymEnv`` in code that moves to aiocollect. It *is* a gymnasium env (a
    ``gymnasium.Wrapper``), so it can be used, wrapped and stepped like any other; the
    collectors step the env inside it directly, so it costs nothing per step. Any plain
    gymnasium env works just as well wherever a ``GymEnv`` does.

    Args:
        env: a registered gymnasium env id such as ``"Pendulum-v1"``, or an env instance.
        device: where this env's observations go once collected (``"cpu"`` by default).
            A [`Collector`][aiocollect.Collector]'s ``env_device`` defaults to it.
        **kwargs: passed to ``gymnasium.make`` (``render_mode``, ``max_episode_steps``,
            env-specific options); only with an env id.

    Raises:
        TypeError: ``env`` is neither an id nor a gymnasium env, or keyword arguments come
            with an env instance.

    Examples:
        >>> from aiocollect import Collector, GymEnv
        >>> collector = Collector(lambda: GymEnv("Pendulum-v1", device="cpu"), policy,
        ...                       frames_per_batch=200)
    """

    def __init__(self, env: str | gym.Env, device: Any = "cpu", **kwargs: Any):
        if isinstance(env, str):
            env = gym.make(env, **kwargs)
        elif kwargs:
            raise TypeError(
                f"GymEnv: keyword arguments {sorted(kwargs)} only apply when the env is given "
                "as an id string; configure the env instance yourself."
            )
        if not isinstance(env, gym.Env):
            raise TypeError(
                f"GymEnv: env must be a gymnasium env id or a gymnasium.Env, got {type(env).__name__}"
            )
        super().__init__(env)
        # kept as a string: a GymEnv built in an env worker must not need torch
        self._device = "cpu" if device is None else str(device)

    @property
    def device(self):
        """The ``torch.device`` this env's data goes to (torch is imported on first access).

        The device is kept as a string, so a ``GymEnv`` built in an env worker process
        never imports torch.
        """
        import torch

        return torch.device(self._device)

    def __repr__(self) -> str:
        return f"GymEnv({self.env}, device={self._device})"

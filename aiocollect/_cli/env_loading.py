"""``--env`` and ``--env-kwargs``: the gymnasium env the command collects from, checked here.

``--env CartPole-v1`` is a registered gymnasium id; ``--env module:EnvId`` imports ``module``
first (it registers its envs on import; see ``user_code``). The env is built once in this
process (``check_env``), so that an id that is not registered, keyword arguments it does not
take, or a dependency missing here, each end the command in one line before any worker starts.
Workers build their envs with ``env_factory``, cloudpickled to them.
"""

from __future__ import annotations

import argparse

from .errors import UsageError, one_line
from .user_code import import_module


def env_kwargs(args: argparse.Namespace) -> dict:
    """``--env-kwargs``, a JSON object, as a dict (``{}`` without it)."""
    if args.env_kwargs is None:
        return {}
    import json

    try:
        kwargs = json.loads(args.env_kwargs)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--env-kwargs {args.env_kwargs!r}: not JSON ({exc}); give an object, e.g. "
                         """--env-kwargs '{"max_episode_steps": 200}' (keys and strings in double quotes)""") from None
    if not isinstance(kwargs, dict):
        raise UsageError(f"--env-kwargs {args.env_kwargs!r}: is a JSON {type(kwargs).__name__}, and it must be an "
                         """object of keyword arguments of gymnasium.make, e.g. '{"max_episode_steps": 200}'""")
    return kwargs


def env_factory(args: argparse.Namespace):
    """What builds one env: ``gymnasium.make(--env, **--env-kwargs)`` (cloudpickled to the workers)."""
    import functools

    import gymnasium as gym

    return functools.partial(gym.make, args.env, **env_kwargs(args))


def check_env(args: argparse.Namespace) -> None:
    """``--env`` names an env that builds here, with ``--env-kwargs``: its module imported (for
    ``module:EnvId``), its id registered, and one env built and closed."""
    import gymnasium as gym

    kwargs = env_kwargs(args)
    module, _, env_id = args.env.rpartition(":")  # "package.module:Env-v0" registers its envs on import
    if module:
        _import_env_module(args, module)
    try:
        gym.spec(env_id)
    except gym.error.Error as exc:
        raise UsageError(f"--env {args.env!r}: not a registered gymnasium env ({exc}); e.g. CartPole-v1") from None
    try:
        gym.make(args.env, **kwargs).close()
    except Exception as exc:  # noqa: BLE001 - a registered env that cannot be built here (a missing dependency...)
        if kwargs:
            raise UsageError(f"--env {args.env!r} with --env-kwargs {args.env_kwargs}: cannot be built here: "
                             f"{one_line(exc)}; check the keyword names and values the env takes") from None
        raise UsageError(f"--env {args.env!r} cannot be built here: {one_line(exc)}") from None


def _import_env_module(args: argparse.Namespace, module: str) -> None:
    """The ``module`` of ``--env module:EnvId``, imported: its envs registered."""
    import_module(module, f"--env {args.env!r}")

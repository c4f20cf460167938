"""Building an env group out of what the user gave as ``create_env_fn``.

``make_group`` takes any of the forms a collector accepts (a gymnasium env, its id, its
factory, a list of factories, a ``VectorEnv``, a TorchRL env or its factory, coroutine envs)
and returns the group that steps them: an ``InProcessGroup`` or a ``VectorEnvGroup``
(``_envs.group``), or a ``CoroutineGroup`` (``_envs.coroutine_group``) when an env is a
coroutine env. ``check_create_env_fn`` refuses a form that cannot work before anything is
built; every env built is checked (spaces set, the gymnasium API) with errors that name the
factory (``create_env_fn[2]``).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from gymnasium.vector import VectorEnv

from .async_env import is_async_env
from .coroutine_group import CoroutineGroup, as_coroutine_env
from .group import EnvCloseError, InProcessGroup, VectorEnvGroup, _GroupBase, check_same_spaces, close_each
from .gym import GymEnv


def _describe(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


# TorchRL envs (any ``EnvBase``) are taken too, wrapped by ``torchrl_env.from_torchrl`` into a
# gymnasium env (``batch_size == []``) or ``VectorEnv`` (``[n]``). TorchRL is never imported to
# find out: only an object whose class comes from TorchRL sends us to ``torchrl_env``.

_TORCHRL_HINT = ("Pass a TorchRL env (an EnvBase), its class, a callable or EnvCreator returning one, or a "
                 "gymnasium env, its id or its factory.")


def _from_torchrl(obj: Any) -> bool:
    """Whether ``obj``'s class, or a class it derives from, is TorchRL's (imports nothing)."""
    return any((getattr(cls, "__module__", None) or "").startswith("torchrl") for cls in type(obj).__mro__)


def is_torchrl_env(obj: Any) -> bool:
    """Whether ``obj`` is a TorchRL env (``torchrl.envs.EnvBase``), without importing TorchRL
    for anything else."""
    if not _from_torchrl(obj):
        return False
    from .torchrl_env import is_torchrl_env as is_env

    return is_env(obj)


def check_not_torchrl(obj: Any, where: str) -> None:
    """A TorchRL object that is neither an env nor an ``EnvCreator`` where an env or a factory
    belongs (a transform, a spec, a policy module...): say what to pass.

    TorchRL objects are often callable, so without this check one would be taken for a
    factory and fail deep inside TorchRL."""
    if not _from_torchrl(obj):
        return
    from .torchrl_env import is_env_class, is_env_creator
    from .torchrl_env import is_torchrl_env as is_env

    if not (is_env(obj) or is_env_creator(obj) or is_env_class(obj)):
        raise TypeError(f"{where} is a TorchRL object ({_describe(obj)}) but not an env. {_TORCHRL_HINT}")


def _is_instance(obj: Any) -> bool:
    """An env already built: a gymnasium env, a ``VectorEnv`` or a TorchRL env."""
    return isinstance(obj, (gym.Env, VectorEnv)) or is_torchrl_env(obj)


def check_not_instance_for_worker(obj: Any, where: str) -> None:
    """The one rule for env instances: a collector that steps its envs in this process
    (``Collector``) takes one; an entry built in a worker process cannot be one (an env is
    not sent to another process). The worker collectors' message (``_workers.plan``), for
    an argument that is not a list (``AsyncCollector``'s ``create_env_fn``)."""
    if _is_instance(obj) and not is_torchrl_env(obj):  # (a TorchRL env: each worker steps a copy, as in TorchRL)
        raise TypeError(
            f"{where} is an env instance ({_describe(obj)}); a worker builds its own envs: pass a "
            "factory instead, e.g. `lambda: gym.make(...)` or `lambda: GymEnv(...)` for a TorchRL "
            "env, or the env id string."
        )


def _check_env(env: Any, where: str) -> gym.Env | VectorEnv:
    if is_async_env(env):
        return env
    if isinstance(env, (gym.Env, VectorEnv)):
        _check_spaces(env, where)
        return env
    if is_torchrl_env(env):
        from .torchrl_env import from_torchrl

        return from_torchrl(env, where)
    raise TypeError(f"{where} gave {_describe(env)}, not a gymnasium env, a TorchRL env or a "
                    f"coroutine env (aiocollect.AsyncEnv). {_factory_fix(env)}")


def _factory_fix(got: Any) -> str:
    """How to fix a factory that returned ``got``, not an env."""
    if got is None:
        return "The factory must return the env it builds: does it end with `return env`?"
    if isinstance(got, str):
        return (f"To make the env of an id, pass the id itself (create_env_fn={got!r}), or a factory that "
                f"returns gymnasium.make({got!r}).")
    if callable(got):
        name = getattr(got, "__qualname__", None)
        return (f"It returned a callable{f' ({name})' if isinstance(name, str) else ''}, a factory of a "
                "factory? Pass the factory that builds the env (`make_env`, not `lambda: make_env`), or "
                "have yours return the env (`lambda: make_env()`).")
    return "The factory must return the env it builds."


def _check_spaces(env: gym.Env | VectorEnv, where: str) -> None:
    """Raise unless ``env`` has the spaces aiocollect reads (a custom env that never set
    them would otherwise fail later with a bare ``AttributeError``); the env is closed first.
    A ``VectorEnv``'s are its ``single_*`` spaces, one env's."""
    prefix = "single_" if isinstance(env, VectorEnv) else ""
    for name in (f"{prefix}observation_space", f"{prefix}action_space"):
        try:
            space = getattr(env, name)
        except AttributeError as exc:
            if exc.name != name:  # another attribute, missing inside a property: that error
                raise
            space = None
        if not isinstance(space, gym.spaces.Space):
            try:
                env.close()
            except Exception:  # noqa: BLE001 - the missing space is the error to report
                pass
            what = "has no" if space is None else f"has a {type(space).__name__} as its"
            sets = (f"VectorEnv sets self.{prefix}observation_space and self.{prefix}action_space" if prefix
                    else "env sets self.observation_space and self.action_space")
            raise TypeError(
                f"{where} gave {_describe(env)}, which {what} {name}; a gymnasium {sets} to "
                "gymnasium.spaces objects (in __init__, or as class attributes)."
            )


def _env_device(env: Any) -> str | None:
    # the name, not GymEnv.device: that imports torch, which a worker process never needs
    return env._device if isinstance(env, GymEnv) else None


def _inner(env: gym.Env) -> gym.Env:
    # GymEnv only carries a device: step the env it wraps and save a call per step.
    return env.env if type(env) is GymEnv else env


def check_create_env_fn(create_env_fn: Any, create_env_kwargs: dict | None) -> None:
    """Validate ``create_env_fn`` without creating anything."""
    check_not_torchrl(create_env_fn, "create_env_fn")
    if isinstance(create_env_fn, (str, gym.Env, VectorEnv)) or callable(create_env_fn):
        if create_env_kwargs and _is_instance(create_env_fn):
            raise ValueError(
                "create_env_kwargs: given with an env instance, which is already built; pass a "
                "factory (callable) or an env id to use create_env_kwargs."
            )
        return
    if isinstance(create_env_fn, (list, tuple)):
        if not create_env_fn:
            raise ValueError("create_env_fn: the list of env factories is empty; give at least one.")
        for i, item in enumerate(create_env_fn):
            check_not_torchrl(item, f"create_env_fn[{i}]")
            if not (callable(item) or isinstance(item, (str, gym.Env))):
                raise TypeError(
                    f"create_env_fn[{i}]: expected a callable returning a gymnasium env (or an "
                    f"env id or instance), got {_describe(item)}."
                )
        return
    raise TypeError(
        "create_env_fn: expected a callable returning a gymnasium or TorchRL env, a gymnasium env, "
        f"a VectorEnv, a TorchRL env, an env id string, or a list of callables; got {_describe(create_env_fn)}."
    )


def _build_one(item: Any, kwargs: dict, where: str) -> gym.Env | VectorEnv:
    if isinstance(item, str):
        return gym.make(item, **kwargs)
    if isinstance(item, (gym.Env, VectorEnv)) or is_torchrl_env(item):
        return _check_env(item, where)
    return _check_env(item(**kwargs), where)


def make_group(create_env_fn: Any, create_env_kwargs: dict | None,
               where: str = "create_env_fn") -> tuple[_GroupBase, bool]:
    """Build the in-process group for ``create_env_fn``.

    Returns the group and whether it is *batched* (batches get an env dimension before
    ``time``): true for a list of factories and for a ``VectorEnv``, false for one env.
    ``where`` names ``create_env_fn`` in errors (``create_env_fn[2]`` for a worker's entry).
    """
    kwargs = dict(create_env_kwargs or {})
    if isinstance(create_env_fn, (list, tuple)):
        envs: list[Any] = []
        try:
            for i, item in enumerate(create_env_fn):
                env = _build_one(item, kwargs, f"{where}[{i}]")
                _check_distinct(env, envs, item, where, i)
                if isinstance(env, VectorEnv):
                    env.close()  # a batched TorchRL env may hold processes (ParallelEnv)
                    raise TypeError(
                        f"{where}[{i}] gave a VectorEnv (or a batched TorchRL env); in a list, each "
                        "entry makes one env (pass the VectorEnv, or its factory, on its own)."
                    )
                envs.append(env)
            check_same_spaces(envs, where)  # (here, so that the envs are closed if it raises)
        except BaseException as exc:
            # a coroutine env holds nothing before its reset
            failures = [f for i, e in enumerate(envs) if not is_async_env(e) for f in close_each([e], i)]
            if failures and hasattr(exc, "add_note"):
                exc.add_note(f"(then, closing the envs built before it: {EnvCloseError(failures, len(envs))})")
            raise
        devices = {_env_device(e) for e in envs} - {None}
        if any(is_async_env(e) for e in envs):
            return _coroutine_group(envs, where), True
        return InProcessGroup([_inner(e) for e in envs], next(iter(devices), None)), True
    env = _build_one(create_env_fn, kwargs, where)
    if isinstance(env, VectorEnv):
        return VectorEnvGroup(env), True
    if is_async_env(env):
        return _coroutine_group([env], where), False
    return InProcessGroup([_inner(env)], _env_device(env)), False


def _check_distinct(env: Any, envs: list, item: Any, where: str, i: int) -> None:
    """``env``, built for ``where[i]``, is not one of the ``envs`` built before it: one env
    object stepped as two would interleave their episodes (and raise, or not, much later)."""
    for j, other in enumerate(envs):
        if env is other:
            fix = ("pass a factory per env, e.g. `[lambda: gym.make(...)] * n`, not `[env] * n`"
                   if _is_instance(item) else
                   "a factory must build a new env at each call (`lambda: gym.make(...)`, not `lambda: env`)")
            raise ValueError(
                f"{where}[{i}] gave the same env object as {where}[{j}] ({_describe(env)}); each entry of "
                f"the list is an env of its own: {fix}."
            )


def _coroutine_group(envs: list, where: str) -> _GroupBase:
    """Coroutine envs, with the gymnasium envs of the same list adapted to them."""
    return CoroutineGroup([as_coroutine_env(e, f"{where}[{i}]") for i, e in enumerate(envs)])

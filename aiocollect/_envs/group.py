"""Env groups: sets of envs the engine steps together.

A group owns ``num_envs`` envs and a set of numpy arrays, one row per env, that always
hold the latest results: ``obs`` (per observation key), ``reward``, ``terminated`` and
``truncated``. ``await group.step(actions)`` steps every env and fills the arrays (for an
env that just finished, ``obs`` holds its *final* observation); ``await group.reset(idx)``
resets the envs whose indices are in ``idx`` and overwrites their ``obs`` rows with the first
observation of the new episode. Gymnasium's autoreset is never used to produce a
transition: the engine resets finished envs explicitly, so no batch ever contains a fake
"reset step".

Two groups live in this process:

* ``InProcessGroup``, a list of gymnasium envs stepped in a tight loop;
* ``VectorEnvGroup``, a gymnasium ``VectorEnv`` in any autoreset mode.

(A third, ``CoroutineGroup``, holds coroutine envs, each stepped on its own; ``_envs.build``
makes the right group out of what the user gave as ``create_env_fn``.)

The same two classes run inside env worker processes, where their result arrays are
views of shared memory (``_GroupBase.bind()``) and they are driven synchronously
(``step_now`` / ``reset_now``). An exception raised by env ``i`` of a list carries
``env_index = i`` and a note saying so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorEnv

from .._errors import add_note
from .keyed import action_check
from .spaces import Leaf, NestedKey, ObsWriter, flatten_space


def _empty_arrays(leaves: list[Leaf], num_envs: int) -> dict[NestedKey, np.ndarray]:
    return {leaf.key: np.zeros((num_envs, *leaf.shape), dtype=leaf.dtype) for leaf in leaves}


class _GroupBase:
    """What every group shares: the spaces, the result arrays and the action check."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, num_envs: int, device):
        self.num_envs = num_envs
        self.observation_space = observation_space
        self.action_space = action_space
        self.device = device
        self.obs_leaves = flatten_space(observation_space, "observation", "observation_space")
        self.check_action = action_check(action_space)
        self.obs = _empty_arrays(self.obs_leaves, num_envs)
        self.reward = np.zeros(num_envs, dtype=np.float32)
        self.terminated = np.zeros(num_envs, dtype=bool)
        self.truncated = np.zeros(num_envs, dtype=bool)
        self._writer = ObsWriter(self.obs_leaves, self.obs)

    def bind(self, obs: dict[NestedKey, np.ndarray], reward: np.ndarray, terminated: np.ndarray,
             truncated: np.ndarray, writer: ObsWriter | None = None) -> None:
        """Write results into these arrays (the rollout storage) from now on; ``writer``:
        an ``ObsWriter`` over ``obs`` made earlier (callers that rebind every step keep one)."""
        self.obs, self.reward, self.terminated, self.truncated = obs, reward, terminated, truncated
        self._writer = writer if writer is not None else ObsWriter(self.obs_leaves, obs)

    def step_now(self, action: np.ndarray) -> None:
        """Step every env with its row of ``action``, writing the results into the arrays."""
        raise NotImplementedError(f"{type(self).__name__} steps its envs one at a time")

    def reset_now(self, idx: np.ndarray, seeds: Sequence[int | None] | None = None) -> None:
        """Reset the envs ``idx`` (with ``seeds``, one per env of the group), writing their observations."""
        raise NotImplementedError(f"{type(self).__name__} resets its envs one at a time")

    def close(self, catch: type[BaseException] = Exception) -> None:
        """Close every env of the group, whatever the others' ``close()`` raised (of the
        ``catch`` kind: ``EnvCloseError`` names them all at the end)."""
        raise NotImplementedError

    async def step(self, action: np.ndarray) -> None:
        self.step_now(action)

    async def reset(self, idx: np.ndarray, seeds: Sequence[int | None] | None = None) -> None:
        self.reset_now(idx, seeds)


def check_same_spaces(envs: Sequence[Any], where: str = "create_env_fn") -> None:
    """Raise unless every env has env 0's observation and action spaces (``where``: the
    list they came from, as errors name it: ``create_env_fn[2]`` for a worker's entry)."""
    first = envs[0]
    for i, env in enumerate(envs[1:], start=1):
        if env.observation_space != first.observation_space or env.action_space != first.action_space:
            raise ValueError(
                f"{where}: env {i} has spaces {env.observation_space} / {env.action_space}, "
                f"env 0 has {first.observation_space} / {first.action_space}; all envs of a "
                "collector must share their observation and action spaces."
            )


def check_step_types(reward: Any, terminated: Any, truncated: Any) -> None:
    """Raise ``TypeError`` unless ``reward`` is a number and the flags are booleans (or 0/1):
    what numpy would otherwise store without a word (``None`` as NaN, any string as True)."""
    if isinstance(reward, np.ndarray) and reward.size == 1:
        reward = reward.item()
    if not isinstance(reward, (int, float, np.integer, np.floating)):
        raise TypeError(f"step() returned reward={reward!r} ({type(reward).__name__}); a gymnasium env returns "
                        "a number (a float).")
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        if isinstance(flag, np.ndarray) and flag.size == 1:
            flag = flag.item()
        if not (isinstance(flag, (bool, np.bool_)) or (isinstance(flag, (int, np.integer)) and flag in (0, 1))):
            raise TypeError(f"step() returned {name}={flag!r} ({type(flag).__name__}); a gymnasium env returns "
                            "True or False.")


def step_result(out: Any) -> Sequence[Any]:
    """``env.step()``'s return value, if it is gymnasium's five parts; else an error that
    says so (the old gym API returned four: ``obs, reward, done, info``)."""
    if isinstance(out, (tuple, list)) and len(out) == 5:
        return out
    raise TypeError(
        f"step() returned {_what(out)}; a gymnasium env returns 5 values: (obs, reward, terminated, "
        "truncated, info). An env written for the old gym API (obs, reward, done, info) can be wrapped "
        "with shimmy's GymV21CompatibilityV0, or return done as terminated and False as truncated."
    )


def reset_result(out: Any) -> Sequence[Any]:
    """``env.reset()``'s return value, if it is gymnasium's ``(obs, info)``; else an error
    that says so (the old gym API returned the observation alone)."""
    if isinstance(out, (tuple, list)) and len(out) == 2:
        return out
    raise TypeError(
        f"reset() returned {_what(out)}; a gymnasium env returns 2 values: (obs, info). An env "
        "written for the old gym API (reset() returning the observation) can return (obs, {}) instead."
    )


def _what(out: Any) -> str:
    if isinstance(out, (tuple, list)):
        return f"a {type(out).__name__} of {len(out)} value(s)"
    return f"{type(out).__name__} (not a tuple)"


def scalar(value: Any) -> Any:
    """A reward or flag that ``check_step_types`` let through as a one-element array, as a
    Python scalar (numpy will not store an array of shape ``(1,)`` into one element)."""
    return value.item() if isinstance(value, np.ndarray) else value


_LATE_TYPES = ("(storing what step() returned failed: the types of an env's return values are checked at its "
               "first step only, and this env returned something else later, such as a reward that became an "
               "array or a flag that is not a boolean; return (obs, float, bool, bool, dict) at every step)")


def _blame(exc: BaseException, i: int | None) -> None:
    """Record on ``exc`` that env ``i`` of the group raised it (``None``: one of a ``VectorEnv``'s).

    The collectors turn an exception so marked into an [`EnvError`][aiocollect.EnvError].
    """
    if not hasattr(exc, "env_index"):
        try:
            exc.env_index = i  # type: ignore[attr-defined]  # (the mark the collectors read, on any exception)
        except AttributeError:  # exceptions with __slots__
            return
        if i is not None:
            add_note(exc, f"(raised by env {i} of the group)")


# --------------------------------------------------------------------------- closing


def close_each(envs: Sequence[Any], first: int = 0,
               catch: type[BaseException] = Exception) -> list[tuple[int, str, BaseException]]:
    """Call every env's ``close()``, whatever the others' did; ``(first + i, class name,
    exception)`` of each env ``i`` whose ``close()`` raised what ``catch`` names (a worker
    process, which ignores Ctrl-C, catches ``BaseException``, as for its envs' steps)."""
    failures = []
    for i, env in enumerate(envs):
        try:
            env.close()
        except catch as exc:  # the others still close
            failures.append((first + i, type(env).__qualname__, exc))
    return failures


class EnvCloseError(RuntimeError):
    """``close()`` raised in some envs of a group; every other env was still closed.

    The message names each env that failed, with its exception and traceback; ``failures``
    holds ``(env index, env class name, exception)`` of each. It never reaches the user as
    an exception: ``shutdown()`` logs it (to the ``aiocollect`` logger, at ``ERROR``; a worker process
    sends its own to the main process, which logs it), and a worker collector warns with
    it (``RuntimeWarning``) for the envs it builds in this process to read the spaces.
    """

    def __init__(self, failures: list[tuple[int, str, BaseException]], total: int):
        from .._errors import exception_text, exception_traceback, truncated

        self.failures = failures
        which = "; ".join(f"env {i} ({name}) raised {type(exc).__name__}: {exception_text(exc)}"
                          for i, name, exc in failures)
        traces = "".join(f"\n\nTraceback of env {i}'s close():\n{exception_traceback(exc).rstrip()}"
                         for i, _, exc in failures)
        others = "the others were closed" if len(failures) < total else "close() was called on each"
        super().__init__(truncated(
            f"close() raised in {len(failures)} of {total} env(s) ({others}): {which}. What they hold may "
            f"not have been released: fix their close().{traces}"))


class InProcessGroup(_GroupBase):
    """Gymnasium envs in this process, stepped one after the other in a tight loop.

    Stepping the envs directly (rather than through ``SyncVectorEnv``) skips the vector
    env's batching and autoreset bookkeeping: the rows of the result arrays are written
    straight from each env's return values.
    """

    def __init__(self, envs: Sequence[gym.Env], device=None, first: int = 0):
        check_same_spaces(envs)
        super().__init__(envs[0].observation_space, envs[0].action_space, len(envs), device)
        self.envs = list(envs)
        self.first = first
        """The index of ``envs[0]`` among its worker's envs (for errors: ``split``)."""
        self._returns_checked = False
        """The types of what ``step`` returned were checked (at the first step, as gymnasium's
        env checker does: a reward of ``None`` would be stored as NaN, a flag of ``"False"`` as True)."""
        self._arrays = False
        """The envs return their reward or flags as one-element arrays (seen at the first
        step): every step takes the path that turns them into scalars."""

    def step_now(self, action: np.ndarray) -> None:
        if not self._returns_checked or self._arrays:
            self._checked_step(action)
            return
        reward, terminated, truncated = self.reward, self.terminated, self.truncated
        i = 0
        try:
            if self._writer.flat:
                obs, leaf, check = self._writer.flat_array, self._writer.flat_leaf, self._writer.check
                shape, ndarray = leaf.shape, np.ndarray
                for i, env in enumerate(self.envs):
                    o, reward[i], terminated[i], truncated[i], _ = env.step(action[i])
                    obs[i] = o if o.__class__ is ndarray and o.shape == shape else check(o, leaf)
            else:
                write = self._writer.write_one
                for i, env in enumerate(self.envs):
                    o, reward[i], terminated[i], truncated[i], _ = env.step(action[i])
                    write(i, o)
        except BaseException as exc:  # (a SystemExit or KeyboardInterrupt an env raises is its error too)
            tb = exc.__traceback__
            if isinstance(exc, (TypeError, ValueError)) and tb is not None and tb.tb_next is None:
                add_note(exc, _LATE_TYPES)  # raised right here: storing what step() returned failed
            _blame(exc, self.first + i)
            raise

    def _checked_step(self, action: np.ndarray) -> None:
        """``step_now`` at the first step (each env's return value and the types of its
        reward and flags checked) and, for envs that return one-element arrays, at every step."""
        i = 0
        first = not self._returns_checked
        try:
            for i, env in enumerate(self.envs):
                o, r, term, trunc, _ = step_result(env.step(action[i])) if first else env.step(action[i])
                if first:
                    check_step_types(r, term, trunc)
                    if any(isinstance(v, np.ndarray) and v.ndim for v in (r, term, trunc)):
                        self._arrays = True  # (numpy stores a 0-d array into one element as it is)
                self.reward[i], self.terminated[i], self.truncated[i] = scalar(r), scalar(term), scalar(trunc)
                self._writer.write_one(i, o)
        except BaseException as exc:  # (a SystemExit or KeyboardInterrupt an env raises is its error too)
            _blame(exc, self.first + i)
            raise
        self._returns_checked = True

    def reset_now(self, idx: np.ndarray, seeds: Sequence[int | None] | None = None) -> None:
        i = 0
        try:
            for i in idx:
                o, _ = reset_result(self.envs[i].reset(seed=None if seeds is None else seeds[i]))
                self._writer.write_one(i, o)
        except BaseException as exc:  # (a SystemExit or KeyboardInterrupt an env raises is its error too)
            _blame(exc, self.first + int(i))
            raise

    def split(self, bounds: list[tuple[int, int]]) -> list[InProcessGroup]:
        """Groups over ``envs[a:b]`` for each ``(a, b)``, sharing these env objects (close
        this group, not them)."""
        return [InProcessGroup(self.envs[a:b], self.device, self.first + a) for a, b in bounds]

    def close(self, catch: type[BaseException] = Exception) -> None:
        """Close every env, even after one whose ``close()`` raised (``catch``: what is
        caught); then raise ``EnvCloseError`` naming each that did."""
        failures = close_each(self.envs, self.first, catch)
        if failures:
            raise EnvCloseError(failures, len(self.envs))


class VectorEnvGroup(_GroupBase):
    """A gymnasium ``VectorEnv``, whatever its autoreset mode.

    * ``NEXT_STEP`` and ``DISABLED``: finished envs are reset right away with
      ``reset(options={"reset_mask": ...})``, so the vector env never performs its own
      "reset step".
    * ``SAME_STEP``: the vector env has already reset the finished envs; their final
      observation comes from ``info["final_obs"]`` and the fresh one is kept aside until
      the engine asks for the reset.

    A partial reset may return the observations of every env (gymnasium's vector envs) or
    only of those it reset (EnvPool, which says which in ``info["env_id"]``); either is
    read row by row into the right env's place (``_reset_rows``). Where a step's
    ``info["env_id"]`` says which env each row belongs to (EnvPool), the rows are put in
    env order (``_in_order``); an asynchronous pool, whose steps return some of its envs
    (EnvPool's ``batch_size`` below ``num_envs``), is refused with an error rather than
    stored in the wrong rows: where the env is first built (before any worker starts, for
    EnvPool, whose ``config`` says so), else at its first step.
    """

    def __init__(self, venv: VectorEnv, device=None):
        config = getattr(venv, "config", None) if _is_envpool(venv) else None  # (its batch_size)
        batch = config.get("batch_size") if isinstance(config, dict) else None
        if isinstance(batch, int) and 0 < batch < venv.num_envs:
            raise ValueError(
                f"{type(venv).__name__} is an asynchronous pool (batch_size={batch} of num_envs={venv.num_envs}): "
                f"each step would return some of its envs; {_SYNCHRONOUS}"
            )
        super().__init__(venv.single_observation_space, venv.single_action_space, venv.num_envs, device)
        self.venv = venv
        mode = venv.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        self.same_step = mode == AutoresetMode.SAME_STEP or mode == "SameStep"
        self._pending: dict[int, Any] = {}
        self._order = np.arange(self.num_envs)

    def step_now(self, action: np.ndarray) -> None:
        try:
            obs, reward, terminated, truncated, info = self.venv.step(action)
        except BaseException as exc:  # (a SystemExit or KeyboardInterrupt an env raises is its error too)
            _blame(exc, None)
            raise
        ids = _row_ids(info)
        if ids is not None and not np.array_equal(ids, self._order):
            obs, reward, terminated, truncated, info = self._in_order(ids, obs, reward, terminated, truncated, info)
        self._writer.write_all(obs)
        self.reward[:] = reward
        self.terminated[:] = terminated
        self.truncated[:] = truncated
        if self.same_step:
            done = np.logical_or(terminated, truncated)
            if done.any():
                final = info["final_obs"]
                for i in np.flatnonzero(done).tolist():
                    self._pending[i] = _row(obs, i)
                    self._writer.write_one(i, final[i])

    def _in_order(self, ids: Any, obs: Any, *rest: Any) -> tuple:
        """A step's results, given for the envs ``ids`` (``info["env_id"]``), in env order;
        an error if they are not one row per env."""
        ids = np.asarray(ids)
        if len(ids) != self.num_envs or not np.array_equal(np.sort(ids), self._order):
            raise ValueError(
                f"{type(self.venv).__name__}.step() returned rows for envs {ids.tolist()} (info['env_id']), "
                f"not one for each of its {self.num_envs} envs: an asynchronous pool (EnvPool with "
                f"batch_size < num_envs) cannot be a collector's vector env; {_SYNCHRONOUS}"
            )
        order = np.argsort(ids)
        *arrays, info = rest

        def take(x: Any) -> Any:
            return {k: take(v) for k, v in x.items()} if isinstance(x, dict) else np.asarray(x)[order]

        if "final_obs" in info:
            info = {**info, "final_obs": take(info["final_obs"])}
        return (take(obs), *(take(x) for x in arrays), info)

    def reset_now(self, idx: np.ndarray, seeds: Sequence[int | None] | None = None) -> None:
        if seeds is None and self._pending and all(int(i) in self._pending for i in idx):
            for i in idx:
                self._writer.write_one(i, self._pending.pop(int(i)))
            return
        for i in idx:
            self._pending.pop(int(i), None)
        mask = np.zeros(self.num_envs, dtype=bool)
        mask[idx] = True
        # (one seed per env: gymnasium's vector envs take a list, though VectorEnv.reset says int)
        seed: Any = None if seeds is None else list(seeds)
        if mask.all():
            try:
                obs, info = self.venv.reset(seed=seed)
            except Exception as exc:
                _blame(exc, None)
                raise
            ids = _row_ids(info)
            if ids is None or np.array_equal(ids, self._order):
                self._writer.write_all(obs)
                return
        else:
            try:
                obs, info = self.venv.reset(seed=seed, options={"reset_mask": mask})
            except Exception as exc:  # a vector env without partial resets
                raise RuntimeError(
                    f"{type(self.venv).__name__} cannot reset a subset of its envs "
                    "(reset(options={'reset_mask': ...}) failed), which aiocollect needs to avoid "
                    "fake autoreset transitions; pass a list of env factories instead, or use "
                    "gymnasium's SyncVectorEnv/AsyncVectorEnv."
                ) from exc
        for i, row in self._reset_rows(idx, obs, info):
            self._writer.write_one(i, _row(obs, row))

    def _reset_rows(self, idx: np.ndarray, obs: Any, info: Any) -> list[tuple[int, int]]:
        """``(env, row of obs)`` for each env of a partial reset: a row per env (gymnasium),
        or a row per env reset, in the order ``info["env_id"]`` gives (EnvPool)."""
        rows = _leading(obs)
        ids = _row_ids(info)
        if rows == self.num_envs and (ids is None or np.array_equal(ids, self._order)):
            return [(int(i), int(i)) for i in idx]
        if ids is not None and len(ids) == rows and sorted(map(int, ids)) == sorted(map(int, idx)):
            return [(int(i), row) for row, i in enumerate(ids)]
        if ids is None and rows == len(idx):
            return [(int(i), row) for row, i in enumerate(idx)]
        said = "" if ids is None else f" for envs {np.asarray(ids).tolist()} (info['env_id'])"
        raise ValueError(
            f"{type(self.venv).__name__}.reset() for envs {np.asarray(idx).tolist()} returned {rows} "
            f"observation rows{said}: expected one per env ({self.num_envs}) or one per env reset, in order "
            f"or named by info['env_id']. (An asynchronous pool, EnvPool with batch_size < num_envs, returns "
            f"some of them: {_SYNCHRONOUS})"
        )

    def close(self, catch: type[BaseException] = Exception) -> None:
        """Close the vector env. Gymnasium's ``SyncVectorEnv`` stops at the first env whose
        ``close()`` raises, leaving the others open: its envs are closed here, each of them
        (see ``InProcessGroup.close``)."""
        venv = self.venv
        if type(venv) is SyncVectorEnv and not venv.closed and isinstance(getattr(venv, "envs", None), list):
            failures = close_each(venv.envs, 0, catch)
            venv.closed = True
            if failures:
                raise EnvCloseError(failures, len(venv.envs))
            return
        venv.close()


_SYNCHRONOUS = ("make it synchronous (batch_size=num_envs, or leave it out), and let the collector overlap the "
                "steps (MultiAsyncCollector).")
"""The fix every error about an asynchronous pool gives."""


def _is_envpool(venv: Any) -> bool:
    """An EnvPool env (its classes come from the ``envpool`` package; EnvPool is not imported)."""
    return any(cls.__module__.split(".")[0] == "envpool" for cls in type(venv).__mro__)


def _row_ids(info: Any) -> np.ndarray | None:
    """The env of each row, where a vector env's ``info["env_id"]`` says it (EnvPool's
    integers); ``None`` otherwise, and for an ``"env_id"`` that gymnasium's vector envs
    gathered from their envs' own infos (those come with an ``"_env_id"`` mask)."""
    if not isinstance(info, dict) or "_env_id" in info:
        return None
    ids = info.get("env_id")
    if ids is None:
        return None
    ids = np.asarray(ids)
    return ids if ids.ndim == 1 and ids.dtype.kind in "iu" else None


def _leading(batched_obs: Any) -> int:
    """The number of rows of a batch of observations (of its first leaf, for a dict)."""
    while isinstance(batched_obs, dict):
        batched_obs = next(iter(batched_obs.values()))
    return len(batched_obs)


def _row(batched_obs: Any, i: int) -> Any:
    if isinstance(batched_obs, dict):
        return {k: _row(v, i) for k, v in batched_obs.items()}
    return batched_obs[i]


EnvGroup = InProcessGroup | VectorEnvGroup

__all__ = ["EnvCloseError", "EnvGroup", "InProcessGroup", "VectorEnvGroup", "close_each"]

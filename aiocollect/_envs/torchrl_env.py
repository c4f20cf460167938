"""TorchRL envs as env sources: an ``EnvBase`` seen as a gymnasium env.

aiocollect drives gymnasium envs. A TorchRL env (``GymEnv``, a ``TransformedEnv`` with its
transforms, a ``SerialEnv`` or ``ParallelEnv``, any ``EnvBase``) is taken as one by wrapping it:

* an env with ``batch_size == []`` becomes a ``TorchRLEnv``, a ``gymnasium.Env``: one env, so a
  batch is ``[time]`` as TorchRL's ``Collector`` gives it, and a list of such envs (or of their
  factories) is stepped one after the other like any list of gymnasium envs;
* an env with ``batch_size == [n]`` becomes a ``TorchRLVectorEnv``, a ``gymnasium.VectorEnv`` of
  ``n`` envs: batches are ``[n, time]``.

Both keep the TorchRL env whole (transforms run inside it) and call its own ``reset`` and
``step`` with TensorDicts, so nothing of TorchRL's semantics is lost; what aiocollect reads back
is numbers:

=====================  ======================================================================
batch entry            where it comes from
=====================  ======================================================================
observations           every tensor leaf of ``env.full_observation_spec``, under its own
                       (possibly nested) key: ``"observation"``, ``"pixels"``, and the keys
                       transforms add there (``"step_count"`` of ``StepCounter``,
                       ``"episode_reward"`` of ``RewardSum``, ...); dtype and shape as the spec
                       says, non-tensor leaves as objects.
``("next", "reward")``  the env's one reward key
``terminated``         ``"terminated"``, or ``"done"`` for an env without a terminated key
``truncated``          ``"truncated"``, or false for an env without one
``"action"``           the env's action, in aiocollect's encoding (below)
=====================  ======================================================================

That is an env with one reward, ``"reward"``, and its done flags at the root. Any other env
(multi-agent, nested or multi-key: rewards or done flags per group, several of them) keeps
each reward and done flag as an entry of its own, under its own key, and each action under
its own key; the engine's reward and flags are then its own bookkeeping (``_Grouped``,
``_envs.keyed``). A batch has each nested group's batch dims as TorchRL's does.

Actions follow aiocollect's encoding, which is TorchRL's with
``categorical_action_encoding=True``: a discrete action is an int64 *index*. For an env whose
action spec is ``OneHot`` (TorchRL's ``GymEnv`` default for ``Discrete`` spaces), the policy
gives an index or one-hot rows, the batch stores what it gave, and the adapter turns an index
into the one-hot vector the env expects just before ``env.step``. Its action space is a
``Discrete`` one that says so (``OneHotDiscrete``): random actions (``policy=None``, the
``init_random_frames``) are drawn as one-hot rows, as TorchRL's ``RandomPolicy`` draws them
from the spec. The action specs taken:

===============================  ======================================  ======================
action spec                      aiocollect action space                 given to the env as
===============================  ======================================  ======================
``Categorical(n)``               ``Discrete(n)``                         the index
``OneHot(n)``                    ``Discrete(n)`` (``OneHotDiscrete``)    a one-hot vector
``MultiCategorical(nvec)``       ``MultiDiscrete(nvec)``                 the indices
``Binary(n)``                    ``MultiBinary(n)``                      0/1 in the spec dtype
``Bounded`` (integer dtype)      ``Discrete``/``MultiDiscrete`` from low  the value
``Bounded`` / ``Unbounded``      ``Box`` (float dtypes)                  the value
===============================  ======================================  ======================

Resets follow aiocollect's rule (finished envs are reset explicitly, never auto-reset inside a
step): a whole reset is ``env.reset()``; resetting some envs of a batched env is TorchRL's
partial reset, ``env.reset(td)`` with a ``"_reset"`` mask, which ``SerialEnv``, ``ParallelEnv``
and their transforms all honour. A seed reseeds the env with ``env.set_seed(seed)`` before a
whole reset (a batched env seeds its sub-envs from it as TorchRL does); a partial reset takes no
seed.

An env with several batch dims (``[5, 2]``) is stepped as ``5 * 2`` rows, and its batches and
its policy's calls have its own dims again (``EnvEntries.env_batch``).

Entries with no fixed shape (non-tensor entries, and a ``-1`` dim) are carried as objects
(``_envs.objects``); a group of heterogeneous agents, lazily stacked, is kept agent by agent
(``_envs.agents``). Not taken (a ``TypeError`` that says so): actions of a dynamic shape, a
batched ``MultiOneHot`` and non-float unbounded actions.

This module imports torch and TorchRL: ``_envs.group`` imports it only once it holds an object
whose class comes from TorchRL, so ``import aiocollect`` never loads TorchRL.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space
from torchrl.data import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    MultiOneHot,
    NonTensor,
    OneHot,
    StackedComposite,
    Unbounded,
)
from torchrl.envs import EnvBase, EnvCreator

from .agents import AGENT, agent_key, agent_td
from .keyed import ENGINE_FLAGS, EnvEntries, KeyedActions
from .objects import OBJECTS, Tensor, encode, object_bytes, objects_space
from .spaces import MultiOneHotDiscrete, OneHotDiscrete


def is_torchrl_env(obj: Any) -> bool:
    """Whether ``obj`` is a TorchRL env (an ``EnvBase``: transformed, batched or not)."""
    return isinstance(obj, EnvBase)


def is_env_class(obj: Any) -> bool:
    """Whether ``obj`` is a TorchRL env class (a subclass of ``EnvBase``): calling it builds
    the env, so TorchRL's collectors take it as ``create_env_fn``, and so do ours."""
    return isinstance(obj, type) and issubclass(obj, EnvBase)


def is_env_creator(obj: Any) -> bool:
    """Whether ``obj`` is TorchRL's ``EnvCreator``, a factory of TorchRL envs."""
    return isinstance(obj, EnvCreator)


def from_torchrl(env: EnvBase, where: str) -> TorchRLEnv | TorchRLVectorEnv:
    """``env`` as a gymnasium env (``batch_size == []``) or ``VectorEnv`` (``[n]``, or
    ``[5, 2]`` as 10 envs); ``where``
    names it in errors. The adapter owns ``env``: closing it closes ``env``."""
    _refuse_post_step_hooks(env, where)
    if len(env.batch_size) == 0:
        return TorchRLEnv(env, where)
    return TorchRLVectorEnv(env, where)


def flat_transforms(transform: Any) -> list:
    """The transforms ``transform`` holds, through nested ``Compose`` objects (none for ``None``)."""
    from torchrl.envs.transforms import Compose

    if transform is None:
        return []
    if isinstance(transform, Compose):
        return [t for item in transform.transforms for t in flat_transforms(item)]
    return [transform]


def _transforms(env: Any) -> list:
    """Every transform of ``env``, through nested ``TransformedEnv`` and ``Compose`` objects."""
    from torchrl.envs.transforms import TransformedEnv

    found: list = []
    while isinstance(env, TransformedEnv):
        found += flat_transforms(env.transform)
        env = env.base_env
    return found


def _refuse_post_step_hooks(env: EnvBase, where: str) -> None:
    """A transform that rewrites the step's outputs after ``step_mdp`` (TorchRL's
    ``_post_step_mdp_hooks``, run by ``step_and_maybe_reset``: ``NextObservationDelta`` stores
    ``("next", "delta", obs)`` and drops ``("next", obs)``) writes entries outside the env's
    specs, which are what aiocollect collects: its batches would silently hold the full next
    observations instead. Refused, with what to do."""
    from torchrl.envs.transforms import Transform

    base = getattr(Transform, "_post_step_mdp_hooks", None)
    if base is None:  # (a TorchRL before the hook: no transform rewrites the step after step_mdp)
        return
    for t in _transforms(env):
        if getattr(type(t), "_post_step_mdp_hooks", base) is not base:
            name = type(t).__name__
            raise TypeError(
                f"{where}: the env's {name} rewrites each step's outputs after the step (TorchRL's post-step-mdp "
                "hook: entries outside the env's specs), which aiocollect does not run: its batches would hold "
                f"the full next observations, not what {name} writes. Remove it from the env; for the memory it "
                "saves, compact_obs=True leaves the (\"next\", observation) entries out of the batches (a replay "
                "buffer's NextStateReconstructor rebuilds them)."
            )


# --------------------------------------------------------------------------- specs -> spaces


def _np_dtype(dtype: torch.dtype, what: str) -> np.dtype:
    try:
        return torch.empty((), dtype=dtype).numpy().dtype
    except TypeError:
        raise TypeError(f"{what} has dtype {dtype}, which numpy cannot hold; convert it with a "
                        "TorchRL transform (DTypeCastTransform, DoubleToFloat).") from None


def _observation_box(spec: Any, what: str) -> spaces.Box:
    """A ``Box`` with the spec's dtype and shape (its bounds if ``Bounded``, else its dtype's)."""
    if any(d < 0 for d in spec.shape):
        raise TypeError(
            f"{what} has shape {list(spec.shape)}: a dynamic dim (-1), whose size changes from step to step. "
            "aiocollect takes such entries among the observations (carried as objects, lazily stacked in "
            "the batches as TorchRL's are), not as actions or done flags or rewards. Give it a fixed size "
            "with a transform, or collect this env with TorchRL's collector."
        )
    dtype, shape = _np_dtype(spec.dtype, what), tuple(spec.shape)
    if dtype.kind == "b":  # a flag (InitTracker's "is_init"): gymnasium wants plain bounds for bool
        return spaces.Box(0, 1, shape, dtype)
    if isinstance(spec, Bounded):
        low = np.broadcast_to(spec.space.low.cpu().numpy(), shape)
        high = np.broadcast_to(spec.space.high.cpu().numpy(), shape)
        return spaces.Box(low.astype(dtype), high.astype(dtype), shape, dtype)
    if dtype.kind == "f":
        return spaces.Box(-np.inf, np.inf, shape, dtype)
    info = np.iinfo(dtype)
    return spaces.Box(info.min, info.max, shape, dtype)


def _key_path(key: Any) -> tuple[str, ...]:
    return (key,) if isinstance(key, str) else tuple(key)


def _leaves(composite: Composite, where: str, what: str,
            objects: list | None = None) -> dict[tuple[str, ...], spaces.Box]:
    """The ``Box`` of each tensor leaf of ``composite``; with ``objects`` (a list), the paths of
    its non-tensor leaves and of those of a dynamic shape are added to it instead (``_envs.objects``)."""
    leaves: dict[tuple[str, ...], spaces.Box] = {}
    for key in composite.keys(include_nested=True, leaves_only=True):
        spec = composite[key]
        if isinstance(spec, Composite) or _in_stack(composite, key):  # (heterogeneous agents: _agent_leaves)
            continue
        if objects is not None and (isinstance(spec, NonTensor) or _dynamic(spec, composite, key)):
            objects.append(_key_path(key))
            continue
        if isinstance(spec, NonTensor):
            continue
        leaves[_key_path(key)] = _observation_box(spec, f"{where}: {what} {key!r}")
    return leaves


def _dynamic(spec: Any, composite: Composite, key: Any) -> bool:
    """Whether ``spec`` (at ``key`` in ``composite``) has a dim that changes from step to step (a ``-1``)."""
    return any(d < 0 for d in spec.shape)


def _in_stack(composite: Composite, key: Any) -> bool:
    """Whether ``key`` lies in a lazily stacked group of ``composite`` (heterogeneous agents)."""
    path = _key_path(key)
    return any(isinstance(composite[path[:i]], StackedComposite) for i in range(1, len(path)))


def _stacked_groups(spec: Composite) -> list[tuple[str, ...]]:
    """The paths of ``spec``'s lazily stacked groups (heterogeneous agents, ``_envs.agents``)."""
    return [_key_path(k) for k in spec.keys(include_nested=True)
            if isinstance(spec[k], StackedComposite) and not _in_stack(spec, k)]


def _agent_specs(env: EnvBase, spec: Composite, group: tuple[str, ...]) -> list[Composite]:
    """Each agent's own spec in ``spec``'s stacked ``group``, without the env's batch dims."""
    nb = len(env.batch_size)
    return [agent[(0,) * nb] if nb else agent for agent in spec[group]._specs]


def _agent_leaves(env: EnvBase, spec: Composite, where: str, what: str,
                  objects: list) -> dict[tuple[str, ...], spaces.Box]:
    """The ``Box`` of each agent's own leaves in ``spec``'s stacked groups, under the engine's
    keys for them (``agent_key``): each has a fixed shape. An agent's non-tensor leaves and
    those of a dynamic shape are added to ``objects`` instead, under the same keys."""
    leaves: dict[tuple[str, ...], spaces.Box] = {}
    for group in _stacked_groups(spec):
        for i, agent in enumerate(_agent_specs(env, spec, group)):
            own: list = []
            for leaf, box in _leaves(agent, where, f"{what} of agent {i} of {group!r}:", own).items():
                leaves[agent_key(group, i, leaf)] = box
            objects.extend(agent_key(group, i, leaf) for leaf in own)
    return leaves


def _group_shapes(env: EnvBase) -> dict[tuple[str, ...], tuple[int, ...]]:
    """Each nested group's own batch dims (a ``Composite`` of shape ``[3]`` under ``"data"``)."""
    shapes: dict[tuple[str, ...], tuple[int, ...]] = {}
    stacked = set(_stacked_groups(env.full_observation_spec)) | set(_stacked_groups(env.full_action_spec))
    for spec in (env.full_observation_spec_unbatched, env.full_done_spec_unbatched,
                 env.full_reward_spec_unbatched, env.full_action_spec_unbatched):
        for key in spec.keys(include_nested=True):
            sub = spec[key]
            if isinstance(sub, Composite) and len(sub.shape) and _key_path(key) not in stacked:
                shapes[_key_path(key)] = tuple(int(d) for d in sub.shape)
    return shapes


def observation_space(env: EnvBase, where: str, grouped: bool = False,
                      objects: list | None = None) -> tuple[spaces.Space, list[tuple[str, ...]], list[Any]]:
    """The gymnasium space of ``env``'s observations, the path of each leaf it reads, and for
    each leaf what stands for it where a TensorDict lacks it (zeros for a reward at a reset:
    the batch holds it under ``"next"`` only), or ``None``.

    A lone ``"observation"`` leaf gives a ``Box`` (the batch key is then ``"observation"``, as
    for a gymnasium env with a ``Box`` space); anything else gives a ``Dict`` nested as the
    spec's keys are, so every leaf keeps its TorchRL key. A ``grouped`` env (rewards or done
    flags per group, see ``_Grouped``) gives an ``EnvEntries`` with its done flags and rewards
    as leaves too. Entries with no fixed shape (non-tensor, or a ``-1`` dim) are one leaf,
    ``OBJECTS`` (``_envs.objects``); their paths are added to ``objects``.
    """
    objects = [] if objects is None else objects
    leaves = _leaves(env.full_observation_spec_unbatched, where, "observation", objects)
    leaves.update(_agent_leaves(env, env.full_observation_spec, where, "observation", objects))
    if objects:
        leaves[(OBJECTS,)] = objects_space(object_bytes())
    if not leaves:
        raise TypeError(f"{where}: the TorchRL env has no tensor observation in its observation_spec.")
    truncated = grouped or "truncated" in env.done_keys  # (else the engine's flags but that one)
    if not grouped and truncated and len(env.batch_size) < 2 and list(leaves) == [("observation",)]:
        return leaves[("observation",)], [("observation",)], [None]
    zeros: dict[tuple[str, ...], Any] = dict.fromkeys(leaves)
    next_only: set = set()
    entries: set = set()  # (the done flags' and rewards' keys)
    if grouped:
        for path, box in _leaves(env.full_done_spec_unbatched, where, "done entry").items():
            leaves[path], zeros[path] = box, np.zeros(tuple(env.full_done_spec[path].shape), box.dtype)
            entries.add(path[0] if len(path) == 1 else path)
        rewards = _leaves(env.full_reward_spec_unbatched, where, "reward")
        for path, box in rewards.items():
            leaves[path] = box
            zeros[path] = np.zeros(tuple(env.full_reward_spec[path].shape), box.dtype)
            next_only.add(path[0] if len(path) == 1 else path)
            entries.add(path[0] if len(path) == 1 else path)
    tree: dict[str, Any] = {}
    for path, box in leaves.items():
        node = tree
        for name in path[:-1]:
            node = node.setdefault(name, {})
        node[path[-1]] = box
    groups = _group_shapes(env)
    env_batch = tuple(int(d) for d in env.batch_size) if len(env.batch_size) > 1 else ()
    if not grouped and not groups and not env_batch and truncated:
        return _as_dict_space(tree), list(leaves), [None] * len(leaves)
    flags = () if grouped else ENGINE_FLAGS if truncated else ENGINE_FLAGS[:3]
    space = EnvEntries({k: _as_dict_space(v) if isinstance(v, dict) else v for k, v in tree.items()},
                       frozenset(next_only), flags, groups, env_batch, frozenset(entries))
    return space, list(leaves), [zeros[p] for p in leaves]


def _as_dict_space(tree: dict[str, Any]) -> spaces.Dict:
    return spaces.Dict({k: _as_dict_space(v) if isinstance(v, dict) else v for k, v in tree.items()})


class ActionEncoder:
    """The gymnasium action space of a TorchRL action spec, and the conversion of an action
    in that space (a numpy array, batched or not) to the tensor the env expects."""

    def __init__(self, spec: Any, device: Any, what: str):
        self.dtype, self.device, self.one_hot = spec.dtype, device, 0
        self.parts: tuple[int, ...] = ()
        self.space: spaces.Space
        shape = tuple(spec.shape)
        if isinstance(spec, MultiOneHot):  # one-hot parts side by side: a MultiDiscrete action
            self.parts = tuple(int(n) for n in spec.nvec)
            if len(shape) != 1:
                raise TypeError(f"{what}: a batched MultiOneHot action spec {list(shape)} is not supported; "
                                "build the env with categorical_action_encoding=True.")
            self.space = MultiOneHotDiscrete(np.array(self.parts, np.int64))
        elif isinstance(spec, OneHot):
            self.one_hot = spec.space.n
            self.space = OneHotDiscrete(self.one_hot)  # (a Discrete space: random draws are one-hot rows)
        elif isinstance(spec, MultiCategorical):
            self.space = spaces.MultiDiscrete(spec.nvec.cpu().numpy().astype(np.int64).reshape(shape))
        elif isinstance(spec, Binary):
            self.space = spaces.MultiBinary(list(shape) if len(shape) != 1 else shape[0])
        elif isinstance(spec, Categorical):
            n = spec.space.n
            self.space = spaces.Discrete(n) if shape == () else spaces.MultiDiscrete(np.full(shape, n, np.int64))
        elif isinstance(spec, Bounded) and not spec.dtype.is_floating_point:
            low = np.broadcast_to(spec.space.low.cpu().numpy(), shape).astype(np.int64)
            high = np.broadcast_to(spec.space.high.cpu().numpy(), shape).astype(np.int64)
            self.space = (spaces.Discrete(int(high - low + 1), start=int(low)) if shape == ()
                          else spaces.MultiDiscrete(high - low + 1, start=low))
        elif isinstance(spec, (Bounded, Unbounded)) and spec.dtype.is_floating_point:
            self.space = _observation_box(spec, what)
        else:
            raise TypeError(
                f"{what}: action spec {type(spec).__name__} of dtype {spec.dtype} is not supported; "
                "aiocollect takes Categorical, OneHot, MultiCategorical, Binary, integer Bounded, "
                "and floating-point Bounded/Unbounded actions."
            )

    def __call__(self, action: np.ndarray) -> torch.Tensor:
        # a copy: ``action`` is a view of the collector's storage, which the next round reuses
        tensor = torch.tensor(action, device=self.device)
        if self.one_hot or self.parts:
            tensor = tensor.long()  # one_hot takes int64 indices; a policy may give int32 or uint8
        if self.one_hot:
            tensor = torch.nn.functional.one_hot(tensor, self.one_hot)
        elif self.parts:
            tensor = torch.cat([torch.nn.functional.one_hot(tensor[..., i], n) for i, n in enumerate(self.parts)], -1)
        return tensor.to(self.dtype)


# --------------------------------------------------------------------------- stepping


def _root_simple(env: EnvBase) -> bool:
    """Whether ``env`` has one reward, ``"reward"``, and its done flags at the root only:
    then the engine's own reward and flags are the env's (every other env is ``_Grouped``)."""
    return list(env.reward_keys) == ["reward"] and "done" in env.done_keys \
        and all(isinstance(k, str) for k in env.done_keys) \
        and env.full_reward_spec_unbatched["reward"].shape.numel() == 1


class _Grouped:
    """The rewards and done flags of an env that has them per group (nested keys), several
    of them, or not at the root: each is a batch entry of its own (``_envs.keyed.EnvEntries``),
    and the engine's own per-env reward and flags are what its bookkeeping needs:
    ``terminated`` if any group terminated (``"terminated"``, or ``"done"`` for a group
    without one), ``truncated`` if any was truncated, the reward summed over every reward
    entry (for the progress bar's returns). An env ends an episode (a new trajectory id, as
    TorchRL's collector counts them) when any group is done; its reset resets the groups that
    are done, as TorchRL's ``maybe_reset`` does (all of them when none is: a truncation by
    ``max_frames_per_traj``, or an explicit reset)."""

    def __init__(self, env: EnvBase):
        self.env = env
        self.reward_keys = [_key_path(k) for k in env.reward_keys]
        self.done_keys = [_key_path(k) for k in env.done_keys]
        self.terminated: list[tuple[str, ...]] = []
        self.truncated: list[tuple[str, ...]] = []
        for group in env.done_keys_groups:
            paths = {_key_path(k)[-1]: _key_path(k) for k in group}
            # ("terminated", else "done", else the group's one flag: MultiAgentCountingEnv's "env_done")
            self.terminated.append(paths.get("terminated", paths.get("done", _key_path(group[0]))))
            if "truncated" in paths:
                self.truncated.append(paths["truncated"])
        self.batch_dims = len(env.batch_size)

    def _any(self, td: Any, paths: list[tuple[str, ...]]) -> np.ndarray:
        shape = tuple(td.batch_size[: self.batch_dims])
        out = np.zeros(shape, bool)
        for path in paths:
            value = td.get(path).detach().cpu().numpy()
            out |= value.reshape(*shape, -1).any(-1)
        return out

    def flags(self, nxt: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        shape = tuple(nxt.batch_size[: self.batch_dims])
        reward = np.zeros(shape, np.float32)
        for path in self.reward_keys:
            reward += nxt.get(path).detach().cpu().numpy().reshape(*shape, -1).sum(-1)
        return reward, self._any(nxt, self.terminated), self._any(nxt, self.truncated)

    def reset_entries(self, td: Any, mask: np.ndarray) -> None:
        """Set ``td``'s ``"_reset"`` entries: the done groups of the envs of ``mask`` (every
        group of an env of ``mask`` that has none done)."""
        env = self.env
        m = torch.as_tensor(mask, device=td.device)
        resets = {}
        for key in env.reset_keys:
            # the group's own done flags, or'ed (TorchRL's ``any_done`` wrote no "_reset" for a
            # group done alone in a TensorDict kept between steps: every group was then reset)
            value = _group_done(env, td, key)
            resets[key] = value & m.reshape(*m.shape, *[1] * (value.ndim - m.ndim))
        any_env = torch.zeros_like(m)
        for value in resets.values():
            any_env |= value.reshape(*m.shape, -1).any(-1)
        none = m & ~any_env
        for key, value in resets.items():
            td.set(key, value | none.reshape(*m.shape, *[1] * (value.ndim - m.ndim)))


def _group_done(env: EnvBase, td: Any, reset_key: Any) -> torch.Tensor:
    """Whether each entry of the group of ``reset_key`` is done: its done flags in ``td`` or'ed
    (false, shaped as the group's first done flag, or ``"done"``, where ``td`` holds none of them)."""
    prefix = _key_path(reset_key)[:-1]
    out, first = None, None
    for group in env.done_keys_groups:
        if _key_path(group[0])[:-1] != prefix:
            continue
        first = first or _key_path(group[0])
        for key in group:
            value = td.get(_key_path(key), None)
            if value is not None:
                out = value.bool() if out is None else out | value.bool()
    if out is None:
        out = torch.zeros_like(td.get(first or (*prefix, "done")), dtype=torch.bool)
    return out


class _Bridge:
    """Resets and steps one TorchRL env through TensorDicts and hands back numpy results.

    It keeps the TensorDict TorchRL's own rollouts keep between steps (``env.step_mdp`` of the
    last step, or the last reset's output): transforms such as ``StepCounter`` read their state
    from it, and a partial reset leaves the envs it does not reset as they were.
    """

    def __init__(self, env: EnvBase, where: str):
        if not isinstance(env, EnvBase):
            raise TypeError(f"{where} gave {type(env).__name__}, not a TorchRL EnvBase.")
        self.env = env
        self.env_batch = tuple(int(d) for d in env.batch_size)
        """The env's batch dims; with several (``[5, 2]``), its envs are stepped as ``5 * 2`` rows."""
        self.num_envs = math.prod(self.env_batch) if self.env_batch else None
        self.grouped = None if _root_simple(env) else _Grouped(env)
        self._objects: list[tuple[str, ...]] = []
        """The paths of the entries carried as objects (``_envs.objects``)."""
        self.observation_space, self._paths, self._fallback = observation_space(
            env, where, self.grouped is not None, self._objects)
        self._where = where
        self._flat = isinstance(self.observation_space, spaces.Box)
        action_keys, self.encoders = self._actions(env, where)
        self._action_keys = action_keys
        self.encode: ActionEncoder | None
        self.keyed: KeyedActions | None
        self.action_space: spaces.Space
        if action_keys == ["action"]:
            self.encode, self.keyed = self.encoders[0], None
            self.action_space = self.encoders[0].space
        else:  # several action keys, or one nested: each under its own key (``_envs.keyed``)
            self.encode = None
            self.keyed = self.action_space = KeyedActions(action_keys, [e.space for e in self.encoders])
        if self.grouped is None:
            self._terminated_key = "terminated" if "terminated" in env.done_keys else "done"
            self._truncated_key = "truncated" if "truncated" in env.done_keys else None
        self._done_shape = env.full_done_spec[env.done_keys[0]].shape
        self._td = None

    @staticmethod
    def _actions(env: EnvBase, where: str) -> tuple[list, list[ActionEncoder]]:
        """The env's action keys, each agent's own in a heterogeneous group (``_envs.agents``),
        and the encoder of each."""
        keys, encoders = [], []
        specs, full = env.full_action_spec_unbatched, env.full_action_spec
        groups = _stacked_groups(full)
        for key in env.action_keys:
            path = _key_path(key)
            group = next((g for g in groups if path[: len(g)] == g), None)
            if group is None:
                keys.append(key if isinstance(key, str) else path)
                encoders.append(ActionEncoder(specs[key], env.device, f"{where}: action spec {key!r}"))
                continue
            for i, agent in enumerate(_agent_specs(env, full, group)):
                keys.append(agent_key(group, i, path[len(group):]))
                encoders.append(ActionEncoder(agent[path[len(group):]], env.device,
                                              f"{where}: action spec {key!r} of agent {i}"))
        return keys, encoders

    def _get(self, td: Any, path: tuple, batch_dims: int | None = None) -> Any:
        """``td``'s entry at ``path``, an agent's own (``_envs.agents``) read from its agent;
        ``batch_dims``: ``td``'s (the env's, by default)."""
        for j, part in enumerate(path):
            if part.startswith(AGENT):
                dims = len(self.env_batch) if batch_dims is None else batch_dims
                agent = agent_td(td.get(path[:j]), int(part[len(AGENT):]), dims)
                return agent.get(path[j + 1:], None)
        return td.get(path, None)

    def _rows(self, value: np.ndarray) -> np.ndarray:
        """An env's values of batch ``[5, 2, ...]`` as rows ``[10, ...]`` (others as they are)."""
        dims = len(self.env_batch)
        return value if dims < 2 else value.reshape(self.num_envs, *value.shape[dims:])

    def _obs(self, td: Any) -> Any:
        if self._flat:
            return self._rows(td.get("observation").detach().cpu().numpy())
        obs: dict[str, Any] = {}
        for path, zeros in zip(self._paths, self._fallback):
            node = obs
            for name in path[:-1]:
                node = node.setdefault(name, {})
            if path == (OBJECTS,):
                node[OBJECTS] = self._object_rows(td)
                continue
            value = self._get(td, path)
            if value is None and zeros is not None:  # a reward, at a reset: the batch holds it under "next" only
                value = zeros
            node[path[-1]] = self._rows(value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value)
        return obs

    def _object_rows(self, td: Any) -> np.ndarray:
        """The ``OBJECTS`` row of each env: its values of the entries with no fixed shape."""
        shape = self.env_batch
        space = self.observation_space
        assert isinstance(space, spaces.Dict)  # (entries carried as objects: a Dict of observations)
        objects = space[OBJECTS]
        assert isinstance(objects, spaces.Box)  # (their bytes: _envs.objects)
        rows = np.zeros((*shape, objects.shape[0]), np.uint8)
        for idx in np.ndindex(*shape):
            sub = td[idx] if shape else td
            values = {}
            for path in self._objects:
                value = self._get(sub, path, 0)
                if value is None:
                    continue
                key = path[0] if len(path) == 1 else path
                values[key] = Tensor(value.detach().cpu().numpy()) if isinstance(value, torch.Tensor) \
                    else getattr(value, "data", value)
            where = self._where if not shape else f"{self._where}, env {list(idx)}"
            encode(values, rows[idx], where)
        return self._rows(rows)

    def reset(self, mask: np.ndarray | None = None, seed: int | None = None) -> Any:
        """Reset every env (``mask=None``), or those of ``mask`` (TorchRL's partial reset);
        return the observations of every env. An env with done flags per group resets the
        groups that are done (see ``_Grouped``)."""
        if mask is None and self.grouped is not None and self._td is not None and seed is None:
            mask = np.ones(() if self.num_envs is None else (self.num_envs,), bool)
        if mask is not None and len(self.env_batch) > 1:
            mask = np.asarray(mask).reshape(self.env_batch)
        if mask is None or self._td is None:
            if seed is not None:
                self.env.set_seed(int(seed))
            self._td = self.env.reset()
        else:
            td = self._td
            if self.grouped is not None:
                self.grouped.reset_entries(td, mask)
            else:
                td.set("_reset", torch.as_tensor(mask, device=self.env.device).reshape(self._done_shape))
            self._td = self.env.reset(td, select_reset_only=True)
        return self._obs(self._td)

    def _set_actions(self, td: Any, action: np.ndarray) -> None:
        if self.keyed is None:  # (one action key: its encoder is ``encode``)
            if len(self.env_batch) > 1:
                action = action.reshape(*self.env_batch, *action.shape[1:])
            td.set("action", self.encoders[0](action))
            return
        for key, encoder, part in zip(self._action_keys, self.encoders,
                                      self.keyed.unpack(action.reshape(*self.env_batch, -1))):
            j = next((j for j, p in enumerate(key) if p.startswith(AGENT)), None) if isinstance(key, tuple) else None
            if j is None:
                td.set(key, encoder(part))
            else:  # (an agent's own action, set in its agent's TensorDict of the lazily stacked group)
                agent_td(td.get(key[:j]), int(key[j][len(AGENT):]), len(self.env_batch)).set(key[j + 1:], encoder(part))

    def step(self, action: np.ndarray) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray]:
        """Step with ``action`` (aiocollect's encoding); observations, reward, terminated,
        truncated, as numpy (one value each, or ``num_envs``)."""
        td = self._td
        if td is None:
            raise RuntimeError("step() before reset(): reset the env first.")
        self._set_actions(td, action)
        out = self.env.step(td)
        nxt = out.get("next")
        obs = self._obs(nxt)
        shape = () if self.num_envs is None else (self.num_envs,)
        if self.grouped is not None:
            reward, terminated, truncated = (v.reshape(shape) for v in self.grouped.flags(nxt))
        else:
            reward = nxt.get("reward").detach().cpu().numpy().reshape(shape)
            terminated = nxt.get(self._terminated_key).cpu().numpy().reshape(shape)
            truncated = (np.zeros(shape, dtype=bool) if self._truncated_key is None
                         else nxt.get(self._truncated_key).cpu().numpy().reshape(shape))
        self._td = self.env.step_mdp(out)
        return obs, reward, terminated, truncated

    def close(self) -> None:
        self._td = None
        if not getattr(self.env, "is_closed", False):
            self.env.close(raise_if_closed=False)


class TorchRLEnv(gym.Env):
    """An unbatched TorchRL env (``batch_size == []``) as a ``gymnasium.Env``.

    Observations are a numpy array (a lone ``"observation"`` key) or a nested dict of them
    keyed like the env's observation spec; see the module docstring.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, env: EnvBase, where: str = "env"):
        self._bridge = _Bridge(env, where)
        self.observation_space = self._bridge.observation_space
        self.action_space = self._bridge.action_space

    @property
    def torchrl_env(self) -> EnvBase:
        """The TorchRL env this adapter steps."""
        return self._bridge.env

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        return self._bridge.reset(None, seed), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        obs, reward, terminated, truncated = self._bridge.step(np.asarray(action))
        return obs, float(reward), bool(terminated), bool(truncated), {}

    def close(self) -> None:
        self._bridge.close()

    def __repr__(self) -> str:
        return f"TorchRLEnv({type(self._bridge.env).__name__})"


class TorchRLVectorEnv(VectorEnv):
    """A TorchRL env with ``batch_size == [n]`` (``SerialEnv``, ``ParallelEnv``, transformed or
    not) as a ``gymnasium.VectorEnv`` of ``n`` envs that never resets by itself.

    ``reset(options={"reset_mask": mask})`` resets the envs of ``mask`` with TorchRL's partial
    reset; a ``seed`` (an int, or a list whose first entry is used) reseeds the whole env
    before a whole reset and is ignored by a partial one.
    """

    metadata: dict[str, Any] = {"autoreset_mode": AutoresetMode.DISABLED}

    def __init__(self, env: EnvBase, where: str = "env"):
        self._bridge = _Bridge(env, where)
        assert self._bridge.num_envs is not None  # (from_torchrl: an env of batch [] is a TorchRLEnv)
        self.num_envs = self._bridge.num_envs
        self.single_observation_space = self._bridge.observation_space
        self.single_action_space = self._bridge.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)

    @property
    def torchrl_env(self) -> EnvBase:
        """The TorchRL env this adapter steps."""
        return self._bridge.env

    def reset(self, *, seed: int | list[int | None] | None = None,
              options: dict | None = None) -> tuple[Any, dict]:
        mask = (options or {}).get("reset_mask")
        if mask is not None and np.all(mask):
            mask = None
        if isinstance(seed, (list, tuple)):
            seed = seed[0] if seed else None
        return self._bridge.reset(None if mask is None else np.asarray(mask, dtype=bool), seed), {}

    def step(self, action: np.ndarray) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        obs, reward, terminated, truncated = self._bridge.step(np.asarray(action))
        return obs, reward, terminated, truncated, {}

    def close_extras(self, **kwargs: Any) -> None:
        bridge = getattr(self, "_bridge", None)  # None: __init__ failed, gymnasium's __del__ closes
        if bridge is not None:
            bridge.close()

    def __repr__(self) -> str:
        return f"TorchRLVectorEnv({type(self._bridge.env).__name__}, num_envs={self.num_envs})"


__all__ = ["TorchRLEnv", "TorchRLVectorEnv", "from_torchrl", "is_env_creator", "is_torchrl_env"]

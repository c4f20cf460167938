"""From gymnasium spaces to tensor layouts.

A gymnasium observation space becomes a flat list of ``Leaf`` entries, one per
tensor the batch will hold. The naming follows TorchRL's ``GymEnv`` with
``categorical_action_encoding=True``, so batches have the keys TorchRL users expect:

==================  ===============================  ============================
space               key                              per-env shape, dtype
==================  ===============================  ============================
``Box``             ``"observation"``                ``space.shape``, its dtype
``Discrete``        ``"observation"``                ``()``, int64 (the index)
``MultiDiscrete``   ``"observation"``                ``nvec.shape``, int64
``MultiBinary``     ``"observation"``                ``(n,)``, int8
``Dict``            the dict's keys, nested          per sub-space, as above
==================  ===============================  ============================

The same table holds for the action, always under the key ``"action"``, with one
addition: a ``Discrete`` action may also come one-hot (TorchRL's default encoding, the
one a ``QValueActor`` or a ``OneHotCategorical`` actor writes), and a ``MultiDiscrete``
one (of one dimension) as TorchRL's ``MultiOneHot``: each sub-action's one-hot row, side
by side. The batch then keeps it as the policy wrote it:

======================================  ==========================  ==================================
the policy writes                       the env is stepped with     the batch's ``"action"`` holds
======================================  ==========================  ==================================
indices ``[n]`` (integer/bool)          that index                  the indices (booleans as int64)
one-hot rows ``[n, space.n]``           the index of each row's 1   the rows, as the policy wrote them
one-hot parts ``[n, sum(space.nvec)]``  each part's index           the rows, as the policy wrote them
======================================  ==========================  ==================================

so a batch carries the encoding of the policy that collected it, and a loss built for
that encoding (TorchRL's ``DQNLoss(action_space="one-hot")``) takes it as it is. Rows are
read as TorchRL's ``OneHot`` spec reads them (the largest value cast to an integer): several
1s (a ``QValueModule``'s tie) step the env with the first; rows that are not one-hot at all
(logits) are read the same way, with a warning.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import spaces

NestedKey = str | tuple[str, ...]


@dataclass(frozen=True)
class Leaf:
    """One tensor of an observation or action: where it lives and what it holds."""

    path: tuple[str, ...]
    """Where the value sits in the env's (possibly nested) dict; ``()`` for a flat space."""
    key: NestedKey
    """The TensorDict key (a string at top level, a tuple when nested)."""
    shape: tuple[int, ...]
    dtype: np.dtype
    space: spaces.Space


def _leaf_dtype_shape(space: spaces.Space, what: str) -> tuple[np.dtype, tuple[int, ...]]:
    if isinstance(space, spaces.Box):
        return np.dtype(space.dtype), tuple(space.shape)
    if isinstance(space, spaces.Discrete):
        return np.dtype(np.int64), ()
    if isinstance(space, spaces.MultiDiscrete):
        return np.dtype(np.int64), tuple(space.nvec.shape)
    if isinstance(space, spaces.MultiBinary):
        shape = (space.n,) if isinstance(space.n, (int, np.integer)) else tuple(space.n)
        return np.dtype(np.int8), shape
    raise TypeError(
        f"{what}: gymnasium space {type(space).__name__} is not supported; use Box, Discrete, "
        "MultiDiscrete, MultiBinary or a Dict of those (wrap the env with "
        "gymnasium.wrappers.FlattenObservation to turn a Tuple space into a Box)."
    )


def flatten_space(space: spaces.Space, default_key: str, what: str) -> list[Leaf]:
    """The leaves of ``space``, in a stable order.

    ``default_key`` names the single leaf of a non-Dict space (``"observation"`` or
    ``"action"``); ``what`` names the space in error messages.
    """
    if not isinstance(space, spaces.Space):
        raise TypeError(f"{what} must be a gymnasium.spaces.Space, got {type(space).__name__}")
    if isinstance(space, spaces.Dict):
        leaves: list[Leaf] = []
        for name, sub in space.spaces.items():
            for leaf in flatten_space(sub, name, f"{what}[{name!r}]"):
                path = (name, *leaf.path)
                key = path[0] if len(path) == 1 else path
                leaves.append(Leaf(path, key, leaf.shape, leaf.dtype, leaf.space))
        if not leaves:
            raise TypeError(f"{what} is an empty Dict space; give the env at least one entry.")
        return leaves
    dtype, shape = _leaf_dtype_shape(space, what)
    return [Leaf((), default_key, shape, dtype, space)]


def get_path(value: Any, path: tuple[str, ...]) -> Any:
    """The entry of a nested dict at ``path`` (``value`` itself for ``()``)."""
    for name in path:
        value = value[name]
    return value


def _unravel(key: tuple) -> tuple[str, ...]:
    """``("next", ("pos", "x"))`` -> ``("next", "pos", "x")`` (tensordict's ``unravel_key``;
    this module is also a worker's, which never imports torch)."""
    return tuple(part for k in key for part in ((k,) if isinstance(k, str) else _unravel(k)))


def nest(flat: dict[NestedKey, Any]) -> dict[str, Any]:
    """``{("next", "obs"): x, "a": y}`` -> ``{"next": {"obs": x}, "a": y}`` (keys within
    keys, ``("next", ("pos", "x"))``, are unravelled)."""
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        path = (key,) if isinstance(key, str) else _unravel(key)
        node = nested
        for name in path[:-1]:
            node = node.setdefault(name, {})
        node[path[-1]] = value
    return nested


class ObsWriter:
    """Writes observations, as gymnasium returns them, into per-leaf numpy arrays.

    ``arrays`` maps each leaf's key to an array whose first dim is the env index. The
    flat single-leaf case (the common one) skips the dict walk; ``flat`` says whether
    this is that case, and ``flat_array`` is then the one array, for callers that write
    it inline in their own hot loop (through ``check`` for anything but an array of the
    leaf's shape).

    Nothing is stored that does not have the space's shape: numpy would store ``None`` as
    NaN and broadcast an array of the wrong shape, so a value that is not an array of the
    leaf's shape goes through ``check``, which takes what has the right number of numbers
    (a scalar, a list, an array of the same size) and rejects the rest (``None``, strings,
    objects, the wrong size) with a ``ValueError`` naming the observation key. Numbers are
    cast to the leaf's dtype as numpy casts them (float64 to float32, as gymnasium's
    vector envs do); their values are not checked against the space's bounds.
    """

    def __init__(self, leaves: list[Leaf], arrays: dict[NestedKey, np.ndarray]):
        self.flat = len(leaves) == 1 and leaves[0].path == ()
        self._targets = [(leaf.path, arrays[leaf.key], leaf) for leaf in leaves]
        self.flat_array = arrays[leaves[0].key]
        self.flat_leaf = leaves[0]

    def write_one(self, i: int | np.ndarray, obs: Any) -> None:
        """Write the observation of env ``i`` (or of envs ``i``, when ``obs`` is batched)."""
        rows = 1 if isinstance(i, (int, np.integer)) else len(i)
        if self.flat:
            self.flat_array[i] = self.check(obs, self.flat_leaf, None if rows == 1 else rows)
            return
        for path, array, leaf in self._targets:
            array[i] = self.check(get_path(obs, path), leaf, None if rows == 1 else rows)

    def write_all(self, obs: Any) -> None:
        """Write a batched observation (a vector env's) for every env."""
        rows = len(self.flat_array)
        if self.flat:
            self.flat_array[...] = self.check(obs, self.flat_leaf, rows)
            return
        for path, array, leaf in self._targets:
            array[...] = self.check(get_path(obs, path), leaf, rows)

    @staticmethod
    def check(value: Any, leaf: Leaf, rows: int | None = None) -> Any:
        """``value`` as an observation of ``leaf`` (``rows`` of them, if given): itself when
        it already is one, converted when it converts exactly, else a ``ValueError``."""
        shape = leaf.shape if rows is None else (rows, *leaf.shape)
        if value.__class__ is np.ndarray and value.shape == shape:
            return value
        if not shape and value.__class__ in _SCALARS:  # a Discrete observation, say
            return value
        array = None if value is None else np.asarray(value)
        if array is None or array.dtype == object or array.size != int(np.prod(shape, dtype=np.int64)) \
                or (array.dtype.kind not in "biuf" and leaf.dtype.kind in "biuf"):
            got = "None" if value is None else f"{type(value).__name__} {_describe(array)}"
            raise ValueError(
                f"observation {leaf.key!r}: the env returned {got}, expected {leaf.dtype} of shape "
                f"{list(shape)} for {leaf.space}; return an observation of the env's observation_space."
            )
        return array.reshape(shape)


_SCALARS = frozenset({int, float, np.int64, np.int32, np.float32, np.float64})


def _describe(array: np.ndarray) -> str:
    return f"of dtype {array.dtype} and shape {list(array.shape)}"


class OneHotDiscrete(spaces.Discrete):
    """A ``Discrete`` action space whose env takes one-hot rows: a TorchRL env with a ``OneHot``
    action spec (TorchRL's ``GymEnv`` default). It is a ``Discrete`` space in every respect
    (the envs are given indices, equal to ``Discrete(n)``); it tells the random policy to
    draw one-hot rows, as TorchRL's ``RandomPolicy(env.action_spec)`` does, so that a
    ``policy=None`` batch or an ``init_random_frames`` one holds TorchRL's encoding."""


class MultiOneHotDiscrete(spaces.MultiDiscrete):
    """A one-dimensional ``MultiDiscrete`` action space whose env takes one-hot parts side by
    side: a TorchRL env with a ``MultiOneHot`` action spec (see ``OneHotDiscrete``)."""


def one_hot_parts(space: spaces.Space) -> tuple[tuple[int, ...], np.ndarray] | None:
    """For an action space whose env takes one-hot rows (``OneHotDiscrete``,
    ``MultiOneHotDiscrete``): each part's width and start; else ``None``."""
    if isinstance(space, OneHotDiscrete):
        return (int(space.n),), np.asarray([space.start], dtype=np.int64)
    if isinstance(space, MultiOneHotDiscrete):
        return tuple(int(n) for n in space.nvec), np.asarray(space.start, dtype=np.int64).reshape(-1)
    return None


def encode_one_hot(indices: np.ndarray, parts: tuple[int, ...], start: np.ndarray) -> np.ndarray:
    """Indices (``[..., ]`` for one part, ``[..., len(parts)]`` for several) as int64 one-hot
    rows ``[..., sum(parts)]``, the parts side by side (TorchRL's ``OneHot``/``MultiOneHot``)."""
    if len(parts) == 1:
        return np.eye(parts[0], dtype=np.int64)[indices - start[0]]
    return np.concatenate([np.eye(n, dtype=np.int64)[indices[..., i] - start[i]] for i, n in enumerate(parts)],
                          axis=-1)


class NonFiniteAction(ValueError):
    """A float action with NaN or infinite values (``ActionCheck``): ``row``, the first row
    of the policy call that has one, ``value``, that row's action as text. Whoever called the
    policy raises it as a [`PolicyError`][aiocollect.PolicyError] naming the env and its
    worker (``_engine.rounds``, ``_policies.actor``)."""

    def __init__(self, action: np.ndarray):
        bad = ~np.isfinite(action.reshape(len(action), -1)).all(axis=1)
        self.row = int(bad.argmax())
        self.value = np.array2string(action[self.row], threshold=8, edgeitems=3)
        super().__init__(f"action: the policy's action for row {self.row} of its call is not finite: {self.value}.")


def all_finite(action: np.ndarray) -> bool:
    """Whether every value of the float array ``action`` is finite: one vectorised test per
    call. A small array is summed as Python floats instead, in a quarter of the time (this
    runs at every step): a NaN or an infinity makes the sum NaN or infinite, and a sum that
    overflows (float64 values near its limit) is tested value by value."""
    if action.size <= 32 and math.isfinite(sum(action.ravel().tolist())):
        return True
    return bool(np.isfinite(action).all())


@dataclass(frozen=True)
class ActionCheck:
    """Checks that a policy's batched action fits the env's action space.

    Shape and dtype are checked on every step (cheap), the range of discrete spaces too:
    an index out of range would otherwise crash deep inside the env, or worse, not crash.
    A float (``Box``) action must be finite (``NonFiniteAction``: an env given NaN returns
    NaN, which would be taken for the env's fault); its bounds are not checked, as gymnasium
    and TorchRL do not (a finite action outside them goes to the envs as it is).
    A ``Discrete`` action may be indices or one-hot rows (see the module docstring);
    ``__call__`` returns what the batch stores, ``env_action`` what the envs are given.
    """

    space: spaces.Space
    shape: tuple[int, ...]
    dtype: np.dtype
    low: np.ndarray | int | None
    high: np.ndarray | int | None
    one_hot: int | None = None
    """How many columns a one-hot action has: ``space.n`` for a ``Discrete`` space,
    ``sum(nvec)`` for a one-dimensional ``MultiDiscrete`` one; else ``None``."""
    parts: tuple[int, ...] = ()
    """The one-hot parts' widths (``(n,)``, or ``nvec``)."""
    _spans: dict = field(default_factory=dict, compare=False, repr=False)
    """Per integer dtype: how ``in_range`` tests it in one comparison, or ``None``."""

    @classmethod
    def for_space(cls, space: spaces.Space) -> ActionCheck:
        leaf = flatten_space(space, "action", "action_space")
        if len(leaf) != 1 or leaf[0].path != ():
            raise TypeError(
                "action_space: Dict action spaces are not supported yet; flatten the action "
                "space with a gymnasium wrapper."
            )
        dtype, shape = leaf[0].dtype, leaf[0].shape
        low = high = one_hot = None
        parts: tuple[int, ...] = ()
        if isinstance(space, spaces.Discrete):
            low, high, one_hot = int(space.start), int(space.start + space.n - 1), int(space.n)
            parts = (one_hot,)
        elif isinstance(space, spaces.MultiDiscrete):
            low, high = np.asarray(space.start), np.asarray(space.start + space.nvec - 1)
            if space.nvec.ndim == 1 and (space.nvec > 1).any():  # (all 1s: one-hot rows = indices' shape)
                parts = tuple(int(n) for n in space.nvec)
                one_hot = sum(parts)
        elif isinstance(space, spaces.MultiBinary):
            low, high = 0, 1
        return cls(space, shape, dtype, low, high, one_hot, parts)

    def __call__(self, action: np.ndarray, num_envs: int) -> np.ndarray:
        """``action`` if it is a valid batch of actions for ``num_envs`` envs, else an error
        naming the action. What the batch stores is what the policy wrote, as in TorchRL: its
        dtype (an integer action for a ``Box`` space, a float one of whole numbers for a
        discrete space) and its per-env shape (``[1]`` where the space has ``[]``, say: any
        shape with the space's number of values per env), save booleans for a discrete space,
        stored as the 0/1 indices the envs get. ``env_action`` gives the envs the action in
        the space's shape (one-hot rows for a ``Discrete`` space as their indices), and the
        envs' action array casts it to the space's dtype. Refused: a wrong number of values
        per env, a float action that is not finite, a discrete one out of range or not a
        whole number (the envs would get another action than the policy's)."""
        expected = (num_envs, *self.shape)
        if action.shape != expected:
            if self.one_hot is not None and action.shape == (num_envs, self.one_hot):
                return self._check_one_hot(action)
            if action.shape[:1] != (num_envs,) or math.prod(action.shape[1:]) != math.prod(self.shape):
                raise ValueError(
                    f"action: the policy returned shape {list(action.shape)} for {num_envs} env(s), "
                    f"expected {list(expected)} for {self.space}.{self._shape_fix(action.shape, num_envs)}"
                )
        kind = action.dtype.kind
        if self.low is None:
            if kind == "f":
                if not all_finite(action):
                    raise NonFiniteAction(action)
            elif kind not in "iub":
                raise TypeError(
                    f"action: the policy returned dtype {action.dtype} for {self.space}; "
                    "a Box action must be a real-valued tensor (floating-point, or integer)."
                )
            return action
        if kind == "f":
            if not all_finite(action):
                raise NonFiniteAction(action)
            if not np.array_equal(action, np.trunc(action)):
                raise TypeError(
                    f"action: the policy returned dtype {action.dtype} for {self.space}, with values that "
                    "are not whole numbers; discrete actions are integer indices of shape [num_envs] (argmax, "
                    "or a Categorical sample), or one-hot rows of shape [num_envs, n]; not float scores."
                )
        elif kind not in "iub":
            raise TypeError(
                f"action: the policy returned dtype {action.dtype} for {self.space}; "
                "discrete actions are integer indices of shape [num_envs] (argmax, or a "
                "Categorical sample), or one-hot rows of shape [num_envs, n]."
            )
        if action.size and not self.in_range(action if action.shape == expected else action.reshape(expected)):
            raise ValueError(
                f"action: the policy returned values outside {self.space} "
                f"(min {action.min()}, max {action.max()}; allowed {self.low}..{self.high})."
            )
        return action.astype(self.dtype) if kind == "b" else action

    def _shape_fix(self, got: tuple[int, ...], num_envs: int) -> str:
        """What to change in the policy for an action of shape ``got`` that does not fit."""
        expected = (num_envs, *self.shape)
        if not got or got[0] != num_envs:
            return (" Return one row per env: keep the first (batch) dim of the observations the "
                    "policy is given.")
        if got == (*expected, 1) and self.one_hot is not None:
            return " Discrete actions are int64 indices of shape [num_envs]: squeeze the last dim."
        if isinstance(self.space, spaces.Discrete):
            per_env = f"{got[1]} values per env" if len(got) == 2 else f"shape {list(got[1:])} per env"
            return (f" A one-hot action has shape [num_envs, {self.one_hot}], one column per action. The "
                    f"policy gave {per_env}: return one int64 index per env (an argmax over the "
                    f"{self.one_hot} actions' scores, or a Categorical sample), or one-hot rows of "
                    f"{self.one_hot} columns (a last layer with {self.one_hot} outputs).")
        if self.one_hot is not None and len(got) == 2:
            return (f" A one-hot action has shape [num_envs, {self.one_hot}], one column per action of each "
                    f"part. Return int64 indices of shape {list(expected)}, one per part, or one-hot rows of "
                    f"{self.one_hot} columns.")
        if self.shape == (1,) and got == (num_envs,):
            return " Return shape [num_envs, 1]: add the last dim (action.unsqueeze(-1))."
        if len(got) == len(expected) == 2:
            return (f" The policy gave {got[1]} values per env for an action of {self.shape[0]}: give its "
                    f"last layer {self.shape[0]} outputs.")
        return (f" Return one action of shape {list(self.shape)} per env: a tensor of shape {list(expected)} "
                f"(reshape the policy's output to it).")

    def in_range(self, action: np.ndarray) -> bool:
        """Every value of ``action`` (integers or booleans) within ``low..high``.

        With scalar bounds and an integer dtype that holds them, one comparison instead of
        two: ``action - low`` read as unsigned is at most ``high - low`` exactly for the
        values in range (the subtraction wraps around, and a value below ``low`` becomes a
        huge unsigned one). This runs on every step."""
        span = self._spans.get(action.dtype, False)
        if span is False:
            span = self._spans[action.dtype] = self._span(action.dtype)
        if span is None:
            return not ((action < self.low).any() or (action > self.high).any())
        low, width, unsigned = span
        shifted = action if low == 0 else action - low
        if shifted.size <= 64:  # (a list's max takes half the time of a numpy comparison at this size)
            return max(shifted.view(unsigned).ravel().tolist()) <= width
        return not np.count_nonzero(shifted.view(unsigned) > width)

    def _span(self, dtype: np.dtype) -> tuple[Any, int, np.dtype] | None:
        """``(low, high - low, the unsigned dtype of dtype's size)`` for ``in_range``, where it applies."""
        if dtype.kind not in "iu" or not dtype.isnative or not isinstance(self.low, int) \
                or not isinstance(self.high, int):
            return None  # (the unsigned view is native-endian: a byte-swapped array takes two comparisons)
        info = np.iinfo(dtype)
        if not info.min <= self.low <= self.high <= info.max:
            return None
        return dtype.type(self.low), self.high - self.low, np.dtype(f"u{dtype.itemsize}")

    def _check_one_hot(self, action: np.ndarray) -> np.ndarray:
        """``action``, rows read as TorchRL's ``OneHot`` specs read them: the env gets the
        index of each row's (each part's) largest value cast to an integer. For one-hot rows
        that is the 1; several 1s are a tie (a ``QValueModule``'s rows when action values are
        equal), stepped with the first. Other rows (a policy writing logits to ``"action"``, as
        TorchRL's weight-sync example does) are read the same way, with a warning, as they
        run under TorchRL; a dtype that is not a number is an error."""
        if action.dtype.kind not in "biuf":
            raise TypeError(
                f"action: the policy returned one-hot rows of dtype {action.dtype} for {self.space}; "
                "use bool, integer or float one-hot rows, or int64 indices of shape [num_envs]."
            )
        bad = np.zeros(len(action), bool)
        if action.dtype.kind != "b":
            bad |= ((action != 0) & (action != 1)).any(axis=1)
        for part in self._split(action):
            bad |= ~(part == 1).any(axis=1)
        if bad.any():
            warnings.warn(
                f"action: the policy's rows of shape [num_envs, {self.one_hot}] for {self.space} are not "
                "one-hot; they are read as TorchRL reads them, the index of the largest value cast to an "
                f"integer{' in each part' if len(self.parts) > 1 else ''}. Return one-hot rows or int64 "
                "indices (an argmax) to step the envs with the action you mean.",
                UserWarning, stacklevel=2,
            )
        return action

    def env_action(self, action: np.ndarray) -> np.ndarray:
        """What the envs are stepped with for the checked ``action``: the action itself; one-hot
        rows as the index of each row's 1 (int64, the space's ``start`` added); an action of
        another per-env shape with as many values (``[n, 1]`` for a ``Discrete`` space, ``[1]``
        for ``[1, 1]``) in the space's shape. The envs' action array (of the space's dtype)
        casts it, as a gymnasium env would take it: a ``Box`` env given the policy's integers
        gets them as floats."""
        if action.shape[1:] == self.shape:
            return action
        if self.one_hot is None or action.shape[1:] != (self.one_hot,):
            return action.reshape(len(action), *self.shape)
        action = action.astype(np.int64, copy=False)  # TorchRL's reading: val.long().argmax(-1)
        if len(self.parts) == 1:
            index = action.argmax(axis=1)
        else:
            index = np.stack([p.argmax(axis=1) for p in self._split(action)], 1)
        return index + self.low if np.any(self.low) else index

    def _split(self, action: np.ndarray) -> list[np.ndarray]:
        """One-hot rows ``[n, sum(parts)]`` cut into their parts (views), ``[n, width]`` each."""
        return np.split(action, np.cumsum(self.parts)[:-1], axis=1)

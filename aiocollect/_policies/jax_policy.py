"""``JaxPolicy``: a JAX function as a collector's policy (imported by :mod:`aiocollect.jax`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .array import ArrayPolicy


def _copy_tree(params: Any) -> Any:
    # jnp.array copies, whether the leaf is a numpy array (mutable) or a jax.Array (which
    # the trainer may donate to its next jitted step, deleting the buffer under us)
    return jax.tree.map(lambda x: jnp.array(x, copy=True), params)


class _HostSnapshots:
    """On the CPU, params live in numpy buffers that this class recycles.

    XLA reads an aligned numpy input in place, so a jitted call costs the same with numpy
    params as with ``jax.Array`` ones; but a snapshot is then one ``memcpy`` per leaf into
    a buffer allocated once (~60 us for 4 MB), where a fresh JAX copy pays for new memory
    (~500 us for 4 MB). A buffer comes back when the params it held are replaced: calls are
    synchronous (the outputs are read before the next call), so nothing reads it any more.
    """

    def __init__(self) -> None:
        self._free: list[list[np.ndarray]] = []
        self._lock = threading.Lock()

    def copy(self, params: Any) -> Any:
        leaves, tree = jax.tree.flatten(params)
        with self._lock:
            bufs = self._free.pop() if self._free else None
        sources = [np.asarray(leaf) for leaf in leaves]  # a view of a jax.Array on the CPU
        if bufs is None or any(b.shape != s.shape or b.dtype != s.dtype for b, s in zip(bufs, sources)):
            bufs = [np.empty_like(s) for s in sources]
        for b, s in zip(bufs, sources):
            np.copyto(b, s)
        return jax.tree.unflatten(tree, bufs)

    def recycle(self, params: Any) -> None:
        with self._lock:
            if len(self._free) < 2:
                self._free.append(jax.tree.leaves(params))


def _as_key(key: Any) -> Any:
    if key is None:
        return None
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        return jax.random.key(int(key))
    return key


class JaxPolicy(ArrayPolicy):
    """A JAX policy: ``apply_fn(params, *inputs)`` returns the output(s), jitted once.

    Args:
        apply_fn: a pure function. Deterministic: ``apply_fn(params, *inputs)``;
            stochastic (``key`` given): ``apply_fn(params, key, *inputs)``. ``inputs`` are
            the observations named by ``in_keys``, batch dim first; it returns one array
            per ``out_keys`` entry (a single array, or a tuple), batch dim first. A flax
            module's ``apply`` fits as it is (``JaxPolicy(model.apply, variables)``).
        params: a pytree of arrays. It is copied: change yours freely afterwards.
        in_keys: the observation keys passed to ``apply_fn``, in order.
        out_keys: the keys its outputs are stored under; ``"action"`` is required.
        key: a PRNG key (``jax.random.key(0)``) or an int seed, for stochastic policies.
            The policy threads it: each call splits it, hands one half to ``apply_fn``
            and keeps the other for the next call, inside the same jitted function, so
            every step draws fresh randomness and a seeded policy replays exactly.

    In a collector the policy is called with the observation buffers themselves (on CPU,
    XLA reads them where they are: no copy) and its outputs are read in place. Update its
    weights with ``collector.update_policy_weights_(new_params)`` (a pytree like
    ``params``): versioned and non-blocking as for torch policies.
    """

    def __init__(self, apply_fn: Callable[..., Any], params: Any, *, in_keys: Sequence = ("observation",),
                 out_keys: Sequence = ("action",), key: Any = None):
        if not callable(apply_fn):
            raise TypeError(f"apply_fn must be callable (apply_fn(params, *inputs)), got {type(apply_fn).__name__}.")
        self.in_keys, self.out_keys = list(in_keys), list(out_keys)
        if not self.in_keys:
            raise ValueError("in_keys: give at least one observation key, e.g. ['observation'].")
        if "action" not in self.out_keys:
            raise ValueError(f"out_keys={self.out_keys}: one output must be 'action'.")
        self.apply_fn = apply_fn
        self._host = _HostSnapshots() if jax.default_backend() == "cpu" else None
        self.params = self._copy(params)
        self._key = _as_key(key)
        self.stochastic = key is not None
        self._jitted = jax.jit(self._step)

    def _step(self, params: Any, key: Any, *inputs: Any) -> tuple[tuple, Any]:
        if self.stochastic:
            key, sub = jax.random.split(key)
            out = self.apply_fn(params, sub, *inputs)
        else:
            out = self.apply_fn(params, *inputs)
        return (tuple(out) if isinstance(out, (tuple, list)) else (out,)), key

    def __call__(self, *arrays: Any) -> tuple[np.ndarray, ...]:
        """The outputs for a batch of inputs, as numpy arrays (read-only views of XLA's buffers)."""
        outs, self._key = self._jitted(self.params, self._key, *arrays)
        return tuple(np.asarray(o) for o in outs)

    # ArrayPolicy: weights --------------------------------------------------------------

    @property
    def weights(self) -> Any:
        return self.params

    def _copy(self, params: Any) -> Any:
        return _copy_tree(params) if self._host is None else self._host.copy(params)

    def snapshot(self, weights: Any) -> Any:
        if isinstance(weights, JaxPolicy):
            weights = weights.params
        new, old = jax.tree.structure(weights), jax.tree.structure(self.params)
        if new != old:
            raise ValueError(
                f"update_policy_weights_: the params pytree has structure {new}, the policy's "
                f"is {old}; pass params of the same model."
            )
        for a, b in zip(jax.tree.leaves(weights), jax.tree.leaves(self.params)):
            if np.shape(a) != np.shape(b):
                raise ValueError(
                    f"update_policy_weights_: a params leaf has shape {np.shape(a)}, the policy's has "
                    f"{np.shape(b)}."
                )
        return self._copy(weights)

    def load(self, snap: Any) -> None:
        old, self.params = self.params, snap
        if self._host is not None:
            self._host.recycle(old)

    def copy(self) -> JaxPolicy:
        twin = object.__new__(JaxPolicy)
        twin.__dict__.update(self.__dict__)
        twin._host = _HostSnapshots() if self._host is not None else None
        twin.params = twin._copy(self.params)
        twin._jitted = jax.jit(twin._step)
        return twin

    def __repr__(self) -> str:
        name = getattr(self.apply_fn, "__qualname__", type(self.apply_fn).__name__)
        return f"JaxPolicy({name}, in_keys={self.in_keys}, out_keys={self.out_keys}, stochastic={self.stochastic})"

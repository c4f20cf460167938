"""``JaxPolicy``: a JAX function as a collector's policy (imported by :mod:`aiocollect.jax`)."""

from __future__ import annotations

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
        self.params = _copy_tree(params)
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

    def snapshot(self, weights: Any) -> Any:
        if isinstance(weights, JaxPolicy):
            weights = weights.params
        new = _copy_tree(weights)
        old = jax.tree.structure(self.params)
        if jax.tree.structure(new) != old:
            raise ValueError(
                f"update_policy_weights_: the params pytree has structure {jax.tree.structure(new)}, "
                f"the policy's is {old}; pass params of the same model."
            )
        for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(self.params)):
            if a.shape != b.shape:
                raise ValueError(
                    f"update_policy_weights_: a params leaf has shape {a.shape}, the policy's has {b.shape}."
                )
        return new

    def load(self, snap: Any) -> None:
        self.params = snap

    def copy(self) -> JaxPolicy:
        twin = object.__new__(JaxPolicy)
        twin.__dict__.update(self.__dict__)
        twin.params = _copy_tree(self.params)
        twin._jitted = jax.jit(twin._step)
        return twin

    def __repr__(self) -> str:
        name = getattr(self.apply_fn, "__qualname__", type(self.apply_fn).__name__)
        return f"JaxPolicy({name}, in_keys={self.in_keys}, out_keys={self.out_keys}, stochastic={self.stochastic})"

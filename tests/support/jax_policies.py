"""JAX policy functions for the tests of a ``JaxPolicy`` in the workers: in a module of their own
(importing JAX alone), which each worker imports to unpickle them (cloudpickle pickles a
module's functions by reference)."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np


def mlp_params(seed: int = 0, sizes: tuple = (4, 16, 2)) -> list[dict]:
    """A pytree of params: a list of layers, each a dict of numpy arrays."""
    rng = np.random.default_rng(seed)
    return [{"w": rng.normal(size=(a, b)).astype(np.float32), "b": rng.normal(size=(b,)).astype(np.float32)}
            for a, b in itertools.pairwise(sizes)]


def mlp_logits(params: list[dict], obs):
    x = obs
    for i, layer in enumerate(params):
        x = x @ layer["w"] + layer["b"]
        if i < len(params) - 1:
            x = jnp.tanh(x)
    return x


def mlp_apply(params: list[dict], obs):
    """Two outputs: the logits and the action, their argmax."""
    logits = mlp_logits(params, obs)
    return logits, jnp.argmax(logits, axis=-1)


def noisy_apply(params, key, obs):
    """A stochastic policy: a uniform random action in {0, 1}, from the key it is given."""
    return jax.random.randint(key, obs.shape[:1], 0, 2)


def int_leaf_apply(params: dict, obs):
    """An action from a float leaf ``b`` and an int leaf ``k``: 1 where ``b + k > 0``."""
    return jnp.broadcast_to((params["b"] + params["k"].astype(jnp.float32)) > 0, obs.shape[:1]).astype(jnp.int32)

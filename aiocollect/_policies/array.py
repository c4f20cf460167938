"""``ArrayPolicy``: the shape of a policy computed outside torch (JAX, see [`aiocollect.jax`][aiocollect.jax]).

The engine calls it with numpy arrays, one per ``in_keys`` entry, batch dim first, and
takes back one array per ``out_keys`` entry. On the CPU both directions share memory:
the observation buffers are handed over as they are and the outputs read in place.
Weight updates go through the same versioned channel as torch policies
(``_policies.weights``): the policy says how to snapshot new weights and how to load one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class ArrayPolicy:
    """Base of policies that map numpy arrays to numpy arrays; subclasses implement the four methods."""

    in_keys: list
    out_keys: list
    @property
    def accelerated(self) -> bool:
        """Whether its calls run on an accelerator (a GPU): the worker collectors then split
        workers in parts more readily, to hide each call's wait (``_workers.plan.pipeline``)."""
        return False

    def __call__(self, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
        raise NotImplementedError

    @property
    def weights(self) -> Any:
        """The weights in use (what ``update_policy_weights_()`` with no argument takes)."""
        raise NotImplementedError

    def snapshot(self, weights: Any) -> Any:
        """A copy of ``weights`` that the caller's later changes cannot reach."""
        raise NotImplementedError

    def load(self, snap: Any) -> None:
        """Use ``snap`` (from ``snapshot()``) from the next call on."""
        raise NotImplementedError

    @property
    def worker_actor(self) -> str | None:
        """``"module:Class"`` of the actor a worker process builds to act with a copy of it
        (``_policies.actor``: the policy in the workers), or ``None``: it acts only here, in
        the main process (the default; a JAX policy off the CPU)."""
        return None

    def worker_config(self) -> dict:
        """What a worker's actor needs besides the pickled policy to compute what it computes
        here (``worker_actor``; JAX: whether 64-bit types are on)."""
        return {}

    def weight_arrays(self, weights: Any = None) -> list[np.ndarray]:
        """The leaves of ``weights`` (``None``: the weights in use) as numpy arrays, in a fixed
        order: the fields of the weights' board when copies act in the workers
        (``_policies.weights_board``). Checked as ``snapshot`` checks them."""
        raise NotImplementedError

    def share(self, arrays: list[np.ndarray]) -> None:
        """Copy the weights in use into ``arrays`` (``weight_arrays``' order and shapes), then
        act with ``arrays`` themselves as its weights (the board's views: each version
        published there is in use here at once)."""
        raise NotImplementedError

    def prepare(self, rows: Sequence[int], inputs: Sequence[tuple[np.dtype, tuple[int, ...]]]) -> None:
        """Get ready for calls over each of ``rows`` envs, with inputs of these (dtype, per-env
        shape): a collector gives every row count its rounds can have, once, at start,
        for an ``accelerated`` policy (JAX compiles one program per shape). Optional."""

    def copy(self) -> ArrayPolicy:
        """An independent policy with the same function and a snapshot of the weights:
        the collector runs its own copy, so the trainer's changes reach it only through
        ``update_policy_weights_``."""
        raise NotImplementedError

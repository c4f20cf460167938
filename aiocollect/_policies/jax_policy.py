"""``JaxPolicy``: a JAX function as a collector's policy (imported by [`aiocollect.jax`][aiocollect.jax])."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .array import ArrayPolicy

logger = logging.getLogger("aiocollect")


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


def _jit_step(apply_fn: Callable[..., Any], stochastic: bool) -> Callable[..., Any]:
    """``apply_fn`` jitted, with the PRNG key threaded through when ``stochastic``. XLA
    compiles it once per input shape, so once per distinct row count of the policy calls."""

    def step(params: Any, key: Any, *inputs: Any) -> tuple[tuple, Any]:
        if stochastic:
            key, sub = jax.random.split(key)
            out = apply_fn(params, sub, *inputs)
        else:
            out = apply_fn(params, *inputs)
        return (tuple(out) if isinstance(out, (tuple, list)) else (out,)), key

    return jax.jit(step)


class JaxPolicy(ArrayPolicy):
    """A JAX policy: ``apply_fn(params, *inputs)`` returns the output(s), jitted once.

    Use it as the ``policy`` of any collector to act with a JAX model (a pure function and
    its params, or a flax module's ``apply`` and variables); batches go to a JAX learner
    with [`to_jax`][aiocollect.jax.to_jax].

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
    ``params``): versioned and non-blocking as for torch policies. JAX's default integer is
    int32, so discrete actions come out as int32 (TorchRL's are int64).

    Raises:
        TypeError: ``apply_fn`` is not callable.
        ValueError: ``in_keys`` is empty, or ``out_keys`` has no ``"action"``.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from aiocollect.jax import JaxPolicy
        >>> def apply(params, obs):                       # obs: [batch, 4]
        ...     return jnp.argmax(obs @ params["w"] + params["b"], axis=-1)
        >>> policy = JaxPolicy(apply, {"w": jnp.zeros((4, 2)), "b": jnp.zeros(2)})
        >>> collector = Collector([lambda: gym.make("CartPole-v1")] * 4, policy, frames_per_batch=400)

        A stochastic policy gets a fresh subkey at every call:

        >>> policy = JaxPolicy(lambda p, key, obs: jax.random.categorical(key, obs @ p["w"]),
        ...                    params, key=0)
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
        """The function given, unjitted."""
        self._host = _HostSnapshots() if jax.default_backend() == "cpu" else None
        self.params = self._copy(params)
        """The params in use: a copy of those given, replaced at each weight update (on the
        CPU, numpy buffers that the policy recycles)."""
        self._key = _as_key(key)
        self.stochastic = key is not None
        """Whether ``apply_fn`` takes a PRNG key (``key`` was given)."""
        self._jitted = _jit_step(apply_fn, self.stochastic)

    def __call__(self, *arrays: Any) -> tuple[np.ndarray, ...]:
        """The outputs for a batch of inputs, as numpy arrays (read-only views of XLA's buffers).

        A stochastic policy splits its key at each call, so each call draws fresh randomness.

        Args:
            *arrays: one array per ``in_keys`` entry, batch dim first.

        Returns:
            One array per ``out_keys`` entry, batch dim first.
        """
        outs, self._key = self._jitted(self.params, self._key, *arrays)
        return tuple(np.asarray(o) for o in outs)

    def prepare(self, rows: Sequence[int], inputs: Sequence[tuple[np.dtype, tuple[int, ...]]]) -> None:
        """Compile for each of ``rows`` now, several at once (XLA compiles outside the GIL),
        rather than at the first call of each row count, inside the collection (where each
        compile of a convolutional network on a GPU can take a second or more). The calls
        run on zeros and their outputs are dropped; the key does not move. A call that
        fails here is left for the real one to report, with its context.

        Args:
            rows: the row counts to compile for.
            inputs: (dtype, per-row shape) of each ``in_keys`` entry, in order.
        """
        def warm(n: int) -> None:
            arrays = [np.zeros((n, *shape), dtype) for dtype, shape in inputs]
            try:
                outs, _ = self._jitted(self.params, self._key, *arrays)
                jax.block_until_ready(outs)
            except Exception as exc:  # noqa: BLE001 - the real call reports it
                logger.debug("aiocollect: compiling %r for %d rows failed: %s", self, n, exc)

        if rows:
            with ThreadPoolExecutor(min(len(rows), os.cpu_count() or 1), "aiocollect-jax-compile") as pool:
                list(pool.map(warm, rows))

    # ArrayPolicy: weights --------------------------------------------------------------

    @property
    def accelerated(self) -> bool:
        """Whether JAX computes it off the CPU (its default backend is a GPU or TPU)."""
        return self._host is None

    @property
    def weights(self) -> Any:
        """The params in use (``params``): what ``update_policy_weights_()`` without an argument sends."""
        return self.params

    def _copy(self, params: Any) -> Any:
        return _copy_tree(params) if self._host is None else self._host.copy(params)

    def snapshot(self, weights: Any) -> Any:
        """A copy of ``weights`` that later changes to them cannot reach (for ``load``).

        Called by ``update_policy_weights_`` in the caller's thread; a jitted step may
        then donate or change the caller's arrays freely.

        Args:
            weights: a params pytree with the structure and leaf shapes of ``params``, or
                a ``JaxPolicy`` (its params).

        Returns:
            The copy.

        Raises:
            ValueError: the pytree structure or a leaf's shape differs from ``params``', or a
                leaf's dtype is of another kind (a float for an int leaf).
        """
        return self._copy(self._checked(weights))

    def _checked(self, weights: Any) -> Any:
        """``weights`` (a ``JaxPolicy``'s params) as ``snapshot`` checks them."""
        if isinstance(weights, JaxPolicy):
            weights = weights.params
        new, old = jax.tree.structure(weights), jax.tree.structure(self.params)
        if new != old:  # type: ignore[operator]  # (jax's PyTreeDef compares; its stub does not say so)
            raise ValueError(
                f"update_policy_weights_: the params pytree has structure {new}, the policy's "
                f"is {old}; pass params of the same model."
            )
        paths = jax.tree_util.tree_flatten_with_path(self.params)[0]
        for a, (path, b) in zip(jax.tree.leaves(weights), paths):
            where = jax.tree_util.keystr(path) or "the params"
            if np.shape(a) != np.shape(b):
                raise ValueError(
                    f"update_policy_weights_: params leaf {where} has shape {np.shape(a)}, the policy's has "
                    f"{np.shape(b)}."
                )
            new_dtype, dtype = np.result_type(a), np.result_type(b)
            if not np.can_cast(new_dtype, dtype, "same_kind"):  # (float into int: refused, wherever it acts)
                raise ValueError(
                    f"update_policy_weights_: params leaf {where} is {new_dtype}, the policy's is {dtype}; "
                    f"pass it as {dtype} (e.g. `.astype({dtype.name})`)."
                )
        return weights

    # ArrayPolicy: copies in the workers ------------------------------------------------

    @property
    def worker_actor(self) -> str | None:
        """On the CPU, a worker process can act with a copy (``_policies.jax_worker``: the
        collectors' ``policy_placement``); on a GPU or TPU it acts only here, batched."""
        return None if self.accelerated else "aiocollect._policies.jax_worker:JaxWorkerActor"

    def worker_config(self) -> dict:
        """JAX's settings a worker's copy must share to compute the same outputs (their
        dtypes: ``jax_enable_x64``)."""
        return {"x64": bool(jax.config.read("jax_enable_x64"))}

    def weight_arrays(self, weights: Any = None) -> list[np.ndarray]:
        """The params' leaves (``jax.tree.leaves`` order) as numpy arrays: the fields of the
        weights' board (``_policies.weights_board``) when copies act in the workers.

        Args:
            weights: a params pytree (checked as ``snapshot`` checks it), or ``None``: ``params``.
        """
        tree = self.params if weights is None else self._checked(weights)
        return [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]

    def share(self, arrays: list[np.ndarray]) -> None:
        """Copy ``params`` into ``arrays`` (``weight_arrays``' order), then use ``arrays``
        themselves as ``params``: the board's views, where each published version is in use
        at once (XLA reads them in place, under the weights' lock)."""
        for dst, src in zip(arrays, self.weight_arrays()):
            np.copyto(dst, src)
        self.params = jax.tree.unflatten(jax.tree.structure(self.params), list(arrays))

    def load(self, snap: Any) -> None:
        """Use ``snap`` (from ``snapshot``) as ``params`` from the next call on.

        Called by the collector between two policy calls.

        Args:
            snap: what ``snapshot`` returned.
        """
        old, self.params = self.params, snap
        if self._host is not None:
            self._host.recycle(old)

    def copy(self) -> JaxPolicy:
        """An independent policy with the same function and a copy of the params.

        A collector runs such a copy, so changes to your ``JaxPolicy``'s params reach it
        only through ``update_policy_weights_``. The copy calls the same jitted function:
        what either compiled (once per batch shape) serves both.

        Returns:
            The new ``JaxPolicy``; a stochastic one starts from the same key.
        """
        twin = object.__new__(JaxPolicy)
        twin.__dict__.update(self.__dict__)
        twin._host = _HostSnapshots() if self._host is not None else None
        twin.params = twin._copy(self.params)
        # the same jitted function: what it compiled (once per batch shape) serves every copy
        twin._jitted = self._jitted
        return twin

    def __getstate__(self) -> dict:
        """What pickling keeps (a policy sent to a remote collector): the function, the params
        and the key; the jitted function and the snapshot pool are made anew where it lands."""
        state = dict(self.__dict__)
        del state["_jitted"], state["_host"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._host = _HostSnapshots() if jax.default_backend() == "cpu" else None
        self._jitted = _jit_step(self.apply_fn, self.stochastic)

    def __repr__(self) -> str:
        name = getattr(self.apply_fn, "__qualname__", type(self.apply_fn).__name__)
        return f"JaxPolicy({name}, in_keys={self.in_keys}, out_keys={self.out_keys}, stochastic={self.stochastic})"

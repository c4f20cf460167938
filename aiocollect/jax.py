"""JAX interop: JAX policies in any collector, and batches handed to JAX without a copy.

Install JAX first: the ``jax`` extra (``pip install -e ".[jax]"`` in a checkout), or
``pip install jax``. ``import aiocollect`` never imports JAX; ``import aiocollect.jax``
without JAX raises an ``ImportError`` that names the extra.

A JAX policy is a pure function and its params:

```python
import gymnasium as gym
import jax, jax.numpy as jnp
from aiocollect import MultiSyncCollector
from aiocollect.jax import JaxPolicy, to_jax

def apply(params, obs):                       # obs: [batch, 4]
    return jnp.argmax(obs @ params["w"] + params["b"], axis=-1)

params = {"w": jnp.zeros((4, 2)), "b": jnp.zeros(2)}
policy = JaxPolicy(apply, params)             # jitted once; in_keys=["observation"]
collector = MultiSyncCollector([lambda: gym.make("CartPole-v1")] * 2, policy,
                               frames_per_batch=200, total_frames=20_000)
for batch in collector:
    data = to_jax(batch)                      # nested dict of jax.Arrays, same memory
    params = train_step(params, data)         # your JAX learner
    collector.update_policy_weights_(params)  # non-blocking, versioned
```

A flax module works as it is: ``JaxPolicy(model.apply, variables)``. A stochastic policy
takes a key: ``JaxPolicy(lambda p, k, obs: jax.random.categorical(k, obs @ p), params,
key=0)`` gets a fresh subkey at every step (see [`JaxPolicy`][aiocollect.jax.JaxPolicy]).

**No copies on the CPU.** Observations reach the jitted function as the collector's own
buffers (XLA reads an aligned numpy buffer in place; measured: the call costs the same for
256 B and 256 MB of input), and the outputs are read as numpy views of XLA's buffers.
[`to_jax`][aiocollect.jax.to_jax] and [`from_jax`][aiocollect.jax.from_jax] go through DLPack and share
memory both ways.

**64-bit leaves.** With JAX's default ``jax_enable_x64=False`` JAX has no int64: the
``int64`` leaves of a batch (``("collector", "traj_ids")``, ``step_count``,
``policy_version``, int64 actions) are converted to int32 by JAX, which copies them. Every
float and bool leaf is shared. Enable x64 (``jax.config.update("jax_enable_x64", True)``)
to share those too.
"""

from __future__ import annotations

try:
    import jax
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "aiocollect.jax needs JAX, which is not installed: install the extra with "
        "pip install 'aiocollect[jax]' (or pip install jax)."
    ) from exc

from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from ._policies.jax_policy import JaxPolicy

__all__ = ["JaxPolicy", "from_jax", "to_jax"]


def to_jax(batch: TensorDictBase) -> dict[str, Any]:
    """``batch`` as a nested dict of ``jax.Array`` that share its memory (through DLPack).

    Nested keys become nested dicts (``out["next"]["observation"]``). Leaves that are not
    contiguous are made contiguous first (a copy of that leaf only). With JAX's default
    ``jax_enable_x64=False``, int64 leaves (``("collector", "traj_ids")``, ``step_count``,
    ``policy_version``, int64 actions) are converted to int32, which copies them; every
    float and bool leaf is shared.

    Args:
        batch: a TensorDict, such as a collected batch.

    Returns:
        A nested dict of ``jax.Array``, keyed as ``batch``; batch dims stay leading dims.

    Raises:
        TypeError: ``batch`` is not a TensorDict.

    Examples:
        >>> for batch in collector:
        ...     data = to_jax(batch)
        ...     obs, reward = data["observation"], data["next"]["reward"]   # [..., T, 4], [..., T, 1]
        ...     params = train_step(params, data)
    """
    if not isinstance(batch, TensorDictBase):
        raise TypeError(f"to_jax: expected a TensorDict (a collected batch), got {type(batch).__name__}.")
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if isinstance(value, TensorDictBase):
            out[key] = to_jax(value)
        else:
            out[key] = jax.dlpack.from_dlpack(value.detach().contiguous())
    return out


def from_jax(tree: dict[str, Any], batch_size: Any = None, *, names: list | None = None) -> TensorDict:
    """A TensorDict whose tensors share memory with the ``jax.Array`` leaves of ``tree``.

    The way back from [`to_jax`][aiocollect.jax.to_jax], through DLPack: for a learner's
    outputs (advantages, new log-probabilities) that should join a TorchRL pipeline.
    JAX arrays are immutable: do not write into the tensors (copy them with ``.clone()``
    first).

    Args:
        tree: a nested dict of ``jax.Array`` (what ``to_jax`` returns, or a learner's
            outputs).
        batch_size: the TensorDict's batch size; by default, the leading dims all leaves
            share.
        names: dim names to set, e.g. ``[None, "time"]`` as in a collected batch.

    Returns:
        A ``TensorDict``, nested as ``tree``.

    Raises:
        TypeError: ``tree`` is not a dict.

    Examples:
        >>> data = to_jax(batch)                              # [4, 100]
        >>> td = from_jax({"advantage": gae(data)}, batch.batch_size, names=[None, "time"])
        >>> batch.update(td)
    """
    if not isinstance(tree, dict):
        raise TypeError(f"from_jax: expected a nested dict of jax.Arrays, got {type(tree).__name__}.")

    def convert(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: convert(v) for k, v in node.items()}
        return torch.from_dlpack(node)

    tensors = convert(tree)
    td = TensorDict(tensors, batch_size=[] if batch_size is None else batch_size)
    if batch_size is None:
        td.auto_batch_size_()
    if names is not None:
        td.refine_names(*names)
    return td

"""A policy's outputs as the engine takes them: a module's return value mapped to its
``out_keys``, and the check every output passes at a lane's first call.

Kept apart from ``_policies.runner`` so that a worker acting with its own copy of a plain
module (``_policies.worker_actor``) maps and checks its outputs exactly as the engine does,
without importing tensordict (a second or more of each worker's start on a small machine).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

NUMPY_DTYPES = frozenset((torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                          torch.float16, torch.float32, torch.float64))
"""The torch dtypes numpy has (so numpy, and shared memory, can hold them)."""


def module_outputs(result: Any, out_keys: list) -> dict:
    """``result``, what a ``TensorDictModule``'s module returned, as ``{out_key: value}``,
    as ``TensorDictModule.forward`` maps it: a mapping holding every out key is read by key
    (a ``TensorDict`` is one), a tuple by position, anything else is the one output; an out
    key ``"_"`` drops its value."""
    if isinstance(result, Mapping) and all(k in result for k in out_keys):
        result = tuple(result[k] for k in out_keys)
    if not isinstance(result, tuple):
        result = (result,)
    if len(result) != len(out_keys):
        raise RuntimeError(f"policy: the module returned {len(result)} tensor(s) for out_keys {out_keys}.")
    return {k: v for k, v in zip(out_keys, result) if k != "_"}


def check_outputs(out: dict, num_envs: int) -> None:
    """Each output is a tensor or array with one row per env, holding data.

    Called on a lane's first policy call (the outputs' keys, shapes and dtypes are then
    fixed for the batch), so a policy that returns something the storage cannot hold
    fails there, with the output's name, rather than deep inside a copy.
    """
    for key, value in out.items():
        name = key if isinstance(key, str) else ".".join(key)
        if isinstance(value, torch.Tensor):
            if value.device.type == "meta" or value.is_sparse:
                raise TypeError(
                    f"{name}: the policy returned a {value.layout if value.is_sparse else 'meta'} tensor, "
                    "which holds no data; return a dense tensor on the CPU or a GPU."
                )
        elif not isinstance(value, np.ndarray) and not hasattr(value, "__array__"):
            raise TypeError(f"{name}: the policy returned a {type(value).__name__}; return a tensor.")
        shape = tuple(value.shape)
        if not shape or shape[0] != num_envs:
            raise ValueError(
                f"{name}: the policy returned shape {list(shape)} for {num_envs} env(s); every output "
                f"needs a first dim of {num_envs} (one row per env)."
            )


def shape_changed(key: Any, shape: tuple, first: tuple) -> ValueError:
    """The error for output ``key`` of per-env shape ``shape`` where its first call wrote
    ``first``: the storage was laid out from that call, and numpy would broadcast a shape of
    1 into it without a word."""
    name = key if isinstance(key, str) else ".".join(key)
    return ValueError(f"{name}: the policy returned shape {list(shape)} per env here, {list(first)} at its first "
                      "call; a policy's outputs keep their shape.")


def dtype_changed(key: Any, dtype: Any, first: Any) -> TypeError | None:
    """The error for output ``key`` of dtype ``dtype`` where the batch holds ``first`` (its
    first call's), if the cast would change its kind (complex to real, float to int: what
    numpy, or torch for a dtype numpy lacks such as bfloat16, does with at most a warning);
    ``None`` for a cast within a kind (float64 to float32, as a batch keeps it). Both numpy
    dtypes, or both torch dtypes."""
    if isinstance(first, torch.dtype):
        if torch.can_cast(dtype, first):
            return None
        dtype, first = str(dtype).removeprefix("torch."), str(first).removeprefix("torch.")
    elif np.can_cast(dtype, first, "same_kind"):
        return None
    name = key if isinstance(key, str) else ".".join(key)
    return TypeError(f"{name}: the policy returned dtype {dtype} here, {first} at its first call; the batch "
                     f"holds {first}, and {dtype} does not cast to it without changing kind. Return {first} "
                     "at every step.")


def host_array(value: torch.Tensor) -> np.ndarray:
    """An output tensor as numpy holds it: a view where it can be (a CPU tensor); a dtype
    numpy lacks (bfloat16, float8: autocast) as float32."""
    try:
        return value.numpy(force=True)
    except TypeError:
        return value.float().numpy(force=True)


_SHAPE_ERRORS = re.compile(
    r"mat1 and mat2 shapes cannot be multiplied|size mismatch|must match the size of tensor"
    r"|expected input\S* .*to have \d+ channels|Expected \d+D \(unbatched\) or \d+D \(batched\) input"
)
"""torch's own messages for an input of the wrong shape (a linear or conv layer, a broadcast)."""


def is_shape_error(exc: BaseException) -> bool:
    """Whether ``exc``, raised by a policy's call, is torch's complaint about its input's
    shape (``mat1 and mat2 shapes cannot be multiplied``, ``size mismatch``, ``must match the
    size of tensor``, a conv layer's channels), not any error that mentions a shape (a
    distribution's validation of its parameters on zeros)."""
    return isinstance(exc, RuntimeError) and _SHAPE_ERRORS.search(str(exc)) is not None


def note_policy_inputs(exc: BaseException, obs: Mapping, num_envs: int, where: str = "") -> None:
    """Add to ``exc``, raised by a policy's first call, what it was called with: the
    observation keys, shapes and dtypes of ``num_envs`` envs (``where``: whose envs), so the
    error says it was the policy, and what does not fit."""
    inputs = ", ".join(f"{k!r}: {list(v.shape)} {str(v.dtype).removeprefix('torch.')}" for k, v in obs.items())
    fix = (" The policy does not take the envs' observations: give its first layer the observations' last "
           "dim, or have it read the keys it takes (in_keys)." if is_shape_error(exc) else "")
    exc.add_note(f"aiocollect: raised by the policy, called on the observations of {num_envs} env(s){where} "
                 f"({inputs}).{fix}")

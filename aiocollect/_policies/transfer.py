"""A policy's inputs and outputs across the bus to a GPU: pinned buffers, one wait per call.

With ``policy_device="cuda"`` every policy call moves the observations to the GPU and the
outputs back. Copies from ordinary (pageable) host memory are synchronous: the driver
stages them through a pinned buffer of its own, one field at a time. Here:

* **inputs**: each observation block (a view of the shared rollout storage) is copied by
  numpy, on this thread, into a page-locked buffer from torch's caching host allocator,
  then sent with ``non_blocking=True``. The allocator records the copy's event, so a
  buffer is handed out again only once its copy is done;
* **outputs**: each output is queued back into a page-locked buffer with
  ``non_blocking=True``, and the call waits **once**, on the stream, for all of them (the
  actions are needed on the host before the envs can step).

A policy on another kind of device (``"mps"``...) keeps plain ``.to()`` copies.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .._envs.spaces import NestedKey

_NUMPY = frozenset((torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                    torch.float16, torch.float32, torch.float64))


def inputs_to(device: torch.device, obs: dict[NestedKey, torch.Tensor]) -> dict[NestedKey, torch.Tensor]:
    """``obs`` on ``device`` (see the module docstring)."""
    if device.type != "cuda":
        return {k: v.to(device, non_blocking=True) for k, v in obs.items()}
    out = {}
    for key, value in obs.items():
        if value.device.type == "cpu":
            value = _pinned(value)
        out[key] = value.to(device, non_blocking=True)
    return out


def inputs_into(targets: dict[NestedKey, torch.Tensor], obs: dict[NestedKey, torch.Tensor]) -> None:
    """Copy ``obs`` into ``targets``, tensors of the same shapes on a CUDA device (a CUDA
    graph's inputs, ``_policies.graphs``), as ``inputs_to`` moves them: host values through
    pinned buffers, every copy queued on the current stream."""
    for key, value in obs.items():
        targets[key].copy_(_pinned(value) if value.device.type == "cpu" else value, non_blocking=True)


def _pinned(value: torch.Tensor) -> torch.Tensor:
    """A page-locked copy of the host tensor ``value``, from torch's caching host allocator
    (which records the copy that reads it before handing the buffer out again)."""
    pinned = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
    if value.dtype in _NUMPY:
        np.copyto(pinned.numpy(), value.numpy())  # one thread (torch's copy may use OpenMP's)
    else:
        pinned.copy_(value)
    return pinned


def outputs_from(device: torch.device, out: dict[NestedKey, Any]) -> dict[NestedKey, Any]:
    """The tensors of ``out`` on the host (see the module docstring)."""
    if device.type != "cuda":
        return {k: v.to("cpu") if isinstance(v, torch.Tensor) else v for k, v in out.items()}
    host: dict[NestedKey, Any] = {}
    waited = False
    for key, value in out.items():
        if isinstance(value, torch.Tensor) and value.device.type == "cuda":
            pinned = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
            pinned.copy_(value, non_blocking=True)
            value, waited = pinned, True
        elif isinstance(value, torch.Tensor) and value.device.type != "cpu":
            value = value.to("cpu")
        host[key] = value
    if waited:
        torch.cuda.current_stream(device).synchronize()
    return host

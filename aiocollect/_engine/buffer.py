"""The rollout buffer: one batch, preallocated, written column by column.

Every entry is a torch tensor of shape ``[num_envs, T, ...]`` allocated once per batch;
the engine writes step ``t`` into column ``t`` through numpy views of those tensors (a
numpy slice assignment costs a fraction of a torch one), and the finished batch becomes
a TensorDict without copying anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from .._envs.spaces import Leaf, NestedKey, nest


@dataclass(frozen=True)
class OutputSpec:
    """Per-env shape and dtype of one policy output."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @classmethod
    def of(cls, value: Any) -> OutputSpec:
        if isinstance(value, np.ndarray):  # possibly read-only (a JAX output): no tensor
            return cls(tuple(value.shape[1:]), torch.from_numpy(np.empty(0, value.dtype)).dtype)
        t = torch.as_tensor(value)
        return cls(tuple(t.shape[1:]), t.dtype)


def _as_numpy(t: torch.Tensor) -> np.ndarray | None:
    try:
        return t.numpy()
    except TypeError:  # dtypes numpy lacks (bfloat16...)
        return None


class RolloutBuffer:
    """Storage for one ``[num_envs, T]`` batch in TorchRL's layout."""

    def __init__(
        self,
        obs_leaves: list[Leaf],
        outputs: dict[NestedKey, OutputSpec],
        num_envs: int,
        frames: int,
        *,
        step_count: bool,
        mask: bool,
    ):
        n, t = num_envs, frames
        self.num_envs, self.frames = n, t
        self.outputs = dict(outputs)

        def empty(shape, dtype):
            return torch.empty((n, t, *shape), dtype=dtype)

        self.tensors: dict[NestedKey | tuple, torch.Tensor] = {}
        for leaf in obs_leaves:
            dtype = torch.from_numpy(np.zeros((), leaf.dtype)).dtype
            self.tensors[leaf.key] = empty(leaf.shape, dtype)
            self.tensors[("next", leaf.key)] = empty(leaf.shape, dtype)
        for key, spec in outputs.items():
            self.tensors[key] = empty(spec.shape, spec.dtype)
        for flag in ("done", "terminated", "truncated"):
            self.tensors[flag] = torch.zeros((n, t, 1), dtype=torch.bool)
            self.tensors[("next", flag)] = empty((1,), torch.bool)
        self.tensors[("next", "reward")] = empty((1,), torch.float32)
        self.tensors[("collector", "traj_ids")] = empty((), torch.int64)
        self.tensors[("collector", "policy_version")] = empty((), torch.int64)
        if step_count:
            self.tensors["step_count"] = empty((1,), torch.int64)
            self.tensors[("next", "step_count")] = empty((1,), torch.int64)
        if mask:
            self.tensors[("collector", "mask")] = torch.zeros((n, t), dtype=torch.bool)

        view = {k: _as_numpy(v) for k, v in self.tensors.items()}
        # (destination column source) pairs the engine walks every step
        self.root_obs = [view[leaf.key] for leaf in obs_leaves]
        self.next_obs = [view[("next", leaf.key)] for leaf in obs_leaves]
        self.out_np = {k: view[k] for k in outputs}
        self.out_torch = {k: self.tensors[k] for k in outputs}
        self.reward = view[("next", "reward")][..., 0]
        self.terminated = view[("next", "terminated")][..., 0]
        self.truncated = view[("next", "truncated")][..., 0]
        self.next_done = view[("next", "done")][..., 0]
        self.root_flags = [view[f][..., 0] for f in ("done", "terminated", "truncated")]
        self.traj_ids = view[("collector", "traj_ids")]
        self.policy_version = view[("collector", "policy_version")]
        self.step_count = view["step_count"][..., 0] if step_count else None
        self.next_step_count = view[("next", "step_count")][..., 0] if step_count else None
        self.mask = view[("collector", "mask")] if mask else None

    def write_outputs(self, t: int, out: dict[NestedKey, Any], version: int) -> None:
        """Store the policy's outputs for step ``t`` of every env, and the policy ``version``
        that made them."""
        self.write_outputs_at(slice(None), t, out, version)

    def write_outputs_at(self, rows: np.ndarray | slice, cols: np.ndarray | int, out: dict[NestedKey, Any],
                         version: int) -> None:
        """Store the policy's outputs for envs ``rows``, each at its column ``cols`` (an
        array, one per env, or one column for all)."""
        self.policy_version[rows, cols] = version
        out_np = self.out_np
        for key, value in out.items():
            dst = out_np.get(key)
            if dst is None:
                if key not in self.out_torch:
                    raise KeyError(
                        f"policy: wrote {key!r} at this step but not on the batch's first step; "
                        "a policy must write the same keys at every step."
                    )
                index = tuple(torch.from_numpy(i) if isinstance(i, np.ndarray) else i for i in (rows, cols))
                self.out_torch[key][index] = torch.as_tensor(value)
            elif isinstance(value, np.ndarray):
                dst[rows, cols] = value
            else:
                dst[rows, cols] = value.numpy(force=True)

    def finish_rows(self, valid: np.ndarray) -> None:
        """``finish`` for envs that each filled their own number of columns ``valid[i]``."""
        if (valid >= self.frames).all():
            self.finish(self.frames)
            return
        np.logical_or(self.terminated, self.truncated, out=self.next_done)
        for i in np.flatnonzero(valid < self.frames).tolist():
            v = int(valid[i])
            for key, tensor in self.tensors.items():
                if key == ("collector", "traj_ids") or key == ("collector", "policy_version"):
                    tensor[i, v:] = -1
                elif key != ("collector", "mask"):
                    tensor[i, v:] = 0
        if self.mask is not None:
            self.mask[...] = np.arange(self.frames)[None, :] < valid[:, None]

    def finish(self, valid: int) -> None:
        """Derive ``("next", "done")`` and blank the unfilled tail of an interrupted batch."""
        np.logical_or(self.terminated, self.truncated, out=self.next_done)
        if valid < self.frames:
            for key, tensor in self.tensors.items():
                if key == ("collector", "traj_ids") or key == ("collector", "policy_version"):
                    tensor[:, valid:] = -1
                elif key != ("collector", "mask"):
                    tensor[:, valid:] = 0
        if self.mask is not None:
            self.mask[:, :valid] = True
            self.mask[:, valid:] = False

    def to_tensordict(self, batched: bool, device: torch.device | None) -> TensorDict:
        """The batch as a TensorDict: ``[num_envs, T]`` if ``batched`` else ``[T]``."""
        tensors = self.tensors if batched else {k: v[0] for k, v in self.tensors.items()}
        shape = [self.num_envs, self.frames] if batched else [self.frames]
        td = TensorDict(nest(tensors), batch_size=shape, device=device)
        td.refine_names(*([None] * (len(shape) - 1)), "time")
        return td


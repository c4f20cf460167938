"""Splitting a batch into trajectories.

[`split_trajectories`][aiocollect.split_trajectories] turns a ``[..., T]`` batch into ``[num_trajectories, max_len]``,
one row per trajectory (in order of first appearance, env by env), zero-padded, with a
boolean ``("collector", "mask")`` marking the real frames. It follows
``torchrl.collectors.utils.split_trajectories``, so code written for TorchRL's output
reads ours the same way.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase, pad


def split_trajectories(
    batch: TensorDictBase,
    *,
    trajectory_key=("collector", "traj_ids"),
    done_key=("next", "done"),
) -> TensorDictBase:
    """Split ``batch`` along time into zero-padded trajectories.

    One row per trajectory, in order of first appearance (env by env), padded with zeros
    to the longest. The output follows ``torchrl.collectors.utils.split_trajectories``
    (tested against it), so code written for TorchRL's output reads it the same way. A
    collector's ``split_trajs=True`` applies it to every batch.

    Args:
        batch: a collected batch, ``[T]`` or ``[envs, T]`` (time last).
        trajectory_key (tuple | str): where the trajectory ids are. When missing,
            trajectories are cut after every ``done_key`` and numbered row by row.
        done_key (tuple | str): the done flags used when there are no trajectory ids.

    Returns:
        A TensorDict ``[num_trajectories, max_len]`` with a ``mask`` entry next to the
        trajectory ids (``("collector", "mask")`` by default). Frames already masked out in
        ``batch`` (an interrupted batch) are dropped first.

    Examples:
        >>> data = next(iter(collector))                # [4, 100]
        >>> trajs = split_trajectories(data)            # [k, longest]
        >>> returns = (trajs["next", "reward"] * trajs["collector", "mask"][..., None]).sum(1)
    """
    prefix = trajectory_key[:-1] if isinstance(trajectory_key, tuple) else ()
    mask_key = (*prefix, "mask") if prefix else "mask"
    batch = batch.copy()
    traj_ids = batch.get(trajectory_key, None)
    if traj_ids is None:
        done = batch.get(done_key)
        if done.ndim > batch.ndim:
            done = done.squeeze(-1)
        # a trajectory starts after each done; rows never share a trajectory
        starts = torch.nn.functional.pad(done[..., :-1].long(), (1, 0))
        traj_ids = starts.cumsum(-1)
        if batch.ndim > 1:
            flat = traj_ids.reshape(-1, traj_ids.shape[-1])
            offsets = (flat[:, -1] + 1).cumsum(0) - (flat[:, -1] + 1)
            traj_ids = (flat + offsets[:, None]).reshape(traj_ids.shape)
        batch.set(trajectory_key, traj_ids)

    flat = batch.reshape(-1)
    old_mask = flat.get(mask_key, None)
    if old_mask is not None:
        flat = flat[old_mask]
    ids = flat.get(trajectory_key)
    _, lengths = torch.unique_consecutive(ids, return_counts=True)
    lengths = lengths.tolist()
    if len(set(lengths)) == 1 and batch.ndim > 0 and lengths[0] == batch.shape[-1] and old_mask is None:
        # every row is exactly one whole trajectory: nothing to cut or pad
        batch.set(mask_key, torch.ones(batch.shape, dtype=torch.bool, device=batch.device))
        return batch.unsqueeze(0) if batch.ndim == 1 else batch
    longest = max(lengths) if lengths else 0
    pieces = []
    for piece in flat.split(lengths, 0):
        piece.set(mask_key, torch.ones(piece.shape, dtype=torch.bool, device=piece.device))
        pieces.append(pad(piece, [0, longest - piece.shape[0]]))
    out = torch.stack(pieces, 0)
    out.refine_names(None, "time")
    return out

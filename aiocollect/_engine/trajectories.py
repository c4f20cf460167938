"""Splitting a batch into trajectories.

[`split_trajectories`][aiocollect.split_trajectories] turns a ``[..., T]`` batch into ``[num_trajectories, max_len]``,
one row per trajectory (in order of first appearance, env by env), zero-padded, with a
boolean ``("collector", "mask")`` marking the real frames. It follows
``torchrl.collectors.utils.split_trajectories``, so code written for TorchRL's output
reads ours the same way.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

import torch
from tensordict import LazyStackedTensorDict, NonTensorData, TensorDict, TensorDictBase, pad


def split_trajectories(
    batch: TensorDictBase,
    *,
    prefix=None,
    trajectory_key=None,
    done_key=None,
    as_nested: bool = False,
) -> TensorDictBase:
    """Split ``batch`` along time into zero-padded trajectories.

    One row per trajectory, in order of first appearance (env by env), padded with zeros
    to the longest. Signature, keys and output follow ``torchrl.collectors.utils.split_trajectories``
    (tested against it), so code written for TorchRL's reads ours the same way. A
    collector's ``split_trajs=True`` applies it to every batch.

    Args:
        batch: a collected batch, ``[T]`` or ``[envs, T]`` (time last).
        prefix (str | tuple): where the trajectory ids (``"traj_ids"``) and the ``"mask"`` are read and
            written: ``"collector"`` when ``batch`` has a ``"collector"`` entry (every
            collected batch), else the root. Prefer ``trajectory_key``.
        trajectory_key (tuple | str): the trajectory ids' key (the mask goes next to it);
            supersedes ``prefix``. Where there are none, trajectories are cut after every
            done step and numbered row by row (the ids are written there).
        done_key (tuple | str): the done flag under ``"next"`` read then (default ``"done"``,
            that is ``("next", "done")``).
        as_nested (bool): give each leaf as a (strided) nested tensor instead,
            ``[num_trajectories, their lengths, ...]``, without padding or mask, as TorchRL's
            does (which, with this torch, also makes strided ones whatever layout it is given).

    Returns:
        A TensorDict ``[num_trajectories, max_len]`` with a ``mask`` entry next to the
        trajectory ids (``("collector", "mask")`` for a collected batch). Frames already
        masked out in ``batch`` (an interrupted batch) are dropped first.

    Examples:
        >>> data = next(iter(collector))                # [4, 100]
        >>> trajs = split_trajectories(data)            # [k, longest]
        >>> returns = (trajs["next", "reward"] * trajs["collector", "mask"][..., None]).sum(1)
    """
    if trajectory_key is None:
        if prefix is None and "collector" in batch.keys():  # noqa: SIM118 - a TensorDict's root keys
            prefix = "collector"
        prefix = () if prefix is None else (prefix if isinstance(prefix, tuple) else (prefix,))
        trajectory_key = (*prefix, "traj_ids") if prefix else "traj_ids"
    else:
        prefix = trajectory_key[:-1] if isinstance(trajectory_key, tuple) else ()
    mask_key = (*prefix, "mask") if prefix else "mask"
    if done_key is None:
        done_key = ("next", "done")
    elif not (isinstance(done_key, tuple) and done_key[0] == "next"):
        done_key = ("next", *done_key) if isinstance(done_key, tuple) else ("next", done_key)
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
    if as_nested:  # one nested tensor per leaf, [trajectories, their own lengths, ...], no mask
        flat = flat.exclude(mask_key).clone(False)
        if flat.names[0] is not None:
            flat.names = [None]
        return flat.apply(lambda x: torch.nested.nested_tensor(list(x.split(lengths))),
                          batch_size=[len(lengths), -1])
    if len(set(lengths)) == 1 and batch.ndim > 0 and lengths[0] == batch.shape[-1] and old_mask is None:
        # every row is exactly one whole trajectory: nothing to cut or pad, only the rows of a
        # [T] or [workers, envs, T] batch made [trajectories, T]
        batch.set(mask_key, torch.ones(batch.shape, dtype=torch.bool, device=batch.device))
        if batch.ndim == 2:
            return batch
        out = batch.reshape(len(lengths), batch.shape[-1])
        out.refine_names(None, "time")
        return out
    return _padded(flat.split(lengths, 0), mask_key)


def _padded(trajs, mask_key) -> TensorDictBase:
    """``trajs`` (``[T_i]`` each) zero-padded to the longest and stacked, ``[len, longest]``,
    with ``mask_key`` marking the real frames."""
    longest = max((t.shape[0] for t in trajs), default=0)
    rows = []
    lazy = any(isinstance(t, LazyStackedTensorDict) for t in trajs)
    for traj in trajs:
        traj = traj.copy()
        traj.set(mask_key, torch.ones(traj.shape, dtype=torch.bool, device=traj.device))
        rows.append(_pad_frames(traj, longest - traj.shape[0]) if lazy else pad(traj, [0, longest - traj.shape[0]]))
    out: TensorDictBase = LazyStackedTensorDict.lazy_stack(rows, 0) if lazy else torch.stack(rows, 0)
    out.refine_names(None, "time")
    return out


def _non_tensor(cls: type) -> bool:
    return issubclass(cls, NonTensorData)


def _pad_frames(traj: TensorDictBase, count: int) -> TensorDictBase:
    """A trajectory lazily stacked along time (an env's entries of a dynamic shape: each frame
    its own shapes) with ``count`` frames of zeros after it, shaped as its last."""
    if count == 0:
        return traj
    blank = traj[-1].clone().zero_()
    for key in blank.keys(include_nested=True, leaves_only=True, is_leaf=_non_tensor):
        if _non_tensor(type(blank.get(key))):  # (zero_ leaves a string as it was: None, as pad() gives)
            blank.set_non_tensor(key, None)
    return LazyStackedTensorDict.lazy_stack([*traj.unbind(0), *[blank.clone() for _ in range(count)]], 0)


class TrajectoryAssembler:
    """Complete trajectories out of consecutive batches: the ``trajs_per_batch`` option.

    Each batch's frames are grouped by trajectory id (``("collector", "traj_ids")``); a
    trajectory's pieces wait here until a piece ends with ``("next", "done")``, and the
    whole trajectory then joins the queue of complete ones, in the order they finished.
    Frames an interrupted batch masked out are dropped first. This follows TorchRL 0.14's
    ``trajs_per_batch`` (``torchrl.collectors.utils._traj_ingest``/``_traj_emit``), so a
    batch of trajectories is laid out as there:

    * ``"padded"``: ``[trajs, longest]``, zero-padded, with a ``("collector", "mask")``
      marking the real frames (as [`split_trajectories`][aiocollect.split_trajectories]);
    * ``"cat"``: ``[frames]``, the trajectories one after the other, each ending with a
      done step.

    Examples:
        >>> assembler = TrajectoryAssembler()
        >>> assembler.add(batch)                       # any [..., T] batch
        >>> if assembler.ready >= 8:
        ...     trajs = assembler.take(8, "padded")     # [8, longest]
    """

    def __init__(self) -> None:
        self._partial: dict[int, list[TensorDictBase]] = {}
        self._pending_bytes = 0
        """Memory held by the trajectories under way (see ``WARN_BYTES``)."""
        self._warned = False
        self._complete: list[TensorDictBase] = []
        self._cut: set[int] = set()
        """Trajectories a reset cut: their frames are dropped (``clear(cut=...)``)."""

    WARN_BYTES = 1 << 30
    """Past this much memory (1 GiB) held by trajectories that have not ended, a warning says
    so, once: an env that never ends its episodes would make it grow without bound."""

    @property
    def ready(self) -> int:
        """How many complete trajectories wait to be taken."""
        return len(self._complete)

    @property
    def pending(self) -> int:
        """How many trajectories have begun and not ended."""
        return len(self._partial)

    @property
    def pending_frames(self) -> int:
        """Frames of the trajectories under way (which a checkpoint does not hold)."""
        partial = list(self._partial.values())  # (one C call: safe while another thread adds)
        return sum(piece.shape[0] for pieces in partial for piece in pieces)

    def state_dict(self) -> dict[str, Any] | None:
        """The complete trajectories not taken yet, for a checkpoint (``None``: there are none).

        Plain tensors in plain dicts, ``{"lengths": [...], "frames": {...}}``: the
        trajectories one after the other, as ``TensorDict.to_dict()`` gives them, so that
        ``torch.load(..., weights_only=True)`` reads a saved checkpoint back.
        """
        complete = list(self._complete)
        if not complete:
            return None
        frames: TensorDictBase = torch.cat(complete, 0)
        return {"lengths": [int(t.shape[0]) for t in complete], "frames": frames.to_dict()}

    @staticmethod
    def read_state(state: Any) -> list[TensorDictBase]:
        """The trajectories of what ``state_dict`` returned (``ValueError`` if it is not that)."""
        try:
            lengths = [int(n) for n in state["lengths"]]
            frames = TensorDict(state["frames"], batch_size=[sum(lengths)])
            if not lengths or min(lengths) < 1:
                raise ValueError("no trajectory, or an empty one")
        except Exception as exc:
            raise ValueError(
                "'trajectories' is not what state_dict() saved there (a dict of 'lengths', the "
                f"trajectories' lengths, and 'frames', their frames): {exc}; nothing was loaded."
            ) from exc
        return list(frames.split(lengths, 0))

    def restore(self, trajectories: list[TensorDictBase]) -> None:
        """Start over from a checkpoint: these complete trajectories wait to be taken, and
        nothing is under way (the envs restart from a reset). The trajectories under way
        here are cut (``cut``), not forgotten: a collector that collects ahead may still
        hold batches with their ends, and a trajectory whose beginning was dropped must
        never be delivered as if it were whole; so are the ids earlier resets cut."""
        self.cut(list(self._partial))
        self._complete = list(trajectories)

    def add(self, batch: TensorDictBase) -> None:
        """Sort ``batch``'s frames into their trajectories."""
        flat = batch.reshape(-1)
        mask = flat.get(("collector", "mask"), None)
        if mask is not None:
            flat = flat[mask].exclude(("collector", "mask"))
        ids = flat.get(("collector", "traj_ids"))
        keep = ids >= 0  # blanked frames (an env that stopped early) carry id -1
        if self._cut:
            keep &= ~torch.isin(ids, torch.tensor(sorted(self._cut), dtype=ids.dtype, device=ids.device))
        if not keep.all():
            flat, ids = flat[keep], ids[keep]
        if not len(ids):
            return
        order = torch.argsort(ids, stable=True)  # each env's frames stay in time order
        flat, ids = flat[order], ids[order]
        unique, counts = torch.unique_consecutive(ids, return_counts=True)
        done = flat.get(("next", "done")).reshape(len(ids), -1).any(-1)
        ends = (counts.cumsum(0) - 1).tolist()
        for tid, piece, last in zip(unique.tolist(), flat.split(counts.tolist(), 0), ends):
            pieces = self._partial.setdefault(tid, [])
            pieces.append(piece)
            if done[last]:
                del self._partial[tid]
                if len(pieces) > 1:  # (the earlier pieces were counted)
                    self._pending_bytes -= sum(p.bytes() for p in pieces[:-1])
                self._complete.append(torch.cat(pieces, 0) if len(pieces) > 1 else pieces[0])
            else:
                self._pending_bytes += piece.bytes()
        if self._pending_bytes > self.WARN_BYTES and not self._warned:
            self._warned = True
            longest = max(sum(p.shape[0] for p in pieces) for pieces in self._partial.values())
            warnings.warn(
                f"trajs_per_batch: {self._pending_bytes / 2**20:.0f} MiB of frames wait in {len(self._partial)} "
                f"trajectories that have not ended (the longest has {longest} frames). Only whole trajectories "
                "are delivered, so an env that never ends its episodes makes this grow without bound: "
                "set max_frames_per_traj to truncate them, or collect without trajs_per_batch. "
                "(Said once per collector.)", RuntimeWarning, stacklevel=2)

    def _forget(self, tid: int) -> None:
        """Trajectory ``tid`` is no longer under way (it ended, or was cut)."""
        self._pending_bytes -= sum(p.bytes() for p in self._partial.pop(tid))

    def take(self, count: int, traj_format: str) -> TensorDictBase:
        """The first ``count`` complete trajectories (at most), as one ``traj_format`` batch."""
        trajs, self._complete = self._complete[:count], self._complete[count:]
        if traj_format == "cat":
            out: TensorDictBase = torch.cat(trajs, 0) if len(trajs) > 1 else trajs[0].clone()
            out.refine_names("time")
            return out
        return _padded(trajs, ("collector", "mask"))

    def take_each(self, per_write: int | None) -> list[TensorDictBase]:
        """Every complete trajectory, flat, ``per_write`` of them per item (``None``: all in one)."""
        trajs, self._complete = self._complete, []
        step = per_write or max(len(trajs), 1)
        return [torch.cat(trajs[i:i + step], 0) for i in range(0, len(trajs), step)]

    def drop_partial(self) -> None:
        """Forget the trajectories under way (their envs were reset: they will never end)."""
        self._partial.clear()
        self._pending_bytes = 0

    def cut(self, ids: Iterable[int]) -> None:
        """The trajectories ``ids`` were cut by a reset: they never end. Their frames here
        are dropped, and so are those still to come (in batches collected before the reset
        and not yet added), instead of waiting here for an end they never reach."""
        ids = {int(i) for i in ids}
        for tid in ids & self._partial.keys():
            self._forget(tid)
        self._cut |= ids

    def clear(self, cut: Iterable[int] = ()) -> None:
        """Forget everything, complete trajectories included (``reset()``). ``cut``: the
        ids of the trajectories under way, which the reset cuts; those begun here are cut
        too (the rest of a trajectory whose beginning was dropped must never be delivered
        as if it were whole)."""
        self.cut([*cut, *self._partial])
        self._complete.clear()

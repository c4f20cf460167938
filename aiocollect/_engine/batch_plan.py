"""A sealed batch's tensors, copied out of the rollout storage by a plan made once per layout.

Every batch of a lane copies the same fields (the same slot, rows, columns and policy
outputs) into tensors of the same shapes and dtypes. Working that out per batch (slicing
the slot and swapping its axes for a dozen fields, each tensor's shape, dtype and place in
the batch's block, which entries a TorchRL env keeps) cost as much as the copies
themselves at CartPole's sizes, so a ``BatchPlan`` does it once per layout, and a batch is
then one block of memory and, per field, one numpy view of it, one copy into it and one
``torch.from_numpy``. The slot's views stay valid: the storage's fields are allocated once
and never move.

The batch is what the storage has always given (``RolloutStorage.batch``): ``[envs,
frames, ...]`` tensors keyed by flat keys, in one order, each a 64-byte aligned copy (as
JAX takes a buffer without a copy) carved out of one block (one allocation per batch:
at a dozen fields, one each cost more than the copies).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

_ALIGN = 64
MASK = ("collector", "mask")
_IDS = (("collector", "traj_ids"), ("collector", "policy_version"))
"""The entries whose frames past a short row's last are blanked to -1 (the others to 0)."""
_FLAGS = ("done", "terminated", "truncated")
_DONE = "done"
"""The spec of ``("next", "done")``: ``terminated | truncated``, computed."""


class StoredValueError(ValueError):
    """What an env returned at some step, found in a batch: a reward that is not a number
    (``None`` is stored as NaN) or a flag that is not a boolean (stored as a byte other than
    0 or 1). ``row`` and ``step`` say where; the scheduler names the env and its worker."""

    def __init__(self, row: int, step: int, what: str):
        super().__init__(what)
        self.row, self.step, self.what = row, step, what


def check_values(reward: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, valid: np.ndarray,
                 lo: int) -> None:
    """Raise ``StoredValueError`` for the first bad value of a batch's rewards and flags
    (``[envs, frames]``, env ``i`` being row ``lo + i``; only the ``valid[i]`` first columns count).

    The envs' types are checked at their first step only (``_envs.group``); this catches what
    an env returns later, once per batch and not per step: a reward of ``None`` (stored as
    NaN) or a flag that is neither a boolean nor 0/1 (the workers store flags as bytes, so a
    string or ``None`` fails as it is stored, and any other number stays visible here).
    Three array operations per batch when all is well: a NaN makes the rewards' sum NaN (an
    infinite sum only sends us to the exact look), and a byte over 1 in either flag makes
    their bitwise or over 1.
    """
    if not reward.size or (math.isfinite(reward.sum())
                           and int((terminated.view(np.uint8) | truncated.view(np.uint8)).max()) <= 1):
        return
    bad_reward = np.isnan(reward)
    bad_flags = (terminated.view(np.uint8) > 1) | (truncated.view(np.uint8) > 1)
    bad = (bad_reward | bad_flags) & (np.arange(reward.shape[1])[None, :] < valid[:, None])
    hits = np.argwhere(bad)
    if not len(hits):
        return
    i, t = (int(v) for v in hits[np.argmin(hits[:, 1])])  # the earliest step
    if bad_reward[i, t]:
        what = ("returned a reward that is not a number (None, or NaN); a gymnasium env returns a float "
                "at every step")
    else:
        name = "terminated" if terminated.view(np.uint8)[i, t] > 1 else "truncated"
        value = int(max(terminated.view(np.uint8)[i, t], truncated.view(np.uint8)[i, t]))
        what = f"returned {name}={value}, not a boolean; a gymnasium env returns True or False at every step"
    raise StoredValueError(lo + i, t, what)


class _Root(int):
    """The spec of a root flag: ``_FLAGS[self]`` of the step before (the batch's first
    column: the lane's start flags, or false)."""


def plan_entries(st: Any, s: int, lo: int, hi: int, frames: int, keys: tuple, mask: bool) -> dict:
    """The batch's entries, in their order, each with its spec: the ``[envs, frames, ...]``
    view of the storage it is a copy of (numpy, or torch for a dtype numpy lacks), ``_DONE``,
    a ``_Root`` or ``MASK``. ``st``: the ``RolloutStorage``."""
    cols, rows = slice(0, frames), slice(lo, hi)

    def src(x: np.ndarray | torch.Tensor) -> Any:
        return x[s, cols, rows].swapaxes(0, 1) if isinstance(x, np.ndarray) else x[s, cols, rows].transpose(0, 1)

    entries: dict = {}
    for key, x, nx in zip(st.keys, st.obs, st.next_obs):
        entries[key] = src(x)
        entries[("next", key)] = src(nx)
    for key in keys:
        arr = st._out_np[key]
        entries[key] = src(st._out_t[key] if arr is None else arr)
    if st.engine_flags:  # (a TorchRL env with rewards and flags per group: they are its own leaves)
        entries[("next", "reward")] = src(st.reward)[..., None]
        entries[("next", "done")] = _DONE
        entries[("next", "terminated")] = src(st.terminated)[..., None]
        entries[("next", "truncated")] = src(st.truncated)[..., None]
        for i, flag in enumerate(_FLAGS):
            entries[flag] = _Root(i)
        if "truncated" not in st.engine_flags:  # (a TorchRL env without one: none in its batches)
            del entries["truncated"], entries[("next", "truncated")]
    for key in st.next_only:  # (its rewards: under "next" only)
        del entries[key]
    entries[_IDS[0]] = src(st.traj_ids)
    entries[_IDS[1]] = src(st.policy_version)
    if st.step_count is not None and st.next_step_count is not None:
        entries["step_count"] = src(st.step_count)[..., None]
        entries[("next", "step_count")] = src(st.next_step_count)[..., None]
    if mask:
        entries[MASK] = MASK
    return entries


class BatchPlan:
    """How the batches of one layout (slot, rows, frames, policy outputs, whether a mask is
    kept) come out of a ``RolloutStorage``: see the module docstring. ``run`` makes one."""

    def __init__(self, st: Any, s: int, lo: int, hi: int, frames: int, keys: tuple, mask: bool):
        entries = plan_entries(st, s, lo, hi, frames, keys, mask)
        self.lo, self.frames = lo, frames
        self.keys = tuple(entries)
        self.check = (st.reward[s, :frames, lo:hi].swapaxes(0, 1), st.terminated[s, :frames, lo:hi].swapaxes(0, 1),
                      st.truncated[s, :frames, lo:hi].swapaxes(0, 1))
        """The rewards and flags as ``check_values`` reads them, ``[envs, frames]``."""
        self.flags = (self.check[1][..., None], self.check[2][..., None])
        self.shifted = (None, self.flags[0][:, :-1], self.flags[1][:, :-1])
        """Each root flag's source, a column late: ``("next", flag)`` of the step before."""
        shape = (hi - lo, frames)
        self.layout: list[tuple[tuple, np.dtype, int]] = []
        """``(shape, dtype, offset)`` of each numpy-filled tensor, in the batch's order."""
        self.copies: list[tuple[int, np.ndarray]] = []
        """``(index in the layout, source)`` of the entries numpy copies."""
        self.cloned: list[tuple[int, torch.Tensor]] = []
        """``(index in keys, source)`` of the entries torch copies (a dtype numpy lacks)."""
        self.roots: list[tuple[int, int]] = []
        """``(index in the layout, which of _FLAGS)`` of each root flag."""
        self.done = self.mask = -1
        offset = 0
        for index, (key, spec) in enumerate(entries.items()):
            if isinstance(spec, torch.Tensor):
                self.cloned.append((index, spec))
                continue
            at = len(self.layout)
            if isinstance(spec, np.ndarray):
                self.copies.append((at, spec))
                field = (spec.shape, spec.dtype)
            elif key is MASK:
                self.mask, field = at, (shape, np.dtype(np.bool_))
            else:
                if isinstance(spec, _Root):
                    self.roots.append((at, int(spec)))
                else:
                    self.done = at
                field = ((*shape, 1), np.dtype(np.bool_))
            self.layout.append((*field, offset))
            offset += -(-math.prod(field[0]) * field[1].itemsize // _ALIGN) * _ALIGN
        self.nbytes = offset
        self.blank = [-1 if key in _IDS else 0 for key in self.keys if key is not MASK]
        self.steps = np.arange(frames)[None, :]

    def run(self, valid: np.ndarray, start_flags: np.ndarray | None, fresh: Any, empty: Any = None) -> dict:
        """The batch (``RolloutStorage.batch``'s arguments; ``empty``: an allocator, ``None``
        for one block of host memory).

        Raises:
            StoredValueError: a bad reward or flag (``check_values``), before anything is copied.
        """
        check_values(*self.check, valid, self.lo)
        if empty is None:
            raw = np.empty(self.nbytes + _ALIGN, np.uint8)
            base = -raw.ctypes.data % _ALIGN
            views = [np.ndarray(shape, dtype, raw, base + offset) for shape, dtype, offset in self.layout]
            tensors = list(map(torch.from_numpy, views))
        else:
            pairs = [empty(shape, dtype) for shape, dtype, _ in self.layout]
            tensors, views = [p[0] for p in pairs], [p[1] for p in pairs]
        for at, src in self.copies:
            views[at][...] = src
        if self.done >= 0:
            np.logical_or(*self.flags, out=views[self.done])
            self._roots(views, start_flags, fresh)
        for index, source in self.cloned:  # (in order: each lands at its own index)
            tensors.insert(index, source.clone(memory_format=torch.contiguous_format))
        out = dict(zip(self.keys, tensors))
        short = valid < self.frames
        if short.any():
            for i in np.flatnonzero(short).tolist():
                v = int(valid[i])
                for tensor, fill in zip(tensors, self.blank):
                    tensor[i, v:] = fill
        if self.mask >= 0:
            np.less(self.steps, valid[:, None], out=views[self.mask])
        return out

    def _roots(self, views: list, start_flags: np.ndarray | None, fresh: Any) -> None:
        """The root flags: those of the step before (its ``("next", flag)``), false at the
        batch's first step (or the lane's ``start_flags`` there, without ``reset_when_done``)
        and where a reset began an episode later in it (``fresh``)."""
        if start_flags is None:
            for at, _ in self.roots:
                views[at].fill(False)
            return
        for at, which in self.roots:
            view = views[at]
            view[:, 0, 0] = start_flags[which]
            shifted = self.shifted[which]
            view[:, 1:] = views[self.done][:, :-1] if shifted is None else shifted
            for t, envs in fresh:
                view[envs, t] = False

"""A collector's checkpoint (``state_dict()``), read and checked before anything is loaded.

The keys are TorchRL's: ``policy_state_dict``, ``env_state_dict``, ``frames``, ``iter`` and
``traj_pool`` (a worker collector adds ``worker0``, ``worker1``...). Two meanings differ from
TorchRL's and say so with their own names: ``traj_pool`` holds ``next_traj_id`` (TorchRL's
``traj_id``) and ``completed_trajectories``, so a TorchRL checkpoint is recognised and refused
with an error that says what to do, not half loaded.

``iter`` is TorchRL's: the index of the last batch delivered, ``-1`` before the first (TorchRL
counts from ``-1``). aiocollect's first checkpoints saved the number of batches there instead;
``aiocollect_format`` (``2`` since ``iter`` means TorchRL's, absent before) tells them apart,
so an old checkpoint still loads with its meaning.

With ``trajs_per_batch``, a checkpoint holds exactly what was not delivered yet: the complete
trajectories waiting to be delivered (``trajectories``, plain tensors), and ``frames`` counts
the frames delivered and those; the frames of trajectories still under way are not counted
(a restored collector's envs restart from a reset, so those trajectories never end there).

``read_checkpoint`` is pure: it checks a whole state and returns what to restore, or raises
before the collector changes at all.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._engine.trajectories import TrajectoryAssembler

CHECKPOINT_FORMAT = 2
"""``state_dict()["aiocollect_format"]``. 1 (no such key): ``iter`` was the number of
batches delivered; 2: ``iter`` is TorchRL's, the number of batches delivered minus one."""

_EXPECTED = ("'frames' (an int), 'iter' (an int) and 'traj_pool' (a dict with 'next_traj_id'), "
             "with 'policy_state_dict' for a policy with weights")


@dataclass(frozen=True)
class Checkpoint:
    """What a checked checkpoint restores."""

    frames: int
    """Frames delivered."""
    batches: int
    """Batches delivered (``iter + 1`` in TorchRL's numbering)."""
    next_traj_id: int
    """The first trajectory id not given yet."""
    completed_trajectories: int
    """Trajectories completed over the collector's life."""
    workers: dict[int, int]
    """Completed trajectories of each worker saved (``worker{i}``), by worker index."""
    trajectories: list = field(default_factory=list)
    """``trajs_per_batch``'s complete trajectories that were not delivered yet (``TensorDict``s)."""
    policy_version: int | None = None
    """The policy version of the saved weights (TorchRL's ``policy_version``; ``None``: a
    checkpoint saved without it): the loaded weights take it up again."""


def counters_state(frames: int, batches: int) -> dict[str, Any]:
    """The counters of a checkpoint, as ``state_dict()`` writes them."""
    return {"frames": frames, "iter": batches - 1, "aiocollect_format": CHECKPOINT_FORMAT}


def read_checkpoint(state_dict: Any, collector: str) -> Checkpoint:
    """Check ``state_dict`` whole, as ``load_state_dict`` receives it; ``collector`` names
    the collector in errors (``"Collector"``).

    Raises:
        TypeError: ``state_dict`` is not a mapping, or an entry has the wrong type.
        KeyError: an entry is missing (a TorchRL collector's checkpoint is named as such).
        ValueError: a counter is negative, or the checkpoint comes from a newer aiocollect.
    """
    where = f"{collector}.load_state_dict"
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"{where}: expected the dict that state_dict() returned, got {type(state_dict).__name__}.")
    fmt = state_dict.get("aiocollect_format", 1)
    if fmt not in (1, CHECKPOINT_FORMAT):
        raise ValueError(f"{where}: checkpoint format {fmt!r} comes from a newer aiocollect (this one reads "
                         f"formats 1 and {CHECKPOINT_FORMAT}); nothing was loaded.")
    pool = state_dict.get("traj_pool")
    missing = [k for k in ("frames", "iter", "traj_pool") if k not in state_dict]
    if isinstance(pool, Mapping) and "next_traj_id" not in pool:
        missing.append("traj_pool['next_traj_id']")
    if missing:
        torchrl = isinstance(pool, Mapping) and "traj_id" in pool and "next_traj_id" not in pool
        hint = (" It looks like a TorchRL collector's checkpoint (its 'traj_pool' has 'traj_id'): aiocollect "
                "cannot resume one, as its trajectory and env state are TorchRL's; load its policy weights "
                "alone with update_policy_weights_(state_dict['policy_state_dict'])." if torchrl else "")
        raise KeyError(f"{where}: this is not an aiocollect checkpoint: it lacks {', '.join(missing)} "
                       f"(an aiocollect checkpoint has {_EXPECTED}); nothing was loaded.{hint}")
    if not isinstance(pool, Mapping):
        raise TypeError(f"{where}: 'traj_pool' must be a dict with 'next_traj_id', got {type(pool).__name__}; "
                        "nothing was loaded.")
    frames = _count(state_dict["frames"], "frames", where, 0)
    it = _count(state_dict["iter"], "iter", where, -1 if fmt == CHECKPOINT_FORMAT else 0)
    next_id = _count(pool["next_traj_id"], "traj_pool['next_traj_id']", where, 0)
    workers = {}
    for key, value in state_dict.items():
        if isinstance(key, str) and key.startswith("worker") and key[6:].isdigit():
            if not isinstance(value, Mapping):
                raise TypeError(f"{where}: {key!r} must be a dict, got {type(value).__name__}; nothing was loaded.")
            workers[int(key[6:])] = _count(value.get("completed_trajectories", 0),
                                           f"{key}['completed_trajectories']", where, 0)
    if "completed_trajectories" in pool:
        completed = _count(pool["completed_trajectories"], "traj_pool['completed_trajectories']", where, 0)
    else:  # a worker collector's checkpoint: its workers' counts
        completed = sum(workers.values())
    batches = it + 1 if fmt == CHECKPOINT_FORMAT else it
    held = state_dict.get("trajectories")
    trajectories = [] if held is None else TrajectoryAssembler.read_state(held)
    if sum(len(t) for t in trajectories) > frames:
        raise ValueError(f"{where}: 'trajectories' holds more frames than 'frames' ({frames}) counts; "
                         "nothing was loaded.")
    version = state_dict.get("policy_version")
    if version is not None:
        version = _count(version, "policy_version", where, 0)
    return Checkpoint(frames, batches, next_id, completed, workers, trajectories, version)


_PUBLISH = "update_policy_weights_: "
"""How the policy's errors about weights that do not fit it begin (they are raised as
weights are published, by ``update_policy_weights_`` or by ``load_state_dict``)."""


def policy_state_error(exc: BaseException, collector: str) -> BaseException:
    """The error ``load_state_dict`` raises when publishing the checkpoint's
    ``policy_state_dict`` raised ``exc``: of ``exc``'s type, saying that the checkpoint's
    weights do not fit the collector's policy, and how (an error that says where it comes
    from other than ``update_policy_weights_``, the call the user did not make, is ``exc``)."""
    text = exc.args[0] if len(exc.args) == 1 and isinstance(exc.args[0], str) else None
    if text is None or not text.startswith(_PUBLISH):
        return exc
    what = getattr(exc, "misfit", None) or text[len(_PUBLISH):].rstrip(".")
    message = (f"{collector}.load_state_dict: the checkpoint's 'policy_state_dict' does not fit this collector's "
               f"policy: {what}. Nothing was loaded; load a checkpoint that a collector with the same policy saved.")
    try:
        return type(exc)(message)
    except Exception:  # noqa: BLE001 - a type built otherwise: its own message is still right
        return exc


def _count(value: Any, name: str, where: str, low: int) -> int:
    """An integer counter (a Python, NumPy or 0-d tensor integer) of at least ``low``."""
    if hasattr(value, "ndim") and getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        value = value.item()  # a 0-d tensor or array
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{where}: {name} must be an int, got {value!r}; nothing was loaded.")
    if value < low:
        raise ValueError(f"{where}: {name}={value} is below {low}; nothing was loaded.")
    return int(value)

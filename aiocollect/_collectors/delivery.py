"""From a collected batch to what the user gets.

A variant's ``_collect()`` returns a raw batch and its valid frames. ``Delivery`` counts it
(``total_frames``), measures its policy lag, adds its episode returns to the progress bar,
moves it to the storing device, then applies ``split_trajs``, ``postproc`` and the replay
buffer, or assembles whole trajectories for ``trajs_per_batch``. ``frames_for_buffer`` says
what a replay buffer's ``extend`` receives.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from .._engine.trajectories import split_trajectories
from .._envs.agents import stack_agents
from .._envs.object_batches import with_objects
from .._envs.spaces import nest
from .parts import CollectorParts
from .progress import ProgressBar, flat_numpy

DONE = object()
"""What ``_next_batch`` returns once ``total_frames`` are delivered."""
NOTHING = object()
"""No batch (``_undelivered`` between batches)."""

_UNCHECKED: Any = getattr(TensorDict, "_new_unsafe", None)


def batch_tensordict(nested: dict, shape: torch.Size, device: torch.device | None,
                     groups: dict | None = None, names: list | None = None, path: tuple = (),
                     outer: tuple = ()) -> TensorDictBase:
    """A TensorDict of the tensors the collector built (``nested``: ``nest``'s dicts), every
    one already of ``shape`` and on ``device``, the last dim named ``"time"``. ``groups``:
    the batch dims of an env's nested groups (``_envs.keyed.EnvEntries``), which the
    sub-TensorDict at that key (and under ``"next"``) has after ``shape``, as in TorchRL.

    tensordict's own unchecked constructor (``_new_unsafe``, which TorchRL's collectors
    use too) takes them as they are: the public one checks every tensor's shape and
    device again, which cost several times more than the rest of building the batch's
    TensorDict. Without it (another tensordict), the public constructor does the same.
    """
    names = names or [None] * (len(shape) - 1) + ["time"]
    if groups:
        fields = {}
        for key, value in nested.items():
            if not isinstance(value, dict):
                fields[key] = value
                continue
            sub = (*path, key)
            full = groups.get(sub[1:] if sub[0] == "next" else sub, ())  # (its dims, its parents' first)
            dims = full[len(outer):] if full[: len(outer)] == outer else ()
            if dims and not all(v.shape[len(shape): len(shape) + len(dims)] == dims for v in _leaf_values(value)):
                dims = ()  # (an entry of another shape there, a policy's: the group keeps the frame's dims)
            fields[key] = batch_tensordict(value, torch.Size([*shape, *dims]), device, groups,
                                           [*names, *[None] * len(dims)], sub, (*outer, *dims))
        return TensorDict(fields, batch_size=shape, device=device, names=names)
    if _UNCHECKED is None:
        return TensorDict(nested, batch_size=shape, device=device, names=names)
    fields = {key: batch_tensordict(value, shape, device) if isinstance(value, dict) else value
              for key, value in nested.items()}
    return _UNCHECKED(fields, batch_size=shape, device=device, names=names, nested=False)


def flat_batch_tensordict(flat: dict, shape: torch.Size, device: torch.device | None,
                          groups: dict | None = None) -> TensorDictBase:
    """``batch_tensordict(nest(flat), shape, device, groups)``, the tree of TensorDicts
    worked out once per set of flat keys (``_nesting``): nesting a dozen keys again for
    every batch cost as much as building its TensorDicts. (An env's nested groups, or a
    tensordict without the unchecked constructor: ``batch_tensordict``.)"""
    if groups or _UNCHECKED is None:
        return batch_tensordict(nest(flat), shape, device, groups)
    names = [None] * (len(shape) - 1) + ["time"]
    return _build(_nesting(tuple(flat)), list(flat.values()), shape, device, names)


@functools.lru_cache(maxsize=256)
def _nesting(keys: tuple) -> tuple:
    """The tree of a batch of flat ``keys``, as ``nest`` lays it out (its order too):
    ``((name, index of its value in keys, or the subtree), ...)``."""
    return _tree(nest(dict(zip(keys, range(len(keys))))))


def _tree(nested: dict) -> tuple:
    return tuple((key, value if isinstance(value, int) else _tree(value)) for key, value in nested.items())


def _build(tree: tuple, values: list, shape: torch.Size, device: torch.device | None, names: list) -> TensorDictBase:
    fields = {key: values[at] if isinstance(at, int) else _build(at, values, shape, device, names) for key, at in tree}
    return _UNCHECKED(fields, batch_size=shape, device=device, names=list(names), nested=False)


def _leaf_values(nested: dict) -> list:
    return [x for v in nested.values() for x in (_leaf_values(v) if isinstance(v, dict) else [v])]


MASK = ("collector", "mask")
"""Where a batch marks its real frames (padded ones ``False``), when it has any padding."""


_VERSION = ("collector", "policy_version")


def with_torchrl_versions(batch: TensorDictBase) -> None:
    """Add TorchRL's ``track_policy_version=True`` keys to ``batch``: ``"policy_version"`` and
    ``("next", "policy_version")``, int64, one per frame (the batch's shape, as TorchRL's),
    each a copy of ``("collector", "policy_version")``: the version that computed the
    frame's action (-1 for masked-out frames). TorchRL writes them through an env transform,
    so its root entry holds the version of the step before (the first frame after an update
    still has the old one); here both hold the frame's own version. A batch without
    ``("collector", "policy_version")`` is left as it is."""
    version = batch.get(_VERSION, None)
    if version is None:
        return
    batch.set("policy_version", version.clone())
    batch.set(("next", "policy_version"), version.clone())


def frames_for_buffer(batch: Any, buffer: Any) -> Any:
    """What ``replay_buffer.extend`` receives for a delivered ``batch``.

    A TorchRL buffer (one with a ``storage``) gets the batch's **frames, one per item**,
    as TorchRL's collectors give them (its multi-process workers extend the buffer with
    their own ``[T]`` batches), so that a sampled item is one transition whatever the
    collector: a batch ``[envs, T]`` (``[workers, envs, T]`` for ``MultiSyncCollector``,
    ``[trajectories, L]`` with ``split_trajs``) becomes ``[frames]``, each row's frames in
    order, one row after the other, so a trajectory stays contiguous (as TorchRL's
    ``SliceSampler`` wants it). Frames masked out in ``("collector", "mask")`` (the
    padding of split trajectories, what a preempted or interrupted batch did not collect)
    hold no transition and are left out, the mask with them: every frame that goes in is
    a real one, and the items have one layout whether a batch was cut or not.

    Left as they are: batches for a storage with more than one batch dim
    (``LazyTensorStorage(..., ndim=2)`` asks for ``[envs, T]``; ``extend_parts`` gives it a
    ``MultiSyncCollector``'s stacked batch one worker at a time), for a buffer of your own
    without a ``storage`` (it decides what to keep, mask included), and whatever a
    ``postproc`` returned that is not a TensorDict.
    """
    storage = getattr(buffer, "storage", None)
    if storage is None or getattr(storage, "ndim", 1) > 1 or not isinstance(batch, TensorDictBase):
        return batch
    frames = batch
    if batch.ndim != 1:
        frames = batch.clone(recurse=False)  # a shallow copy: the names go, not the batch's
        frames.names = None
        frames = frames.reshape(-1)
    mask = frames.get(MASK, None)
    if mask is None:
        return frames
    frames = frames.exclude(MASK)
    return frames if bool(mask.all()) else frames[mask.reshape(-1)]



def extend_parts(buffer: Any, batch: Any) -> None:
    """``buffer.extend`` with ``batch`` as ``frames_for_buffer`` lays it out; a storage with
    ``ndim`` batch dims given a batch with more (a ``MultiSyncCollector``'s ``[workers, envs,
    T]``, ``cat_results="stack"``) gets its leading slices one by one (each worker's ``[envs,
    T]``), as TorchRL's workers extend a shared buffer each with its own batch: extended
    whole, the storage would take the time dim for a feature dim."""
    ndim = getattr(getattr(buffer, "storage", None), "ndim", 1)
    if ndim > 1 and isinstance(batch, TensorDictBase) and batch.ndim > ndim:
        for part in batch.reshape(-1, *batch.shape[batch.ndim - ndim:]).unbind(0):
            buffer.extend(_storage_device(part, buffer))
        return
    buffer.extend(_storage_device(frames_for_buffer(batch, buffer), buffer))


def _storage_device(data: Any, buffer: Any) -> Any:
    """``data`` saying the device of ``buffer``'s storage where it says none and every tensor
    is there already (TorchRL's collectors align it so before they extend a buffer; no
    copy). Otherwise as it is: the storage moves what is elsewhere itself."""
    device = getattr(getattr(buffer, "storage", None), "device", None)
    if device is None or device == "auto" or not isinstance(data, TensorDictBase) or data.device is not None:
        return data
    device = torch.device(device)
    if any(t.device != device for t in data.values(True, True) if isinstance(t, torch.Tensor)):
        return data
    return data.to(device)


def without_private_keys(batch: Any) -> Any:
    """``batch`` less every entry whose key, or a key it is nested under, starts with ``_``
    (a policy's ``"_dummy"`` output, an env's ``("agents", "_mask")``...): TorchRL's collectors
    drop them after ``postproc``, and so do ours. A batch with none is returned as it is."""
    if not isinstance(batch, TensorDictBase):
        return batch  # (a postproc that returned something else: as it is)
    if type(batch) is TensorDict and _none_private(batch) is True:
        return batch
    private = [key for key in batch.keys(True) if _private(key)]
    return batch.exclude(*private, inplace=True) if private else batch


def _private(key: Any) -> bool:
    return key.startswith("_") if isinstance(key, str) else any(k.startswith("_") for k in key)


def _none_private(td: TensorDict) -> bool | None:
    """``True`` if no key of ``td``, a tree of ``TensorDict``s and tensors, starts with ``_``
    (``None``: a node of another kind, a lazy stack or a non-tensor, whose keys ``keys(True)``
    is left to list). One ``items()`` per node: listing ``keys(True)`` cost 15 us for a
    CartPole batch, most of what delivering it cost besides the copies."""
    for key, value in td.items():
        if key.startswith("_"):
            return False
        if type(value) is TensorDict:
            below = _none_private(value)
            if below is not True:
                return below
        elif not isinstance(value, torch.Tensor):
            return None
    return True


class Delivery(CollectorParts):
    """``DataCollectorBase``'s path from ``_collect()`` to the user. Uses the collector's
    ``options``, counters (``_frames``, ``_batches``, ``_max_lag``), ``_returns``,
    ``_progress``, ``_profile``, ``_staging``, ``_assembler``, ``_policy`` and ``_guarded_collect``."""

    async def _next_batch(self) -> Any:
        """The next delivered batch (``None`` with a replay buffer), or ``DONE``."""
        opts = self.options
        if opts.trajs_per_batch is not None:
            delivered = await self._next_trajectories()
        else:
            delivered = await self._next_raw()
            if delivered is DONE:
                return DONE
            if opts.split_trajs:
                delivered = split_trajectories(delivered)
            delivered = self._deliver(delivered)
        if self._profile is not None and delivered is not DONE:
            self._profile.delivered()
        return delivered

    async def _next_raw(self) -> Any:
        """The next collected batch, counted, measured and shown, or ``DONE``."""
        self._check_usable()
        total = self.options.total_frames
        prof = self._profile
        if total > 0 and self._frames >= total:
            if prof is not None and prof.tracing:
                self._on_engine(self._end_trace)  # the last batch: the trace is saved now
            return DONE
        if prof is not None:
            if prof.traces:
                self._on_engine(self._trace_step)  # (torch's profiler records one thread)
            prof.asked()
        self._run_pre_collect_hook()
        batch, frames = await self._guarded_collect()
        if prof is not None:
            prof.collected(frames)
        self._frames += frames
        self._batches += 1
        self._measure_lag(batch)  # (both read the host's copy of the batch)
        self._returns.add(batch, self.options.set_truncated)
        batch = self._finish(batch)
        hook = self.post_collect_hook
        if hook is not None and not self._hook_after_postproc:  # (each worker's batch, as TorchRL's workers)
            for part in self._worker_parts(batch):
                hook(part)
        if self.options.progress:
            if self._progress is None:
                self._progress = ProgressBar(self.options.total_frames, type(self).__name__, self._returns)
                self._resources.closers.append(self._progress.close)
            self._progress.update(frames)
        return batch

    def _finish(self, batch: TensorDictBase) -> TensorDictBase:
        """A collected batch as it is handed out: on the storing device (one copy, see
        ``_engine.staging``), with TorchRL's version keys if asked for, written into the first
        batch with ``return_same_td``."""
        if self._staging is not None:
            batch = self._staging.upload(batch)
        if self._left_out:  # compact_obs=True: no ("next", obs) entries; track_traj_ids=False: no ids
            batch = batch.exclude(*self._left_out)
        if self._object_entries:  # (an env's entries with no fixed shape: _envs.objects)
            batch = with_objects(batch)
        if self._agent_groups:  # (heterogeneous agents: each group lazily stacked, as TorchRL's)
            batch = stack_agents(batch)
        if self.options.track_policy_version:
            with_torchrl_versions(batch)
        if self._reuse_td and not self._object_entries:  # (their shapes and values are each batch's own)
            batch = self._reuse(batch)
        return batch

    def _reuse(self, batch: TensorDictBase) -> TensorDictBase:
        """``return_same_td``: the batch written into the first batch delivered (whose keys it has)."""
        same = self._same_td
        if same is not None and set(batch.keys(True, True)) <= set(same.keys(True, True)):
            return same.update_(batch)
        self._same_td = batch
        return batch

    async def _next_trajectories(self) -> Any:
        """``trajs_per_batch``: collect until that many trajectories are complete (with a replay
        buffer: write those that ended in one collection); ``DONE`` once ``total_frames``
        are collected (trajectories still incomplete then are never delivered, as in TorchRL).
        ``postproc`` applies to each collected batch before assembly, as in TorchRL."""
        opts, assembler, count = self.options, self._assembler, self.options.trajs_per_batch
        assert count is not None  # (the delivery of trajs_per_batch only)
        while True:
            if opts.replay_buffer is None and assembler.ready >= count:
                return assembler.take(count, opts.traj_format)
            batch = await self._next_raw()
            if batch is DONE:
                return DONE
            if opts.postproc is not None:  # on each collected batch, before assembly, as in TorchRL
                batch = opts.postproc(batch)
            batch = without_private_keys(batch)
            if self.post_collect_hook is not None and self._hook_after_postproc:
                self.post_collect_hook(batch)
            assembler.cut(self._take_cut())
            assembler.add(batch)
            if opts.reset_at_each_iter:
                assembler.drop_partial()  # their envs restart: those trajectories never end
            if opts.replay_buffer is not None:
                for trajs in assembler.take_each(opts.trajs_per_write):
                    extend_parts(opts.replay_buffer, trajs)
                return None

    def _deliver(self, batch: TensorDictBase) -> Any:
        """``postproc``, then the replay buffer (``None`` is delivered) or the batch itself,
        less its private keys (``without_private_keys``)."""
        opts = self.options
        if opts.postproc is not None:
            batch = opts.postproc(batch)
        batch = without_private_keys(batch)
        steps = opts.replay_buffer is not None and not self.extend_buffer
        if self.post_collect_hook is not None and self._hook_after_postproc and not steps:
            self.post_collect_hook(batch)  # (TorchRL's Collector has no batch to call it with for extend_buffer=False)
        if opts.replay_buffer is not None:
            if self.extend_buffer:
                extend_parts(opts.replay_buffer, batch)
            else:
                self._add_steps(batch)
            return None
        return batch

    def _add_steps(self, batch: TensorDictBase) -> None:
        """``extend_buffer=False``: the replay buffer gets each step with ``add``, as TorchRL's
        collectors write it while collecting: per worker (``_worker_parts``), one item per time
        step, holding that step of each of the worker's envs (``[]`` for one env, ``[envs]``
        otherwise); a step no env took (``("collector", "mask")``) is left out."""
        buffer = self.options.replay_buffer
        for part in self._worker_parts(batch):
            mask = part.get(MASK, None)
            if mask is not None:
                part = part.exclude(MASK)
            for t in range(part.shape[-1]):
                if mask is not None and not bool(mask[..., t].any()):
                    continue
                buffer.add(part[..., t])

    def _versions(self) -> tuple[int, int] | None:
        """``(version in effect, newest version published)``, or ``None`` without weights."""
        policy = self._policy
        if policy is None or policy.weights is None:
            return None
        return policy.version, policy.latest

    def _measure_lag(self, batch: TensorDictBase) -> None:
        versions = self._versions()
        if versions is None or batch is None:
            return
        tagged = batch.get(("collector", "policy_version"), None)
        if tagged is None:
            return
        tagged = flat_numpy(tagged)  # (numpy: see EpisodeReturns.add)
        tagged = tagged[tagged >= 0]  # -1: masked-out frames
        if tagged.size:
            self._max_lag = max(self._max_lag, versions[1] - int(tagged.min()))

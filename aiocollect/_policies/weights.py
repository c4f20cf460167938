"""Versioned, non-blocking weight updates.

The trainer and the engine live in different threads (or the same thread at different
times). A weight update goes through a ``WeightsChannel`` in two halves:

* **publish** (the caller's thread, inside ``update_policy_weights_``): the new weights
  are copied into a *snapshot* right away, so the caller may change its own parameters
  the moment the call returns, and the snapshot becomes the channel's *pending* one,
  tagged with the next version number. Nothing waits for the engine: publishing takes a
  lock only long enough to swap a reference. A newer publish replaces a pending snapshot
  that was never applied (its version is skipped: no frame ever carries it).
* **apply** (the engine, right before a policy call, under ``WeightsChannel.lock``):
  the pending snapshot's weights are loaded into the policy and its version becomes the
  one *in effect*. Policy calls hold the same lock, so no action is ever computed from a
  mix of two versions.

Version 0 is the weights at construction; each publish adds one. The engine tags every
frame with the version in effect when its action was computed.

On a GPU, taking a snapshot and loading it are device-to-device copies queued on the
trainer's stream and on the policy's, ordered by CUDA events (``_Snapshot``): the update
call returns without waiting for the copy or for the collector's policy calls.

How a snapshot is taken and loaded depends on the policy: ``TorchWeights`` copies
tensors into preallocated buffers (recycled once applied: a 1M-parameter MLP costs two
memcpy of 4 MB, ~60 us each, and no allocation); a JAX policy keeps immutable arrays and
swaps them ([`aiocollect.jax`][aiocollect.jax]).

Two channels watch the module the user trains (``ModuleWatch``: its tensors' in-place
version counters, plus the steps of any ``torch.optim`` optimizer over them):

* ``FollowChannel`` (``Collector``): the policy *is* the user's module, or a copy on
  ``policy_device`` refreshed from it. A change of the module found before a policy call
  is a new version, so the collector acts with the user's current weights and its
  versions stay honest without any ``update_policy_weights_``.
* ``CopyChannel`` (the worker collectors, which collect while the user trains): a private
  copy, changed only by published updates; it warns once when the user's module has
  changed for a long time and no update was ever published.

The runner asks ``has_pending`` before every policy call, holding ``lock``: that is where
these channels look at the module.
"""

from __future__ import annotations

import contextlib
import operator
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDictBase
from torch.nn.parameter import is_lazy
from torch.optim.optimizer import register_optimizer_step_post_hook


class WeightsChannel:
    """Hands weight snapshots from the trainer to the engine; see the module docstring.

    Args:
        snapshot: ``snapshot(weights) -> snap`` copies ``weights`` (whatever the user
            passed) into a form the policy can load later; runs in the caller's thread.
        load: ``load(snap)`` puts a snapshot's weights into the policy; runs under
            ``lock``, between two policy calls.
        recycle: ``recycle(snap)`` gets back a snapshot that was applied or replaced.
    """

    def __init__(self, snapshot: Callable[[Any], Any], load: Callable[[Any], None],
                 recycle: Callable[[Any], None] | None = None):
        self._snapshot, self._load = snapshot, load
        self._recycle = recycle or (lambda snap: None)
        self._swap = threading.Lock()  # guards _pending and latest; held for a few bytecodes
        self.lock: threading.Lock | _CallLock = threading.Lock()
        """Held by whoever calls the policy or loads weights into it."""
        self._pending: tuple[int, Any] | None = None
        self.latest = 0
        """The newest version published."""
        self.version = 0
        """The version in effect: the one the next policy call uses (after ``apply_pending()``)."""
        self.fence: tuple[torch.device | None, Any] | None = None
        """``(GPU, CUDA event)`` that the stream of the next policy call on that GPU must wait
        for, or ``None``: set where weights reach the policy on a stream it may not run on
        (``FollowChannel``); the runner takes it under ``lock``."""

    @property
    def has_pending(self) -> bool:
        """Whether ``apply_pending()`` has work; the runner asks before every policy call."""
        return self._pending is not None

    def publish(self, weights: Any) -> int:
        """Snapshot ``weights`` and make them the pending version; returns that version."""
        snap = self._snapshot(weights)
        with self._swap:
            self.latest += 1
            replaced, self._pending = self._pending, (self.latest, snap)
            version = self.latest
        if replaced is not None:
            self._recycle(replaced[1])
        return version

    def skip_to(self, version: int) -> None:
        """The next version published is numbered at least ``version`` (a checkpoint's weights
        take their saved version up again); the numbers skipped are never in effect."""
        with self._swap:
            self.latest = max(self.latest, version - 1)

    def apply_pending(self) -> None:
        """Load the pending snapshot, if any. The caller holds ``lock``."""
        with self._swap:
            pending, self._pending = self._pending, None
        if pending is None:
            return
        version, snap = pending
        self._load(snap)
        self.version = version
        self._recycle(snap)

    def try_apply(self) -> bool:
        """Apply the pending snapshot now unless a policy call is under way; ``True`` if
        every published version is in effect afterwards."""
        if not self.lock.acquire(blocking=False):
            return False
        try:
            self.apply_pending()
        finally:
            self.lock.release()
        return self.version >= self.latest


_COMPILED = "_orig_mod."
"""What ``torch.compile`` puts in the names of a compiled module's weights."""


def _plain(name: str) -> str:
    """A weight's name as the uncompiled module names it: a compiled policy takes the
    weights of a plain module, and the other way round."""
    return name.replace(_COMPILED, "")


class _Snapshot(list):
    """A snapshot's tensors. On a GPU every copy is queued, not waited for: ``ready`` is
    recorded on the trainer's stream after the snapshot was taken, ``loaded`` on the
    policy's stream after it was loaded. A load waits for ``ready`` and a reuse of the
    buffers for ``loaded``, on the GPU: the host never waits, and the copies are ordered
    even when the trainer and the policy use different streams."""

    ready: Any = None
    loaded: Any = None



def tensor_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``module.state_dict(keep_vars=True)`` less what is not a tensor: its parameters and
    buffers, the weights that updates and checkpoints carry. A module's *extra state*
    (``get_extra_state``, any picklable object) is not versioned weights: updates leave it as
    it is, as TorchRL's (``TensorDict.from_module``) do, and a policy that has some stays in
    the main process (``_collectors.placement``)."""
    return {k: v for k, v in module.state_dict(keep_vars=True).items() if isinstance(v, torch.Tensor)}


def _weights_of(state: Any) -> dict:
    """A state dict given as weights, less its extra-state entries (``tensor_state``)."""
    return {k: v for k, v in state.items() if not (k.endswith("_extra_state") and not isinstance(v, torch.Tensor))}

def _cuda_device(module: torch.nn.Module) -> torch.device | None:
    """The GPU holding ``module``'s first tensor on a GPU, or ``None``."""
    for t in tensor_state(module).values():
        if t.is_cuda:
            return t.device
    return None


def _stream_of(snap: list[torch.Tensor]) -> Any:
    """The current CUDA stream of this thread on the snapshot's device, or ``None`` off CUDA."""
    if snap and snap[0].is_cuda:
        return torch.cuda.current_stream(snap[0].device)
    return None


class TorchWeights:
    """Snapshots of an ``nn.Module``'s parameters and buffers (see the module docstring).

    The policy's ``state_dict`` names every tensor; a source must give every one of them
    with the same shape: a module of the same structure, a TensorDict of its parameters
    (``TensorDict.from_module``, nested keys are joined with ``"."``) or a state dict.
    ``torch.compile`` makes no difference: names are compared without its ``_orig_mod.``.
    Snapshots live on the policy's device: an update from a trainer on another device is
    copied there in the update call.

    **Lazy modules** (``nn.LazyLinear``...): a tensor still uninitialised takes any shape.
    Its first policy call initialises it (torch's own first-forward rule), or, when an
    update comes first, the update's shapes do (as ``load_state_dict`` would); either way
    every later update must match the shapes it then has.

    **No tensors** (an ``nn.Module`` policy without parameters or buffers, e.g. a random one):
    an update still makes a new version, and copies nothing (TorchRL's update does
    nothing to such a policy either).
    """

    def __init__(self, policy: torch.nn.Module):
        self.module = policy
        self.stream: Any = None
        """The CUDA stream the policy runs on, if it has its own (``PolicyRunner``): loads are
        queued there, ordered with the policy's calls whichever thread loads."""
        self._free: list[_Snapshot] = []
        self._lock = threading.Lock()
        self._bind()

    def _bind(self) -> None:
        """Look the module's tensors up (again: initialising a lazy tensor gives it new data)."""
        state = tensor_state(self.module)
        names = [_plain(name) for name in state]
        params = list(state.values())
        lazy = any(is_lazy(t) for t in params)
        # one assignment: the engine and the caller's thread may both rebind
        self._view = (names, set(names), params, [t.data for t in params], lazy)

    def _now(self) -> tuple[list[str], set[str], list[torch.Tensor], list[torch.Tensor], bool]:
        if self._view[4]:
            self._bind()
        return self._view

    def sources(self, weights: Any) -> list[torch.Tensor]:
        """The tensors of ``weights``, in the policy's order; raises if they do not fit."""
        if isinstance(weights, torch.nn.Module):
            state = tensor_state(weights)
        elif isinstance(weights, TensorDictBase):
            state = dict(weights.flatten_keys(".").items())
        elif isinstance(weights, dict):
            state = _weights_of(weights)
        else:
            raise TypeError(
                "update_policy_weights_: expected a module, a TensorDict of parameters, a state "
                f"dict or None; got {type(weights).__name__}."
            )
        if any(_COMPILED in name for name in state):
            state = {_plain(name): value for name, value in state.items()}
        names, known, params, _, _ = self._now()
        missing = [n for n in names if n not in state]
        extra = [n for n in state if n not in known]
        if missing or extra:
            misfit = "; ".join([f"missing {missing[:5]}"] * bool(missing) + [f"unexpected {extra[:5]}"] * bool(extra))
            error = KeyError(
                f"update_policy_weights_: the weights do not fit the collector's policy; {misfit}. Pass a module "
                "of the same structure, TensorDict.from_module(module), or its state_dict()."
            )
            error.misfit = misfit  # type: ignore[attr-defined]  # what load_state_dict says of a checkpoint's weights (policy_state_error)
            raise error
        out = []
        for name, param in zip(names, params):
            src = state[name]
            if not isinstance(src, torch.Tensor):
                src = torch.as_tensor(src)
            if is_lazy(src):
                raise ValueError(
                    f"update_policy_weights_: {name!r} is not initialised yet (a lazy module); run "
                    "your policy once on an observation (or train a step) before sending its weights."
                )
            if not is_lazy(param) and src.shape != param.shape:
                raise ValueError(
                    f"update_policy_weights_: {name!r} has shape {tuple(src.shape)}, the "
                    f"collector's policy has {tuple(param.shape)}."
                )
            out.append(src)  # no .detach(): every torch call lets the engine thread take the GIL
        return out

    def snapshot(self, weights: Any) -> _Snapshot:
        sources = self.sources(weights)
        _, _, params, targets, lazy = self._view
        buf: _Snapshot | None = None
        if not lazy:
            with self._lock:
                buf = self._free.pop() if self._free else None
        if buf is None:
            if lazy:  # shaped like the sources: they initialise the policy's lazy tensors
                buf = _Snapshot(torch.empty(s.shape, dtype=p.dtype, device=p.device) for s, p in zip(sources, params))
            else:
                buf = _Snapshot(torch.empty_like(t) for t in targets)
            if self.stream is not None and buf and buf[0].is_cuda:
                for t in buf:  # made on this thread's stream, read on the policy's: freed only after both
                    t.record_stream(self.stream)
        stream = _stream_of(buf)
        if stream is not None and buf.loaded is not None:
            stream.wait_event(buf.loaded)  # a recycled buffer: its last load must be done
        # one call, one release of the GIL: while the engine thread runs the policy, each
        # torch call here would wait for the GIL to come back (none for a policy without
        # tensors: the update is a new version with nothing to copy)
        if buf:
            # a queued copy from page-locked host memory reads it later, when the caller may
            # have changed it already: such sources are copied before the call returns
            # (pageable memory is staged by CUDA before the copy call returns anyway)
            queued = not (buf[0].is_cuda and any(s.device.type == "cpu" and s.is_pinned() for s in sources))
            with torch.no_grad():
                torch._foreach_copy_(buf, sources, non_blocking=queued)
        if stream is not None:
            buf.ready = stream.record_event()
        return buf

    def load(self, snap: list[torch.Tensor]) -> None:
        _, _, params, targets, lazy = self._now()
        if lazy:  # an update before the first policy call: its shapes initialise the module
            for param, src in zip(params, snap):
                if is_lazy(param):
                    param.materialize(src.shape)
            self._bind()
            targets = self._view[3]
        with contextlib.nullcontext() if self.stream is None else torch.cuda.stream(self.stream):
            stream = _stream_of(snap)
            ready = getattr(snap, "ready", None)  # (none for the sources themselves: FollowChannel)
            if stream is not None and ready is not None:
                stream.wait_event(ready)  # taken on the trainer's stream, perhaps another one
            elif not isinstance(snap, _Snapshot) and targets and targets[0].is_cuda:
                # the user's own GPU tensors (a policy copy following them): read after the
                # writes queued on their device's default stream, where an optimiser steps
                here = torch.cuda.current_stream(targets[0].device)
                for device in {t.device for t in snap if t.is_cuda}:
                    here.wait_stream(torch.cuda.default_stream(device))
            if targets:  # (a module without parameters or buffers: nothing to load)
                with torch.no_grad():
                    torch._foreach_copy_(targets, snap, non_blocking=True)
            if stream is not None and isinstance(snap, _Snapshot):
                snap.loaded = stream.record_event()

    def recycle(self, snap: _Snapshot) -> None:
        targets = self._view[3]
        if any(a.shape != b.shape for a, b in zip(snap, targets)):
            return  # taken while the policy was lazy
        with self._lock:
            if len(self._free) < 2:
                self._free.append(snap)


# ---------------------------------------------------------------------------- watching a module

_VERSION = operator.attrgetter("_version")
_WATCHES: weakref.WeakSet[ModuleWatch] = weakref.WeakSet()
_HOOKED = False


def _count_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """A global ``torch.optim`` post-step hook: each ``ModuleWatch`` whose tensors this
    optimizer holds counts the step (fused optimizers do not bump version counters)."""
    try:
        for watch in list(_WATCHES):
            watch.count(optimizer)
    except Exception:  # noqa: BLE001 - never fail the user's optimiser step
        pass


class ModuleWatch:
    """Whether a module's parameters or buffers changed since ``mark()``.

    ``now()`` sums the tensors' version counters, which every in-place change bumps (an
    optimiser step, ``load_state_dict``, ``copy_`` or ``fill_`` under ``no_grad``), and the
    steps of any ``torch.optim`` optimiser that holds them (a fused optimiser bumps no
    counter). Both only grow, so the sum changes whenever either does. It costs about
    0.1 us per tensor. Not seen: writes through ``.data`` and tensors replaced by new
    objects (``module.weight = ...``, ``TensorDict.to_module``).
    """

    def __init__(self, module: torch.nn.Module):
        global _HOOKED
        tensors = []
        for t in tensor_state(module).values():
            try:
                t._version  # noqa: B018 - an inference tensor has no counter: it cannot change here
            except RuntimeError:
                continue
            tensors.append(t)
        self.tensors = tensors
        self._ids = {id(t) for t in tensors}
        self._holds: weakref.WeakKeyDictionary[torch.optim.Optimizer, bool] = weakref.WeakKeyDictionary()
        self.steps = 0
        """Optimiser steps over these tensors."""
        if not _HOOKED:
            register_optimizer_step_post_hook(_count_step)
            _HOOKED = True
        _WATCHES.add(self)
        self.seen = self.now()
        """``now()`` at the last ``mark()``."""

    def count(self, optimizer: torch.optim.Optimizer) -> None:
        holds = self._holds.get(optimizer)
        if holds is None:
            ids = self._ids
            holds = self._holds[optimizer] = any(
                id(p) in ids for group in optimizer.param_groups for p in group["params"]
            )
        if holds:
            self.steps += 1

    def now(self) -> int:
        return sum(map(_VERSION, self.tensors)) + self.steps

    def changed(self) -> bool:
        return self.now() != self.seen

    def mark(self, at: int | None = None) -> None:
        self.seen = self.now() if at is None else at

    @property
    def lazy(self) -> bool:
        """Some tensor is not initialised yet (a lazy module before its first call)."""
        return any(is_lazy(t) for t in self.tensors)


class _CallLock:
    """A ``threading.Lock`` that calls ``on_release()``, still holding it, before each release:
    after every policy call (the runner holds the lock for each) and every load."""

    __slots__ = ("_lock", "on_release")

    def __init__(self, on_release: Callable[[], None]):
        self._lock = threading.Lock()
        self.on_release = on_release

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        try:
            self.on_release()
        finally:
            self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc_info: Any) -> None:
        self.release()


class FollowChannel(WeightsChannel):
    """The policy acts with the module the user trains (``Collector``); see the module docstring.

    The policy is ``source`` itself (*shared*) or a copy of it (on ``policy_device``). Before
    each policy call, if ``source`` changed since the version in effect was taken, the
    change becomes a new version: nothing to load when shared, a copy from ``source``
    otherwise. Published updates go through the channel as usual; loaded into a shared
    policy they change the user's module (as TorchRL's ``Collector`` does). A publish of
    ``source`` itself to a shared policy copies nothing: it only makes a version.

    A shared lazy module is initialised by its first call: that call's change is not the
    user's, so the module is looked at again after it (``_CallLock``).
    """

    def __init__(self, weights: TorchWeights, source: torch.nn.Module):
        super().__init__(self._take, self._put, self._give_back)
        self._weights = weights
        self._source = source
        self.shared = weights.module is source
        self._gpu = _cuda_device(source) if self.shared else None
        """The GPU of a shared module: weights loaded into it from the trainer's thread are
        queued on the trainer's stream, which the policy's calls do not run on (``fence``)."""
        self.watch = ModuleWatch(source)
        self._lazy = self.shared and self.watch.lazy
        if self._lazy:
            self.lock = _CallLock(self._after_call)

    @property
    def has_pending(self) -> bool:
        return self._pending is not None or self.watch.changed()

    def apply_pending(self) -> None:
        now = self.watch.now()
        with self._swap:  # one step with publish: versions stay in order
            pending, self._pending = self._pending, None
            if pending is None:
                if now == self.watch.seen:
                    return
                self.latest += 1
                pending = (self.latest, None)
        version, snap = pending
        if snap is None:  # the user's module changed: a version of its own
            if not self.shared:
                self._weights.load(self._weights.sources(self._source))
            self.watch.mark(now)
        else:
            self._load(snap)
            self._recycle(snap)
        self.version = version

    def _take(self, weights: Any) -> tuple[int, _Snapshot | None, Any]:
        at = self.watch.now()  # what the source held when these weights were sent
        buf = None if self.shared and weights is self._weights.module else self._weights.snapshot(weights)
        # on a GPU: where the caller's stream stood (its writes to a shared module before the publish)
        taken = None if self._gpu is None else torch.cuda.current_stream(self._gpu).record_event()
        return at, buf, taken

    def _put(self, snap: tuple[int, _Snapshot | None, Any]) -> None:
        at, buf, taken = snap
        gpu = self._gpu
        if taken is not None:
            torch.cuda.current_stream(gpu).wait_event(taken)
        if buf is None:
            self.watch.mark(at)  # changes after the publish are a version of their own
        else:
            self._weights.load(buf)
            # a load into the shared module is that module's state now; a copy follows the
            # source again when it changes after the publish
            self.watch.mark(None if self.shared else at)
        if gpu is not None:  # the next policy call, on whichever stream, comes after this
            self._fence_after(torch.cuda.current_stream(gpu))

    def _give_back(self, snap: tuple[int, _Snapshot | None, Any]) -> None:
        if snap[1] is not None:
            self._weights.recycle(snap[1])

    def follow_caller(self) -> None:
        """Order the next policy call after what this thread has queued on its current CUDA
        stream, when that is not the default stream the calls of a shared module run on: an
        optimiser step under ``torch.cuda.stream(s)``, then ``next(collector)`` with no
        publish, is read by the next call only once the step is done on the GPU."""
        gpu = self._gpu
        if gpu is None:
            return
        here = torch.cuda.current_stream(gpu)
        if here == torch.cuda.default_stream(gpu):
            return  # (the calls' own stream: ordered already)
        with self.lock:
            self._fence_after(here)

    def _fence_after(self, stream: Any) -> None:
        """Make ``fence`` order the next policy call after what ``stream`` has queued so far,
        and after the fence there was (a load on another stream not waited for yet)."""
        if self.fence is not None:
            stream.wait_event(self.fence[1])
        self.fence = self._gpu, stream.record_event()

    def _after_call(self) -> None:
        if self._lazy and not self.watch.lazy:  # the call (or a load) initialised the module
            self._lazy = False
            self.watch.mark()


STALE_WARNING_S = 30.0
"""How long a worker collector's source may have changed, with no update ever published,
before ``CopyChannel`` warns."""


class CopyChannel(WeightsChannel):
    """A private copy's channel that warns once about a user who never publishes.

    The worker collectors collect while the user trains, so they run a copy and take new
    weights only when published. If the module the user passed (``source``) changes (an
    optimiser step) and no update is published for ``STALE_WARNING_S`` seconds, ever, the
    collector is most likely acting with its construction weights by mistake: a
    ``UserWarning`` says so, once. After the first publish the source is no longer looked at.
    """

    def __init__(self, weights: TorchWeights, source: torch.nn.Module | None):
        super().__init__(weights.snapshot, weights.load, weights.recycle)
        self._watch = None if source is None else ModuleWatch(source)
        self._since: float | None = None

    @property
    def has_pending(self) -> bool:
        if self._watch is not None:
            self._look()
        return self._pending is not None

    def _look(self) -> None:
        if self.latest:  # the user publishes updates
            self._watch = None
            return
        if self._watch is None or not self._watch.changed():
            return
        now = time.monotonic()
        if self._since is None:
            self._since = now
        elif now - self._since >= STALE_WARNING_S:
            self._watch = None
            warnings.warn(
                f"aiocollect: the policy you passed to the collector has changed (an optimiser step?) "
                f"for {now - self._since:.0f} s, but update_policy_weights_() was never called: the "
                "collector still acts with the copy it took at construction (policy_version 0). Call "
                "collector.update_policy_weights_() after your optimiser steps (docs/weights.md).",
                UserWarning,
                stacklevel=1,
            )

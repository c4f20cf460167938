"""The remote end of a distributed collector: an aiocollect collector in another process.

``RemoteCollector`` is what a Ray actor (``_distributed.ray_collector``) or an RPC worker
(``_distributed.rpc_collector``) holds: a local collector (``Collector``, ``MultiSyncCollector`` or
``MultiAsyncCollector``) built from cloudpickled arguments, stepped one batch per
``next_batch()`` call. The transport only moves batches out (each with the ids of the
trajectories its resets cut: ``next_batch``) and weights in.

Weights arrive tagged with the *driver's* version number. The local collector counts its
own versions (one per update it received); the remote collector maps them back, so every
frame's ``("collector", "policy_version")`` is the driver's version, whichever subset of
remote collectors each update was sent to.

Arguments travel as cloudpickle bytes and are unpickled after the driver's ``sys.path`` is
in place: env factories and policies defined in the driver's own modules (a script, a test
file) import in the remote process too. The driver's ``AIOCOLLECT_*`` switches
(``AIOCOLLECT_POLICY_IN_WORKERS``, ``AIOCOLLECT_SPIN``, ``AIOCOLLECT_PIPELINE``) travel with
them (``switches``) and are set in the remote process before its collector is built, so the
remote collectors choose as a local one would: a Ray actor's process was started with the
environment of whoever started its node, not the driver's environment of now.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from typing import Any

import cloudpickle
import torch

from .._errors import CollectorError, add_note, pickled_exception, unpickled_exception
from .._errors import RemoteCollectorError as RemoteCollectorError


def resolve_collector_class(collector_class: Any) -> type:
    """``collector_class`` as a class: a collector class, or "single" / "sync" / "async"."""
    from .._collectors.collector import Collector
    from .._collectors.multi_async import MultiAsyncCollector
    from .._collectors.multi_sync import MultiSyncCollector

    if isinstance(collector_class, str):
        named = {"single": Collector, "sync": MultiSyncCollector, "async": MultiAsyncCollector}
        if collector_class not in named:
            raise ValueError(
                f"collector_class={collector_class!r}: use 'single', 'sync', 'async', or one of "
                "aiocollect.Collector, MultiSyncCollector, MultiAsyncCollector."
            )
        return named[collector_class]
    allowed = (Collector, MultiSyncCollector, MultiAsyncCollector)
    if not (isinstance(collector_class, type) and issubclass(collector_class, allowed)):
        raise TypeError(
            f"collector_class={collector_class!r}: a remote collector runs an aiocollect collector: "
            "aiocollect.Collector, MultiSyncCollector or MultiAsyncCollector (or 'single', 'sync', 'async'). "
            "TorchRL's collector classes are not accepted."
        )
    return collector_class


def portable_weights(weights: Any) -> Any:
    """What travels to remote collectors: a CPU state dict for torch weights (not the
    module), anything else (a JAX params pytree) as it is."""
    from tensordict import TensorDictBase

    from .._policies.weights import tensor_state

    if isinstance(weights, torch.nn.Module):
        return {k: v.detach().cpu() for k, v in tensor_state(weights).items()}
    if isinstance(weights, TensorDictBase):
        return {k: v.detach().cpu() for k, v in weights.flatten_keys(".").items()}
    if isinstance(weights, dict) and all(isinstance(v, torch.Tensor) for v in weights.values()):
        return {k: v.detach().cpu() for k, v in weights.items()}
    return weights


class RemoteFailure:
    """The exception a remote collector raised, sent back as a value rather than raised.

    Ray re-raises a remote exception as its own type, but ``torch.distributed.rpc`` turns
    every one into a ``RuntimeError`` with the text; as a value, the exception travels
    pickled and the driver raises it as it was, with the remote traceback as a note, under
    the same [`RemoteCollectorError`][aiocollect.RemoteCollectorError] on either transport."""

    def __init__(self, exc: BaseException):
        self.text = f"{type(exc).__name__}: {exc}"
        self.traceback = "".join(traceback.format_exception(exc))
        self.data = pickled_exception(exc)

    def exception(self) -> BaseException:
        """The remote exception (a ``CollectorError`` with its text if it could not travel)."""
        exc = unpickled_exception(self.data) or CollectorError(self.text)
        add_note(exc, f"remote traceback:\n{self.traceback}")
        return exc


def switches() -> dict[str, str]:
    """This process's ``AIOCOLLECT_*`` environment variables, for ``RemoteCollector``: the
    engine's switches (``_collectors``, ``_policies.actor``), read as a collector is built."""
    return {name: value for name, value in os.environ.items() if name.startswith("AIOCOLLECT_")}


class RemoteCollector:
    """A local aiocollect collector, driven from another process; see the module docstring.

    ``sys_path`` and ``switches`` are the driver's (``switches()``): the paths are added in
    front of this process's, the switches set here (one the driver did not set stays as it is
    here)."""

    def __init__(self, payload: bytes, sys_path: list[str], switches: dict[str, str]):
        for entry in reversed(sys_path):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        os.environ.update(switches)
        cls, args, kwargs, self.index = cloudpickle.loads(payload)
        torch.set_num_threads(1)
        self.collector = cls(*args, **kwargs)
        # the ids of trajectories its resets cut travel with its batches: the driver's
        # trajs_per_batch must drop those (they never end) rather than hold them for good
        self.collector._scheduler.timelines.keep_cut = True
        self._iter = iter(self.collector)
        self._global = [0]  # local policy version -> driver's version
        self._published = 0  # the newest driver version published to the local collector
        self._lock = threading.Lock()

    def info(self) -> tuple[int, int]:
        """``(pid, number of envs)``: also the sign that the collector was built."""
        import os

        return os.getpid(), self.collector.num_envs

    def set_seed(self, seed: int, static_seed: bool) -> int:
        return self.collector.set_seed(seed, static_seed)

    def next_batch(self, min_version: int = 0) -> Any:
        """``(batch, cut)``: the next batch, its policy versions in the driver's numbering, and
        the ids (this collector's numbering) of the trajectories that resets cut since the
        last call (``set_seed``, ``load_state_dict``: see ``_engine.timelines``); or a
        ``RemoteFailure``.

        ``min_version``: wait until the driver's weights of that version, whose load request
        was sent before this call, are published here, so the whole batch uses them.
        """
        deadline = time.monotonic() + 60
        while self._published < min_version and time.monotonic() < deadline:
            time.sleep(0.0002)  # the load runs in the actor's other thread
        try:
            batch = next(self._iter)
        except StopIteration:
            raise
        except Exception as exc:  # noqa: BLE001 - returned, so that every transport keeps its type
            return RemoteFailure(exc)
        versions = None if batch is None else batch.get(("collector", "policy_version"), None)
        if versions is not None:
            table = torch.tensor([-1, *self._global], dtype=torch.int64)  # -1 stays -1
            batch.set(("collector", "policy_version"), table[versions + 1])
        return batch, self.collector._take_cut()

    def load_weights(self, weights: Any, version: int, wait: bool = False) -> int:
        """Publish ``weights`` as the driver's ``version``; with ``wait``, return once they
        are in effect. Runs concurrently with ``next_batch`` (a second actor thread)."""
        with self._lock:
            # map the local version before publishing it: a batch may carry it at once
            local = self.collector._policy.latest + 1
            self._global.extend([version] * (local + 1 - len(self._global)))
            self._global[local] = version
            self.collector.update_policy_weights_(weights)
            self._published = max(self._published, version)
        if wait:
            channel = self.collector._policy.weights
            while channel is not None and channel.version < local and not channel.try_apply():
                time.sleep(0.0005)
        return version

    def state_dict(self) -> Any:
        return self.collector.state_dict()

    def load_state_dict(self, state_dict: dict, version: int, strict: bool) -> int:
        """Load a checkpoint; its policy weights (if any) become the driver's ``version``,
        mapped as ``load_weights`` maps them."""
        with self._lock:
            weights = state_dict.get("policy_state_dict")
            if weights is not None:
                local = self.collector._policy.latest + 1
                self._global.extend([version] * (local + 1 - len(self._global)))
                self._global[local] = version
            self.collector.load_state_dict(state_dict, strict)
            if weights is not None:
                self._published = max(self._published, version)
        return version

    def statistics(self) -> Any:
        return self.collector.statistics()

    def shutdown(self) -> None:
        self.collector.shutdown()

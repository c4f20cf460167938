"""Where a collection's time goes: counters a user can print, and ranges for torch's profiler.

``collector.enable_profile()`` (TorchRL's name) gives the collector a ``Profile``. From then
on the engine times its parts as it runs them, and names them for ``torch.profiler`` with
``record_function`` ranges:

* ``aiocollect.policy``: each policy call (one per round, over every ready env);
* ``aiocollect.batch``: each batch copied out of the rollout storage.

Making a batch what the user gets (the storing device, ``split_trajs``, ``postproc``, the
replay buffer, ``trajs_per_batch``) is timed as *delivery*. The caller's side is timed too:
how long your loop waited for each batch, and how long it spent between two batches
(training, usually), and for a ``MultiSyncCollector`` how much of the wait came after the
first worker had its share, waiting for the slowest (``straggled``).
``collector.profile_report()`` returns a frozen ``ProfileReport`` of
the counters; ``print()`` shows it as a table.

With ``save_path`` (or ``on_trace_ready``), the batches from ``warmup_rollouts`` up to
``num_rollouts`` are also recorded by ``torch.profiler`` and the trace saved as a Chrome
trace (open it in ``chrome://tracing`` or Perfetto). torch's profiler records the thread it
is started in: the collector starts it where its engine runs (the loop thread of a worker
collector, the thread that iterates a ``Collector``).

Off (no ``enable_profile()``), the engine pays an ``is None`` test or two per round.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.profiler import ProfilerActivity, profile, record_function

logger = logging.getLogger("aiocollect")

_ACTIVITIES = {"cpu": ProfilerActivity.CPU, "cuda": ProfilerActivity.CUDA}


@dataclass(frozen=True)
class ProfileReport:
    """A frozen snapshot of a collector's profile (``collector.profile_report()``).

    Seconds are wall-clock time since ``enable_profile()``. The engine's parts
    (``policy_seconds``, ``batch_seconds``) run while your loop waits for a batch
    (``wait_seconds``) or, for collectors that collect ahead (``MultiAsyncCollector``,
    ``start()``), while it trains (``caller_seconds``); the rest of the wait is the envs
    stepping and the engine's own bookkeeping.

    Examples:
        >>> collector.enable_profile()
        >>> for batch in collector:
        ...     train(batch)
        >>> print(collector.profile_report())
    """

    policy_calls: int
    """Policy calls (one per round; none for random actions taken in runs)."""
    policy_rows: int
    """Envs acted for, over every policy call (``policy_rows / policy_calls``: envs per call)."""
    policy_seconds: float
    """Time inside the policy calls."""
    batches: int
    """Batches delivered."""
    frames: int
    """Frames delivered."""
    batch_seconds: float
    """Time copying batches out of the rollout storage."""
    deliver_seconds: float
    """Time making batches what the user gets (storing device, ``split_trajs``,
    ``postproc``, the replay buffer, ``trajs_per_batch``)."""
    wait_seconds: float
    """Time your loop waited for the batches (the collection, as seen from your loop)."""
    caller_seconds: float
    """Time your loop spent between two batches (your training step)."""
    straggler_seconds: float = 0.0
    """``MultiSyncCollector`` only (0 elsewhere): the part of the wait during which the first
    worker had its share of the batch and the others were still stepping. Each batch waits
    for its last worker; a large figure says the workers differ in speed (or the machine's
    cores do, moment to moment). ``preemptive_threshold`` cuts the batch before the last
    workers are done, and larger batches even their shares out."""
    policy_placement: str = ""
    """Where the policy ran: ``"here"`` (in this process, each call timed above) or ``"in the
    workers"`` (each worker's own copy, inside its runs of steps: no call is timed one by one),
    followed by what the collector measured to choose, where it did
    (``collector.placement_costs``); ``""`` where the collector does not say (a distributed
    collector: each remote collector chooses for itself)."""

    def __str__(self) -> str:
        per_call = self.policy_rows / self.policy_calls if self.policy_calls else 0.0
        per_frame = 1e6 / self.frames if self.frames else 0.0
        rows = [
            ("policy calls", f"{self.policy_calls}", f"{per_call:.1f} envs per call"),
            ("policy", f"{self.policy_seconds:.3f} s", f"{self.policy_seconds * per_frame:.2f} us/frame"),
            ("batches out of storage", f"{self.batch_seconds:.3f} s", f"{self.batch_seconds * per_frame:.2f} us/frame"),
            ("delivery", f"{self.deliver_seconds:.3f} s", f"{self.deliver_seconds * per_frame:.2f} us/frame"),
            ("your loop waited", f"{self.wait_seconds:.3f} s", f"{self.wait_seconds * per_frame:.2f} us/frame"),
            ("your loop's own time", f"{self.caller_seconds:.3f} s", f"{self.caller_seconds * per_frame:.2f} us/frame"),
        ]
        if self.straggler_seconds:
            s = self.straggler_seconds
            rows.insert(-1, ("  of it, for the slowest worker", f"{s:.3f} s", f"{s * per_frame:.2f} us/frame"))
        head = f"aiocollect profile: {self.frames} frames in {self.batches} batches"
        if self.policy_placement:
            head += f"; the policy ran {self.policy_placement}"
        width = max(len(r[0]) for r in rows)
        return "\n".join([head, *(f"  {a:<{width}}  {b:>10}  {c}" for a, b, c in rows)])


class Profile:
    """The counters, and the torch profiler's trace while it records (see the module docstring)."""

    def __init__(self, *, num_rollouts: int = 3, warmup_rollouts: int = 1, save_path: str | Path | None = None,
                 on_trace_ready: Callable[[Any], None] | None = None, activities: list[str] | None = None,
                 **torch_options: Any):
        self.policy_calls = self.policy_rows = self.batches = self.frames = 0
        self.policy_s = self.batch_s = self.deliver_s = self.wait_s = self.caller_s = self.straggler_s = 0.0
        self._handed_out: float | None = None
        """When the last batch went to the caller (``None``: none since it asked)."""
        self._since = time.perf_counter()
        """When the part of the caller's wait under way began."""
        self._trace_from, self._trace_to = warmup_rollouts, num_rollouts
        self._save_path = None if save_path is None else Path(save_path)
        self._on_trace_ready = on_trace_ready
        self._activities = [_ACTIVITIES[a] for a in (activities or ["cpu"])]
        self._torch_options = torch_options
        self._trace: profile | None = None
        self._trace_thread: int | None = None
        self.trace_saved: Path | None = None

    # ------------------------------------------------------------------ the engine's parts

    def policy(self, runner: Callable, obs: Any, n: int) -> Any:
        """``runner(obs, n)``, timed and named."""
        start = time.perf_counter()
        with record_function("aiocollect.policy"):
            out = runner(obs, n)
        self.policy_s += time.perf_counter() - start
        self.policy_calls += 1
        self.policy_rows += n
        return out

    def batch(self, build: Callable[[], Any]) -> Any:
        """``build()``, a batch copied out of the storage, timed and named."""
        start = time.perf_counter()
        with record_function("aiocollect.batch"):
            out = build()
        self.batch_s += time.perf_counter() - start
        return out

    def straggled(self, seconds: float) -> None:
        """A batch waited ``seconds`` for its last worker once the first had its share
        (``MultiSyncCollector``)."""
        self.straggler_s += seconds

    # ------------------------------------------------------------------ the caller's side

    def asked(self) -> None:
        """The caller asks for a batch: the time since it got the last one was its own."""
        now = time.perf_counter()
        if self._handed_out is not None:
            self.caller_s += now - self._handed_out
            self._handed_out = None
        self._since = now

    def collected(self, frames: int) -> None:
        """A batch of ``frames`` was collected for the caller."""
        now = time.perf_counter()
        self.wait_s += now - self._since
        self._since = now
        self.batches += 1
        self.frames += frames

    def delivered(self) -> None:
        """What the caller gets is ready: it is the caller's now."""
        now = time.perf_counter()
        self.deliver_s += now - self._since
        self.wait_s += now - self._since
        self._handed_out = now

    # ------------------------------------------------------------------ torch's profiler

    @property
    def traces(self) -> bool:
        return self._save_path is not None or self._on_trace_ready is not None

    def trace_step(self, batch_index: int) -> None:
        """Before collecting batch ``batch_index`` (0: the first since ``enable_profile``),
        in the engine's thread: start the trace at ``warmup_rollouts``, end it at ``num_rollouts``."""
        if not self.traces:
            return
        if self._trace is None and self.trace_saved is None and self._trace_from <= batch_index < self._trace_to:
            self._trace = profile(activities=self._activities, **self._torch_options)
            self._trace.__enter__()
            self._trace_thread = threading.get_ident()
        elif self._trace is not None and batch_index >= self._trace_to:
            self.finish()

    @property
    def tracing(self) -> bool:
        """A trace is under way (started, not ended yet)."""
        return self._trace is not None

    def in_trace_thread(self) -> bool:
        """Whether this thread is the one the trace under way began in (``True`` with none)."""
        return self._trace is None or threading.get_ident() == self._trace_thread

    def finish(self) -> bool:
        """End the trace under way, if one is, and save it; ``False`` where it cannot end here.

        torch's profiler ends a trace only in the thread it began in: ended in another, it
        finds no session, and the process crashes at exit (as it does when the thread that
        began a trace ends first). So the collector ends it on its engine's thread (at the
        last batch, or as its loop thread stops: ``LoopThread.at_exit``); called in another
        thread, this leaves the trace as it is, says so, and returns ``False``.
        """
        trace = self._trace
        if trace is None:
            return True
        if not self.in_trace_thread():
            logger.warning("aiocollect: the profile's trace was not saved: it records the thread it began in, "
                           "and torch's profiler can end it only there; end the iteration (or shut the "
                           "collector down) in the thread that iterates it")
            return False
        self._trace = None
        trace.__exit__(None, None, None)
        if self._on_trace_ready is not None:
            self._on_trace_ready(trace)
        if self._save_path is not None:
            _export(trace, self._save_path)
            self.trace_saved = self._save_path
        return True

    def report(self) -> ProfileReport:
        return ProfileReport(self.policy_calls, self.policy_rows, self.policy_s, self.batches, self.frames,
                             self.batch_s, self.deliver_s, self.wait_s, self.caller_s, self.straggler_s)


def _export(trace: profile, path: Path) -> None:
    """Save ``trace`` as a Chrome trace at ``path``, or raise ``OSError``: torch's exporter
    only logs a failure (the file cannot be written, the path became a folder) and leaves its
    ``<path>.tmp`` behind; that is removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    before = path.stat().st_mtime_ns if path.is_file() else None
    trace.export_chrome_trace(str(path))
    if not path.is_file() or path.stat().st_mtime_ns == before:
        path.with_name(path.name + ".tmp").unlink(missing_ok=True)
        raise OSError(f"aiocollect: the profile's trace could not be written to {str(path)!r} (is it writable, "
                      "and not a folder?)")

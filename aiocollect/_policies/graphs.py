"""CUDA graphs of a policy's calls (``cudagraph_policy``, TorchRL's keyword): one graph per row count.

A small policy on a GPU spends most of a call launching kernels: a three-layer MLP is a
dozen launches of several microseconds of CPU each, for microseconds of GPU work, and in
the worker collectors that CPU is the engine thread's, which also steps the rounds. A CUDA
graph records a call's kernels once and replays them with one launch. With
``cudagraph_policy=True`` the collector does that for its torch policy on a CUDA device:

* **Per row count.** A call covers some number of envs: always the same in ``Collector``,
  the ready workers' envs in the worker collectors, so a few counts. Each count is called
  eagerly ``warmup`` times first (lazy layers initialise, ``torch.compile`` compiles for the
  shape, cuBLAS sets itself up), then captured once with ``torch.cuda.graph``: its
  observations get GPU buffers of their own, and every later call at that count copies
  the observations from their pinned staging buffers straight into those buffers, replays
  the graph, and copies the outputs back as an eager call's are. At most ``MAX_GRAPHS``
  counts are captured; others run eagerly.
* **Weights.** A graph reads the module's tensors where they live, and every weight update
  copies into them in place (``_policies.weights``), so a replay acts with the newest
  weights, and the version it reports is as true as an eager call's.
* **Sampling.** A stochastic policy draws new numbers at each replay: torch advances the
  CUDA generator's offset for every replay of a graph that samples.
* **What cannot be captured.** A call that waits for the GPU or reads a value on the host
  (``.item()``, ``nonzero``, a shape that depends on data, a distribution built with
  ``validate_args=True``) fails its capture. The collector then warns once, with the
  reason, and calls the policy eagerly from then on: slower, never wrong. A capture whose
  outputs are not all CUDA tensors (say a numpy array, made once at capture and never
  again) is refused the same way. What a graph cannot see is Python state: a policy that
  changes its behaviour through Python attributes (a counter, a flag) is replayed as it was
  captured; keep such state in tensors (buffers), as TorchRL's ``EGreedyModule`` does.

Every graph allocates from one memory pool: an output is copied to the host, and waited
for, before the next call, so no graph's memory is read after another's replay. Captures
run in ``thread_local`` error mode, so a trainer's CUDA work in another thread neither
breaks a capture nor is broken by one. A capture synchronises the device once (as
``torch.cuda.graph`` does); a replay does not.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .._envs.spaces import NestedKey
from .transfer import inputs_into

MAX_GRAPHS = 64
"""Most row counts captured per collector (each holds its inputs and outputs on the GPU)."""

DEFAULT_WARMUP = 2
"""Eager calls per row count before its capture (TorchRL's ``CudaGraphModule`` default)."""


def cudagraph_warmup(value: Any) -> int | None:
    """``cudagraph_policy`` checked: ``None`` when off, else the number of eager calls per row count
    before its capture. Takes TorchRL's values: ``None``, ``False``, ``True``, or a dict of
    ``CudaGraphModule`` arguments, of which ``warmup`` applies here (``device`` too, when it
    names the policy's device: checked later)."""
    if value is None or value is False:
        return None
    if value is True:
        return DEFAULT_WARMUP
    if not isinstance(value, dict):
        raise TypeError(f"cudagraph_policy must be True, False, None or a dict such as {{'warmup': 3}}, "
                        f"got {value!r}.")
    unknown = sorted(set(value) - {"warmup", "device"})
    if unknown:
        raise ValueError(f"cudagraph_policy: {unknown} are not taken here (the inputs and outputs are the "
                         "policy's own; only 'warmup' and 'device' are); remove them.")
    warmup = value.get("warmup", DEFAULT_WARMUP)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
        raise ValueError(f"cudagraph_policy: warmup={warmup!r}; give the number of eager calls before a "
                         "capture, an int >= 1 (default 2).")
    return warmup


@dataclass
class _Graph:
    """One row count's graph: its static input and output tensors."""

    graph: torch.cuda.CUDAGraph
    inputs: dict[NestedKey, torch.Tensor]
    outputs: dict[NestedKey, torch.Tensor]


class CudaGraphs:
    """The captured calls of one policy on ``device``; see the module docstring.

    ``PolicyRunner`` asks ``replay(obs, rows)`` first (a graph's outputs, or ``None``), then,
    for an eager call, ``due(rows)``: whether to ``capture`` this one instead.
    """

    def __init__(self, device: torch.device, warmup: int):
        self.device = torch.device(device)
        self.warmup = warmup
        self.graphs: dict[int, _Graph] = {}
        """The captured row counts."""
        self.failed: str | None = None
        """Why a capture failed (then no more are tried)."""
        self.replays = 0
        """Calls answered by a replay."""
        self._eager: dict[int, int] = {}
        self._pool: Any = None
        self._stream: torch.cuda.Stream | None = None

    def replay(self, obs: dict[NestedKey, torch.Tensor], rows: int) -> dict[NestedKey, torch.Tensor] | None:
        """The outputs of the graph of ``rows`` for ``obs`` (host or GPU tensors), on the
        current stream, or ``None`` if there is no such graph. The outputs are the graph's
        own tensors: read them before the next replay."""
        graph = self.graphs.get(rows)
        if graph is None:
            return None
        with torch.cuda.device(self.device):
            inputs_into(graph.inputs, obs)
            graph.graph.replay()
        self.replays += 1
        return graph.outputs

    def due(self, rows: int) -> bool:
        """Whether this (eager) call at ``rows`` is to be captured: it follows ``warmup`` eager ones."""
        if self.failed is not None or len(self.graphs) >= MAX_GRAPHS:
            return False
        done = self._eager.get(rows, 0)
        if done < self.warmup:
            self._eager[rows] = done + 1
            return False
        return True

    def capture(self, call: Callable[[dict[NestedKey, torch.Tensor]], dict[NestedKey, Any]],
                obs: dict[NestedKey, torch.Tensor], rows: int) -> dict[NestedKey, Any] | None:
        """Capture ``call`` (the policy's eager call) on a copy of ``obs`` (on the GPU), replay
        it once, and return its outputs; ``None`` if it cannot be captured (warned once)."""
        inputs = {key: value.clone() for key, value in obs.items()}
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(self.device):
            here = torch.device("cuda", torch.cuda.current_device())
            stream = torch.cuda.current_stream()
            if self._stream is None:
                self._pool = torch.cuda.graph_pool_handle()
                self._stream = torch.cuda.Stream(here)
            try:
                with torch.cuda.graph(graph, pool=self._pool, stream=self._stream,
                                      capture_error_mode="thread_local"):
                    outputs = call(inputs)
                strays = [key for key, value in outputs.items()
                          if not (isinstance(value, torch.Tensor) and value.device == here)]
                if strays:
                    raise TypeError(f"outputs {strays} are not tensors on {here}: a graph would give "
                                    "back their values at capture at every replay")
                graph.replay()
            except Exception as exc:  # noqa: BLE001 - any failure of the capture: the policy runs eagerly
                # (a capture that fails at its end leaves its stream current: back to the caller's)
                torch.cuda.set_stream(stream)
                self.failed = f"{type(exc).__name__}: {exc}"
                message = (f"cudagraph_policy: the policy's call over {rows} envs could not be captured in "
                           f"a CUDA graph ({self.failed}); the policy runs without CUDA graphs from now on.")
                warnings.warn(message, RuntimeWarning, stacklevel=2)
                return None
        self.graphs[rows] = _Graph(graph, inputs, outputs)
        return outputs


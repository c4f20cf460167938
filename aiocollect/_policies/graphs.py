"""CUDA graphs of a policy's calls (``cudagraph_policy``, TorchRL's keyword): one graph per row count.

A small policy on a GPU spends most of a call launching kernels: a three-layer MLP is a
dozen launches of several microseconds of CPU each, for microseconds of GPU work, and in
the worker collectors that CPU is the engine thread's, which also steps the rounds. A CUDA
graph records a call's kernels once and replays them with one launch. With
``cudagraph_policy=True`` the collector does that for its torch policy on a CUDA device:

* **Per row count.** A call covers some number of envs: always the same in ``Collector``,
  the ready workers' envs in the worker collectors, so a few counts. Each count is called
  eagerly ``warmup`` times first (lazy layers initialise, ``torch.compile`` compiles for the
  shape, cuBLAS sets itself up), then captured once: its observations get GPU buffers of
  their own, and every later call at that count copies the observations from their pinned
  staging buffers straight into those buffers, replays the graph, and copies the outputs
  back as an eager call's are. The collector's constructor does this for every count its
  rounds can have, on zeros (``PolicySetup.prepare``; past ``ROUND_SIZES_MAX`` counts, a
  full round's and each lane's), so collecting mostly replays; a count met later (one the
  constructor did not capture, or any after the graphs were dropped) is warmed up and
  captured at its own calls. At most ``MAX_GRAPHS`` counts are captured; others run
  eagerly.
* **Weights.** A graph reads the module's tensors where they live, and every weight update
  through the collector copies into them in place (``_policies.weights``), so a replay acts
  with the newest weights, and the version it reports is as true as an eager call's. A
  ``Collector`` acting with your own module also checks, before each replay, that the
  module still holds the tensors it captured: one replaced (``load_state_dict(...,
  assign=True)``, ``module.weight = ...``, ``TensorDict.to_module``, ``.to()``) drops the
  graphs, and they are captured again after a new warmup (a submodule replaced whole is
  not seen).
* **Sampling.** A stochastic policy draws new numbers at each replay: torch advances the
  CUDA generator's offset for every replay of a graph that samples.
* **What cannot be captured** is an error, raised (from the constructor, or the
  collection for a count met later) with the policy's own exception as its cause: a call
  that waits for the GPU or reads a value on the host (``.item()``, ``if x.any():``,
  ``nonzero``, a shape that depends on data, a distribution that checks its arguments),
  one whose outputs are not all tensors on the GPU (a value made once at capture would
  come back at every replay), or one that replaces the module's tensors (the graph would
  read the old ones). There is no quiet fallback to eager calls: a failed capture can leave
  torch broken for the rest of the process (without pytorch#180395, April 2026, the
  allocator believes a capture is under way; without pytorch#176752, March 2026, the
  default CUDA generator stays in capture mode and every later CUDA random draw fails), so
  the process should be restarted without ``cudagraph_policy`` or with the policy fixed.
  What a graph cannot see is Python state: a policy that changes its behaviour through
  Python attributes (a counter, a flag) is replayed as it was captured; keep such state in
  tensors (buffers), as TorchRL's ``EGreedyModule`` does.

Captures use ``CUDAGraph.capture_begin``/``capture_end`` on a stream of the policy's
stream's priority (a replay's kernels keep the priority of the stream they were captured
on), in ``thread_local`` error mode, so another thread's CUDA calls during a capture are
allowed (but for a CUDA random draw in torch releases without per-capture RNG state,
pytorch#176752: one reason the constructor captures every count it can); unlike
``torch.cuda.graph`` they do not synchronise the device or empty torch's caches, so a
trainer in another thread is not held up or made to allocate again. Every graph allocates
from one memory pool (a new one after the graphs are dropped): a call's outputs are copied
to the host, and waited for, before the next call, so no graph's memory is read after
another's replay.
"""

from __future__ import annotations

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
    for an eager call, ``due(rows)``: whether to ``capture`` this one instead. ``module``:
    the policy, when it is a module; ``watch``: whether it is the user's own module (the
    collector acts with it, ``Collector``), checked for swapped tensors before each replay.
    """

    def __init__(self, device: torch.device, warmup: int, module: torch.nn.Module | None = None,
                 watch: bool = False):
        self.device = torch.device(device)
        self.warmup = warmup
        self._module = module
        """The policy, when it is a module: a capture checks that its call keeps the module's tensors."""
        self._watch = watch
        """Whether ``module`` is the user's own (the collector acts with it): it may swap its tensors."""
        self._slots: list[tuple[dict, str]] | None = None
        self._captured: list[int] = []
        """The watched module's tensors' addresses at the captures of the graphs there are."""
        self.graphs: dict[int, _Graph] = {}
        """The captured row counts."""
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
        if self._slots is not None and _pointers(self._slots) != self._captured:
            self.drop()  # the watched module holds other tensors now: capture again
            return None
        with torch.cuda.device(self.device):
            inputs_into(graph.inputs, obs)
            graph.graph.replay()
        self.replays += 1
        return graph.outputs

    @property
    def full(self) -> bool:
        """Whether ``MAX_GRAPHS`` counts are captured (no more will be)."""
        return len(self.graphs) >= MAX_GRAPHS

    def due(self, rows: int) -> bool:
        """Whether this (eager) call at ``rows`` is to be captured: it follows ``warmup`` eager ones."""
        if self.full:
            return False
        done = self._eager.get(rows, 0)
        if done < self.warmup:
            self._eager[rows] = done + 1
            return False
        return True

    def drop(self) -> None:
        """Forget every graph. Their pool goes with them: torch cannot capture into a pool
        whose graphs are all freed, so the next capture starts a new one."""
        self.graphs.clear()
        self._eager.clear()
        self._pool = None

    def capture(self, call: Callable[[dict[NestedKey, torch.Tensor]], dict[NestedKey, Any]],
                obs: dict[NestedKey, torch.Tensor], rows: int) -> dict[NestedKey, Any]:
        """Capture ``call`` (the policy's eager call) on a copy of ``obs`` (on the GPU), replay
        it once, and return its outputs; raise ``RuntimeError`` if it cannot be captured."""
        inputs = {key: value.clone() for key, value in obs.items()}
        graph = torch.cuda.CUDAGraph()
        failure: BaseException | None = None
        with torch.cuda.device(self.device):
            here = torch.device("cuda", torch.cuda.current_device())
            stream = torch.cuda.current_stream()
            if self._stream is None:
                self._stream = torch.cuda.Stream(here, priority=stream.priority)
            slots = _tensor_slots(self._module) if self._module is not None else []
            before = _pointers(slots)
            if self._watch and self.graphs and before != self._captured:
                self.drop()  # (swapped since the graphs there are were captured)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            with torch.cuda.stream(self._stream):
                graph.capture_begin(pool=self._pool, capture_error_mode="thread_local")
                try:
                    outputs = call(inputs)
                except Exception as exc:  # noqa: BLE001 - reported below, as the cause
                    failure = exc
                finally:
                    try:
                        graph.capture_end()
                    except Exception as exc:  # noqa: BLE001 - the capture was invalidated
                        failure = failure or exc
            if failure is None:
                strays = [key for key, value in outputs.items()
                          if not (isinstance(value, torch.Tensor) and value.device == here)]
                if strays:
                    failure = TypeError(f"outputs {strays} are not tensors on {here}: a graph would give back "
                                        "their values at capture at every replay")
                elif _pointers(slots) != before:
                    failure = TypeError("the call replaced parameters or buffers of the module (as in "
                                        "self.buf = self.buf + 1): a graph reads the tensors it was captured "
                                        "with; update them in place (self.buf.add_(1))")
            if failure is not None:
                reason = f"{type(failure).__name__}: {str(failure).splitlines()[0] if str(failure) else ''}"
                raise RuntimeError(
                    f"cudagraph_policy: the policy's call over {rows} envs cannot be captured in a CUDA graph "
                    f"({reason}). A captured call may not read values on the host (.item(), if x.any(), "
                    "nonzero, shapes that depend on data) nor check a distribution's arguments "
                    "(torch.distributions.Distribution.set_default_validate_args(False)), and must return "
                    "tensors on the GPU. Make the policy capturable, or remove cudagraph_policy."
                ) from failure
            graph.replay()
        if self._watch and not self.graphs:
            self._slots, self._captured = slots, before
        self.graphs[rows] = _Graph(graph, inputs, outputs)
        return outputs


def _pointers(slots: list[tuple[dict, str]]) -> list[int]:
    """The addresses of the tensors in ``slots`` (0 for an empty one)."""
    return [where[name].data_ptr() if where.get(name) is not None else 0 for where, name in slots]


def _tensor_slots(module: torch.nn.Module) -> list[tuple[dict, str]]:
    """Where ``module`` keeps each of its parameters and buffers: (its submodule's dict, name)."""
    return [(slots, name) for sub in module.modules() for slots in (sub._parameters, sub._buffers) for name in slots]

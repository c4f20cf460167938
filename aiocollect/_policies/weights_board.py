"""Weights in shared memory: published once by the collector, loaded by the workers' copies.

With the policy in the workers (``_policies.actor``), the weights travel through a *board*
in the shared memory every worker maps (``board_fields``: one field per tensor of the
module's ``state_dict``, each submodule's train/eval mode, and a clock of two words):

* **publish** (``_policies.board_channel.BoardChannel``, in the caller's thread, inside ``update_policy_weights_``):
  the new weights are copied **once**, straight into the board, behind a sequence lock
  (``WeightsBoard.write``: the sequence word is odd while the copy runs). The collector's own
  copy of the policy needs no second copy: its tensors *are* views of the board (``share``),
  so ``collector.policy``, its checkpoints and any call of it here see each version as it
  is published. The version is in effect as soon as the call returns.
* **load** (``WeightsBoard.read``, in each worker, before a step of its own copy): when the
  sequence word moved, the worker copies the board into its private copy's tensors, and
  retries if the word moved again meanwhile, so no step acts with a mix of two versions.

The board stays mapped, and its memory kept, when the rollout storage is handed back at
shutdown (``_workers.shm.SharedArrays.release`` keeps the fields laid out as ``kept``), so
the collector's policy keeps its weights after ``shutdown()``.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

SEQ, VERSION = 0, 1
"""The words of the weights' clock (``wclock``): a sequence lock (odd while the collector
writes) and the version of the weights there."""


def _array(tensor: Any) -> np.ndarray:
    return tensor if isinstance(tensor, np.ndarray) else tensor.detach().cpu().numpy()


def _into(dst: np.ndarray, src: np.ndarray) -> None:
    """One field's copy (cast as torch's ``copy_`` casts)."""
    np.copyto(dst, src, casting="unsafe")


def weight_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """The tensors of ``module``'s ``state_dict`` (``_policies.weights.tensor_state``'s, in its
    order), read without tensordict (a worker's copy of a plain module does not import it)."""
    return [v for v in module.state_dict(keep_vars=True).values() if isinstance(v, torch.Tensor)]


def board_fields(module: Any) -> list[tuple[str, np.dtype, tuple]]:
    """The board's fields for ``module`` (``Layout.plan``'s ``kept``): each tensor of its
    ``state_dict`` (``w{i}``, ``weight_tensors``), each submodule's mode (``wmode``),
    the clock (``wclock``). For an ``ArrayPolicy`` (a JAX policy), each leaf of its weights
    (``weight_arrays``) and no modes."""
    if isinstance(module, torch.nn.Module):
        arrays = [_array(t) for t in weight_tensors(module)]
        modes = len(list(module.modules()))
    else:
        arrays, modes = module.weight_arrays(), 0
    out = [(f"w{i}", a.dtype, tuple(a.shape)) for i, a in enumerate(arrays)]
    out.append(("wmode", np.dtype(np.uint8), (modes,)))
    out.append(("wclock", np.dtype(np.int64), (2,)))
    return out


class WeightsBoard:
    """The weights' fields of the shared memory (``board_fields``): the collector ``write``s,
    workers ``read``."""

    def __init__(self, arrays: dict[str, np.ndarray]):
        count = sum(1 for name in arrays if name.startswith("w") and name[1:].isdigit())
        self.arrays = [arrays[f"w{i}"] for i in range(count)]
        self.modes = arrays["wmode"]
        """Each submodule's ``training`` flag (train/eval mode), in ``modules()`` order of
        the collector's policy: they travel with the weights."""
        self.clock = arrays["wclock"]

    @property
    def version(self) -> int:
        return int(self.clock[VERSION])

    def share(self, module: torch.nn.Module) -> None:
        """Copy ``module``'s weights in (without a new sequence: the workers' copies were
        built with them), then make its tensors views of the board."""
        tensors = weight_tensors(module)
        for dst, tensor in zip(self.arrays, tensors):
            np.copyto(dst, _array(tensor))
        for dst, tensor in zip(self.arrays, tensors):
            tensor.data = torch.from_numpy(dst)

    def write(self, sources: list, modes: list[bool], version: int) -> None:
        """Copy ``sources`` (one tensor per field, in order) in, with the submodules'
        ``modes``, as ``version``. An exception in the middle (a Ctrl-C between two tensors)
        finishes the copy before it propagates: the sequence word never stays odd (every
        worker would wait for it forever) and never turns even over half-copied weights.
        Each source is cast to its field's dtype, as torch's ``copy_`` casts (an int buffer
        sent as a float), the same whether the policy acts here or in the workers; sources
        that cannot be copied (of another shape or number) are refused before anything is
        written."""
        arrays = [_array(tensor) for tensor in sources]  # (a GPU tensor is fetched before the copy begins)
        if len(arrays) != len(self.arrays) or any(a.shape != d.shape for a, d in zip(arrays, self.arrays)):
            got, want = [list(a.shape) for a in arrays], [list(d.shape) for d in self.arrays]
            raise ValueError(f"update_policy_weights_: weights of shapes {got} for the workers' copies "
                             f"of shapes {want}.")
        clock = self.clock
        clock[SEQ] += 1  # odd: being written
        try:
            self._copy(arrays, modes, version)
        except BaseException:
            self._copy(arrays, modes, version)
            raise
        finally:
            clock[SEQ] += 1

    def _copy(self, arrays: list[np.ndarray], modes: list[bool], version: int) -> None:
        for dst, src in zip(self.arrays, arrays):
            _into(dst, src)
        if len(modes) == len(self.modes):
            self.modes[:] = modes
        self.clock[VERSION] = version

    def read(self, tensors: list, seen: int, modules: list) -> tuple[int, int] | None:
        """Load the weights into ``tensors`` (a worker's copy's ``state_dict`` values), and
        the train/eval mode into ``modules`` (its submodules, in the order of the
        collector's policy's ``modules()``), if they changed since sequence ``seen``:
        ``(sequence, version)``, or ``None`` if unchanged."""
        clock = self.clock
        while True:
            seq = int(clock[SEQ])
            if seq == seen:
                return None
            if seq & 1:
                os.sched_yield()
                continue
            version = int(clock[VERSION])
            for tensor, src in zip(tensors, self.arrays):
                tensor.copy_(torch.from_numpy(src))
            modes = self.modes.tolist()
            if int(clock[SEQ]) == seq:
                for module, mode in zip(modules, modes):
                    module.training = bool(mode)
                return seq, version

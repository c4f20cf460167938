"""The publish side of the weights' board: a weights channel that copies each update once.

``_policies.weights_board`` says how the board works; ``_policies.actor`` gives the tour.
"""

from __future__ import annotations

from typing import Any

import torch

from .array import ArrayPolicy
from .weights import CopyChannel, TorchWeights, WeightsChannel
from .weights_board import WeightsBoard, weight_tensors


class BoardChannel(CopyChannel):
    """The weights channel of a collector whose workers act with copies of its policy: the
    publish side of the board (see the module docstring). Nothing is ever pending: a publish
    copies the weights into the board, where the collector's own copy reads them, and is in
    effect at once."""

    def __init__(self, weights: TorchWeights, source: torch.nn.Module | None, board: WeightsBoard):
        super().__init__(weights, source)
        self.torch_weights = weights
        self.board = board
        board.share(weights.module)
        weights._bind()  # (its targets are the board's views now)

    def publish(self, weights: Any) -> int:
        module = self.torch_weights.module
        sources = self.torch_weights.sources(weights)  # (checked against the policy's names and shapes)
        with self.lock:  # (no call of the policy here meanwhile, nor a checkpoint's read)
            shapes = [tuple(a.shape) for a in self.board.arrays]
            now = [tuple(t.shape) for t in weight_tensors(module)]
            if now != shapes:  # (its tensors are no longer the board's views: the workers' copies cannot follow)
                raise RuntimeError(
                    f"policy: its weights are now of shapes {[list(x) for x in now]}, the workers' copies "
                    f"{[list(x) for x in shapes]}: a policy whose weights change shape or number "
                    "(a submodule replaced...) needs a new collector.")
            with self._swap:
                self.latest += 1
                version = self.latest
            try:
                self.board.write(sources, [m.training for m in module.modules()], version)
            finally:
                _settle(self, self.board, version)
        return version


class ArrayBoardChannel(WeightsChannel):
    """``BoardChannel`` for an ``ArrayPolicy`` (a JAX policy on the CPU): its weights' leaves
    (``weight_arrays``) are the board's fields, and the collector's own copy acts with the
    board's views (``ArrayPolicy.share``). A publish checks the new weights against the
    policy's (``snapshot``'s checks), then copies them once, into the board."""

    def __init__(self, policy: ArrayPolicy, board: WeightsBoard):
        super().__init__(policy.snapshot, policy.load)
        self.policy = policy
        self.board = board
        policy.share(board.arrays)

    def publish(self, weights: Any) -> int:
        sources = self.policy.weight_arrays(weights)  # (checked: the pytree's structure and shapes)
        with self.lock:  # (no call of the policy here meanwhile, nor a checkpoint's read)
            with self._swap:
                self.latest += 1
                version = self.latest
            try:
                self.board.write(sources, [], version)
            finally:
                _settle(self, self.board, version)
        return version


def _settle(channel: WeightsChannel, board: WeightsBoard, version: int) -> None:
    """After a publish of ``version``: in effect if the board has it (a Ctrl-C in the copy
    lets the copy finish first), else never published (refused before the copy began), so
    the next publish takes its number again: ``latest`` counts only versions that took
    effect (``max_policy_lag`` measures the frames' versions against it)."""
    if board.version == version:
        channel.version = version
    else:
        with channel._swap:
            if channel.latest == version:
                channel.latest = version - 1

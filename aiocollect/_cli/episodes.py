"""The evaluation ``aiocollect collect`` prints: the return and the length of the episodes that
finished in the batches collected (the progress bar shows their mean return as it goes)."""

from __future__ import annotations

from typing import Any


class Episodes:
    """The return and the length of every episode that finishes in the batches, summed per
    trajectory id (an episode spans batches); the episodes still going at the end are counted
    apart, as ``running``, and never averaged in."""

    def __init__(self):
        self._open: dict[int, tuple[float, int]] = {}  # trajectory id -> (return, steps) so far
        self.returns: list[float] = []
        self.lengths: list[int] = []
        self._sum = 0.0

    def add(self, batch: Any) -> None:
        import numpy as np

        ids = batch.get(("collector", "traj_ids")).reshape(-1).numpy(force=True)
        reward = batch.get(("next", "reward")).reshape(-1).double().numpy(force=True)
        done = batch.get(("next", "done")).reshape(-1).numpy(force=True)
        valid = ids >= 0
        mask = batch.get(("collector", "mask"), None)
        if mask is not None:
            valid &= mask.reshape(-1).numpy(force=True)
        ids, reward, done = ids[valid], reward[valid], done[valid]
        runs, inverse = np.unique(ids, return_inverse=True)
        sums = np.bincount(inverse, weights=reward, minlength=len(runs))
        steps = np.bincount(inverse, minlength=len(runs))
        finished = np.zeros(len(runs), dtype=bool)
        finished[inverse[done]] = True
        for tid, total, count, end in zip(runs.tolist(), sums.tolist(), steps.tolist(), finished.tolist()):
            before, before_steps = self._open.pop(tid, (0.0, 0))
            if end:
                self.returns.append(before + total)
                self._sum += before + total
                self.lengths.append(before_steps + count)
            else:
                self._open[tid] = (before + total, before_steps + count)

    @property
    def running(self) -> int:
        return len(self._open)

    @property
    def mean(self) -> float | None:
        """The mean return of every episode finished so far (the bar's, and the summary's at the end)."""
        return self._sum / len(self.returns) if self.returns else None

    def summary(self) -> list[str]:
        """The evaluation, in lines: episodes, return mean and std (min, max), lengths."""
        import statistics

        n, running = len(self.returns), self.running
        going = f" ({running:,} still running at the end, not counted)" if running else ""
        if not n:
            return [f"episodes: none finished{going}; collect more --frames for an evaluation"]
        std = statistics.pstdev(self.returns) if n > 1 else 0.0
        return [f"episodes: {n:,} finished{going}",
                f"  return: mean {statistics.fmean(self.returns):.2f}, std {std:.2f}, "
                f"min {min(self.returns):.2f}, max {max(self.returns):.2f}",
                f"  length: mean {statistics.fmean(self.lengths):.1f}, min {min(self.lengths):,}, "
                f"max {max(self.lengths):,} steps"]

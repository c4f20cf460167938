"""Episode returns (``statistics().mean_episode_return``) and ``progress=True``: a tqdm bar
over a collector's frames, with frames/s and the mean episode return.

The bar counts delivered frames (against ``total_frames`` when the collector is finite)
and shows the mean return of the episodes that finished in the last batches. Returns are
summed per trajectory id, so an episode that spans several batches (or several workers'
batches, in any order) is counted once, whole. ``tqdm.auto`` picks a notebook widget
inside Jupyter and a text bar elsewhere.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from itertools import repeat

import numpy as np
import torch
from tensordict import TensorDictBase


def flat_numpy(x: torch.Tensor) -> np.ndarray:
    """``x`` as a flat numpy array (a view for a CPU tensor, a copy from a GPU)."""
    return x.reshape(-1).numpy(force=True)


class EpisodeReturns:
    """Sums rewards per trajectory id across batches; hands out the returns of finished episodes.

    Trajectories that never finish (abandoned by ``reset_at_each_iter``, or cut by dropped
    stale frames) would pile up: at most ``max_open`` unfinished ones are kept, and the one
    that has gone longest without a new frame is forgotten first.
    """

    def __init__(self, window: int = 100, max_open: int = 100_000):
        self._partial: OrderedDict[int, float] = OrderedDict()  # least recently extended first
        self._max_open = max_open
        self.recent: deque[float] = deque(maxlen=window)
        self.episodes = 0

    def add(self, batch: TensorDictBase | None, set_truncated: bool = False) -> None:
        """Book ``batch``'s rewards. ``set_truncated``: its last step's ``done`` is the
        collector's mark, not an episode's end (the episode goes on in the next batch), unless
        it terminated there (an episode an env truncated on that very step stays open, and is
        forgotten, rather than reported short)."""
        if batch is None:
            return
        ids = batch.get(("collector", "traj_ids"), None)
        if ids is None or batch.get(("next", "done"), None) is None or batch.get(("next", "reward"), None) is None:
            return  # (a multi-agent env's batch: rewards and flags per group, no one return per episode)
        # numpy, not torch: torch's indexing kernels run on its OpenMP threads, whose
        # spinning after each call took a quarter of the engine's CPU (and the workers')
        done = batch.get(("next", "done"))
        if set_truncated and done.shape[-2] > 0:
            done = done.clone()
            done[..., -1, :] = batch.get(("next", "terminated"))[..., -1, :]
        ids = flat_numpy(ids)
        reward, done = flat_numpy(batch.get(("next", "reward"))), flat_numpy(done)
        if reward.size != ids.size or done.size != ids.size:
            return  # (a reward or flags of several values per frame: no one return per episode)
        valid = ids >= 0
        mask = batch.get(("collector", "mask"), None)
        if mask is not None:
            valid &= flat_numpy(mask)
        if not valid.all():
            ids, reward, done = ids[valid], reward[valid], done[valid]
        if not ids.size:
            return
        # a trajectory's steps sit side by side, in time order, in every batch layout (a
        # row per env): sum each run of one id, then one dict operation per run
        starts = np.flatnonzero(np.concatenate(([True], ids[1:] != ids[:-1])))
        runs = ids[starts]
        tids = runs.tolist()
        if len(set(tids)) < len(tids):  # an id in two places: sum per id instead
            runs, inverse = np.unique(ids, return_inverse=True)
            sums = np.bincount(inverse, weights=reward.astype(np.float64), minlength=len(runs))
            finished = np.zeros(len(runs), dtype=bool)
            finished[inverse[done]] = True
            tids = runs.tolist()
        else:
            sums = np.add.reduceat(reward.astype(np.float64), starts)
            finished = np.logical_or.reduceat(done, starts)
        partial = self._partial
        totals = sums + np.fromiter(map(partial.pop, tids, repeat(0.0)), np.float64, len(tids))
        self.recent.extend(totals[finished].tolist())
        self.episodes += int(np.count_nonzero(finished))
        going = ~finished
        partial.update(zip(runs[going].tolist(), totals[going].tolist()))
        while len(partial) > self._max_open:
            partial.popitem(last=False)

    @property
    def mean(self) -> float | None:
        return sum(self.recent) / len(self.recent) if self.recent else None


class ProgressBar:
    """The bar of one collector (created at its first batch, closed at ``shutdown()``)."""

    def __init__(self, total_frames: int, name: str, returns: EpisodeReturns):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total_frames if total_frames > 0 else None, unit="frames", unit_scale=True,
                        desc=name, dynamic_ncols=True)
        self.returns = returns  # the collector's, fed before each update

    def update(self, frames: int) -> None:
        mean = self.returns.mean
        if mean is not None:
            self.bar.set_postfix(episode_return=f"{mean:.1f}", episodes=self.returns.episodes, refresh=False)
        self.bar.update(frames)

    def close(self) -> None:
        self.bar.close()

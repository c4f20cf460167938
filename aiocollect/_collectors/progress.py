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

import numpy as np
import torch
from tensordict import TensorDictBase


def flat_numpy(x: torch.Tensor) -> np.ndarray:
    """``x`` as a flat numpy array (a view for a contiguous CPU tensor, a copy from a GPU)."""
    return x.numpy(force=True).reshape(-1)


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
        # (each sub-TensorDict taken once: a nested key costs twice a plain one)
        collector, nxt = batch.get("collector", None), batch.get("next", None)
        if collector is None or nxt is None:
            return
        ids, done, reward = collector.get("traj_ids", None), nxt.get("done", None), nxt.get("reward", None)
        if ids is None or done is None or reward is None:
            return  # (a multi-agent env's batch: rewards and flags per group, no one return per episode)
        # numpy, not torch: torch's indexing kernels run on its OpenMP threads, whose
        # spinning after each call took a quarter of the engine's CPU (and the workers')
        if set_truncated and done.shape[-2] > 0:
            done = done.clone()
            done[..., -1, :] = nxt.get("terminated")[..., -1, :]
        ids, reward, done = flat_numpy(ids), flat_numpy(reward), flat_numpy(done)
        if reward.size != ids.size or done.size != ids.size:
            return  # (a reward or flags of several values per frame: no one return per episode)
        if not ids.size:
            return
        mask = collector.get("mask", None)
        if mask is not None or ids.min() < 0:  # (-1: a frame no env took)
            valid = ids >= 0
            if mask is not None:
                valid &= flat_numpy(mask)
            if not valid.all():
                ids, reward, done = ids[valid], reward[valid], done[valid]
            if not ids.size:
                return
        self._book(ids, reward, done)

    def _book(self, ids: np.ndarray, reward: np.ndarray, done: np.ndarray) -> None:
        """Add the rewards of each trajectory (``ids``, one per frame) to its sum so far; those
        ``done`` somewhere here finish. A trajectory's steps sit side by side, in time order,
        in every batch layout (a row per env): sum each run of one id (one ``reduceat``),
        then a few dict operations per run (a dozen at CartPole's 8 envs x 32 steps, where a
        dozen numpy calls over them cost more)."""
        first = np.empty(ids.size, dtype=bool)  # where each run starts
        first[0] = True
        np.not_equal(ids[1:], ids[:-1], out=first[1:])
        starts = first.nonzero()[0]
        tids = ids[starts].tolist()
        if len(set(tids)) < len(tids):  # an id in two places: sum per id instead
            runs, inverse = np.unique(ids, return_inverse=True)
            sums = np.bincount(inverse, weights=reward.astype(np.float64), minlength=len(runs))
            finished = np.zeros(len(runs), dtype=bool)
            finished[inverse[done]] = True
            tids = runs.tolist()
        else:
            sums = np.add.reduceat(reward.astype(np.float64), starts)
            finished = np.logical_or.reduceat(done, starts)
        partial, ended = self._partial, []
        pop = partial.pop
        for tid, total, end in zip(tids, sums.tolist(), finished.tolist()):
            total += pop(tid, 0.0)
            if end:
                ended.append(total)
            else:
                partial[tid] = total
        self.recent.extend(ended)
        self.episodes += len(ended)
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

"""Batches of a TorchRL env with nested agent groups keep each group's batch dims, a group
inside a group its own beyond its parent's (``_collectors.delivery.batch_tensordict``), and the
episode returns skip rewards of several values per frame (issue 51)."""

from __future__ import annotations

import torch

from aiocollect._collectors.delivery import batch_tensordict
from aiocollect._collectors.progress import EpisodeReturns
from aiocollect._envs.spaces import nest


def test_a_group_inside_a_group_has_its_own_dims_after_its_parent_s():
    tensors = {("data", "x"): torch.zeros(5, 3, 1), ("data", "sub", "y"): torch.zeros(5, 3, 2, 4),
               ("next", "data", "sub", "y"): torch.zeros(5, 3, 2, 4), ("collector", "traj_ids"): torch.zeros(5)}
    td = batch_tensordict(nest(tensors), torch.Size([5]), None, {("data",): (3,), ("data", "sub"): (3, 2)})
    assert td["data"].batch_size == (5, 3)
    assert td["data", "sub"].batch_size == td["next", "data", "sub"].batch_size == (5, 3, 2)
    assert td["collector"].batch_size == (5,)


def test_returns_skip_a_reward_of_several_values_per_frame():
    returns = EpisodeReturns()
    batch = batch_tensordict(nest({("next", "reward"): torch.ones(4, 2), ("next", "done"): torch.ones(4, 1, dtype=bool),
                                   ("collector", "traj_ids"): torch.arange(4)}), torch.Size([4]), None)
    returns.add(batch)
    assert returns.episodes == 0 and returns.mean is None

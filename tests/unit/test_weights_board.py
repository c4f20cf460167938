"""The weights' board in shared memory (``_policies.weights_board``) and its publish side
(``_policies.board_channel``): the collector's own copy acts with views of the board, an
update is one copy into it behind a sequence lock, a worker's copy loads it when the sequence
moved, and the board outlives the release of the rollout storage at shutdown."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from torch import nn

from aiocollect._policies import weights_board
from aiocollect._policies.board_channel import BoardChannel
from aiocollect._policies.weights import TorchWeights
from aiocollect._policies.weights_board import SEQ, WeightsBoard, board_fields
from aiocollect._workers.shm import Layout, SharedArrays, create_segment


def net(value: float = 0.0) -> nn.Module:
    module = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    with torch.no_grad():
        for t in module.state_dict().values():
            t.fill_(value)
    return module


def board_for(module: nn.Module, fd: int = -1) -> tuple[SharedArrays, WeightsBoard]:
    """A storage of 2 envs over 1024 columns (pages of it, the release's unit), then the board."""
    layout = Layout.plan([(np.dtype(np.float32), (3,))], (np.dtype(np.int64), ()), 2, 1, columns=1024,
                         kept=board_fields(module))
    shared = SharedArrays(layout, fd)
    return shared, WeightsBoard(shared.arrays)


def test_the_board_has_a_field_per_tensor_the_modes_and_a_clock():
    module = net()
    fields = board_fields(module)
    assert [name for name, _, _ in fields] == [f"w{i}" for i in range(9)] + ["wmode", "wclock"]
    assert [shape for _, _, shape in fields[:9]] == [tuple(t.shape) for t in module.state_dict().values()]
    assert fields[9][2] == (len(list(module.modules())),)


def test_the_collectors_copy_acts_with_views_of_the_board():
    module = net(2.0)
    _, board = board_for(module)
    board.share(module)
    assert int(board.clock[SEQ]) == 0  # (the workers' copies were built with these weights)
    for t, a in zip(module.state_dict().values(), board.arrays):
        assert np.shares_memory(t.numpy(), a) and (a == 2).all()


def test_a_write_moves_the_sequence_and_a_worker_copy_loads_it_once():
    module, copy = net(0.0), net(0.0)
    _, board = board_for(module)
    board.share(module)
    modes = [False] * len(list(module.modules()))
    board.write([t + 2 for t in net(1.0).state_dict().values()], modes, version=7)
    assert int(board.clock[SEQ]) == 2 and board.version == 7
    assert all((t == 3).all() for t in module.state_dict().values())  # (the views: no load here)
    tensors, modules = list(copy.state_dict().values()), list(copy.modules())
    assert board.read(tensors, 0, modules) == (2, 7)
    assert all((t == 3).all() for t in tensors) and not any(m.training for m in modules)
    assert board.read(tensors, 2, modules) is None  # (unchanged since: nothing copied)


def test_an_interrupted_write_finishes_before_the_interrupt_goes_on(monkeypatch):
    module = net()
    _, board = board_for(module)
    into, calls = weights_board._into, []

    def interrupted(dst, src):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        into(dst, src)

    monkeypatch.setattr(weights_board, "_into", interrupted)
    with pytest.raises(KeyboardInterrupt):
        board.write(list(net(4.0).state_dict().values()), [], version=1)
    assert int(board.clock[SEQ]) == 2 and board.version == 1  # (even: never left odd, nor half copied)
    assert all((a == 4).all() for a in board.arrays)


def test_weights_that_do_not_fit_are_refused_before_anything_is_written():
    module = net()
    _, board = board_for(module)
    before = [a.copy() for a in board.arrays]
    sources = list(net(4.0).state_dict().values())
    with pytest.raises(ValueError, match="weights of shapes"):
        board.write([*sources[:-1], torch.zeros(7)], [], version=1)
    assert int(board.clock[SEQ]) == 0 and board.version == 0
    assert all((a == b).all() for a, b in zip(board.arrays, before))


def test_a_publish_is_one_copy_into_the_board_in_effect_at_once():
    module = net()
    _, board = board_for(module)
    channel = BoardChannel(TorchWeights(module), None, board)
    assert channel.publish(net(5.0)) == 1 and channel.version == 1 and not channel.has_pending
    assert board.version == 1 and all((t == 5).all() for t in module.state_dict().values())
    module[2] = nn.Linear(4, 3)  # (a submodule replaced: the workers' copies cannot take it)
    with pytest.raises(RuntimeError, match=r"weights are now of shapes .* needs a new collector"):
        channel.publish(net(7.0))
    assert int(board.clock[SEQ]) == 2


def test_releasing_the_storage_at_shutdown_keeps_the_board():
    module = net(6.0)
    fd = create_segment(board_for(module)[0].layout.size)
    try:
        shared, board = board_for(module, fd)
    finally:
        os.close(fd)
    board.share(module)
    shared.arrays["reward"][...] = 1.0
    shared.release()
    assert not shared.arrays["reward"].any()  # (the storage's memory is given back...)
    assert all((t == 6).all() for t in module.state_dict().values())  # (...the policy's weights are not)

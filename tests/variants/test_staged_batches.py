"""Batches built through a ``DeviceStaging`` (a GPU ``storing_device``'s path) are the batches
built without one: the whole batch path (storage, worker parts, joins), with the CPU as the
staging's device, so that it runs where there is no GPU (``tests/gpu`` runs it on one)."""

from __future__ import annotations

import pytest
import torch

from aiocollect import Collector, MultiSyncCollector
from aiocollect._engine.staging import DeviceStaging
from support.envs import CounterEnv

CPU = torch.device("cpu")


def cycle(observation: torch.Tensor) -> torch.Tensor:
    """A deterministic policy (a random one draws differently as workers group their calls)."""
    return (observation[:, 0] + observation[:, 1]).long() % 3


@pytest.mark.parametrize("make", [
    lambda: Collector([CounterEnv] * 4, cycle, frames_per_batch=40, total_frames=160),
    lambda: MultiSyncCollector([[CounterEnv] * 2] * 2, cycle, frames_per_batch=40, total_frames=160,
                               cat_results="stack"),
    lambda: MultiSyncCollector([[CounterEnv] * 2] * 2, cycle, frames_per_batch=40, total_frames=160,
                               cat_results=-1),  # joined by torch.cat: outside the block
], ids=["Collector", "MultiSync-stack", "MultiSync-cat-time"])
def test_collected_batches_are_the_same_staged_or_not(make):
    def run(staged: bool) -> list:
        with make() as collector:
            if staged:
                collector._staging = collector._scheduler.storage.staging = DeviceStaging(CPU)
            collector.set_seed(3)
            out = [batch.clone() for batch in collector]
            if staged:
                assert collector._staging.copies == len(out)
        return out

    plain, staged = run(False), run(True)
    assert len(plain) == len(staged) == 4
    for a, b in zip(plain, staged):
        assert a.batch_size == b.batch_size and a.names == b.names
        assert set(a.keys(True, True)) == set(b.keys(True, True))
        for key in a.keys(True, True):
            if key == ("collector", "traj_ids"):  # numbered in the order workers finish episodes
                x, y = a[key], b[key]
                assert torch.equal(x[..., 1:] != x[..., :-1], y[..., 1:] != y[..., :-1])
            else:
                assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("make", [
    lambda: Collector([CounterEnv] * 4, cycle, frames_per_batch=40, total_frames=-1),
    lambda: MultiSyncCollector([[CounterEnv] * 2] * 2, cycle, frames_per_batch=40, total_frames=-1),
], ids=["Collector", "MultiSync"])
def test_rollout_is_staged_too_and_later_batches_do_not_change_it(make):
    with make() as collector:
        staging = collector._staging = collector._scheduler.storage.staging = DeviceStaging(CPU)
        first = collector.rollout()
        kept = first.clone()
        second = collector.rollout()
        assert staging.copies == 2
        assert first["observation"].untyped_storage().data_ptr() != second["observation"].untyped_storage().data_ptr()
        assert (first == kept).all()


def test_return_same_td_holds_for_rollout():
    with Collector([CounterEnv] * 4, cycle, frames_per_batch=40, total_frames=-1, return_same_td=True) as collector:
        first = collector.rollout()
        second = collector.rollout()
        assert second is first
        batch = next(iter(collector))
        assert batch is first


async def test_async_for_is_staged_too():
    """The async face: each batch is uploaded once and is the user's (later batches do not change it)."""
    async with MultiSyncCollector([[CounterEnv] * 2] * 2, cycle, frames_per_batch=40, total_frames=160) as collector:
        staging = collector._staging = collector._scheduler.storage.staging = DeviceStaging(CPU)
        got = []
        async for batch in collector:
            got.append((batch, batch.clone()))
        assert staging.copies == len(got) == 4
        assert all((batch == kept).all() for batch, kept in got)

"""Versioned, non-blocking weight updates, in every collector variant and both faces."""

from __future__ import annotations

import threading
import time

import pytest
import torch
import torch.nn as nn
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from aiocollect import AsyncCollector, Collector, MultiAsyncCollector, MultiSyncCollector
from support.checks import check_batch
from support.envs import IntObsEnv

VARIANTS = {
    "Collector": lambda policy, **kw: Collector([IntObsEnv] * 3, policy, **kw),
    "MultiSync": lambda policy, **kw: MultiSyncCollector([[IntObsEnv] * 3] * 2, policy, **kw),
    "MultiAsync": lambda policy, **kw: MultiAsyncCollector([[IntObsEnv] * 3] * 2, policy, **kw),
    "AsyncCollector": lambda policy, **kw: AsyncCollector([IntObsEnv] * 3, policy, **kw),
}


def linear(value: float) -> TensorDictModule:
    """``action = value * (sum(obs) + 1)``: every weight of version ``k`` is ``k``."""
    module = nn.Linear(3, 1)
    with torch.no_grad():
        module.weight.fill_(value)
        module.bias.fill_(value)
    return TensorDictModule(module, in_keys=["observation"], out_keys=["action"])


def check_versions(batch) -> set[int]:
    """Each frame's action came from exactly the weights of the version it is tagged with."""
    for part in (batch.unbind(0) if batch.ndim == 3 else [batch]):  # MultiSync: [workers, envs, T]
        check_batch(part)
    version = batch["collector", "policy_version"].to(torch.float32)
    expected = version * (batch["observation"].sum(-1) + 1)
    assert torch.equal(batch["action"][..., 0], expected), "an action does not match its policy version"
    return set(batch["collector", "policy_version"].unique().tolist())


class Trainer(threading.Thread):
    """Sets its weights to ``k``, sends them as version ``k``, then poisons its own copy."""

    def __init__(self, collector):
        super().__init__(daemon=True)
        self.collector, self.policy = collector, linear(0.0)
        self.stop, self.sent, self.error = threading.Event(), 0, None

    def run(self):
        params = list(self.policy.parameters())
        try:
            while not self.stop.is_set():
                with torch.no_grad():
                    for p in params:
                        p.fill_(self.sent + 1)
                version = self.collector.update_policy_weights_(self.policy)
                assert version == self.sent + 1, (version, self.sent)
                self.sent = version
                with torch.no_grad():
                    for p in params:
                        p.fill_(-1e9)  # poison: any frame computed from it would show
                time.sleep(0.0005)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_concurrent_updates_never_mix_versions_sync_face(variant):
    collector = VARIANTS[variant](linear(0.0), frames_per_batch=60, total_frames=60 * 40)
    trainer = Trainer(collector)
    seen: set[int] = set()
    with collector:
        trainer.start()
        try:
            for batch in collector:
                seen |= check_versions(batch)
        finally:
            trainer.stop.set()
            trainer.join()
    assert trainer.error is None, trainer.error
    assert len(seen) >= 5, f"too few versions collected to test anything: {seen}"
    assert max(seen) <= trainer.sent


@pytest.mark.parametrize("variant", ["Collector", "MultiAsync"])
async def test_concurrent_updates_never_mix_versions_async_face(variant):
    collector = VARIANTS[variant](linear(0.0), frames_per_batch=60, total_frames=60 * 30)
    trainer = Trainer(collector)
    seen: set[int] = set()
    async with collector:
        trainer.start()
        try:
            async for batch in collector:
                seen |= check_versions(batch)
        finally:
            trainer.stop.set()
            trainer.join()
    assert trainer.error is None, trainer.error
    assert len(seen) >= 5, seen


@pytest.mark.parametrize("variant", list(VARIANTS))
async def test_async_twin_returns_once_in_effect(variant):
    async with VARIANTS[variant](linear(0.0), frames_per_batch=30, total_frames=-1) as collector:
        batch = await collector.arollout()
        assert (batch["collector", "policy_version"] == 0).all()
        assert collector.statistics().policy_version == 0
        version = await collector.update_policy_weights(linear(1.0))
        assert version == 1
        stats = collector.statistics()
        assert stats.policy_version == 1 and stats.latest_policy_version == 1
        # in effect already: the collector's own copy holds them, the next frames carry them
        assert torch.equal(collector.policy.module.weight, torch.full((1, 3), 1.0))
        async for batch in collector:
            if variant in ("MultiAsync", "AsyncCollector") and (batch["collector", "policy_version"] == 0).any():
                continue  # collected ahead, before the update
            assert (batch["collector", "policy_version"] == 1).all()
            check_versions(batch)
            break


def test_update_forms_and_versions():
    trainer = linear(2.0)
    with Collector([IntObsEnv] * 2, linear(0.0), frames_per_batch=8, total_frames=-1) as c:
        assert c.update_policy_weights_(trainer) == 1
        assert c.update_policy_weights_(TensorDict.from_module(trainer)) == 2
        assert c.update_policy_weights_(trainer.state_dict()) == 3
        # only the newest pending snapshot is applied: versions 1 and 2 are never used
        batch = c.rollout()
        assert (batch["collector", "policy_version"] == 3).all()
        assert torch.equal(batch["action"][..., 0], 2.0 * (batch["observation"].sum(-1) + 1))
        with pytest.raises(KeyError, match="missing"):
            c.update_policy_weights_({"module.weight": torch.zeros(1, 3)})
        with pytest.raises(KeyError, match="unexpected"):
            c.update_policy_weights_({**trainer.state_dict(), "extra": torch.zeros(1)})
        with pytest.raises(ValueError, match="shape"):
            c.update_policy_weights_({"module.weight": torch.zeros(2, 3), "module.bias": torch.zeros(1)})
        with pytest.raises(TypeError, match="expected a module"):
            c.update_policy_weights_(42)
        assert c.statistics().latest_policy_version == 3  # failed calls publish nothing


def test_none_takes_the_construction_policy_and_the_collector_owns_a_copy():
    policy = linear(0.0)
    with MultiSyncCollector([IntObsEnv] * 2, policy, frames_per_batch=20, total_frames=-1) as c:
        assert c.policy is not policy
        with torch.no_grad():
            for p in policy.parameters():
                p.fill_(3.0)  # an optimiser step on the user's object...
        batch = c.rollout()
        assert (batch["collector", "policy_version"] == 0).all()
        assert torch.equal(batch["action"], torch.zeros_like(batch["action"]))  # ...does not leak in
        assert c.update_policy_weights_() == 1  # TorchRL's usual call: take the given policy's weights
        batch = c.rollout()
        assert (batch["collector", "policy_version"] == 1).all()
        assert torch.equal(batch["action"][..., 0], 3.0 * (batch["observation"].sum(-1) + 1))


def test_random_policy_has_no_weights():
    with Collector([IntObsEnv], None, frames_per_batch=4, total_frames=-1) as c:
        assert c.update_policy_weights_() == 0
        with pytest.raises(TypeError, match="no weights"):
            c.update_policy_weights_(linear(1.0))
        assert (c.rollout()["collector", "policy_version"] == 0).all()


@pytest.mark.parametrize("lag", [0, 1])
def test_max_policy_lag_bounds_every_delivered_frame(lag):
    collector = MultiAsyncCollector([[IntObsEnv] * 2] * 2, linear(0.0), frames_per_batch=40,
                                    total_frames=40 * 24, max_policy_lag=lag)
    trainer = linear(0.0)
    with collector:
        for i, batch in enumerate(collector):
            newest = collector.statistics().latest_policy_version
            check_versions(batch)
            oldest = int(batch["collector", "policy_version"].min())
            assert newest - oldest <= lag, (i, newest, oldest)
            with torch.no_grad():
                for p in trainer.parameters():
                    p.fill_(newest + 1)
            collector.update_policy_weights_(trainer)  # after every batch, as a trainer would
        stats = collector.statistics()
    assert stats.max_policy_lag <= lag
    assert stats.latest_policy_version == 24
    if lag == 0:
        # with two workers collecting ahead, a bound of 0 must have dropped frames
        assert stats.stale_frames_dropped > 0


def test_without_a_bound_the_lag_is_reported():
    collector = MultiAsyncCollector([[IntObsEnv] * 2] * 2, linear(0.0), frames_per_batch=40, total_frames=40 * 12)
    trainer = linear(1.0)
    with collector:
        for _ in collector:
            collector.update_policy_weights_(trainer)
        stats = collector.statistics()
    assert stats.max_policy_lag >= 1 and stats.stale_frames_dropped == 0


def test_max_policy_lag_is_validated_before_any_process_starts():
    with pytest.raises(ValueError, match="max_policy_lag"):
        MultiAsyncCollector([IntObsEnv] * 2, None, frames_per_batch=10, max_policy_lag=-1)
    with pytest.raises(ValueError, match="max_policy_lag.*MultiAsyncCollector"):
        MultiSyncCollector([IntObsEnv] * 2, None, frames_per_batch=10, max_policy_lag=1)


class ListBuffer:
    """The smallest replay buffer: keeps every batch it is given."""

    def __init__(self):
        self.batches, self.lock = [], threading.Lock()

    def extend(self, batch):
        with self.lock:
            self.batches.append(batch)


@pytest.mark.parametrize("variant", ["Collector", "MultiAsync"])
def test_updates_while_collecting_in_the_background(variant):
    rb = ListBuffer()
    collector = VARIANTS[variant](linear(0.0), frames_per_batch=30, total_frames=-1, replay_buffer=rb)
    trainer = linear(0.0)
    versions = []
    try:
        collector.start()
        for k in range(1, 30):  # the training loop: sample, step, send the weights
            time.sleep(0.01)
            with torch.no_grad():
                for p in trainer.parameters():
                    p.fill_(k)
            versions.append(collector.update_policy_weights_(trainer))
    finally:
        collector.async_shutdown(timeout=5)
    assert versions == list(range(1, 30))
    seen = set()
    with rb.lock:
        assert len(rb.batches) >= 5
        for batch in rb.batches:
            seen |= check_versions(batch)
    assert len(seen) >= 3, seen

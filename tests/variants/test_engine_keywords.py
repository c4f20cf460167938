"""``spin`` and ``pipeline``: how the engine and its workers wait for each other, and whether
each worker steps its envs in two halves, as keywords of the worker collectors (issue 54):
the keyword decides whatever ``AIOCOLLECT_SPIN``/``AIOCOLLECT_PIPELINE`` say (the variables
are the fallback of ``None``), the collector says what was chosen, the workers run that way
and collect the same batches, and a bad value is a ``TypeError`` naming the keyword, raised
before any worker process starts."""

from __future__ import annotations

import pytest
import torch
from tensordict.nn import TensorDictModule
from torch import nn

import aiocollect
from aiocollect._workers import protocol
from support.envs import TaggedCounter
from support.procs import children

pytestmark = pytest.mark.usefixtures("leak_check")


class _Steps(nn.Module):
    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return (obs[..., 0] + obs[..., 1]).long() % 3


def policy() -> TensorDictModule:
    """Deterministic, and the same whoever else is in the call: halves give the same actions."""
    return TensorDictModule(_Steps(), in_keys=["observation"], out_keys=["action"])


def entries(workers: int = 2, envs: int = 4) -> list:
    return [[lambda w=w: TaggedCounter(w)] * envs for w in range(workers)]


@pytest.mark.parametrize(("spin", "variable"), [(True, "0"), (False, "1"), (None, "1"), (None, "0")])
def test_the_spin_keyword_decides_and_the_variable_is_the_fallback(monkeypatch, spin, variable):
    monkeypatch.setenv("AIOCOLLECT_SPIN", variable)
    on = spin if spin is not None else variable == "1"
    with aiocollect.MultiSyncCollector(entries(), policy(), frames_per_batch=16, total_frames=32,
                                       spin=spin) as collector:
        assert collector.spin is on
        assert collector.worker_options.spin is spin
        assert collector._pool.worker_spin_s == (protocol.SPIN_S if on else 0.0)  # (what each worker got)
        batches = list(collector)
    assert [b.batch_size for b in batches] == [(2, 4, 2)] * 2  # (workers, envs, steps)
    assert all((b["next", "observation"][..., 0] == b["observation"][..., 0] + 1).all() for b in batches)


def test_the_default_spins_only_on_cores_no_other_program_takes(monkeypatch):
    monkeypatch.delenv("AIOCOLLECT_SPIN", raising=False)
    monkeypatch.setattr(protocol, "_x86_64", lambda: True)
    monkeypatch.setattr(protocol, "usable_cores", lambda: 2)
    monkeypatch.setattr(protocol.os, "getloadavg", lambda: (64.0, 64.0, 64.0))  # (a machine busy elsewhere,
    monkeypatch.setattr(protocol, "runnable_now", lambda: 65)  # on average and right now)
    with aiocollect.MultiAsyncCollector(entries(), policy(), frames_per_batch=16, total_frames=16) as collector:
        assert collector.spin is False
        assert collector._pool.worker_spin_s == protocol.WORKER_SPIN_S
        assert next(iter(collector)).numel() == 16


def halves_of(collector) -> set[int]:
    return {len(lanes) for lanes in collector._worker_lanes}


@pytest.mark.parametrize("cls", [aiocollect.MultiSyncCollector, aiocollect.MultiAsyncCollector])
def test_pipeline_true_steps_each_worker_in_halves_and_collects_the_same_batches(monkeypatch, cls):
    monkeypatch.setenv("AIOCOLLECT_PIPELINE", "0")  # (the keyword decides)
    got = {}
    for pipeline in (True, False):
        with cls(entries(1, 4), policy(), frames_per_batch=28, total_frames=56, pipeline=pipeline,
                 policy_placement="central") as collector:
            assert collector.pipeline is pipeline
            assert halves_of(collector) == ({2} if pipeline else {1})
            collector.set_seed(3)
            got[pipeline] = [b.exclude("collector") for b in collector]
    assert len(got[True]) == len(got[False]) == 2
    for a, b in zip(got[True], got[False]):
        assert (a == b).all(), "the halves give the batches of a worker stepping all its envs at once"


def test_pipeline_true_has_nothing_to_overlap_with_random_actions_or_a_policy_in_the_workers():
    with aiocollect.MultiSyncCollector(entries(1, 8), None, frames_per_batch=16, total_frames=16,
                                       pipeline=True) as collector:
        assert collector.pipeline is False and halves_of(collector) == {1}
    with aiocollect.MultiSyncCollector(entries(1, 8), policy(), frames_per_batch=16, total_frames=16,
                                       pipeline=True, policy_placement="workers") as collector:
        assert collector.policy_in_workers and collector.pipeline is False


@pytest.mark.parametrize(("keyword", "value"), [("spin", "yes"), ("spin", 1), ("pipeline", "auto"), ("pipeline", 0)])
def test_a_bad_value_names_the_keyword_before_any_worker_starts(keyword, value):
    before = set(children())
    with pytest.raises(TypeError, match=rf"{keyword} must be True, False or None"):
        aiocollect.MultiAsyncCollector(entries(), policy(), frames_per_batch=16, **{keyword: value})
    assert set(children()) == before


async def test_the_keywords_hold_on_the_async_face(monkeypatch):
    monkeypatch.setenv("AIOCOLLECT_SPIN", "1")
    monkeypatch.setenv("AIOCOLLECT_PIPELINE", "0")
    async with aiocollect.MultiAsyncCollector(entries(1, 4), policy(), frames_per_batch=28, total_frames=56,
                                              spin=False, pipeline=True, policy_placement="central") as collector:
        assert collector.spin is False and collector.pipeline is True and halves_of(collector) == {2}
        batches = [batch async for batch in collector]
    assert [b.numel() for b in batches] == [28, 28]
    assert all((b["next", "observation"][..., 0] == b["observation"][..., 0] + 1).all() for b in batches)

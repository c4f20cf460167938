"""``enable_profile()``: where the collection's time goes, in every variant, counted and named for
torch's profiler; off until asked for."""

from __future__ import annotations

import json
import time

import pytest
import torch

from aiocollect import CollectorError, MultiSyncCollector, ProfileReport
from support.envs import CounterEnv

FPB = 40


def policy(observation):
    return (observation[..., 0] % 3).to(torch.int64)  # reads the observation: one call per round


def test_profile_counts_the_policy_calls_batches_and_the_callers_own_time(variant):
    with variant(CounterEnv, policy, frames_per_batch=FPB, total_frames=4 * FPB) as collector:
        with pytest.raises(CollectorError, match="enable_profile"):
            collector.profile_report()
        collector.enable_profile()
        for _ in collector:
            time.sleep(0.02)  # "training"
        report = collector.profile_report()
    assert isinstance(report, ProfileReport)
    assert report.batches == 4 and report.frames == 4 * FPB
    assert report.policy_calls > 0 and report.policy_rows >= 4 * FPB  # collectors ahead take more steps
    assert report.policy_rows / report.policy_calls <= variant.num_envs
    assert report.policy_seconds > 0 and report.batch_seconds > 0 and report.deliver_seconds > 0
    assert report.caller_seconds >= 3 * 0.02  # the time between batches, three of them
    assert report.wait_seconds > 0
    # only a MultiSyncCollector waits for a slowest worker (variants/test_worker_collectors.py)
    if variant.cls is not MultiSyncCollector:
        assert report.straggler_seconds == 0.0
    assert 0.0 <= report.straggler_seconds <= report.wait_seconds
    assert report.policy_placement == "here"  # (a plain function: no worker runs it)
    text = str(report)
    assert "160 frames in 4 batches; the policy ran here" in text
    assert "policy calls" in text and "your loop's own time" in text


async def test_profile_on_the_async_face(variant):
    async with variant(CounterEnv, policy, frames_per_batch=FPB, total_frames=2 * FPB) as collector:
        collector.enable_profile()
        assert [b.numel() async for b in collector] == [FPB, FPB]
        report = collector.profile_report()
    assert report.batches == 2 and report.policy_calls > 0
    assert report.policy_placement == "here"


def test_profile_saves_a_torch_trace_with_the_engines_ranges(variant, tmp_path):
    path = tmp_path / "trace.json"
    with variant(CounterEnv, policy, frames_per_batch=FPB, total_frames=5 * FPB) as collector:
        collector.enable_profile(warmup_rollouts=1, num_rollouts=3, save_path=path)
        for _ in collector:
            pass
    names = {event.get("name") for event in json.loads(path.read_text())["traceEvents"]}
    assert "aiocollect.policy" in names and "aiocollect.batch" in names


def test_enable_profile_refuses_bad_arguments_and_a_closed_collector(variant):
    collector = variant(CounterEnv, None, frames_per_batch=FPB)
    with pytest.raises(ValueError, match="warmup_rollouts=3 must be below num_rollouts=3"):
        collector.enable_profile(warmup_rollouts=3, num_rollouts=3)
    with pytest.raises(ValueError, match="activities"):
        collector.enable_profile(activities=["tpu"])
    with pytest.raises(TypeError, match="workers"):
        collector.enable_profile(workers="all")
    collector.shutdown()
    with pytest.raises(CollectorError, match="shut down"):
        collector.enable_profile()

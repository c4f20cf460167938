"""``enable_profile()``: where the collection's time goes, in every variant, counted and named for
torch's profiler; off until asked for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from aiocollect import CollectorError, MultiSyncCollector, ProfileReport
from support.envs import CounterEnv
from support.variants import VARIANTS

FPB = 40
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def trace_names(path) -> set:
    return {event.get("name") for event in json.loads(path.read_text())["traceEvents"]}


def test_a_profile_whose_collection_ends_before_num_rollouts_saves_its_trace_at_the_last_batch(variant, tmp_path):
    # issue 50 item 1: the trace was ended at shutdown, in another thread than the engine's
    # that began it (torch: "no active profiling session"), and the process died of SIGSEGV
    # (4 batches, traced from the second: a collector that collects ahead may have stepped all of
    # the second and third batches before its trace began: two finished batches wait at most)
    path = tmp_path / "trace.json"
    with variant(CounterEnv, policy, frames_per_batch=FPB, total_frames=4 * FPB) as collector:
        collector.enable_profile(save_path=path, num_rollouts=6)  # the collection ends first
        for _ in collector:
            pass
        assert path.is_file(), "the trace is saved as the last batch is delivered"
    assert {"aiocollect.policy", "aiocollect.batch"} <= trace_names(path)


PROFILED_ENDINGS = textwrap.dedent(
    """
    import asyncio, sys
    sys.path.insert(0, {tests!r})
    from pathlib import Path
    from support.variants import VARIANTS
    from support.envs import CounterEnv

    def policy(observation):
        return (observation[..., 0] % 3).long()

    folder = Path({folder!r})
    endings = ("break then shutdown", "with block", "async for")
    for k, variant in enumerate(VARIANTS):
        for ending in [endings[k % 3]]:  # (each ending over several variants; one collector each)
            path = folder / f"{{variant.name}}-{{ending.replace(' ', '-')}}.json"
            collector = variant(CounterEnv, policy, frames_per_batch=40, total_frames=-1)
            collector.enable_profile(save_path=path, num_rollouts=5)
            if ending == "break then shutdown":
                for i, _ in enumerate(collector):
                    if i == 2:
                        break
                collector.shutdown()
            elif ending == "with block":
                with collector:
                    it = iter(collector)
                    next(it), next(it), next(it)
            else:
                async def main():
                    async with collector:
                        async for i, _ in _enumerate(collector):
                            if i == 2:
                                break
                async def _enumerate(items):
                    i = 0
                    async for item in items:
                        yield i, item
                        i += 1
                asyncio.run(main())
            assert path.is_file(), path
            print(variant.name, ending, "saved", flush=True)
    print("the end")
    """
)


def test_a_trace_under_way_at_shutdown_is_saved_and_the_process_exits_cleanly(tmp_path):
    # issue 50 item 1: a trace still recording when the collection stopped (a break, the end
    # of a with block, an async for left) was ended in the wrong thread: SIGSEGV at exit
    script = PROFILED_ENDINGS.format(tests=TESTS, folder=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=TESTS)
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    assert proc.stdout.rstrip().endswith("the end")
    saved = sorted(tmp_path.glob("*.json"))
    assert len(saved) == len(VARIANTS)
    for path in saved:
        assert "aiocollect.batch" in trace_names(path), path


def test_enable_profile_refuses_a_save_path_that_cannot_be_written(tmp_path):
    collector = MultiSyncCollector([[CounterEnv]] * 2, None, frames_per_batch=FPB, total_frames=FPB)
    try:
        with pytest.raises(ValueError, match=r"save_path=.* is a folder: give a file path in it"):
            collector.enable_profile(save_path=tmp_path)
        blocker = tmp_path / "file"
        blocker.write_text("")
        with pytest.raises(ValueError, match=r"save_path=.*its folder cannot be made"):
            collector.enable_profile(save_path=blocker / "trace.json")
        with pytest.raises(TypeError, match="save_path=3: give a file path"):
            collector.enable_profile(save_path=3)
        for _ in range(5):
            collector.enable_profile()
        assert collector._resources.closers.count(collector._end_trace) == 1  # (issue 50 item 12)
    finally:
        collector.shutdown()
    assert not list(tmp_path.glob("*.tmp"))

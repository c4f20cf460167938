"""The benchmark script keeps working (its speed is reported, never asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).parent.parent / "benchmarks" / "bench_collect.py"


def test_benchmark_quick_mode_runs_and_reports_every_contender(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for row in ("plain gymnasium SyncVectorEnv loop", "aiocollect Collector, for", "aiocollect Collector, async for",
                "TorchRL Collector(SerialEnv)", "hand-written SyncVectorEnv + MLP loop"):
        assert row in proc.stdout, row
    results = json.loads(out.read_text())
    assert results, "no results written"


def test_weights_benchmark_quick_mode_reports_every_section(tmp_path):
    out = tmp_path / "weights.json"
    script = BENCH.parent / "bench_weights.py"
    proc = subprocess.run([sys.executable, str(script), "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for row in ("torch, idle", "torch, collecting", "jax, idle", "jax, collecting",
                "collector-16-small", "multisync-2x8-1M", "collector-64", "multisync-2x32"):
        assert row in proc.stdout, row
    results = json.loads(out.read_text())
    assert set(results["update_call"]) == {"torch, idle", "torch, collecting", "jax, idle", "jax, collecting"}
    for section in ("with_updates", "jax"):
        for entry in results[section].values():
            assert entry["ratio"] > 0


def test_coroutine_benchmark_quick_mode_reports_every_contender(tmp_path):
    out = tmp_path / "coroutines.json"
    script = BENCH.parent / "bench_coroutines.py"
    proc = subprocess.run([sys.executable, str(script), "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for row in ("barrier: asyncio.gather", "aiocollect Collector, coroutine envs",
                "TorchRL AsyncBatchedCollector, threading", "aiocollect / bound"):
        assert row in proc.stdout, row
    results = json.loads(out.read_text())
    assert results["bound"] == 25_600
    assert set(results["contenders"]) == {"barrier", "aiocollect", "torchrl"}


def test_ray_benchmark_quick_mode_reports_both_contenders(tmp_path):
    out = tmp_path / "ray.json"
    script = BENCH.parent / "bench_ray.py"
    proc = subprocess.run([sys.executable, str(script), "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for row in ("aiocollect RayCollector (Collector)", "TorchRL RayCollector (Collector, SerialEnv)",
                "aiocollect / TorchRL"):
        assert row in proc.stdout, row
    results = json.loads(out.read_text())
    assert set(results["contenders"]) == {"aiocollect", "torchrl"} and results["ratio"] > 0

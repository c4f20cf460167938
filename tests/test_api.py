"""The public surface is exactly what we mean it to be."""

from __future__ import annotations

import subprocess
import sys

import aiocollect

EXPECTED = {
    "Collector",
    "CollectorOptions",
    "CollectorStatistics",
    "DataCollectorBase",
    "GymEnv",
    "Interruptor",
    "RandomPolicy",
    "SyncDataCollector",
    "split_trajectories",
}


def test_exported_names_are_exactly_the_public_api():
    assert set(aiocollect.__all__) == EXPECTED
    assert aiocollect.__all__ == sorted(aiocollect.__all__)
    public = {name for name in vars(aiocollect) if not name.startswith("_")}
    assert public == EXPECTED
    for name in EXPECTED:
        assert getattr(aiocollect, name).__module__.startswith("aiocollect._"), name


def test_seed_era_names_are_the_new_classes():
    assert aiocollect.SyncDataCollector is aiocollect.Collector
    assert issubclass(aiocollect.Collector, aiocollect.DataCollectorBase)


def test_the_library_never_imports_torchrl():
    code = (
        "import sys, gymnasium as gym, aiocollect\n"
        "c = aiocollect.Collector([lambda: gym.make('CartPole-v1')] * 2, None, frames_per_batch=20, total_frames=40)\n"
        "assert len(list(c)) == 2\n"
        "c.shutdown()\n"
        "assert not [m for m in sys.modules if m.startswith('torchrl')], 'torchrl imported'\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"

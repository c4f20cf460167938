"""The public surface is exactly what we mean it to be."""

from __future__ import annotations

import subprocess
import sys
import types

import aiocollect

EXPECTED = {
    "AsyncCollector",
    "AsyncEnv",
    "BaseCollector",
    "Collector",
    "CollectorBusyError",
    "CollectorClosedError",
    "CollectorError",
    "CollectorFailedError",
    "CollectorOptions",
    "CollectorStatistics",
    "DataCollectorBase",
    "EnvError",
    "GymEnv",
    "Interruptor",
    "MultiAsyncCollector",
    "MultiCollector",
    "MultiSyncCollector",
    "MultiSyncDataCollector",
    "MultiaSyncDataCollector",
    "PolicyError",
    "ProfileReport",
    "RPCCollector",
    "RandomPolicy",
    "RayCollector",
    "RemoteCollectorError",
    "StartTimeoutError",
    "StepTimeoutError",
    "SyncDataCollector",
    "ThreadEnv",
    "WorkerError",
    "WorkerStatistics",
    "aSyncDataCollector",
    "split_trajectories",
    "tune",
}


def test_exported_names_are_exactly_the_public_api():
    assert set(aiocollect.__all__) == EXPECTED
    assert aiocollect.__all__ == sorted(aiocollect.__all__)
    for name in EXPECTED:
        assert getattr(aiocollect, name).__module__.startswith("aiocollect._"), name
    # submodules (aiocollect.jax, once imported) are attributes too, but not names
    public = {name for name, value in vars(aiocollect).items()
              if not name.startswith("_") and not isinstance(value, types.ModuleType)}
    assert public == EXPECTED
    assert set(dir(aiocollect)) >= EXPECTED


def test_import_is_lazy_and_torch_free():
    code = "import sys, aiocollect; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_seed_era_names_are_the_new_classes():
    assert aiocollect.SyncDataCollector is aiocollect.Collector
    assert aiocollect.MultiSyncDataCollector is aiocollect.MultiSyncCollector
    assert aiocollect.MultiaSyncDataCollector is aiocollect.MultiAsyncCollector
    assert aiocollect.aSyncDataCollector is aiocollect.AsyncCollector
    assert issubclass(aiocollect.AsyncCollector, aiocollect.MultiAsyncCollector)
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


def test_every_fault_error_is_a_collector_error_and_a_runtime_error():
    faults = [aiocollect.WorkerError, aiocollect.EnvError, aiocollect.StepTimeoutError,
              aiocollect.RemoteCollectorError, aiocollect.CollectorClosedError,
              aiocollect.CollectorFailedError, aiocollect.CollectorBusyError]
    for cls in faults:
        assert issubclass(cls, aiocollect.CollectorError) and issubclass(cls, RuntimeError), cls
    assert issubclass(aiocollect.EnvError, aiocollect.WorkerError)
    assert issubclass(aiocollect.StepTimeoutError, aiocollect.EnvError)
    assert issubclass(aiocollect.StepTimeoutError, TimeoutError)
    # every error class is defined in one module
    assert {cls.__module__ for cls in [aiocollect.CollectorError, *faults]} == {"aiocollect._errors"}


def test_errors_survive_pickling_with_their_attributes():
    import pickle

    err = aiocollect.EnvError("env 1 of worker 2 raised", worker=2, pid=7, env=1, remote_type="ValueError",
                              remote_traceback="tb")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is aiocollect.EnvError and str(back) == str(err)
    assert (back.worker, back.pid, back.env, back.remote_type, back.remote_traceback) == (2, 7, 1, "ValueError", "tb")
    remote = aiocollect.RemoteCollectorError("remote collector 1 failed", index=1, where="Ray actor x", pid=9)
    back = pickle.loads(pickle.dumps(remote))
    assert type(back) is aiocollect.RemoteCollectorError and (back.index, back.where, back.pid) == (1, "Ray actor x", 9)

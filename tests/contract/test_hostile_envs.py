"""Envs that make their own errors hard to report: an exception whose ``__str__`` raises,
a 50 MB message, ``SystemExit`` or ``KeyboardInterrupt`` raised by env code, a ``close()``
that raises. Each still gives the usual error, naming worker and env, at once."""

from __future__ import annotations

import functools
import logging
import os
import re
import time
import warnings

import pytest

from aiocollect import Collector, EnvError, MultiAsyncCollector, MultiSyncCollector
from support.envs import CloseRaisesEnv, CloseRecordEnv, CounterEnv, HostileEnv, NoSpacesEnv
from support.procs import children


def _failing(variant, how: str):
    k = variant.num_envs - 1
    collector = variant([CounterEnv] * k + [functools.partial(HostileEnv, how)], frames_per_batch=40,
                        total_frames=-1)
    t0 = time.monotonic()
    with pytest.raises(EnvError) as info:
        for _ in collector:
            pass
    elapsed = time.monotonic() - t0
    collector.shutdown()
    return info.value, variant.locate(k), elapsed


def test_an_exception_whose_str_raises_is_still_an_env_error(variant):
    err, (worker, env), elapsed = _failing(variant, "unprintable")
    assert elapsed < 5
    assert (err.worker, err.env) == (worker, env)
    assert "raised UnprintableError: <unprintable UnprintableError>" in str(err)
    assert err.remote_type == "UnprintableError" and "in step" in err.remote_traceback


def test_a_huge_exception_message_is_truncated():
    collector = MultiSyncCollector([[functools.partial(HostileEnv, "huge")]], frames_per_batch=10, total_frames=-1)
    t0 = time.monotonic()
    with pytest.raises(EnvError) as info:
        for _ in collector:
            pass
    assert time.monotonic() - t0 < 3
    collector.shutdown()
    err = info.value
    assert (err.worker, err.env) == (0, 0)
    assert "characters truncated" in str(err) and len(str(err)) < 300_000
    assert "in step" in err.remote_traceback and len(err.remote_traceback) < 100_000


@pytest.mark.parametrize(("how", "kind"), [("exit", "SystemExit"), ("interrupt", "KeyboardInterrupt")])
def test_system_exit_or_keyboard_interrupt_from_env_code_is_an_env_error(how, kind):
    collector = MultiSyncCollector([[CounterEnv] * 2, [CounterEnv, functools.partial(HostileEnv, how)]],
                                   frames_per_batch=32, total_frames=-1)
    with pytest.raises(EnvError) as info:
        for _ in collector:
            pass
    collector.shutdown()
    err = info.value
    assert (err.worker, err.env, err.remote_type) == (1, 1, kind)
    assert "env 1 of worker 1" in str(err) and "in step" in err.remote_traceback
    assert err.exitcode is None  # reported by the worker, not seen as its death


def test_a_probe_env_whose_close_raises_only_warns():
    with pytest.warns(RuntimeWarning, match=r"create_env_fn\[0\] \(CloseRaisesEnv\).*close failed on purpose"):
        collector = MultiSyncCollector([CloseRaisesEnv], frames_per_batch=10, total_frames=20)
    assert sum(1 for _ in collector) == 2
    collector.shutdown()


@pytest.mark.parametrize("cls", [Collector, MultiSyncCollector, MultiAsyncCollector])
def test_an_env_without_spaces_is_refused_naming_the_factory_before_any_process_starts(cls):
    NoSpacesEnv.closed = False
    before = children()
    envs = [NoSpacesEnv] if cls is Collector else [[NoSpacesEnv]]
    where = "create_env_fn[0]" if cls is Collector else "create_env_fn[0][0]"
    with pytest.raises(TypeError, match=rf"{re.escape(where)} gave .*NoSpacesEnv, which has no observation_space; "
                                        r"a gymnasium env sets self.observation_space and self.action_space"):
        cls(envs, None, frames_per_batch=10)
    assert NoSpacesEnv.closed
    assert children() == before, "a worker process was started for a collector that was refused"


def test_every_env_is_closed_when_some_close_raises_and_each_failure_is_reported(variant, tmp_path, caplog):
    # envs 0 and 2 (the first of each worker) fail to close: the envs after them, in the same
    # worker, in the env built in this process to read the spaces, in a vector env, still close
    fail = set(range(0, variant.num_envs, 2))
    envs = [functools.partial(CloseRecordEnv, str(tmp_path), k, k in fail) for k in range(variant.num_envs)]
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        collector = variant(envs, frames_per_batch=8, total_frames=16)
    with caplog.at_level(logging.ERROR, logger="aiocollect"):
        assert sum(1 for _ in collector) == 2
        collector.shutdown()
    assert os.listdir(tmp_path), "no env recorded that it was built"
    assert CloseRecordEnv.unclosed(str(tmp_path)) == []
    reports = [r.getMessage() + (r.exc_text or "") for r in caplog.records if r.levelno >= logging.ERROR]
    reports += [str(w.message) for w in warned if issubclass(w.category, RuntimeWarning)]
    text = "\n".join(reports)
    for k in fail:  # each failure is reported, with its traceback
        assert f"close of env {k} failed on purpose" in text, text
    assert "in close" in text, text
    if variant.processes:  # reported by the worker, naming it, at shutdown
        assert re.search(r"worker 0 \(pid \d+\)", text), text

"""Hostile arguments, the same in every variant: ``nan`` and ``inf`` where seconds or a
fraction are due, numpy integers where ints are, seeds gymnasium refuses, and a bad
``shutdown(timeout=...)``. Each is refused with an error naming the argument, before any
process starts (or, on a running collector, before anything is queued or stored), so the
collector goes on working and still shuts down cleanly."""

from __future__ import annotations

import numpy as np
import pytest

from aiocollect import Collector, MultiSyncCollector
from support.procs import children

NAN, INF = float("nan"), float("inf")


def _refused(variant, exc, match, **kwargs) -> None:
    """``variant(**kwargs)`` raises ``exc`` matching ``match``, and no worker process started."""
    before = children()
    with pytest.raises(exc, match=match):
        variant(frames_per_batch=40, **kwargs)
    assert children() == before, "a worker process was started for a collector that was refused"


@pytest.mark.parametrize("value", [NAN, INF], ids=["nan", "inf"])
def test_a_step_timeout_that_is_not_finite_is_refused(variant, value):
    """``nan`` passed ``value <= 0``, then a worker collector waited forever and a coroutine
    env was blamed for a timeout; for other in-process envs the knob is refused anyway."""
    if variant.processes or variant.coroutine:
        _refused(variant, ValueError, rf"^step_timeout={value}: give a positive, finite number of seconds",
                 step_timeout=value)
    else:
        _refused(variant, ValueError, "^step_timeout: these apply to coroutine envs", step_timeout=value)


def test_a_batch_timeout_that_is_nan_is_refused(variant):
    match = "batch_timeout=nan: give a positive, finite" if variant.cls is Collector and variant.coroutine \
        else "^batch_timeout: "
    _refused(variant, ValueError, match, batch_timeout=NAN)


def test_preemptive_threshold_is_refused_naming_the_class_called(variant):
    name = variant.cls.__name__
    if variant.cls is Collector:
        _refused(variant, TypeError, "preemptive_threshold", preemptive_threshold=0.5)
    elif variant.cls is MultiSyncCollector:
        _refused(variant, ValueError, r"^preemptive_threshold=nan: give the fraction", preemptive_threshold=NAN)
    else:  # MultiAsyncCollector and its one-worker AsyncCollector
        _refused(variant, ValueError, f"; a {name} never waits for a slow worker", preemptive_threshold=0.5)
        _refused(variant, ValueError, f"^interruptor: a {name} delivers", interruptor=_Interruptor())


class _Interruptor:
    def collection_stopped(self) -> bool:
        return False


def test_numpy_integers_are_taken_wherever_ints_are(variant):
    """``isinstance(x, int)`` refused ``np.int64``; every integer argument takes it now."""
    if variant.cls is Collector:
        _refused(variant, TypeError, "max_policy_lag", max_policy_lag=np.int64(2))
        return
    _refused(variant, ValueError, r"^max_policy_lag=np.int64\(-1\): give how many", max_policy_lag=np.int64(-1))
    extra = {"cat_results": np.int64(0)} if variant.cls is MultiSyncCollector else {"max_policy_lag": np.int64(2)}
    with variant(frames_per_batch=40, total_frames=40, **extra) as collector:
        assert len(list(collector)) == 1
        assert collector.options.frames_per_batch == 40


def test_a_bad_seed_is_refused_before_any_seed_is_queued(variant):
    """``set_seed(-5)`` used to raise gymnasium's error and leave the seeds queued (the next
    batch then failed with ``EnvError``); ``2**64`` gave a raw ``OverflowError``."""
    with variant(frames_per_batch=40, total_frames=-1) as collector:
        batches = iter(collector)
        next(batches)
        for seed, exc in ((-5, ValueError), (2**64, ValueError), (np.int64(-1), ValueError), (3.0, TypeError)):
            with pytest.raises(exc, match=r"^seed"):
                collector.set_seed(seed)
        next(batches)  # nothing was queued: the envs step on
        chained = collector.set_seed(np.int64(3))
        assert chained == 3 + variant.num_envs and type(chained) is int
        next(batches)


BAD_TIMEOUTS = [("x", TypeError), (NAN, ValueError), (INF, ValueError), (10**30, ValueError), (-1, ValueError)]


@pytest.mark.parametrize("method", ["shutdown", "async_shutdown"])
def test_a_bad_shutdown_timeout_changes_nothing(variant, method):
    """A bad ``timeout`` was stored (then every later ``shutdown()`` failed) or overflowed;
    now it is refused first, and the collector still collects and shuts down."""
    before = children()
    collector = variant(frames_per_batch=40, total_frames=-1)
    batches = iter(collector)
    next(batches)
    for timeout, exc in BAD_TIMEOUTS:
        with pytest.raises(exc, match=r"^timeout"):
            getattr(collector, method)(timeout=timeout)
    next(batches)
    collector.shutdown()
    assert children() == before, "a worker process outlived shutdown()"

"""Fixtures every test folder may use; shared helpers live in ``tests/support/``."""

from __future__ import annotations

import gc
import threading

import pytest

from support.procs import leftovers, snapshot, wait_until


@pytest.fixture
def no_thread_leak():
    """Fails the test if an aiocollect loop thread outlives it."""
    yield
    for _ in range(100):
        alive = [t for t in threading.enumerate() if t.name.startswith("aiocollect")]
        if not alive:
            return
        threading.Event().wait(0.02)
    raise AssertionError(f"threads left behind: {alive}")


@pytest.fixture(params=["spin", "sleep"])
def spin_mode(request, monkeypatch):
    """Run a worker test both ways the engine and its workers wait for each other:
    spinning on shared memory, and sleeping on the socket (see aiocollect._workers.protocol)."""
    monkeypatch.setenv("AIOCOLLECT_SPIN", "1" if request.param == "spin" else "0")
    return request.param


@pytest.fixture
def leak_check():
    """Nothing a collector created outlives the test: no worker process, no aiocollect thread,
    no shared-memory fd or socket (``support.procs.leftovers``). Only this process and its
    children are looked at, never all of /dev/shm, so other programs cannot fail a test.
    ``contract/`` and ``variants/`` use it for every test."""
    before = snapshot()
    yield
    gc.collect()
    assert wait_until(lambda: not leftovers(before)), f"left behind: {leftovers(before)}"


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray instance for the module's tests (2 CPUs, no dashboard), stopped after them."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False)
    yield ray
    ray.shutdown()

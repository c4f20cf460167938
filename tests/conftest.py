"""Fixtures every test folder may use; shared helpers live in ``tests/support/``."""

from __future__ import annotations

import gc
import threading

import pytest

from support.procs import leftovers, snapshot, wait_until


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Keeps ``--dist loadgroup`` grouping (scripts/test.sh): pytest-xdist sends the tests of one
    ``xdist_group`` to one worker by suffixing their node ids with ``@group`` in each worker, and
    on pytest 9.2 its suffix no longer takes (pytest 9.2 keeps a structured id; pytest-xdist
    issue 1386): every Ray test then ran beside another, two Ray instances on the 2 cores. This
    writes the same suffix where xdist's did not; where it did, it does nothing."""
    if not getattr(config.option, "loadgroup", False):  # set in the workers of --dist loadgroup
        return
    for item in items:
        groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                         for m in item.iter_markers("xdist_group")})
        suffix = "@" + "_".join(groups)
        if groups and not item.nodeid.endswith(suffix):
            from _pytest.nodeid import NodeId  # (pytest >= 9.2, where xdist's suffix does not take)

            item._id = NodeId.parse(item.nodeid + suffix)


def pytest_collection_finish(session):
    """``leak_check`` runs ``gc.collect()`` after each of some 700 tests, and a full collection
    walks every object of the process: with torch, tensordict, JAX and TorchRL imported by the
    test modules, 0.2 s a test. Once the tests are collected, ``gc.freeze()`` sets the objects
    that exist then (modules, classes, the collected tests) aside for good, and a collection
    walks only what was made since: what the tests made, collectors and their cycles included."""
    gc.freeze()


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

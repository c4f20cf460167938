"""Fixtures every test folder may use; shared helpers live in ``tests/support/``."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import threading
from pathlib import Path

import pytest

from support import ray_instance
from support.procs import leftovers, snapshot, wait_until

if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    # A suite started in the background by a non-interactive shell (`bash .ci/run > log &`,
    # nohup) starts with Ctrl-C ignored, which Python keeps and every subprocess inherits: the
    # tests that send a collect Ctrl-C (in-process and to a subprocess) then wait for a
    # KeyboardInterrupt that never comes. The tests are about Ctrl-C reaching a collect, so
    # they restore Python's own handler (a subprocess then starts with the default action).
    signal.signal(signal.SIGINT, signal.default_int_handler)


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
    walks only what was made since: what the tests made, collectors and their cycles included.

    It also opens, before any test looks, the one pipe libuv keeps for the whole process
    (its signal lock, made with the first uvloop loop, never closed): ``leak_check`` counts
    pipes, and that one is no collector's. Likewise multiprocessing's resource tracker (a
    process and the pipe to it, kept for the process's life), which the first TorchRL replay
    buffer of a test process starts (its storage's ``multiprocessing.Value``s)."""
    _open_libuvs_own_pipe()
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    if _TORCHRL_FORKSERVER:
        from multiprocessing import forkserver

        forkserver.ensure_running()
    gc.freeze()


def _torchrls_workers_from_a_forkserver() -> bool:
    """TorchRL's collectors start their workers with ``multiprocessing``'s ``spawn`` (``import
    torchrl`` sets it, unless a start method is set already): a fresh interpreter per worker,
    3 s of CPU importing torch and TorchRL, 116 of the suite's some 1,600 core-seconds. Here the
    test processes set ``forkserver`` before the test modules import TorchRL, with those modules
    preloaded, as a TorchRL user may (TorchRL takes the start method it finds): each worker is
    then a fork of a server that imported them once. The server is started with the session
    (``pytest_collection_finish``), before any leak check's snapshot, as the resource tracker
    is. (The users' programs the tests run, ``artifacts/`` and ``torchrl_corpus/``, are
    subprocesses with TorchRL's own default.)"""
    import importlib.util
    import multiprocessing

    if importlib.util.find_spec("torchrl") is None or multiprocessing.get_start_method(allow_none=True):
        return False
    multiprocessing.set_start_method("forkserver")
    multiprocessing.set_forkserver_preload(["torch", "tensordict", "gymnasium", "torchrl.collectors", "torchrl.envs"])
    return True


_TORCHRL_FORKSERVER = _torchrls_workers_from_a_forkserver()


def _open_libuvs_own_pipe() -> None:
    try:
        import uvloop
    except ImportError:  # (no uvloop: asyncio's loop, no such pipe)
        return
    loop = uvloop.new_event_loop()
    try:
        loop.run_until_complete(asyncio.sleep(0))
        loop.add_signal_handler(signal.SIGUSR2, lambda: None)  # (libuv's signal lock: made here)
        loop.remove_signal_handler(signal.SIGUSR2)
    finally:
        loop.close()


def pytest_sessionfinish(session):
    """Stops this test process's warm launcher (``_warm_start``), if one runs: it would
    otherwise exit only with the process, and its workers' CPU time would not be counted."""
    from aiocollect._workers import launcher

    launcher.shutdown()


PLACEMENT = "AIOCOLLECT_POLICY_IN_WORKERS"
_PLACED_OUTSIDE = PLACEMENT in os.environ
"""The run was started with a placement of its own (``AIOCOLLECT_POLICY_IN_WORKERS=1 pytest``:
every test that does not choose its own runs the policy in the workers); then nothing pins it."""
_USERS_PROGRAMS = ("artifacts", "torchrl_corpus", "gpu")
_TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _policy_placement(request, monkeypatch):
    """Where a torch policy runs (``_policies.actor``) is chosen from the machine's cores
    and, with cores to spare, from the policy's measured cost. A test that does not choose gets the main process
    everywhere, so that a run tests the same paths on any machine; the policy in the workers
    has its own contract file (``contract/test_policy_in_workers.py``, each case in both
    places), the ``MultiAsync-process`` variant takes it for the whole contract suite
    (``support/variants.py``: a test over the variants gets its variant's placement for the
    collectors the variant builds, and the machine's for any other), and a test that wants
    it sets it. A worker with the policy
    imports torch: 2 s more for each collector built here, 40% of ``variants/``'s time.
    The users' programs (the docs, examples, notebooks, the TorchRL corpus, the GPU pages)
    keep the machine's choice, as a user gets it; so does a run started with a placement."""
    if _PLACED_OUTSIDE or "variant" in request.fixturenames:
        return
    if request.node.path.resolve().relative_to(_TESTS).parts[0] in _USERS_PROGRAMS:
        return
    monkeypatch.setenv(PLACEMENT, "0")


WARM_START = "AIOCOLLECT_WARM_START"
_WARM_OUTSIDE = WARM_START in os.environ


@pytest.fixture(autouse=True)
def _warm_start(request, monkeypatch):
    """Worker processes start from the warm launcher (``aiocollect._workers.launcher``): forked
    from an interpreter that imported the worker, and torch for the workers with a copy of the
    policy, once per test process, instead of a fresh interpreter per worker (0.15 s of CPU each,
    1.5 s with torch: most of what ``contract/`` and ``variants/`` spent). The fresh start,
    which users get by default, stays under test: the contract's ``MultiSync-process`` variant,
    every test marked ``cold_start`` (where the start-up itself is what it is about), and the
    users' programs (``artifacts/``, ``torchrl_corpus/``, ``gpu/``: subprocesses that do not
    inherit the switch), and a run started with ``AIOCOLLECT_WARM_START`` set is left as it is.
    The launcher is started here, before ``leak_check`` takes its snapshot: its process and
    socket are the test process's, not the test's (``support.procs.children`` counts the workers
    it forked)."""
    if _WARM_OUTSIDE:
        from aiocollect._workers import launcher

        if launcher.enabled():  # (a run started with the switch on: the launcher is the test
            launcher.launcher()  # process's, started before the leak check's snapshot as below)
        return
    if request.node.get_closest_marker("cold_start"):
        return
    if request.node.path.resolve().relative_to(_TESTS).parts[0] in _USERS_PROGRAMS:
        return
    if "variant" in request.fixturenames and not getattr(request.getfixturevalue("variant"), "warm", True):
        return  # (the contract's variants; ``variant`` is a plain parameter in some files)
    from aiocollect._workers import launcher

    launcher.launcher()
    monkeypatch.setenv(WARM_START, "1")


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


@pytest.fixture(params=["fresh", "warm"])
def worker_start(request, monkeypatch):
    """Run a test both ways worker processes start: as fresh interpreters (the default), and
    forked from the warm launcher (``AIOCOLLECT_WARM_START=1``, which a script run by the test
    inherits), for what the start or the death of the main process must keep either way."""
    monkeypatch.setenv(WARM_START, "1" if request.param == "warm" else "0")
    return request.param


@pytest.fixture
def leak_check(_warm_start):
    """Nothing a collector created outlives the test: no worker process, no aiocollect thread,
    no shared-memory fd or socket (``support.procs.leftovers``). Only this process and its
    children are looked at, never all of /dev/shm, so other programs cannot fail a test.
    ``contract/`` and ``variants/`` use it for every test."""
    before = snapshot()
    yield
    gc.collect()
    assert wait_until(lambda: not leftovers(before)), f"left behind: {leftovers(before)}"


@pytest.fixture(scope="session")
def zygote():
    """This test process's warm interpreter (``support.zygote``), started before the test (and
    so before its leak check's snapshot: its socket and process are not the test's)."""
    from support import zygote as warm

    return warm.zygote()


@pytest.fixture(scope="session")
def _ray_session():
    """Stops the shared Ray instance at the end of the session if it is still up."""
    yield
    ray_instance.stop()


@pytest.fixture
def ray_cluster(request, _ray_session):
    """A local Ray instance (2 CPUs, no dashboard), shared by the tests that take it while they
    run one after the other, across modules, and stopped after the last of them
    (``support.ray_instance``)."""
    ray = pytest.importorskip("ray")
    ray_instance.ensure_up(ray)
    yield ray
    if not ray_instance.needed_after(request.node):
        ray_instance.stop()


@pytest.fixture
def no_ray_instance():
    """For the tests about the instance ``RayCollector`` starts itself: ``ray_cluster``'s
    shared instance, if still up, is stopped first (any other is left for the test to find)."""
    pytest.importorskip("ray")
    ray_instance.stop(only_shared=True)


@pytest.fixture(scope="session")
def trained_ppo_cartpole(tmp_path_factory):
    """``examples/ppo_cartpole.py --frames 6144 --save trained.pt2``, run once for the tests that
    train it (``test_examples``: its output; ``test_cli_policy``: the console script evaluates
    the saved actor): ``(the finished process, the saved path)``. Their tests share the
    ``xdist_group`` "ppo-cartpole", so that under ``--dist loadgroup`` one worker trains it."""
    import subprocess
    import sys
    from pathlib import Path

    path = tmp_path_factory.mktemp("ppo_cartpole") / "trained.pt2"
    example = Path(__file__).resolve().parents[1] / "examples" / "ppo_cartpole.py"
    proc = subprocess.run([sys.executable, str(example), "--frames", "6144", "--save", str(path)],
                          capture_output=True, text=True, timeout=180)
    return proc, path

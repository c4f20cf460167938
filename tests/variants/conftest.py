"""Fixtures of the per-variant tests: the same leak check as the contract suite's.

After every test nothing a collector created may be left: no worker process, no aiocollect
thread, no shared-memory fd or socket of this process (``support.procs.leftovers``). Only
this process and its children are looked at, never all of /dev/shm.
"""

from __future__ import annotations

import gc

import pytest

from support.procs import leftovers, snapshot, wait_until


@pytest.fixture(autouse=True)
def leak_check():
    """Nothing a collector created outlives the test (checked on this process and its children)."""
    before = snapshot()
    yield
    gc.collect()
    assert wait_until(lambda: not leftovers(before)), f"left behind: {leftovers(before)}"

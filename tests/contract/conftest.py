"""The contract suite's fixtures: ``variant`` (every local collector variant) and the leak check.

Every test here takes ``variant`` and so runs once per variant of ``support.variants``;
a case a variant does not support asserts the error it gives instead of being skipped.
After every test nothing may be left: no worker process, no aiocollect thread, no
shared-memory fd or socket of this process (``support.procs.leftovers``).
"""

from __future__ import annotations

import gc

import pytest

from support.procs import leftovers, snapshot, wait_until
from support.variants import VARIANTS


@pytest.fixture(params=VARIANTS, ids=[v.name for v in VARIANTS])
def variant(request):
    return request.param


@pytest.fixture(autouse=True)
def leak_check():
    """Nothing a collector created outlives the test (checked on this process and its children)."""
    before = snapshot()
    yield
    gc.collect()
    assert wait_until(lambda: not leftovers(before)), f"left behind: {leftovers(before)}"

"""The contract suite's fixtures: ``variant`` (every local collector variant) and the leak check.

Every test here takes ``variant`` and so runs once per variant of ``support.variants``;
a case a variant does not support asserts the error it gives instead of being skipped.
After every test nothing may be left: no worker process, no aiocollect thread, no
shared-memory fd or socket of this process (``support.procs.leftovers``).
"""

from __future__ import annotations

import pytest

from support.variants import VARIANTS


@pytest.fixture(params=VARIANTS, ids=[v.name for v in VARIANTS])
def variant(request):
    return request.param


@pytest.fixture(autouse=True)
def _no_leaks(leak_check):
    """``tests/conftest.py``'s ``leak_check`` for every contract test (``test_distributed.py``
    overrides it for the sockets its Ray cluster keeps)."""

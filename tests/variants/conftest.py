"""Every per-variant test runs under the leak check of ``tests/conftest.py``, as the contract's do."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_leaks(leak_check):
    """``leak_check`` for every test of this folder."""

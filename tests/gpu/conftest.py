"""The GPU tests run where CUDA is: elsewhere (CI) every test here is skipped, with the reason
in the run's summary. ``bash scripts/gpu_tests.sh run`` runs them on a CUDA machine."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

REASON = ("no CUDA device here (torch.cuda.is_available() is False): "
          "run `bash scripts/gpu_tests.sh run` on a GPU machine")


HERE = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    for item in items:  # (every item of the session: keep this folder's)
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(pytest.mark.skip(reason=REASON))


@pytest.fixture(autouse=True)
def _no_leaks(leak_check):
    """Nothing left behind, as in the contract suite (``tests/conftest.py``)."""

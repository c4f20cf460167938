"""The GPU tests run where CUDA is: elsewhere (CI) every test here is skipped, with the reason
in the run's summary. ``bash scripts/gpu_tests.sh run`` runs them on a CUDA machine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from support.variants import VARIANTS

# JAX takes 75% of the GPU's memory at its first use unless told not to; torch shares the GPU here
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

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


@pytest.fixture(params=VARIANTS, ids=[v.name for v in VARIANTS])
def variant(request):
    """Each local collector variant (``support.variants``)."""
    return request.param

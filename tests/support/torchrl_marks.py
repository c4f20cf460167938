"""The warnings TorchRL and tensordict give about their own deprecations and defaults, kept
out of the test report of every module that drives TorchRL (``pytestmark = QUIET_TORCHRL``)."""

from __future__ import annotations

import pytest

QUIET_TORCHRL = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning:torchrl.*"),
    pytest.mark.filterwarnings("ignore::UserWarning:tensordict.*"),
]

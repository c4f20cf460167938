"""The examples of ``docs/gpu.md`` (fenced ``py``: the CPU-only docs run skips them) run as a
newcomer would run them, each in a fresh interpreter."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "gpu.md"
BLOCKS = re.findall(r"^```py\n(.*?)^```", PAGE.read_text(), re.S | re.M)


def test_the_page_has_examples():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_an_example_of_the_gpu_page_runs(code, tmp_path):
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
    assert proc.returncode == 0, proc.stderr[-4000:]

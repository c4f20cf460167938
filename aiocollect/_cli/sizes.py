"""Sizes that must fit, checked as Python ints before anything starts: a typo of a few zeros
must not start workers that then fail to allocate, or fill the disk (a memory-mapped file that
cannot grow kills the process). A batch must fit three times in the memory available (the
collector holds about three), and the whole save on the disk of ``--out``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .errors import UsageError


def readable_size(nbytes: float) -> str:
    """``nbytes`` in bytes, kB, MB, GB, TB or PB (powers of 1000), e.g. ``1.5 GB``."""
    for unit in ("bytes", "kB", "MB", "GB", "TB", "PB"):
        if nbytes < 1000 or unit == "PB":
            return f"{nbytes:,.0f} {unit}" if unit == "bytes" else f"{nbytes:,.1f} {unit}"
        nbytes /= 1000
    raise AssertionError  # unreachable


def free_disk(path: Path) -> int:
    """Free bytes on the disk that holds ``path`` (or would: its nearest existing ancestor)."""
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def batch_too_big(flag: str, frames: int, frame_bytes: int, memory: int, fix: str) -> UsageError:
    """The error for batches of ``frames`` that do not fit three times in ``memory``."""
    return UsageError(f"{flag}: a batch of {frames:,} frames takes {readable_size(frames * frame_bytes)} "
                      f"({frame_bytes} bytes a frame) and the collector holds about three, with "
                      f"{readable_size(memory)} of memory available; {fix}")

"""Run the programs of docs/training.md in full and store the learning curves they draw.

    .venv/bin/python scripts/draw_training_curves.py         # both: a few minutes on 2 cores
    .venv/bin/python scripts/draw_training_curves.py jax     # the programs whose name has "jax"

A program of the page is a ```py block whose first line is ``# NAME.py: what it does``. Each
runs as it is, in a temporary directory, with this interpreter (so, with the ``dev`` extra);
the PNG it saves goes to ``docs/assets/training/``, and its last printed line is shown, to
check the page's words against. ``tests/artifacts/test_docs.py`` runs the same programs with
``TOTAL_FRAMES`` cut to a few batches (``run(..., total_frames=...)``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "training.md"
FIGURES = ROOT / "docs" / "assets" / "training"
PROGRAM = re.compile(r"^```py\n(# (\w+)\.py: .*?)^```", re.S | re.M)


def programs() -> dict[str, str]:
    """The page's programs, by name."""
    return {name: code for code, name in PROGRAM.findall(PAGE.read_text())}


def run(code: str, cwd: Path, total_frames: int | None = None, timeout: float | None = None):
    """Run one program in ``cwd``; with ``total_frames``, its ``TOTAL_FRAMES`` is that."""
    if total_frames is not None:
        code, n = re.subn(r"^TOTAL_FRAMES = [\d_]+$", f"TOTAL_FRAMES = {total_frames}", code, flags=re.M)
        assert n == 1, "a program of the page sets TOTAL_FRAMES once, on a line of its own"
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def main(argv: list[str]) -> int:
    FIGURES.mkdir(parents=True, exist_ok=True)
    for name, code in programs().items():
        if argv and not any(word in name for word in argv):
            continue
        print(f"running {name} ...", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            proc = run(code, Path(tmp))
            if proc.returncode != 0:
                print(proc.stderr[-3000:], file=sys.stderr)
                return 1
            pngs = sorted(Path(tmp).glob("*.png"))
            for png in pngs:
                shutil.copy(png, FIGURES / png.name)
                print(f"  {FIGURES.relative_to(ROOT) / png.name}, {png.stat().st_size / 1024:.0f} KiB")
        print(f"  last line: {proc.stdout.strip().splitlines()[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

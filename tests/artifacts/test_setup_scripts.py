"""``scripts/setup.sh`` and ``scripts/demo.sh``, run in a copy of the checkout over a stub
``.venv`` whose ``python`` and ``aiocollect`` only log their arguments: each step says what it
does, pip shows its own progress for the long installs (no ``-q``: the demo was silent for
about 105 s), the CPU-only torch index is passed on when asked, and the last lines say how to
put ``aiocollect`` on PATH."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _checkout(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of ``scripts/`` beside a stub ``.venv``, and the file its stubs log their calls to."""
    root, log = tmp_path / "checkout", tmp_path / "calls.log"
    shutil.copytree(ROOT / "scripts", root / "scripts")
    venv = root / ".venv" / "bin"
    venv.mkdir(parents=True)
    for tool in ("python", "aiocollect"):
        (venv / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> "{log}"\n')
        (venv / tool).chmod(0o755)
    return root, log


def _run(root: Path, script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "TORCH_INDEX_URL"}
    return subprocess.run(["bash", str(root / "scripts" / script), *args], capture_output=True, text=True,
                          timeout=60, env={**environ, **env, "TMPDIR": str(root)})


def test_setup_says_each_step_shows_pips_progress_and_how_to_activate(tmp_path):
    root, log = _checkout(tmp_path)
    proc = _run(root, "setup.sh", "dev,jax")
    assert proc.returncode == 0, proc.stderr
    steps = [line for line in proc.stdout.splitlines() if line.startswith("==> setup: ")]
    assert [s.split(": ", 1)[1].split()[0] for s in steps] == ["upgrading", "installing", "installing", "done."]
    assert "CUDA" in steps[1] and f"TORCH_INDEX_URL={CPU_INDEX}" in steps[1]  # (what is true, and the CPU line)
    assert "source .venv/bin/activate" in steps[-1]
    installs = [line for line in log.read_text().splitlines() if " install " in line]
    torch, project = installs[1], installs[2]
    assert "torch==2.13.0" in torch and "--index-url" not in torch and " -q " not in f"{torch} "
    assert project.endswith("-e .[dev,jax]") and " -q " not in f"{project} "


def test_setup_installs_the_cpu_build_from_the_index_it_is_given(tmp_path):
    root, log = _checkout(tmp_path)
    proc = _run(root, "setup.sh", TORCH_INDEX_URL=CPU_INDEX)
    assert proc.returncode == 0, proc.stderr
    assert f"installing torch==2.13.0 from {CPU_INDEX}" in proc.stdout
    torch = next(line for line in log.read_text().splitlines() if "torch==2.13.0" in line)
    assert torch.endswith(f"--index-url {CPU_INDEX}")


def test_the_demo_says_what_it_does_then_collects(tmp_path):
    root, log = _checkout(tmp_path)
    proc = _run(root, "demo.sh")
    assert proc.returncode == 0, proc.stderr
    demo = [line for line in proc.stdout.splitlines() if line.startswith("==> demo: ")]
    assert len(demo) == 3 and "setting up .venv" in demo[0] and "collecting 500,000 frames" in demo[1]
    assert "source .venv/bin/activate" in demo[2]
    assert proc.stdout.index("==> setup: done.") < proc.stdout.index(demo[1])
    assert log.read_text().splitlines()[-1].startswith("aiocollect collect --env CartPole-v1 --workers 2")

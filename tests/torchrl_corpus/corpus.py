"""How a corpus program is ported and run (``test_corpus.py`` uses it; so can a person:
``python tests/torchrl_corpus/corpus.py getting_started_3`` runs one program both ways).

A program is a TorchRL script as a TorchRL user writes it. **Porting changes only its
imports**: each ``from torchrl.collectors... import NAMES`` line becomes
``from aiocollect import NAMES``; nothing else in the file is touched. A program ends by
printing one line ``RESULT {json}`` with at least:

* ``"collector"``: the module of the collector class it used (so a port that still ran
  TorchRL's collector is caught);
* ``"learned"``: whether it learned, by its own criterion (``null`` for a program that does
  not train);

and any figures the criterion used, so a failure says by how much it missed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROGRAMS = HERE / "programs"

_IMPORT = re.compile(r"^(\s*)from torchrl\.collectors(?:\.utils|\.distributed)? import (.+)$")


def port(source: str) -> str:
    """``source`` with every ``from torchrl.collectors[.utils|.distributed] import X`` line
    pointed at ``aiocollect``: the only change a user makes."""
    lines = source.splitlines(keepends=True)
    out = []
    for line in lines:
        m = _IMPORT.match(line.rstrip("\n"))
        out.append(f"{m.group(1)}from aiocollect import {m.group(2)}\n" if m else line)
    return "".join(out)


@dataclass
class Run:
    returncode: int
    result: dict | None
    output: str

    def explain(self) -> str:
        return f"exit {self.returncode}; last output:\n{self.output[-4000:]}"


def run(path: Path, *, ported: bool, workdir: Path, timeout: float = 240) -> Run:
    """Run the program at ``path`` (ported or as written) in a fresh interpreter in ``workdir``."""
    source = path.read_text()
    script = workdir / (("ported_" if ported else "original_") + path.name)
    script.write_text(port(source) if ported else source)
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(script)], cwd=workdir, env=env, capture_output=True,
                          text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    result = None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
            break
    return Run(proc.returncode, result, output)


if __name__ == "__main__":  # python tests/torchrl_corpus/corpus.py NAME [NAME ...]
    import tempfile

    names = sys.argv[1:] or sorted(p.stem for p in PROGRAMS.glob("*.py"))
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            for ported in (False, True):
                r = run(PROGRAMS / f"{name}.py", ported=ported, workdir=Path(tmp))
                print(name, "ported" if ported else "original", r.returncode, r.result)
                if r.returncode:
                    print(r.output[-3000:])

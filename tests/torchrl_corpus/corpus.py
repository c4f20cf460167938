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

A program is one file (``programs/NAME.py``), or one of TorchRL's sota-implementations kept
as TorchRL ships them (``programs/sota/<folder>/``, listed in ``sota.PROGRAMS``): every
``.py`` file of its folder is ported, and ``sota.py`` launches it with hydra overrides and
prints its ``RESULT`` line from what the script logged.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import sota

HERE = Path(__file__).resolve().parent
PROGRAMS = HERE / "programs"
NAMES = sorted([p.stem for p in PROGRAMS.glob("*.py")] + list(sota.PROGRAMS))
"""Every program: the one-file ones, then the sota scripts (``sota.PROGRAMS``)."""


def sources(name: str) -> list[Path]:
    """The Python files of program ``name``: what porting changes."""
    if name in sota.PROGRAMS:
        return sorted((sota.SOTA / sota.PROGRAMS[name].folder).glob("*.py"))
    return [PROGRAMS / f"{name}.py"]

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


def run(name: str, *, ported: bool, workdir: Path, timeout: float = 240, args: tuple[str, ...] = ()) -> Run:
    """Run program ``name`` (ported or as written) in a fresh interpreter in ``workdir``;
    ``args`` go to a sota program's launcher (``--seed N``, hydra overrides)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    prefix = "ported_" if ported else "original_"
    if name in sota.PROGRAMS:
        program = sota.PROGRAMS[name]
        folder = workdir / (prefix + program.folder)
        shutil.copytree(sota.SOTA / program.folder, folder, dirs_exist_ok=True)
        if ported:
            for path in folder.glob("*.py"):
                path.write_text(port(path.read_text()))
        cwd = workdir / (prefix + name)
        cwd.mkdir(exist_ok=True)
        command = [sys.executable, str(HERE / "sota.py"), name, str(folder), *args]
    else:
        source = (PROGRAMS / f"{name}.py").read_text()
        script = workdir / (prefix + f"{name}.py")
        script.write_text(port(source) if ported else source)
        command, cwd = [sys.executable, str(script)], workdir
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    result = None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
            break
    return Run(proc.returncode, result, output)


if __name__ == "__main__":  # python tests/torchrl_corpus/corpus.py NAME [NAME ...]
    import tempfile

    names = sys.argv[1:] or NAMES
    for name in names:
        if name in sota.PROGRAMS and sota.skip_reason(sota.PROGRAMS[name]):
            print(name, "skipped:", sota.skip_reason(sota.PROGRAMS[name]))
            continue
        with tempfile.TemporaryDirectory() as tmp:
            for ported in (False, True):
                r = run(name, ported=ported, workdir=Path(tmp))
                print(name, "ported" if ported else "original", r.returncode, r.result)
                if r.returncode:
                    print(r.output[-3000:])

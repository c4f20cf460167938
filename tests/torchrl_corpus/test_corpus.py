"""TorchRL programs, run as written and with only their imports pointed at aiocollect
(``corpus.port``): the port must run, use aiocollect's collector, and learn where the
original learns. Each program is described in ``README.md``."""

from __future__ import annotations

import difflib

import pytest

from corpus import PROGRAMS, port, run

NAMES = sorted(p.stem for p in PROGRAMS.glob("*.py"))


def test_porting_changes_only_import_lines():
    for name in NAMES:
        source = (PROGRAMS / f"{name}.py").read_text()
        changed = [line for line in difflib.unified_diff(source.splitlines(), port(source).splitlines(), n=0)
                   if line[:1] in "+-" and not line.startswith(("+++", "---"))]
        assert changed, f"{name}: nothing to port (no torchrl.collectors import)"
        for line in changed:
            assert line[1:].lstrip().startswith(("from torchrl.collectors", "from aiocollect import")), (name, line)


@pytest.mark.parametrize("name", NAMES)
def test_program_runs_ported_and_learns_where_the_original_learns(name, tmp_path):
    path = PROGRAMS / f"{name}.py"
    original = run(path, ported=False, workdir=tmp_path)
    assert original.returncode == 0 and original.result, f"the original {name} failed: {original.explain()}"
    assert original.result["collector"].startswith("torchrl."), original.result
    ported = run(path, ported=True, workdir=tmp_path)
    assert ported.returncode == 0 and ported.result, f"ported {name} failed: {ported.explain()}"
    assert ported.result["collector"].startswith("aiocollect."), ported.result
    if original.result["learned"] is None:  # a program that does not train
        assert ported.result["learned"] is None
        return
    assert original.result["learned"], f"the original {name} did not learn (too short?): {original.result}"
    assert ported.result["learned"], f"{name} learned with TorchRL's collector, not with aiocollect's: " \
                                     f"original {original.result}, ported {ported.result}"

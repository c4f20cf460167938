"""TorchRL programs with only their imports pointed at aiocollect (``corpus.port``): the port
must run, use aiocollect's collector, and learn where the original learns (by the program's
criterion, calibrated on the original; ``AIOCOLLECT_CORPUS_ORIGINALS=1`` runs the originals
too). Each program is described in ``README.md``."""

from __future__ import annotations

import difflib
import hashlib
import os

import pytest
import sota

from corpus import NAMES, port, run, sources


def test_porting_changes_only_import_lines():
    for name in NAMES:
        changed = []
        for path in sources(name):
            source = path.read_text()
            changed += [line for line in difflib.unified_diff(source.splitlines(), port(source).splitlines(), n=0)
                        if line[:1] in "+-" and not line.startswith(("+++", "---"))]
        assert changed, f"{name}: nothing to port (no torchrl.collectors import)"
        for line in changed:
            assert line[1:].lstrip().startswith(("from torchrl.collectors", "from aiocollect import")), (name, line)


def test_sota_scripts_are_torchrl_s_files_unmodified():
    """Every file under programs/sota/ is the file of pytorch/rl's sota-implementations at
    ``sota.TORCHRL_COMMIT``, byte for byte (its git blob id), and nothing else is there."""
    files = sorted(p.relative_to(sota.SOTA).as_posix() for p in sota.SOTA.rglob("*") if p.is_file()
                   and "__pycache__" not in p.parts)
    assert files == sorted(sota.BLOBS)
    for rel, blob in sota.BLOBS.items():
        data = (sota.SOTA / rel).read_bytes()
        got = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git's blob id
        assert got == blob, f"programs/sota/{rel} differs from TorchRL's (blob {got}, TorchRL's {blob})"


@pytest.mark.parametrize("name", NAMES)
def test_program_runs_ported_and_learns_where_the_original_learns(name, tmp_path):
    """The port learns by the program's criterion, which was calibrated to hold for the original
    over several seeds (its docstring has the figures). The original runs too where
    ``AIOCOLLECT_CORPUS_ORIGINALS=1`` (it doubles the time, and CI's 2 cores have none to
    spare): then it must learn as well, and the port must have learned where it did."""
    if name in sota.PROGRAMS and sota.skip_reason(sota.PROGRAMS[name]):
        pytest.skip(f"{name}: {sota.skip_reason(sota.PROGRAMS[name])}")
    ported = run(name, ported=True, workdir=tmp_path)
    assert ported.returncode == 0 and ported.result, f"ported {name} failed: {ported.explain()}"
    assert ported.result["collector"].startswith("aiocollect."), ported.result
    original = None
    if os.environ.get("AIOCOLLECT_CORPUS_ORIGINALS") == "1":
        original = run(name, ported=False, workdir=tmp_path)
        assert original.returncode == 0 and original.result, f"the original {name} failed: {original.explain()}"
        assert original.result["collector"].startswith("torchrl."), original.result
        assert (original.result["learned"] is None) == (ported.result["learned"] is None)
        if original.result["learned"] is not None:
            assert original.result["learned"], f"the original {name} did not learn (too short?): {original.result}"
    if ported.result["learned"] is not None:
        assert ported.result["learned"], (f"{name} did not learn with aiocollect's collector: ported {ported.result}"
                                          + (f", original {original.result}" if original else ""))

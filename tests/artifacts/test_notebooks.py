"""The notebooks run top to bottom in a real Jupyter kernel, and the outputs stored in them (what
GitHub shows) are those of their current code: ``scripts/refresh_notebooks.py`` stores them, and
its docstring gives the rule by which a fresh run is compared with the stored one."""

from __future__ import annotations

import difflib
import importlib.util
import pprint
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

_spec = importlib.util.spec_from_file_location("refresh_notebooks", ROOT / "scripts" / "refresh_notebooks.py")
refresh = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(refresh)


def _stale(path: Path, why: str) -> str:
    return (f"{path.name}: the stored outputs are stale ({why}); refresh them with\n"
            f"    .venv/bin/python scripts/refresh_notebooks.py notebooks/{path.name}\n"
            f"and commit the notebook with its outputs")


def _outputs(nb) -> list:
    return [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_stored_outputs_come_from_the_current_code(path):
    """Without a kernel: every code cell ran, in order, and no cell changed since."""
    nb = nbformat.read(path, as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1)), \
        _stale(path, "not every cell ran, top to bottom")
    stored = nb.metadata.get("aiocollect", {}).get("source_digest")
    assert stored == refresh.source_digest(nb), _stale(path, "a code cell changed after the outputs were stored")
    # what GitHub shows: a plot, and no widget it cannot draw (progress bars are stored as text)
    outputs = _outputs(nb)
    assert [o for o in outputs if "image/png" in o.get("data", {})], f"{path.name} shows no plot"
    assert not [o for o in outputs if refresh.WIDGET_VIEW in o.get("data", {})], _stale(path, "a widget is stored")
    assert "widgets" not in nb.metadata, _stale(path, "widget state is stored")
    assert path.stat().st_size < 150_000, f"{path.name} is {path.stat().st_size:,} bytes: keep its figures small"


def test_the_quickstart_shows_a_progress_bar_and_the_return_rising():
    nb = nbformat.read(ROOT / "notebooks" / "quickstart.ipynb", as_version=4)
    texts = [o.get("data", {}).get("text/plain", "") for o in _outputs(nb)]
    bars = [t for t in texts if t.startswith("Collector: 100%|██████████|") and "episode_return=" in t]
    assert bars, texts


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_in_a_kernel_and_gives_its_stored_outputs(path):
    fresh = refresh.execute(path)  # raises on a cell's error
    outputs = "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in _outputs(fresh))
    assert "frames/s" in outputs
    assert not [o for o in _outputs(fresh) if o.get("output_type") == "error"]
    expected = refresh.outline(nbformat.read(path, as_version=4))
    got = refresh.outline(fresh)
    if got != expected:
        diff = "\n".join(difflib.unified_diff(pprint.pformat(expected, width=110).splitlines(),
                                              pprint.pformat(got, width=110).splitlines(),
                                              "stored", "fresh run", lineterm=""))
        pytest.fail(_stale(path, "a fresh run's outputs differ, numbers masked") + "\n" + diff)


@pytest.mark.timeout(120)
def test_a_for_in_a_cell_does_not_warn_and_one_in_an_async_def_does(tmp_path):
    """In a real kernel, a plain ``for`` in a cell is the sync face's intended use (the kernel
    runs the cell inside a task of its loop, yet the cell is no ``async def``): no warning. The
    same ``for`` inside an ``async def`` awaited in a cell blocks the kernel's loop: it warns,
    naming ``async for`` (issue 52, item 7)."""
    from nbclient import NotebookClient

    cells = [
        "import warnings\nwarnings.simplefilter('always')\nimport gymnasium as gym\nfrom aiocollect import Collector\n"
        "c = Collector([lambda: gym.make('CartPole-v1')] * 2, None, frames_per_batch=20, total_frames=-1)",
        "for batch in c:\n    break\nprint('cell', batch.numel())",
        "async def main():\n    for batch in c:\n        return batch.numel()\n\nprint('async def', await main())",
        "c.shutdown()",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code) for code in cells])
    NotebookClient(nb, timeout=60, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()

    def streams(cell, name):
        return "".join(o.get("text", "") for o in cell.outputs if o.get("name") == name)

    plain, in_async_def = nb.cells[1], nb.cells[2]
    assert streams(plain, "stdout") == "cell 20\n" and "RuntimeWarning" not in streams(plain, "stderr")
    assert streams(in_async_def, "stdout") == "async def 20\n"
    warned = streams(in_async_def, "stderr")
    assert "RuntimeWarning: `for batch in collector` in the async function main() blocks" in warned, warned
    assert "Use `async for batch in collector` there" in warned

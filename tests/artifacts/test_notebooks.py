"""The notebooks run top to bottom in a real Jupyter kernel."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_in_a_kernel(path):
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    outputs = "".join(
        o.get("text", "") for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])
    )
    assert "frames/s" in outputs
    assert not [o for cell in nb.cells for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    if path.name != "quickstart.ipynb":  # the others show a plot where a person would rather look
        images = [o for cell in nb.cells for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
        assert images, f"{path.name} shows no plot"

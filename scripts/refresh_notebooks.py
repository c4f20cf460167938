"""Run the notebooks in a Jupyter kernel and store their outputs, as GitHub will show them.

    .venv/bin/python scripts/refresh_notebooks.py                               # every notebook
    .venv/bin/python scripts/refresh_notebooks.py notebooks/quickstart.ipynb    # some

Run it after changing a notebook, and commit the notebook with its outputs. Each notebook runs
top to bottom in a fresh ``python3`` kernel of this interpreter (so, with the ``dev`` extra), in
``notebooks/``, as ``tests/artifacts/test_notebooks.py`` runs it. What is stored, so that the
file stays small and reads the same on GitHub, in Jupyter and in a diff:

* a tqdm progress bar (a widget in Jupyter) becomes the text of its final state, the line the
  bar showed when it closed (``Collector: 100%|██████████| 64.0k/64.0k [00:07<00:00, ...]``):
  GitHub draws no widget, and a widget without its kernel shows an error in Jupyter; the widget
  state is not kept;
* text written with carriage returns keeps what a terminal would show (the last rewrite of
  each line), without colour codes (a log line's ANSI escapes), and consecutive writes to one
  stream are joined into one output;
* no execution timestamps;
* ``metadata.aiocollect.source_digest``: a digest of the code cells' sources, so that a
  notebook edited after its outputs were stored is found stale without running it.

Freshness, as the test checks it: the stored digest must match the code, and a fresh run must
give the same *outline* (``outline()``): the same code cells with outputs, each output of the
same type (stream name; display_data or execute_result with the same MIME types, an image for
an image) and the same text, line for line, once every number is masked. The mask
(``VOLATILE_NUMBER``) replaces each number, with its thousands separators, decimals, exponent
and an SI suffix (``8.66k``), by ``#``, and makes each run of spaces one (a column's padding
follows its numbers' widths): throughput, timings, returns and counts differ from run to run,
while headers, keys, dtypes, the number of values on each line and the lines themselves do not.
Images are compared by type only.
"""

from __future__ import annotations

import hashlib
import html
import re
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
REFRESH = "python scripts/refresh_notebooks.py"
TIMEOUT = 240  # seconds per cell

VOLATILE_NUMBER = re.compile(r"[-+]?\d(?:[\d_]|,(?=\d))*(?:\.\d+)?(?:[eE][-+]?\d+)?[kMGTP]?")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def source_digest(nb: nbformat.NotebookNode) -> str:
    """sha256 of the code cells' sources, in order."""
    digest = hashlib.sha256()
    for cell in nb.cells:
        if cell.cell_type == "code":
            digest.update(cell.source.encode() + b"\0")
    return digest.hexdigest()


def execute(path: Path) -> nbformat.NotebookNode:
    """``path`` run top to bottom in a fresh kernel, its outputs normalised (not written)."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
            cell.metadata.pop("execution", None)
    client = NotebookClient(nb, timeout=TIMEOUT, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    return normalise(nb)


def normalise(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Widgets to text, streams joined and carriage returns resolved, the digest stamped."""
    state = nb.metadata.pop("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        outputs = []
        for out in cell.outputs:
            if out.output_type in ("display_data", "execute_result") and WIDGET_VIEW in out.data:
                model = out.data.pop(WIDGET_VIEW)["model_id"]
                out.data["text/plain"] = _bar_text(state, model) or out.data.get("text/plain", "")
            previous = outputs[-1] if outputs else None
            if out.output_type == "stream" and previous and previous.output_type == "stream" \
                    and previous.name == out.name:
                previous.text += out.text
                continue
            outputs.append(out)
        for out in outputs:
            if out.output_type == "stream":
                out.text = _resolve_carriage_returns(out.text)
        cell.outputs = outputs
    nb.metadata["aiocollect"] = {"source_digest": source_digest(nb), "refresh": REFRESH}
    return nb


def _bar_text(state: dict, model_id: str) -> str | None:
    """The final line of the tqdm notebook bar whose container is ``model_id``, as text."""
    box = state.get(model_id, {}).get("state", {})
    children = [state.get(ref.removeprefix("IPY_MODEL_"), {}).get("state", {}) for ref in box.get("children", [])]
    if len(children) != 3 or "value" not in children[1]:
        return None
    left, bar, right = children

    def text(widget: dict) -> str:
        return html.unescape(widget.get("value", "")).replace("\u2007", " ")

    if not bar.get("max"):  # no total: tqdm shows no bar
        return f"{text(left)}{text(right)}".strip()
    frac = min(max(bar["value"] / bar["max"], 0.0), 1.0)
    full, part = divmod(int(frac * 10 * 8), 8)
    cells = "█" * full + (" ▏▎▍▌▋▊▉"[part] if full < 10 else "")
    return f"{text(left)}|{cells.ljust(10)}|{text(right)}"


ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _resolve_carriage_returns(text: str) -> str:
    text = ANSI_ESCAPE.sub("", text)
    return "\n".join(line.rstrip("\r").rsplit("\r", 1)[-1] for line in text.split("\n"))


def mask(text: str) -> list[str]:
    """``text``'s lines with every number replaced by ``#``, and each run of spaces made one
    (the padding of a column follows the width of its numbers)."""
    return [" ".join(VOLATILE_NUMBER.sub("#", line).split()) for line in text.rstrip("\n").split("\n")]


def outline(nb: nbformat.NotebookNode) -> list[tuple]:
    """What a fresh run must reproduce: per code cell with outputs, its index and each output's
    kind (stream name, or output type and MIME types) and masked text."""
    cells = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or not cell.outputs:
            continue
        outputs = []
        for out in cell.outputs:
            if out.output_type == "stream":
                outputs.append(("stream", out.name, mask(out.text)))
            elif out.output_type == "error":
                outputs.append(("error", out.ename, []))
            else:
                outputs.append((out.output_type, tuple(sorted(out.data)), mask(out.data.get("text/plain", ""))))
        cells.append((index, outputs))
    return cells


def main(argv: list[str]) -> int:
    paths = [Path(p).resolve() for p in argv] or sorted(NOTEBOOKS.glob("*.ipynb"))
    for path in paths:
        print(f"running {path.relative_to(ROOT)} ...", flush=True)
        nb = execute(path)  # a cell that raises stops here, and nothing is written
        nbformat.write(nb, path)
        print(f"  stored, {path.stat().st_size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

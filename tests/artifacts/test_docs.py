"""The docs site builds in strict mode and documents the whole public API, and the examples of
the docs and the README run as a newcomer would run them: block after block, each in a fresh
namespace, shell blocks in a shell, in an empty directory."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from html.parser import HTMLParser
from pathlib import Path

import pytest

import aiocollect

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

# Every ```python block of the docs and the README is a complete program, run in page order;
# fragments are fenced ```py instead. Bash blocks run only on these pages (the README's and
# jax.md's set up a virtualenv or install packages).
PAGES = ["../README.md", *sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")
                                 if re.search(r"^```python\n", p.read_text(), re.M))]
RUN_SHELL = {"quickstart.md", "cli.md"}

RUNNER = textwrap.dedent("""
    import re, subprocess, sys
    text = open(sys.argv[1]).read()
    for i, (lang, code) in enumerate(re.findall(r"^```(python|bash)\\n(.*?)^```", text, re.S | re.M)):
        print(f"--- block {i} ({lang})", flush=True)
        if lang == "bash" and sys.argv[2] == "True":
            subprocess.run(["bash", "-euc", code], check=True)
        elif lang == "python":
            exec(compile(code, f"{sys.argv[1]}, block {i}", "exec"), {"__name__": "__main__"})
""")


class _Anchors(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids: set[str] = set()
        self.images: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        if tag == "img":
            self.images.append(attrs["src"])


def _parse(path: Path) -> _Anchors:
    parser = _Anchors()
    parser.feed(path.read_text())
    return parser


# the tests that read the built site run on one worker, which builds it once (scripts/test.sh runs pytest -n 2)
ON_THE_SITE = pytest.mark.xdist_group("mkdocs-site")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


@ON_THE_SITE
def test_the_api_reference_documents_every_public_name(site):
    ids: set[str] = set()
    for page in (site / "api").rglob("index.html"):
        ids |= _parse(page).ids
    expected = {f"aiocollect.{name}" for name in aiocollect.__all__
                if name not in {"SyncDataCollector", "MultiSyncDataCollector", "MultiaSyncDataCollector",
                                "aSyncDataCollector", "BaseCollector"}}  # plain aliases of the new names
    expected |= {"aiocollect.jax.JaxPolicy", "aiocollect.jax.to_jax", "aiocollect.jax.from_jax",
                 "aiocollect.DataCollectorBase.update_policy_weights_", "aiocollect.DataCollectorBase.shutdown",
                 "aiocollect.CollectorOptions.frames_per_batch"}
    assert expected <= ids, sorted(expected - ids)


@ON_THE_SITE
def test_every_collector_variant_has_a_page_saying_when_to_use_it(site):
    for name in ("collector", "multi_sync", "multi_async", "async_collector", "ray", "rpc"):
        text = (DOCS / "collectors" / f"{name}.md").read_text()
        assert "**Use it when**" in text and "**Prefer**" in text, name
        assert (site / "collectors" / name / "index.html").exists()


@ON_THE_SITE
def test_the_benchmarks_page_shows_the_chart_the_benchmark_script_drew(site):
    images = _parse(site / "benchmarks" / "index.html").images
    charts = [src for src in images if src.endswith("benchmarks.png")]
    assert len(charts) == 1, images
    png = (site / "benchmarks" / charts[0]).resolve()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the chart is drawn from the JSON kept beside it: the engine benchmark's, the page's table
    assert {p.name for p in png.parent.glob("*.json")} == {"engine.json"}
    assert "footnote" in (site / "benchmarks" / "index.html").read_text()  # (the notes, as footnotes)


def _chart_module():
    spec = importlib.util.spec_from_file_location("bench_chart", ROOT / "benchmarks" / "chart.py")
    chart = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = chart  # (dataclasses look their module up there)
    spec.loader.exec_module(chart)
    return chart


def test_the_benchmarks_page_has_one_current_table_and_the_chart_draws_it():
    """docs/benchmarks.md's table and its chart show the same run: every best and median of the
    table is in ``engine.json`` (the file ``benchmarks/chart.py`` draws the chart from), row for
    row, and the chart's bars and limit lines are exactly those figures; the page names the
    run's date, which the file records."""
    import json
    import statistics

    page = (DOCS / "benchmarks.md").read_text()
    engine = json.loads((DOCS / "assets" / "benchmarks" / "engine.json").read_text())
    rows = re.findall(r"^\| [^|]+ \| ([\d,]+) \(([\d,]+)\) \|", page, re.M)
    table = sorted((int(best.replace(",", "")), int(median.replace(",", ""))) for best, median in rows)
    measured = sorted((r["best"], round(statistics.median(r["runs"]))) for r in engine["results"])
    assert len(table) == 18 and table == measured
    date, hour = engine["date"].split()
    assert f"**{date}, {hour}**" in page and "## The current figures" in page
    panels = _chart_module().panels_from(DOCS / "assets" / "benchmarks")
    drawn = sorted([bar.fps for panel in panels for bar in panel.bars] + [panel.bound for panel in panels])
    assert drawn == sorted(best for best, _ in table)


@ON_THE_SITE
def test_the_guide_draws_the_data_flow_and_the_weights_path(site):
    """The diagrams are mermaid blocks, drawn by mkdocs-material in the browser (mkdocs.yml's
    superfences custom fence): the built pages carry them as ``<pre class="mermaid">``."""
    def diagrams(page: str) -> list[str]:
        text = (site / page / "index.html").read_text()
        return re.findall(r'<pre class="mermaid"><code>(.*?)</code></pre>', text, re.S)

    guide = diagrams("guide")
    assert len(guide) >= 3, "the data flow, the weights path, a worker's round trips"
    flow = next(d for d in guide if d.startswith("flowchart") and "shared memory" in d)
    for part in ("your process", "loop thread", "scheduler", "policy", "worker processes", "rollout storage",
                 "batch", "doorbell"):
        assert part in flow, part
    assert any("update_policy_weights_" in d and "max_policy_lag" in d for d in guide)
    assert any(d.startswith("sequenceDiagram") and "spins" in d for d in guide)
    weights = diagrams("weights")
    assert weights and "update_policy_weights_" in weights[0] and "policy_version" in weights[0]


def test_every_api_directive_has_a_line_of_context():
    """Above each ``:::`` directive of the API pages, a line saying what it is for; on the errors
    page, its tree says it, one line per class."""
    for page in sorted((DOCS / "api").glob("*.md")):
        text = page.read_text()
        tree = re.search(r"^```text\n(.*?)^```", text, re.S | re.M)
        lines = text.splitlines()
        for i, line in enumerate(lines):
            if not line.startswith("::: "):
                continue
            name = line.split()[1].rsplit(".", 1)[-1]
            if tree and re.search(rf"\b{name}\b", tree.group(1)):
                continue
            above = next(prev for prev in reversed(lines[:i]) if prev.strip())
            assert not above.startswith((":::", " ", "#")), f"{page.name}: no line of context above {line!r}"


def _training():
    spec = importlib.util.spec_from_file_location("draw_training_curves", ROOT / "scripts" / "draw_training_curves.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@ON_THE_SITE
def test_the_training_page_shows_the_curves_its_programs_draw(site):
    programs = _training().programs()
    assert set(programs) == {"ppo_cartpole_torchrl", "jax_learner_async"}
    assert "ClipPPOLoss" in programs["ppo_cartpole_torchrl"] and "GAE(" in programs["ppo_cartpole_torchrl"]
    assert "async for batch in collector" in programs["jax_learner_async"]
    images = _parse(site / "training" / "index.html").images
    for name in programs:
        src = next(src for src in images if src.endswith(f"{name}.png"))
        png = (site / "training" / src).resolve()
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert png.stat().st_size < 100_000, f"{png.name}: keep the figure small"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", ["ppo_cartpole_torchrl", "jax_learner_async"])
def test_the_training_programs_run_and_draw_their_curve(name, tmp_path):
    """Each program of docs/training.md, as it is but for two batches (the full runs draw the
    page's figures: ``scripts/draw_training_curves.py``)."""
    training = _training()
    proc = training.run(training.programs()[name], tmp_path, total_frames=4096, timeout=200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = re.findall(r"^ +[\d,]+ frames  mean return +[\d.]+", proc.stdout, re.M)
    assert len(lines) == 2, proc.stdout
    assert (tmp_path / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_pages_with_examples_include_the_quick_start_and_every_collector():
    assert {"quickstart.md", "cli.md", "index.md", "collectors/ray.md", "collectors/rpc.md"} <= set(PAGES)
    # the runner reads fences at the start of a line: an indented complete block would go unrun
    for page in [ROOT / "README.md", *DOCS.rglob("*.md")]:
        indented = re.findall(r"^[ \t]+```python$", page.read_text(), re.M)
        assert not indented, f"{page}: an indented ```python block (fence fragments ```py)"


@pytest.mark.parametrize("page", [
    pytest.param(page, marks=pytest.mark.xdist_group("ray")) if "RayCollector(" in (DOCS / page).read_text() else page
    for page in PAGES])  # pages that start Ray run where the other Ray tests run, one instance at a time
def test_the_examples_of_the_page_run(page, tmp_path):
    path = (DOCS / page).resolve()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(path), str(page in RUN_SHELL)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=110, env=env)
    assert proc.returncode == 0, f"{page}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"


GPU_TO_CPU = [('"cuda"', '"cpu"'), (".cuda()", ""), (".is_cuda", '.device.type == "cpu"'),
              ("total_frames=20_480", "total_frames=2_048"), ("total_frames=10_240", "total_frames=2_048")]
"""What turns the GPU page's examples into short CPU programs (``tests/gpu/test_gpu_docs.py``
runs them as they are, on a GPU)."""


@pytest.mark.parametrize("block", range(3))
def test_the_gpu_pages_examples_run_on_the_cpu(block, tmp_path):
    """The examples of ``docs/gpu.md`` with the CPU in place of the GPU: what they call
    exists and works the same way, checked here where no GPU is (the GPU run is the device's)."""
    blocks = re.findall(r"^```py\n(.*?)^```", (DOCS / "gpu.md").read_text(), re.S | re.M)
    assert len(blocks) == 3
    code = blocks[block]
    assert "cuda" in code
    for gpu, cpu in GPU_TO_CPU:
        code = code.replace(gpu, cpu)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stderr[-3000:]


PLACEMENT_PAGES = ["README.md", "docs/index.md", "docs/guide.md", "docs/collectors/multi_sync.md", "docs/migrating.md"]
"""The pages that say where a worker collector's policy runs."""

OLD_PLACEMENT_CLAIMS = [
    "worker processes: fresh interpreters, no torch",  # (the guide's data flow, before)
    "the policy batched over every ready worker in the main process:",  # (the README, before)
    "workers do not run torch",  # (options.py's num_threads, before)
    "a worker does not import torch",  # (multi_sync.md, before)
    "it runs in this process, batched over every ready worker's envs.",  # (the collectors' Args, before)
]


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_the_pages_say_where_the_policy_runs_as_the_collectors_choose(monkeypatch):
    """One story, on every page that tells it and in the code's docstrings: a worker collector
    runs its policy in the main process, batched over every ready worker, or a copy in each
    worker; a small torch MLP on the CPU goes to the workers where they take every core (as the
    README's example on 2 cores), and a plain function or a policy that changes its own state
    while acting stays in the main process. Each claim is checked against collectors built here,
    as a user gets them (no placement forced)."""
    import functools

    import gymnasium as gym
    from tensordict.nn import TensorDictModule
    from torch import nn

    from aiocollect import MultiSyncCollector
    from aiocollect._workers.protocol import usable_cores
    from support.plain_modules import ArgmaxMLP

    monkeypatch.delenv("AIOCOLLECT_POLICY_IN_WORKERS", raising=False)
    make = functools.partial(gym.make, "CartPole-v1")
    workers = [[make] * 2] * usable_cores()  # (a worker per core: no core left for the engine)
    mlp = TensorDictModule(ArgmaxMLP(4, 2), in_keys=["observation"], out_keys=["action"])
    with MultiSyncCollector(workers, mlp, frames_per_batch=4 * len(workers), total_frames=4 * len(workers)) as c:
        assert c.policy_in_workers is True
        assert next(iter(c)).numel() == 4 * len(workers)
    stateful = TensorDictModule(nn.Sequential(nn.BatchNorm1d(4), ArgmaxMLP(4, 2)), in_keys=["observation"],
                                out_keys=["action"])
    for policy in (lambda observation: (observation[..., 0] > 0).long(), stateful):
        with MultiSyncCollector(workers, policy, frames_per_batch=4 * len(workers),
                                total_frames=4 * len(workers)) as c:
            assert c.policy_in_workers is False, policy

    for page in PLACEMENT_PAGES:
        text = _flat((ROOT / page).read_text())
        assert re.search(r"over every ready (worker|env)", text), f"{page}: the main process's placement"
        assert re.search(r"a copy (of [^.]{0,40})?in each worker|each worker a copy", text), f"{page}: the workers'"
        for old in OLD_PLACEMENT_CLAIMS:
            assert old not in text, f"{page}: {old!r}"
    readme = _flat((ROOT / "README.md").read_text())
    assert "a plain function and a policy that changes its own state while acting stay in the main process" in readme
    assert "`collector.policy_in_workers` says which" in readme
    for module in sorted((ROOT / "aiocollect").rglob("*.py")):
        text = _flat(module.read_text())
        for old in OLD_PLACEMENT_CLAIMS:
            assert old not in text, f"{module.relative_to(ROOT)}: {old!r}"

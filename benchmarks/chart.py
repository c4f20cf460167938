"""Draw the benchmarks' frames/s side by side, one panel per scenario, as a PNG.

It reads the JSON files the benchmark scripts write (``--json``), named after them::

    python benchmarks/bench_engine.py --json results/engine.json     # the headline: sections E, R, P
    python benchmarks/bench_collect.py --json results/collect.json
    python benchmarks/bench_workers.py --json results/workers.json
    python benchmarks/bench_coroutines.py --json results/coroutines.json
    python benchmarks/bench_ray.py --json results/ray.json
    python benchmarks/chart.py results                 # -> results/benchmarks.png

``aiocollect bench --results DIR`` does all of that in one go. Every file is optional: a
panel is drawn for each scenario found. Bars show each contender's best run; aiocollect's
bars are labelled with their ratio to the fastest TorchRL row of the same panel. Needs matplotlib.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

AIOCOLLECT, TORCHRL, BASELINE = "aiocollect", "TorchRL", "baseline"
COLOURS = {AIOCOLLECT: "#1f77b4", TORCHRL: "#d62728", BASELINE: "#9a9a9a"}


@dataclass
class Bar:
    label: str
    fps: float
    kind: str


@dataclass
class Panel:
    title: str
    bars: list[Bar]
    bound: float | None = None  # a vertical line: what the envs themselves allow
    bound_label: str = "bound"


def _kind(name: str) -> str:
    if name.startswith("aiocollect"):
        return AIOCOLLECT
    return TORCHRL if name.startswith("TorchRL") else BASELINE


def collect_panels(results: dict) -> list[Panel]:
    """``bench_collect.py``: scenario A (random policy) and B (MLP), one process."""
    titles = {"A": "CartPole-v1, 8 envs, random policy, one process",
              "B": "CartPole-v1, 64 envs, MLP policy, one process"}
    panels = []
    for scenario, title in titles.items():
        bars = [Bar(r["name"], r["frames_per_s"], _kind(r["name"]))
                for r in results["results"] if r["scenario"] == scenario and r.get("frames_per_s")]
        if bars:
            panels.append(Panel(title, bars))
    return panels


def workers_panels(results: dict) -> list[Panel]:
    """``bench_workers.py``: section C (CartPole in workers) and S (CPU-bound stragglers)."""
    titles = {"C": "CartPole-v1, 2 worker processes x 16 envs, random policy",
              "S": "8 CPU-bound envs with straggling steps, 2 worker processes"}
    panels = []
    for section, title in titles.items():
        rows = [r for r in results["results"] if r["section"] == section and r.get("best") and not r.get("error")]
        bound = next((r["best"] for r in rows if r["key"] == "ceiling"), None)
        bars = [Bar(r["name"], r["best"], _kind(r["name"])) for r in rows if r["key"] != "ceiling"]
        if bars:
            panels.append(Panel(title, bars, bound, "the envs alone, x 2 cores"))
    return panels


ENGINE_TITLES = {
    "E": "CartPole-v1, {w} workers x 16 envs, an MLP policy that reads the observation",
    "R": "CartPole-v1, {w} workers x 16 envs, random actions (the warm-up)",
    "P": "Pixel env (4x84x84 uint8, 200 us a step), 2 workers x 8 envs, random",
}


def engine_panels(results: dict) -> list[Panel]:
    """``bench_engine.py``: its frames/s sections E (the headline), R and P, one panel each (per
    worker count): every row but the limit as a bar, the limit (the envs alone, x the cores) as
    the dashed line. The second limit and the ceilings are grey, as baselines."""
    rows = [r for r in results["results"] if r.get("unit") == "frames/s" and r.get("best") and not r.get("error")]
    panels = []
    for section in dict.fromkeys(r["section"] for r in rows):
        if section[0] not in ENGINE_TITLES:
            continue
        part = [r for r in rows if r["section"] == section]
        bound = next((r["best"] for r in part if r["name"] == "limit"), None)
        bars = [Bar(r["name"], r["best"], _kind(r["name"])) for r in part if r["name"] != "limit"]
        if bars:
            title = ENGINE_TITLES[section[0]].format(w=section[1:])
            panels.append(Panel(title, bars, bound, "limit"))
    return panels


def contenders_panel(results: dict, title: str, names: dict[str, str], bound: float | None = None) -> list[Panel]:
    """``bench_coroutines.py`` and ``bench_ray.py``: ``{"contenders": {key: {"best": fps}}}``."""
    bars = [Bar(names[key], entry["best"], _kind(names[key]))
            for key, entry in results["contenders"].items() if key in names and entry.get("best")]
    return [Panel(title, bars, bound)] if bars else []


def panels_from(directory: Path) -> list[Panel]:
    """Every panel whose JSON file is in ``directory``."""
    def load(name: str) -> dict | None:
        path = directory / f"{name}.json"
        return json.loads(path.read_text()) if path.exists() else None

    panels: list[Panel] = []
    if (results := load("engine")) is not None:
        panels += engine_panels(results)
    if (results := load("collect")) is not None:
        panels += collect_panels(results)
    if (results := load("workers")) is not None:
        panels += workers_panels(results)
    if (results := load("coroutines")) is not None:
        panels += contenders_panel(
            results, "256 coroutine envs, each step awaits 5-15 ms",
            {"barrier": "asyncio.gather over all envs per step", "aiocollect": "aiocollect Collector, coroutine envs",
             "ahead": "aiocollect Collector, step_ahead=True", "torchrl": "TorchRL AsyncBatchedCollector, threads"},
            bound=results.get("bound"))
    if (results := load("ray")) is not None:
        panels += contenders_panel(
            results, "Ray: 2 actors x 8 CartPole-v1 envs, random policy",
            {"aiocollect": "aiocollect RayCollector", "torchrl": "TorchRL RayCollector"})
    return panels


def _si(value: float) -> str:
    return f"{value / 1e3:.1f}k" if value >= 1e3 else f"{value:.0f}"


def draw(panels: list[Panel], out: Path, subtitle: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heights = [0.9 + 0.38 * len(p.bars) for p in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, sum(heights) + 0.8),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, panel in zip(axes[:, 0], panels):
        bars = panel.bars[::-1]  # matplotlib draws the first bar at the bottom
        ax.barh(range(len(bars)), [b.fps for b in bars], color=[COLOURS[b.kind] for b in bars])
        ax.set_yticks(range(len(bars)), [b.label for b in bars], fontsize=8.5)
        top = max([b.fps for b in bars] + [panel.bound or 0])
        log = top / min(b.fps for b in bars) > 20  # a linear axis where the bars are of one magnitude
        if log:
            ax.set_xscale("log")
        else:
            ax.xaxis.set_major_formatter(lambda value, _: _si(value))
        ax.set_title(panel.title, fontsize=10, loc="left")
        ax.grid(axis="x", which="major", alpha=0.3)
        torchrl = max((b.fps for b in bars if b.kind == TORCHRL), default=None)  # the faster TorchRL row
        for y, b in enumerate(bars):
            text = f" {_si(b.fps)}"
            if b.kind == AIOCOLLECT and torchrl:
                text += f"  ({b.fps / torchrl:.1f}x TorchRL)"
            ax.text(b.fps, y, text, va="center", fontsize=8)
        if panel.bound:
            ax.axvline(panel.bound, color="black", linestyle="--", linewidth=1)
            ax.text(panel.bound, len(bars) - 0.45, f" {panel.bound_label}: {_si(panel.bound)}", fontsize=7.5,
                    va="bottom")
        ax.set_xlim(*((min(b.fps for b in bars) / 2, top * 5) if log else (0, top * 1.35)))
    axes[-1, 0].set_xlabel("frames/s (env steps per second; best run; log scale where the bars span 20x or more)")
    fig.suptitle("aiocollect vs gymnasium loops and TorchRL" + (f"\n{subtitle}" if subtitle else ""), fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _subtitle(directory: Path) -> str:
    """The machine and versions of the first JSON file that names them (and its run's date, where
    it has one)."""
    for path in sorted(directory.glob("*.json")):
        results = json.loads(path.read_text())
        env = results.get("environment")
        if env:
            parts = [f"{env['cpu_count']} CPUs"] if "cpu_count" in env else []
            parts += [f"{name} {env[key]}" for key, name in (("python", "Python"), ("torch", "torch"),
                      ("torchrl", "torchrl"), ("gymnasium", "gymnasium"), ("aiocollect", "aiocollect")) if env.get(key)]
            return ", ".join(([results["date"]] if results.get("date") else []) + parts)
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path,
                        help="directory with engine.json, collect.json, workers.json, coroutines.json, ray.json")
    parser.add_argument("-o", "--out", type=Path, help="the PNG to write (default: RESULTS/benchmarks.png)")
    args = parser.parse_args(argv)
    panels = panels_from(args.results)
    if not panels:
        parser.error(f"no benchmark results in {args.results}: run the benchmarks with --json {args.results}/NAME.json")
    out = args.out or args.results / "benchmarks.png"
    draw(panels, out, _subtitle(args.results))
    print(f"chart written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

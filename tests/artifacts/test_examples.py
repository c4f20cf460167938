"""The examples run, end to end, with few frames (their speed is reported, not asserted)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run(script: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_collect_cartpole():
    out = run("collect_cartpole.py", "--envs", "4", "--frames", "4000")
    assert re.search(r"4000 frames in [\d.]+ s: [\d,]+ frames/s", out), out


def test_coroutine_game_over_tcp():
    out = run("coroutine_game.py", "--envs", "16", "--frames", "1600")
    assert re.search(r"1600 frames from 16 TCP envs in [\d.]+ s", out), out
    episodes, mean = re.search(r"(\d+) episodes, mean return ([+-][\d.]+)", out).groups()
    assert int(episodes) > 0 and -1 <= float(mean) <= 1


@pytest.mark.timeout(240)  # the shared training run may start in this test
@pytest.mark.xdist_group("ppo-cartpole")
def test_ppo_cartpole_runs_a_few_updates(trained_ppo_cartpole):
    """``ppo_cartpole.py --frames 6144 --save ...``: the run ``test_cli_policy`` evaluates the
    saved actor of (the conftest fixture trains it once for both)."""
    proc, _ = trained_ppo_cartpole
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert re.search(r"batch   2  frames    6,144  mean return", out), out
    assert "done: mean return" in out


def test_ppo_torchrl_trains_on_aiocollect_batches_with_torchrl_losses():
    out = run("ppo_torchrl.py", "--frames", "4096")
    assert re.search(r"done: 4,096 frames, [\d,]+ frames/s collecting, mean episode return -?[\d.]+", out), out


def test_jax_learner_runs_a_few_updates():
    out = run("jax_learner.py", "--frames", "4096")
    assert re.search(r"batch   1  frames   4,096  mean episode length", out), out
    assert "done after" in out

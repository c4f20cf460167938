"""``aiocollect.tune()`` and ``aiocollect tune`` (issue 35, item 2) on CartPole, with tiny
budgets: the tests check what is measured and printed, and that the best split's constructor
and command work as printed, never which split is fastest (that is the machine's to say)."""

from __future__ import annotations

import re
import shlex
import time

import gymnasium as gym
import pytest
import torch

import aiocollect
from aiocollect import Collector, MultiSyncCollector
from support.cli import run, run_main


def test_tune_measures_every_split_and_its_best_is_one_of_them():
    began = time.perf_counter()
    result = aiocollect.tune("CartPole-v1", workers=[0, 1], envs_per_worker=[2, 4], seconds=4)
    took = time.perf_counter() - began
    assert [(t.workers, t.envs_per_worker) for t in result.trials] == [(0, 2), (0, 4), (1, 2), (1, 4)]
    for t in result.trials:
        assert t.frames_per_second > 0 and t.frames > 0 and t.measured_seconds >= 0.5  # (MIN_WINDOW_S)
        assert t.frames_per_batch == t.num_envs * 100 and t.frames % t.frames_per_batch == 0
        assert t.frames_per_second == pytest.approx(t.frames / t.measured_seconds)
    assert result.trials[0].startup_seconds >= 0
    assert result.best in result.trials
    assert result.best.frames_per_second == max(t.frames_per_second for t in result.trials)
    assert result.env == "CartPole-v1" and result.policy == "random actions" and result.skipped == ()
    assert took < 4 + 15  # the budget, with what the last splits overrun by (a start-up, a batch)
    # the printed table lists every split and marks the best
    text = str(result)
    for t in result.trials:
        assert re.search(rf"^ +{t.workers} +{t.envs_per_worker} +{t.num_envs} +{t.frames_per_second:,.0f} +"
                         rf"{t.startup_seconds:.1f} s +{t.measured_seconds:.1f} s", text, re.M), text
    assert text.count("<- best") == 1 and "best: " in text
    assert f"--workers {result.best.workers} --envs-per-worker {result.best.envs_per_worker}" in result.command


def test_the_best_constructor_runs_as_printed():
    """The constructor line is Python that builds the best collector: run it."""
    policy = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.Softmax(-1))

    def act(observation):  # a policy: its calls decide the best split
        return policy(observation).argmax(-1)

    result = aiocollect.tune("CartPole-v1", act, env_kwargs={"max_episode_steps": 50}, workers=[0, 1],
                             envs_per_worker=[2], seconds=2)
    assert result.policy == "policy act"
    code = result.constructor.replace("total_frames=...", f"total_frames={result.best.frames_per_batch}")
    assert "max_episode_steps=50" in code and ", policy, " in code
    collector = eval(code, {"gym": gym, "Collector": Collector, "MultiSyncCollector": MultiSyncCollector,
                            "policy": act})
    with collector:
        (batch,) = list(collector)
    assert batch.numel() == result.best.frames_per_batch
    assert int(batch["collector", "traj_ids"].unique().numel()) >= result.best.num_envs
    assert "--env-kwargs '{\"max_episode_steps\": 50}'" in result.command and "--policy POLICY" in result.command


def test_frames_per_batch_that_does_not_split_skips_the_split():
    result = aiocollect.tune("CartPole-v1", workers=[0], envs_per_worker=[2, 3], frames_per_batch=40, seconds=1)
    assert [(t.workers, t.envs_per_worker) for t in result.trials] == [(0, 2)]
    assert result.skipped == ((0, 3, "frames_per_batch=40 does not split over 3 envs"),)
    assert "skipped: frames_per_batch=40 does not split over 3 envs" in str(result)
    assert result.trials[0].frames_per_batch == 40


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"workers": [-1]}, "workers must be whole numbers >= 0"),
    ({"envs_per_worker": [0]}, "envs_per_worker must be whole numbers >= 1"),
    ({"seconds": 0}, "seconds must be > 0"),
    ({"envs_per_worker": [3], "workers": [0], "frames_per_batch": 40}, "splits over none"),
])
def test_bad_arguments_are_value_errors_that_say_what_to_give(kwargs, expected):
    with pytest.raises(ValueError, match=expected):
        aiocollect.tune("CartPole-v1", **kwargs)


def test_the_command_prints_the_table_the_best_and_a_command_that_runs(tmp_path):
    proc = run("tune", "--env", "CartPole-v1", "--workers", "0,1", "--envs-per-worker", "2,4", "--seconds", "4",
               timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = re.findall(r"^ +(\d+) +(\d+) +(\d+) +([\d,]+) +[\d.]+ s", proc.stdout, re.M)
    assert {(int(w), int(e)) for w, e, _, _ in rows} == {(0, 2), (0, 4), (1, 2), (1, 4)}, proc.stdout
    best = re.search(r"^best: (.*), ([\d,]+) frames/s", proc.stdout, re.M)
    assert best and int(best[2].replace(",", "")) == max(int(r[3].replace(",", "")) for r in rows)
    assert "CartPole-v1, random actions, on " in proc.stdout
    command = re.search(r"^  command: +(aiocollect collect .*)$", proc.stdout, re.M)[1]
    assert re.search(r"^  constructor: +(Multi)?[A-Za-z]*Collector\(", proc.stdout, re.M)
    args = shlex.split(command.replace("FRAMES", "400").replace("DIR", str(tmp_path / "o")))[1:]
    collected = run_main(*args)  # the printed command, as printed
    assert collected.returncode == 0, collected.stderr[-3000:]
    assert "frames: " in collected.stdout


def test_the_command_tunes_with_a_policy_file(tmp_path, monkeypatch):
    class Rule(torch.nn.Module):
        def forward(self, observation: torch.Tensor) -> torch.Tensor:
            return (observation[:, 2] > 0).long()

    torch.jit.script(Rule()).save(str(tmp_path / "rule.pt"))
    threads = torch.get_num_threads()
    monkeypatch.chdir(tmp_path)
    try:
        proc = run_main("tune", "--env", "CartPole-v1", "--policy", "rule.pt", "--workers", "0,1",
                        "--envs-per-worker", "2", "--seconds", "2")
    finally:
        torch.set_num_threads(threads)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CartPole-v1, rule.pt (TorchScript), on " in proc.stdout
    assert re.search(r"^  command: +aiocollect collect --env CartPole-v1 --workers [01] --envs-per-worker 2 "
                     r"--policy rule.pt --frames FRAMES --out DIR$", proc.stdout, re.M), proc.stdout


@pytest.mark.parametrize(("args", "expected"), [
    (["--workers", "-1"], "--workers must be >= 0"),
    (["--workers", "one,two"], "is not a comma-separated list of whole numbers"),
    (["--envs-per-worker", "0"], "--envs-per-worker must be >= 1"),
    (["--seconds", "0"], "--seconds must be > 0"),
    (["--seconds", "nan"], "--seconds must be > 0"),
    (["--policy", "nope.pt"], "--policy nope.pt: no such file"),
    (["--envs-per-worker", "3", "--workers", "0", "--frames-per-batch", "40"], "splits over none"),
])
def test_the_command_refuses_bad_input_in_one_line(args, expected):
    proc = run_main("tune", "--env", "CartPole-v1", *args)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aiocollect: error:") and expected in lines[0], lines


@pytest.mark.timeout(30)  # (they were taken, and measured for ever: each split's window was infinite)
@pytest.mark.parametrize("seconds", ["inf", "1e999", "Infinity"])
def test_infinite_seconds_are_refused_in_one_line(seconds):
    proc = run_main("tune", "--env", "CartPole-v1", "--workers", "0", "--envs-per-worker", "2", "--seconds", seconds)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0] == ("aiocollect: error: --seconds must be > 0 and finite, got inf; give about how long to "
                        "measure, e.g. --seconds 30 (the default)")
    assert proc.stdout == ""  # nothing measured
    with pytest.raises(ValueError, match=r"seconds must be > 0 and finite \(about how long to measure\), got inf"):
        aiocollect.tune("CartPole-v1", workers=[0], envs_per_worker=[2], seconds=float(seconds))


def test_splits_left_when_the_time_runs_out_are_listed_with_the_seconds_that_measure_them():
    """A budget shorter than a worker's start-up: the first split (the most workers) is measured,
    the other is skipped, and the result says about what ``seconds`` would measure both."""
    from aiocollect._tune import OUT_OF_TIME

    result = aiocollect.tune("CartPole-v1", workers=[1, 0], envs_per_worker=[2], seconds=0.05)
    assert [(t.workers, t.envs_per_worker) for t in result.trials] == [(1, 2)]
    assert result.skipped == ((0, 2, OUT_OF_TIME),)
    spent = result.trials[0].startup_seconds + result.trials[0].measured_seconds
    assert result.seconds_to_measure_all >= spent and result.seconds_to_measure_all % 10 == 0
    assert ("1 of 2 splits not measured: the seconds=0.05 given were spent" in str(result)
            and f"seconds={result.seconds_to_measure_all:g} would measure every split" in str(result))


def test_the_command_says_which_flag_gives_the_splits_left(monkeypatch):
    """``aiocollect tune`` names its ``--seconds`` flag, not ``tune()``'s keyword (the result
    here as ``tune()`` would return it when 30 s measured 2 of 6 splits)."""
    import aiocollect._tune as tune_module
    from aiocollect._tune import OUT_OF_TIME, Trial, TuneResult

    def measured(env, policy, *, seconds, **kwargs):
        trials = (Trial(2, 8, 1600, 5e4, 12.2, 3.0, 150_000), Trial(2, 32, 6400, 6e4, 12.9, 2.5, 150_000))
        skipped = tuple((w, e, OUT_OF_TIME) for w in (0, 1) for e in (8, 32))
        return TuneResult(env, "random actions", 2, trials, skipped, trials[1], "MultiSyncCollector(...)",
                          seconds=seconds, seconds_to_measure_all=90.0)

    monkeypatch.setattr(tune_module, "tune", measured)
    proc = run_main("tune", "--env", "CartPole-v1")
    assert proc.returncode == 0, proc.stderr
    assert "the --seconds 30 given were spent" in proc.stdout
    assert "--seconds 90 would measure every split" in proc.stdout
    assert "seconds=" not in proc.stdout

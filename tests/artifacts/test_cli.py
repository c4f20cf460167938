"""The ``aiocollect`` command, run as a user runs it: the console script, in a subprocess, and its
``main()`` in this process for the cases about what it checks and writes (``support.cli``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from tensordict import TensorDict

from support.checks import check_batch
from support.cli import run, run_main


def test_collect_saves_a_memmapped_tensordict_and_prints_a_summary(tmp_path):
    out = tmp_path / "cartpole"
    proc = run("collect", "--env", "CartPole-v1", "--workers", "2", "--envs-per-worker", "4", "--frames", "4000",
               "--out", str(out), timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"collected 4,000 frames of CartPole-v1 from 8 envs \(2 worker processes\) in [\d.]+ s: "
                     r"[\d,]+ frames/s", proc.stdout), proc.stdout
    assert "frames: 4,000 collected, as asked" in proc.stdout and "policy: random actions" in proc.stdout
    assert re.search(r"^episodes: [\d,]+ finished \(\d+ still running at the end, not counted\)\n"
                     r"  return: mean [\d.]+, std [\d.]+, min [\d.]+, max [\d.]+\n"
                     r"  length: mean [\d.]+, min \d+, max \d+ steps$", proc.stdout, re.M), proc.stdout
    assert "MultiSyncCollector" in proc.stderr and "frames/s" in proc.stderr  # the progress bar
    data = TensorDict.load_memmap(out)
    assert data.shape == (2, 4, 500) and data.numel() == 4000
    for row in data.unbind(0):
        row.refine_names(None, "time")
        check_batch(row)


def test_collect_in_process_with_workers_0(tmp_path):
    proc = run_main("collect", "--env", "CartPole-v1", "--workers", "0", "--envs-per-worker", "2", "--frames", "300",
                    "--frames-per-batch", "100", "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert TensorDict.load_memmap(tmp_path / "o").shape == (2, 150)
    assert (tmp_path / "o" / "step_count.memmap").exists() is False
    # --overwrite replaces a previous save whole: no file of the old one is left
    proc = run_main("collect", "--env", "CartPole-v1", "--workers", "0", "--envs-per-worker", "2", "--frames", "100",
                    "--max-frames-per-traj", "5", "--out", str(tmp_path / "o"), "--overwrite")
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = TensorDict.load_memmap(tmp_path / "o")
    assert data.shape == (2, 100) and int(data["step_count"].max()) == 4
    proc = run_main("collect", "--env", "CartPole-v1", "--workers", "0", "--envs-per-worker", "2", "--frames", "100",
                    "--out", str(tmp_path / "o"), "--overwrite")
    assert proc.returncode == 0 and not (tmp_path / "o" / "step_count.memmap").exists()


def assert_one_line_error(proc: subprocess.CompletedProcess, expected: str) -> None:
    assert proc.returncode == 2, (proc.args, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aiocollect: error:") and expected in lines[0], (proc.args, lines)
    assert "Traceback" not in proc.stderr


def test_bad_input_is_one_line_and_exit_code_2(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep me")
    (tmp_path / "afile").write_text("keep me too")
    cases = [
        (["collect", "--env", "CartPole-v1", "--frames-per-batch", "0", "--out", str(tmp_path / "f")],
         "--frames-per-batch must be >= 1"),
        (["collect", "--env", "CartPole-v1", "--max-frames-per-traj", "-3", "--out", str(tmp_path / "g")],
         "--max-frames-per-traj must be >= 1"),
        (["collect", "--env", "CartPole-v1", "--out", str(tmp_path / "afile"), "--overwrite"], "is a file"),
        (["collect", "--env", "CartPole-v1", "--out", str(tmp_path / "afile" / "sub")], "cannot write there"),
        (["collect", "--env", "CartPole-v1", "--out", str(tmp_path / "full"), "--overwrite"],
         "replaces only a directory that aiocollect collect saved"),
        (["collect", "--env", "NoSuchEnv-v0", "--out", str(tmp_path / "a")], "not a registered gymnasium env"),
        (["collect", "--env", "CartPole-v1", "--workers", "-1", "--out", str(tmp_path / "b")], "--workers"),
        (["collect", "--env", "CartPole-v1", "--seed", "-3", "--out", str(tmp_path / "b")],
         "--seed must be in 0.."),
        (["tune", "--env", "CartPole-v1", "--envs-per-worker", "100000000", "--seconds", "5"],
         "--envs-per-worker 100000000: a batch of 10,000,000,000 frames takes"),
        (["collect", "--env", "CartPole-v1", "--frames", "lots", "--out", str(tmp_path / "c")], "--frames"),
        (["collect", "--env", "CartPole-v1", "--out", str(tmp_path / "full")], "pass --overwrite"),
        (["collect", "--env", "CartPole-v1", "--envs-per-worker", "3", "--frames-per-batch", "100", "--out",
          str(tmp_path / "d")], "does not split"),
    ]
    for args, expected in cases:
        assert_one_line_error(run_main(*args), expected)
    assert (tmp_path / "full" / "x").read_text() == "keep me"
    assert (tmp_path / "afile").read_text() == "keep me too"
    assert not any((tmp_path / name).exists() for name in "fg")  # nothing collected, nothing saved


def test_bad_input_from_the_console_script(tmp_path, monkeypatch):
    """The command itself, in a subprocess: a refusal of ``main()`` (an env that cannot be built)
    and one of the argument parser both end the process with exit code 2 and one line."""
    # a registered env that cannot be built (as one whose optional dependency is missing)
    (tmp_path / "broken_envs.py").write_text(
        "import gymnasium\n"
        "def make():\n    raise gymnasium.error.DependencyNotInstalled('the physics engine is not installed')\n"
        "gymnasium.register('Broken-v0', entry_point=make)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    cases = [
        (["collect", "--env", "broken_envs:Broken-v0", "--out", str(tmp_path / "e")],
         "cannot be built here: DependencyNotInstalled: the physics engine is not installed"),
        (["frobnicate"], "invalid choice"),
    ]
    for args, expected in cases:
        assert_one_line_error(run(*args), expected)
    assert not (tmp_path / "e").exists()


def test_bench_runs_the_benchmarks_prints_the_table_and_draws_the_chart(tmp_path, monkeypatch):
    # the scripts' --smoke (as the other benchmark smoke tests): --quick's rows, each measured briefly
    monkeypatch.setenv("AIOCOLLECT_BENCH_SMOKE", "1")
    results = tmp_path / "results"
    proc = run("bench", "--quick", "--only", "collect", "--results", str(results), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "# bench_collect.py" in proc.stdout
    for row in ("plain gymnasium SyncVectorEnv loop", "aiocollect Collector, for", "aiocollect Collector, async for",
                "TorchRL Collector(SerialEnv)", "hand-written SyncVectorEnv + MLP loop"):
        assert row in proc.stdout, row
    collect = json.loads((results / "collect.json").read_text())
    assert collect["mode"] == "smoke"  # the variable reached the script
    rows = collect["results"]
    assert {(r["scenario"], r["key"]) for r in rows} >= {("A", "plain"), ("A", "aio"), ("A", "torchrl"), ("B", "aio")}
    assert all(r["frames_per_s"] > 0 for r in rows)
    png = (results / "benchmarks.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert f"chart written to {results / 'benchmarks.png'}" in proc.stdout
    # a quick run's rough ratios keep their goals, unjudged
    assert "not judged: --quick figures are rough" in proc.stdout and "MISSED" not in proc.stdout


def test_bench_results_must_be_a_directory(tmp_path):
    (tmp_path / "f").write_text("")
    proc = run("bench", "--quick", "--results", str(tmp_path / "f"), timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().startswith("aiocollect: error: --results")
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_python_dash_m_is_the_same_command():
    proc = subprocess.run([sys.executable, "-m", "aiocollect", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and all(name in proc.stdout for name in ("collect", "tune", "bench"))


def test_an_env_module_that_raises_on_import_is_one_line_and_exit_code_2(tmp_path, monkeypatch):
    (tmp_path / "raising_envs_a.py").write_text("raise RuntimeError('no licence server')\n")
    (tmp_path / "raising_envs_b.py").write_text("import gymnasium\ndef broken(:\n    pass\n")
    (tmp_path / "raising_envs_c.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cases = [
        ("raising_envs_a:Any-v0", "importing 'raising_envs_a' raised RuntimeError: no licence server"),
        ("raising_envs_b:Any-v0", "importing 'raising_envs_b' raised SyntaxError"),
        ("raising_envs_c:Any-v0", "importing 'raising_envs_c' raised SystemExit: 3"),
        ("no_such_envs_module:Any-v0", "cannot import 'no_such_envs_module'"),
    ]
    for env, expected in cases:
        assert_one_line_error(run_main("collect", "--env", env, "--out", str(tmp_path / "o")), expected)
    assert not (tmp_path / "o").exists()


def test_an_env_module_in_the_current_directory_is_found_by_the_console_script(tmp_path):
    """``aiocollect collect --env mod:Id`` imports ``mod`` from the current directory, as
    ``python -m aiocollect`` does (and gymnasium's ``module:EnvId`` convention expects), in
    this process and in the workers."""
    (tmp_path / "cwd_envs.py").write_text(
        "import gymnasium\n"
        "gymnasium.register('CwdCartPole-v0', entry_point='gymnasium.envs.classic_control:CartPoleEnv')\n")
    proc = run("collect", "--env", "cwd_envs:CwdCartPole-v0", "--workers", "1", "--envs-per-worker", "2",
               "--frames", "200", "--out", "o", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "collected 200 frames of cwd_envs:CwdCartPole-v0" in proc.stdout
    assert TensorDict.load_memmap(tmp_path / "o").shape == (1, 2, 100)


FAILING_ENVS = '''
import os

import gymnasium
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class ResetFails(CartPoleEnv):
    def reset(self, *, seed=None, options=None):
        raise RuntimeError("the simulator licence expired")


class StepFails(CartPoleEnv):
    def step(self, action):
        raise ValueError("the physics diverged")


class FailsInWorkers(CartPoleEnv):  # passes the command's checks (in its own process), fails in a worker
    def reset(self, *, seed=None, options=None):
        if os.getpid() != int(os.environ["FAILING_ENVS_MAIN_PID"]):
            raise OSError("no display in this process")
        return super().reset(seed=seed, options=options)


gymnasium.register("ResetFails-v0", entry_point=ResetFails)
gymnasium.register("StepFails-v0", entry_point=StepFails)
gymnasium.register("FailsInWorkers-v0", entry_point=FailsInWorkers)
'''


def test_an_env_that_raises_at_its_first_reset_or_step_is_one_line_and_exit_code_2(tmp_path, monkeypatch):
    """The env's own error (type, message, and the line of the env's code that raised it) in
    one line, never the traceback of aiocollect's frames that the ``EnvError`` carries; for
    ``collect`` and ``tune``, and for an env that fails only in a worker process."""
    path = tmp_path / "failing_envs.py"
    path.write_text(FAILING_ENVS)
    lines = FAILING_ENVS.splitlines()

    def line_of(text: str) -> int:
        return next(i for i, line in enumerate(lines, 1) if text in line)

    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("FAILING_ENVS_MAIN_PID", str(__import__("os").getpid()))
    reset = (f"RuntimeError: the simulator licence expired (raised at {path}:{line_of('licence')}, in reset); "
             "fix the env")
    step = f"ValueError: the physics diverged (raised at {path}:{line_of('diverged')}, in step); fix the env"
    worker = (f"raised OSError: no display in this process (raised at {path}:{line_of('no display')}, in reset); "
              "fix the env")
    cases = [
        (["collect", "--env", "failing_envs:ResetFails-v0", "--out", str(tmp_path / "o")],
         f"--env 'failing_envs:ResetFails-v0': one step of it failed here: {reset}"),
        (["collect", "--env", "failing_envs:StepFails-v0", "--out", str(tmp_path / "o")],
         f"--env 'failing_envs:StepFails-v0': one step of it failed here: {step}"),
        (["tune", "--env", "failing_envs:ResetFails-v0", "--seconds", "1"],
         f"--env 'failing_envs:ResetFails-v0': one step of it failed here: {reset}"),
        (["tune", "--env", "failing_envs:StepFails-v0", "--seconds", "1"],
         f"--env 'failing_envs:StepFails-v0': one step of it failed here: {step}"),
        (["tune", "--env", "failing_envs:FailsInWorkers-v0", "--workers", "1", "--envs-per-worker", "2",
          "--seconds", "1"], "--env 'failing_envs:FailsInWorkers-v0': env 0 of worker 0 (pid "),
    ]
    for args, expected in cases:
        proc = run_main(*args)
        assert_one_line_error(proc, expected)
        assert "aiocollect/" not in proc.stderr and "_collectors" not in proc.stderr, proc.stderr
    assert worker in proc.stderr, proc.stderr
    assert not (tmp_path / "o").exists()


def hide(package: str, tmp_path, monkeypatch, error: str = "ModuleNotFoundError") -> None:
    """A ``package`` first on the path whose import raises ``error``: it hides the installed one in
    the command and the scripts it runs, as in a venv without that extra (``scripts/demo.sh``'s)."""
    shadow = tmp_path / "shadow" / package
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(f"raise {error}(\"No module named '{package}'\")\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(shadow.parent), os.environ.get("PYTHONPATH")])))


def test_bench_names_the_extra_a_section_lacks_and_exits_0(tmp_path, monkeypatch):
    hide("ray", tmp_path, monkeypatch)
    proc = run("bench", "--quick", "--only", "ray", timeout=120)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert "# bench_ray.py" in proc.stdout
    expected = "skipped: RayCollector's benchmark needs ray, which is not installed here: pip install -e '.[ray]'"
    assert expected in proc.stdout
    assert "skipped, as a package they need is not installed" in proc.stdout and "bench_ray.py" in proc.stdout
    assert "no goal is judged" in proc.stdout and "MISSED" not in proc.stdout


def test_bench_says_why_the_torchrl_rows_are_missing(tmp_path, monkeypatch):
    """Without torchrl a section still runs; its TorchRL row reads n/a, and a line says why; its
    rough ``--quick`` ratio is not judged."""
    monkeypatch.setenv("AIOCOLLECT_BENCH_SMOKE", "1")
    hide("torchrl", tmp_path, monkeypatch)
    proc = run("bench", "--quick", "--only", "coroutines", timeout=120)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert re.search(r"TorchRL AsyncBatchedCollector, threading +n/a", proc.stdout), proc.stdout
    assert "TorchRL's row is n/a: torchrl is not installed here: pip install -e '.[dev]'" in proc.stdout
    assert "(goal >= 0.8, not judged: --quick figures are rough)" in proc.stdout


def test_bench_shows_the_end_of_a_failing_scripts_stderr_and_exits_1(tmp_path, monkeypatch):
    """A script that fails for another reason is a failure, and says why (before, its stderr went
    to /dev/null): here ray's import raises something other than ``ImportError``."""
    hide("ray", tmp_path, monkeypatch, error="RuntimeError")
    proc = run("bench", "--quick", "--only", "ray", timeout=120)
    assert proc.returncode == 1, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert "bench_ray.py failed (exit code 1); the end of its stderr:" in proc.stdout
    assert "RuntimeError: No module named 'ray'" in proc.stdout and "skipped" not in proc.stdout

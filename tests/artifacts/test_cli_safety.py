"""``aiocollect collect`` never loses what is in ``--out`` and never leaves a save that looks complete
when it is not: real files, real signals to real subprocesses (issue 17, items 1, 2 and 14). The
runs that no signal interrupts call the command's ``main()`` in this process (``support.cli``).

The interrupted runs collect from ``SlowCartPole-v0`` (``slow_envs``, written by the ``slow`` fixture):
CartPole at about 500 steps a second, which touches a flag file once it has taken 100 steps, so a
test can signal a run that is surely in the middle of writing.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from tensordict import TensorDict

from support.cli import SCRIPT, run_main

SLOW_ENVS = '''
import os
import time

import gymnasium
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class SlowCartPole(CartPoleEnv):
    steps = 0

    def step(self, action):
        time.sleep(0.002)
        SlowCartPole.steps += 1
        if SlowCartPole.steps == 100:
            open(os.environ["SLOW_FLAG"], "w").close()
        return super().step(action)


gymnasium.register("SlowCartPole-v0", entry_point=SlowCartPole, max_episode_steps=500)
'''


@pytest.fixture(scope="module")
def a_save(tmp_path_factory) -> Path:
    """A small save of the command's, made once: tests copy it (``small_save``)."""
    out = tmp_path_factory.mktemp("template") / "save"
    proc = run_main("collect", "--env", "CartPole-v1", "--workers", "0", "--envs-per-worker", "2", "--frames", "200",
                    "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture
def small_save(a_save) -> Callable[[Path], None]:
    """Puts a copy of a small save of the command's (``[2, 100]``) at a path."""
    return lambda out: shutil.copytree(a_save, out)


def contents(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` (links not followed), by relative path."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def assert_refused(proc: subprocess.CompletedProcess, *expected: str) -> None:
    """Exit code 2, one line naming the problem, no traceback, and nothing collected."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aiocollect: error:"), proc.stderr[-3000:]
    for text in expected:
        assert text in lines[0], (text, lines[0])
    assert proc.stdout == ""


@pytest.fixture
def slow(tmp_path, monkeypatch) -> Path:
    """Makes ``slow_envs:SlowCartPole-v0`` importable by the command; returns its flag file."""
    (tmp_path / "slow_envs.py").write_text(SLOW_ENVS)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("SLOW_FLAG", str(tmp_path / "flag"))
    return tmp_path / "flag"


def start_slow_collect(tmp_path: Path, out: Path, workers: int, *extra: str) -> subprocess.Popen:
    """A slow collect into ``out`` (its stderr into a file: a pipe nobody reads could block it),
    returned once it is writing frames."""
    err = open(tmp_path / "stderr.txt", "w")  # noqa: SIM115 - closed when the test is done with the process
    proc = subprocess.Popen([str(SCRIPT), "collect", "--env", "slow_envs:SlowCartPole-v0", "--workers", str(workers),
                             "--envs-per-worker", "2", "--frames-per-batch", "20", "--frames", "100000",
                             "--out", str(out), *extra], stdout=subprocess.PIPE, stderr=err, text=True,
                            env={**os.environ, "PYTHONFAULTHANDLER": "1"})  # (see exit_code)
    err.close()
    flag = Path(os.environ["SLOW_FLAG"])

    def writing() -> bool:  # a partial save being written, or (before issue 17) --out itself
        return flag.exists() and (any(out.parent.glob(f".{out.name}.partial-*/meta.json")) or
                                  ((out / "meta.json").exists() and not (out / "aiocollect.json").exists()))

    deadline = time.monotonic() + 60
    while not writing():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the collect never started writing: {(tmp_path / 'stderr.txt').read_text()[-3000:]}")
        time.sleep(0.02)
    time.sleep(0.2)  # a few more batches
    return proc


def exit_code(proc: subprocess.Popen, tmp_path: Path, timeout: float = 30) -> int:
    """The exit code of a command ``start_slow_collect`` started; if it has not exited within
    ``timeout``, the failure shows where each of its threads was (faulthandler's dump, which
    ``SIGABRT`` writes to its stderr), not only that it hung."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        stderr = (tmp_path / "stderr.txt").read_text()
        raise AssertionError(f"still running {timeout} s later; its threads then:\n{stderr[-6000:]}") from None


def test_overwrite_refuses_the_current_directory_and_its_ancestors(tmp_path, monkeypatch):
    home = tmp_path / "thesis"
    (home / "code").mkdir(parents=True)
    (home / "meta.json").write_text('{"shape": [1]}')
    (home / "thesis.tex").write_text("\\documentclass{article}")
    (home / "code" / "main.py").write_text("print('years of work')")
    before = contents(home)
    monkeypatch.chdir(home)
    for out in (".", ".."):
        proc = run_main("collect", "--env", "CartPole-v1", "--workers", "0", "--frames", "100", "--out", out,
                        "--overwrite")
        assert_refused(proc, f"--out {out}:", "current directory")
    assert contents(home) == before


def test_overwrite_replaces_only_a_provable_save_of_its_own(tmp_path, small_save):
    stranger = tmp_path / "u2"
    (stranger / "sub").mkdir(parents=True)
    (stranger / "meta.json").write_text("{}")
    (stranger / "precious.txt").write_text("keep me")
    (stranger / "sub" / "model.pt").write_bytes(b"weights")
    before = contents(stranger)
    proc = run_main("collect", "--env", "CartPole-v1", "--workers", "0", "--frames", "100", "--out", str(stranger),
                    "--overwrite")
    assert_refused(proc, f"--out {stranger}:", "replaces only a directory that aiocollect collect saved",
                   "no aiocollect.json")
    assert contents(stranger) == before
    # a save of ours to which something was added since, or whose record was edited: refused too
    save = tmp_path / "save"
    small_save(save)
    (save / "notes.txt").write_text("mine")
    before = contents(save)
    proc = run_main("collect", "--env", "CartPole-v1", "--workers", "0", "--frames", "100", "--out", str(save),
                    "--overwrite")
    assert_refused(proc, "it holds notes.txt, which aiocollect collect did not write")
    assert contents(save) == before
    (save / "notes.txt").unlink()
    record = json.loads((save / "aiocollect.json").read_text())
    record["files"]["precious.txt"] = {"size": 7}
    (save / "aiocollect.json").write_text(json.dumps(record))
    proc = run_main("collect", "--env", "CartPole-v1", "--workers", "0", "--frames", "100", "--out", str(save),
                    "--overwrite")
    assert_refused(proc, "was changed after aiocollect collect wrote it")
    assert TensorDict.load_memmap(save).shape == (2, 100)


def test_out_may_not_be_a_symbolic_link(tmp_path, small_save):
    save = tmp_path / "save"
    small_save(save)
    before = contents(save)
    (tmp_path / "link").symlink_to(save)
    proc = run_main("collect", "--env", "CartPole-v1", "--workers", "0", "--frames", "100",
                    "--out", str(tmp_path / "link"), "--overwrite")
    assert_refused(proc, f"--out {tmp_path / 'link'}:", "symbolic link", "give a real path")
    assert contents(save) == before and (tmp_path / "link").is_symlink()


def test_sizes_that_cannot_fit_are_refused_before_any_worker_starts(tmp_path):
    for flag, value, expected in (("--frames", 10**15, "disk"), ("--frames-per-batch", 10**12, "memory")):
        start = time.monotonic()
        proc = run_main("collect", "--env", "CartPole-v1", "--workers", "2", "--envs-per-worker", "2", flag, str(value),
                        "--out", str(tmp_path / "o"))
        assert_refused(proc, f"{flag} {value}:", expected, "bytes a frame", f"use a smaller {flag}"
                       if flag == "--frames-per-batch" else "collect fewer frames")
        assert "Collector" not in proc.stderr  # no progress bar: nothing started
        assert time.monotonic() - start < 30
    assert list(tmp_path.iterdir()) == []  # nothing written, not even a partial directory


@pytest.mark.parametrize("old_save", [False, True], ids=["fresh", "over-an-old-save"])
def test_ctrl_c_leaves_out_as_it_was_and_no_partial_save(tmp_path, slow, small_save, old_save):
    out = tmp_path / "o"
    if old_save:
        small_save(out)
    before = contents(out) if old_save else None
    proc = start_slow_collect(tmp_path, out, 1, *(["--overwrite"] if old_save else []))
    proc.send_signal(signal.SIGINT)
    assert exit_code(proc, tmp_path) == 130
    stderr = (tmp_path / "stderr.txt").read_text()
    assert "aiocollect: interrupted" in stderr and "Traceback" not in stderr, stderr[-3000:]
    if old_save:
        assert contents(out) == before
        assert TensorDict.load_memmap(out).shape == (2, 100)
    else:
        assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no partial left


def test_sigkill_leaves_out_as_it_was_and_a_partial_named_as_such(tmp_path, slow, small_save):
    out = tmp_path / "o"
    small_save(out)
    before = contents(out)
    proc = start_slow_collect(tmp_path, out, 0, "--overwrite")
    proc.kill()
    assert exit_code(proc, tmp_path) == -signal.SIGKILL
    assert contents(out) == before  # the old save, whole
    (partial,) = tmp_path.glob(".o.partial-*")
    record = json.loads((partial / "aiocollect.json").read_text())
    assert record["complete"] is False and 0 < record["frames_written"] < record["frames"] == 100_000
    # the next run says what is left over, and replaces the old save
    proc = run_main("collect", "--env", "CartPole-v1", "--workers", "0", "--envs-per-worker", "2", "--frames", "100",
                    "--max-frames-per-traj", "5", "--out", str(out), "--overwrite")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"aiocollect: note: {partial} is left from a run of aiocollect collect that was killed" in proc.stderr
    assert int(TensorDict.load_memmap(out)["step_count"].max()) == 4
    assert partial.exists()  # a note, never a delete: the run that wrote it might still be going


def test_a_save_set_aside_by_a_killed_replacement_is_named_as_the_previous_save(tmp_path, small_save):
    # killed between the two renames of --overwrite: the old save, set aside, is the only copy
    out = tmp_path / "o"
    aside = tmp_path / ".o.replaced-0123abcd"
    small_save(aside)
    proc = run_main("collect", "--env", "CartPole-v1", "--workers", "0", "--envs-per-worker", "2", "--frames", "100",
                    "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"aiocollect: note: {aside} is the previous save of {out}" in proc.stderr
    assert "mv " in proc.stderr and "rm -r" not in proc.stderr
    assert aside.exists()


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_an_out_where_nothing_can_be_written_is_refused_as_not_writable(tmp_path):
    """``/proc`` takes no new directory (root included) and says it has 0 bytes free: the
    refusal says it is not writable, not that the disk is full."""
    for out in ("/proc/aiocollect-frames", "/proc/aiocollect/new/frames"):
        proc = run_main("collect", "--env", "CartPole-v1", "--workers", "2", "--envs-per-worker", "2",
                        "--frames", "100", "--out", out)
        assert_refused(proc, f"--out {out}: not writable: making a directory in /proc failed (",
                       "give an --out in a directory you can write to")
        assert "free" not in proc.stderr and "Collector" not in proc.stderr  # no disk size, nothing started
    # a file on the way: cannot write there either, and nothing is left beside it
    (tmp_path / "afile").write_text("keep me")
    proc = run_main("collect", "--env", "CartPole-v1", "--workers", "0", "--frames", "100",
                    "--out", str(tmp_path / "afile" / "new" / "frames"))
    assert_refused(proc, f"--out {tmp_path / 'afile' / 'new' / 'frames'}: cannot write there: "
                         f"{tmp_path / 'afile'} is a file, not a directory")
    assert [p.name for p in tmp_path.iterdir()] == ["afile"] and (tmp_path / "afile").read_text() == "keep me"
    # inside a directory this user may not enter (another user's, mode 700): the system says
    # EACCES to any look inside it, as it is made to here (root enters any directory)
    locked = tmp_path / "locked"
    locked.mkdir()
    real = {name: getattr(os, name) for name in ("stat", "lstat", "mkdir")}

    def denied(name):
        def call(path, *args, **kwargs):
            if os.fspath(path).startswith(f"{locked}{os.sep}"):
                raise PermissionError(13, "Permission denied", os.fspath(path))
            return real[name](path, *args, **kwargs)
        return call

    with pytest.MonkeyPatch.context() as patch:
        for name in real:
            patch.setattr(os, name, denied(name))
        proc = run_main("collect", "--env", "CartPole-v1", "--workers", "0", "--frames", "100",
                        "--out", str(locked / "frames"))
    assert_refused(proc, f"--out {locked / 'frames'}: not writable: ", "Permission denied",
                   "give an --out in a directory you can write to")
    locked.rmdir()
    # where it can write, the check leaves nothing behind
    proc = run_main("collect", "--env", "CartPole-v1", "--workers", "0", "--envs-per-worker", "2", "--frames", "100",
                    "--out", str(tmp_path / "new" / "frames"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "new"]
    assert [p.name for p in (tmp_path / "new").iterdir()] == ["frames"]

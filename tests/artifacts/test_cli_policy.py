"""``aiocollect collect`` with a trained policy (issue 35, item 1): ``--policy`` as TorchScript,
a ``torch.export`` program, a state dict with ``--policy-factory``, or ``module:callable``;
``--env-kwargs``; ``--policy-device``; the evaluation summary; the frames asked against those
collected; one clock for the progress bar and the summary.

The policies are real modules saved in the test. Most act by a fixed rule of the observation
(push the cart the way the pole falls: ``theta + theta_dot > 0``), so a test can read the saved
frames and check that every action is the policy's, not a random one. The end-to-end test
trains the PPO example for a few seconds and collects with what it saved, through the console
script.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import statistics
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from tensordict import TensorDict

from support.cli import run, run_main

POLICIES = '''
import torch
import torch.nn as nn


class Rule(nn.Module):
    """theta + theta_dot > 0, as logits (returned with the action: an actor-critic's tuple)."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(4, 2)

    def forward(self, observation):
        logits = self.head(observation)
        return logits.argmax(-1), logits


def make_rule():
    return lambda observation: (observation[:, 2] + observation[:, 3] > 0).long()


def not_a_module():
    return 42


def raises():
    raise RuntimeError("no weights server")
'''


class Rule(nn.Module):
    """The rule, scriptable and exportable."""

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return (observation[:, 2] + observation[:, 3] > 0).long()


def rule_state_dict() -> dict:
    """The weights that make ``policies.Rule`` act by the rule (its own init would not)."""
    head = nn.Linear(4, 2)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[0.0, 0, 0, 0], [0, 0, 1, 1]]))
        head.bias.zero_()
    return {f"head.{k}": v for k, v in head.state_dict().items()}


@pytest.fixture(autouse=True)
def torch_threads():
    """``--policy-threads`` sets torch's threads of the process that runs ``main()``: this one."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def policies(tmp_path, monkeypatch) -> Path:
    """``policies.py`` importable (as from the current directory), and the rule saved three
    ways: ``rule.pt`` (TorchScript), ``rule_state.pt`` (a state dict of ``policies:Rule``),
    ``rule_fixed.pt2`` (a torch.export program with a fixed batch of 2)."""
    (tmp_path / "policies.py").write_text(POLICIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    torch.jit.script(Rule()).save(str(tmp_path / "rule.pt"))
    torch.save(rule_state_dict(), tmp_path / "rule_state.pt")
    return tmp_path


def assert_acts_by_the_rule(out: Path) -> TensorDict:
    data = TensorDict.load_memmap(out)
    obs = data["observation"]
    assert torch.equal(data["action"], (obs[..., 2] + obs[..., 3] > 0).long())
    return data


def episodes_of(data: TensorDict) -> tuple[list[float], list[int]]:
    """Return and length of every episode that finished in a saved ``[..., envs, time]`` run."""
    reward = data["next", "reward"].reshape(-1, data.shape[-1])
    done = data["next", "done"].reshape(-1, data.shape[-1])
    returns, lengths = [], []
    for r, d in zip(reward, done):
        start = 0
        for t in d.nonzero().flatten().tolist():
            returns.append(float(r[start:t + 1].sum()))
            lengths.append(t + 1 - start)
            start = t + 1
    return returns, lengths


def evaluation(stdout: str) -> dict:
    """The numbers of the evaluation summary."""
    n = re.search(r"^episodes: ([\d,]+) finished", stdout, re.M)
    ret = re.search(r"^  return: mean ([\d.-]+), std ([\d.]+), min ([\d.-]+), max ([\d.-]+)$", stdout, re.M)
    length = re.search(r"^  length: mean ([\d.]+), min ([\d,]+), max ([\d,]+) steps$", stdout, re.M)
    assert n and ret and length, stdout
    return {"episodes": int(n[1].replace(",", "")), "mean": float(ret[1]), "std": float(ret[2]),
            "min": float(ret[3]), "max": float(ret[4]), "length_mean": float(length[1]),
            "length_min": int(length[2].replace(",", "")), "length_max": int(length[3].replace(",", ""))}


def test_a_torchscript_policy_acts_and_the_evaluation_matches_the_saved_episodes(policies):
    proc = run_main("collect", "--env", "CartPole-v1", "--policy", "rule.pt", "--workers", "0",
                    "--envs-per-worker", "4", "--frames", "4000", "--out", "o")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "policy: rule.pt (TorchScript)" in proc.stdout
    data = assert_acts_by_the_rule(policies / "o")
    returns, lengths = episodes_of(data)
    summary = evaluation(proc.stdout)
    assert summary["episodes"] == len(returns) > 0
    assert summary["mean"] == pytest.approx(statistics.fmean(returns), abs=0.005)
    assert summary["std"] == pytest.approx(statistics.pstdev(returns), abs=0.005)
    assert (summary["min"], summary["max"]) == (min(returns), max(returns))
    assert (summary["length_min"], summary["length_max"]) == (min(lengths), max(lengths))
    assert summary["mean"] > 30  # the rule balances the pole far longer than random actions (about 22)
    running = re.search(r"\(([\d,]+) still running at the end, not counted\)", proc.stdout)
    assert running and 0 < int(running[1]) <= 4
    assert "frames: 4,000 collected, as asked" in proc.stdout
    assert json.loads((policies / "o" / "aiocollect.json").read_text())["policy"] == "rule.pt (TorchScript)"


def test_an_exported_program_and_env_kwargs_in_worker_processes(policies):
    """A ``torch.export`` program (``.pt2``) acts in a ``MultiSyncCollector``, and
    ``--env-kwargs`` reaches ``gymnasium.make`` in every worker: episodes end at 30 steps."""
    batch = torch.export.Dim("batch")
    program = torch.export.export(Rule(), (torch.zeros(2, 4),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(policies / "rule.pt2"))
    proc = run_main("collect", "--env", "CartPole-v1", "--env-kwargs", '{"max_episode_steps": 30}',
                    "--policy", "rule.pt2", "--policy-device", "cpu", "--workers", "2", "--envs-per-worker", "2",
                    "--frames", "800", "--out", "o")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "policy: rule.pt2 (torch.export), on cpu" in proc.stdout
    data = assert_acts_by_the_rule(policies / "o")
    assert data.shape == (2, 2, 200)
    summary = evaluation(proc.stdout)
    assert summary["length_max"] == 30 and summary["episodes"] >= 4 * (200 // 30)
    assert json.loads((policies / "o" / "aiocollect.json").read_text())["env_kwargs"] == {"max_episode_steps": 30}


def test_a_state_dict_loads_into_the_module_of_policy_factory(policies):
    """``policies:Rule`` initialised at random acts by the rule only with the saved weights in;
    it returns ``(action, logits)``, and the first element is the action."""
    proc = run_main("collect", "--env", "CartPole-v1", "--policy", "rule_state.pt", "--policy-factory",
                    "policies:Rule", "--workers", "1", "--envs-per-worker", "3", "--frames", "600", "--out", "o")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "policy: rule_state.pt (state dict, into policies:Rule())" in proc.stdout
    assert_acts_by_the_rule(policies / "o")


def test_module_callable_alone_returns_the_policy(policies):
    proc = run_main("collect", "--env", "CartPole-v1", "--policy", "policies:make_rule", "--workers", "0",
                    "--envs-per-worker", "2", "--frames", "400", "--out", "o")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "policy: policies:make_rule()" in proc.stdout
    assert_acts_by_the_rule(policies / "o")


def rate(text: str) -> float:
    value, kilo = re.fullmatch(r"([\d.]+)(k?)", text).groups()
    return float(value) * (1000 if kilo else 1)


def test_the_frames_asked_and_collected_and_one_clock_for_bar_and_summary(tmp_path):
    proc = run_main("collect", "--env", "CartPole-v1", "--workers", "0", "--envs-per-worker", "2", "--frames", "250",
                    "--frames-per-batch", "100", "--out", str(tmp_path / "a"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("frames: 300 collected, 250 asked: rounded up to 3 whole batches of 100 frames (--frames-per-batch)"
            in proc.stdout), proc.stdout
    assert TensorDict.load_memmap(tmp_path / "a").numel() == 300
    proc = run_main("collect", "--env", "CartPole-v1", "--workers", "1", "--envs-per-worker", "16", "--frames",
                    "20000", "--out", str(tmp_path / "b"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("frames: 20,800 collected, 20,000 asked: rounded up to 13 whole batches of 1,600 frames "
            "(100 steps of each of 16 envs; --frames-per-batch sets it)") in proc.stdout, proc.stdout
    summary = re.search(r"in ([\d.]+) s: ([\d,]+) frames/s \(the progress bar's clock, from the first batch asked "
                        r"for; the ([\d.]+) s of start-up before it not counted\)", proc.stdout)
    assert summary, proc.stdout
    bar = re.findall(r"20\.8k/20\.8k \[[^,]+, ([\d.]+k?)frames/s", proc.stderr)  # the bar's last state
    assert bar, proc.stderr[-2000:]
    # the same frames over the same clock: equal to the bar's rounding (3 significant digits)
    assert rate(bar[-1]) == pytest.approx(float(summary[2].replace(",", "")), rel=0.01)


@pytest.mark.timeout(240)  # the shared training run may start in this test
@pytest.mark.xdist_group("ppo-cartpole")
def test_the_ppo_example_saves_a_policy_that_the_console_script_evaluates(trained_ppo_cartpole, tmp_path):
    """End to end, as the docs show it: train the PPO example briefly, ``--save`` its actor,
    and collect with it through the ``aiocollect`` command, all options of the policy given.
    (The training run, ``ppo_cartpole.py --frames 6144 --save PATH``, is the conftest's
    ``trained_ppo_cartpole``: ``test_examples`` checks its output too.)"""
    train, trained = trained_ppo_cartpole
    assert train.returncode == 0, train.stderr[-3000:]
    assert f"saved the actor to {trained}" in train.stdout
    proc = run("collect", "--env", "CartPole-v1", "--policy", str(trained), "--policy-device", "cpu",
               "--policy-threads", "1", "--env-kwargs", '{"max_episode_steps": 100}', "--workers", "1",
               "--envs-per-worker", "4", "--frames", "2000", "--out", str(tmp_path / "eval"), timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"policy: {trained} (torch.export), on cpu" in proc.stdout
    summary = evaluation(proc.stdout)
    assert summary["episodes"] > 0 and summary["length_max"] <= 100
    assert "frames: 2,000 collected, as asked" in proc.stdout
    data = TensorDict.load_memmap(tmp_path / "eval")
    assert data.shape == (1, 4, 500) and set(data["action"].unique().tolist()) <= {0, 1}


def assert_one_line_error(proc: subprocess.CompletedProcess, expected: str) -> None:
    assert proc.returncode == 2, (proc.args, proc.stderr[-3000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aiocollect: error:") and expected in lines[0], (proc.args, lines)
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_bad_policy_and_env_options_are_one_line_and_exit_code_2(policies):
    class Wrong(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(3, 2)  # CartPole observations have 4 numbers

        def forward(self, observation: torch.Tensor) -> torch.Tensor:
            return self.head(observation).argmax(-1)

    torch.jit.script(Wrong()).save("wrong.pt")

    class Logits(nn.Module):  # its logits, not an action: read as TorchRL reads one-hot rows, they stepped 0
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(4, 2)

        def forward(self, observation: torch.Tensor) -> torch.Tensor:
            return self.head(observation)

    torch.jit.script(Logits()).save("logits.pt")
    torch.save(nn.Linear(4, 2), "whole.pt")  # a pickled module, not unpickled
    torch.save({"model": rule_state_dict(), "step": 3}, "checkpoint.pt")
    torch.save({"head.weight": torch.zeros(2, 4)}, "partial.pt")
    torch.save({"head.weight": torch.zeros(3, 4), "head.bias": torch.zeros(3)}, "misshapen.pt")
    Path("notes.pt").write_text("not a tensor file")
    Path("adir").mkdir()
    fixed = torch.export.export(Rule(), (torch.zeros(2, 4),))  # a batch of exactly 2 envs
    torch.export.save(fixed, "fixed.pt2")
    collect = ("collect", "--env", "CartPole-v1", "--workers", "0", "--envs-per-worker", "2", "--frames", "100",
               "--out", "o")
    cases = [
        (["--policy", "nope.pt"], "--policy nope.pt: no such file; give a TorchScript file"),
        (["--policy", "adir"], "--policy adir: is a directory"),
        (["--policy", "rule_state.pt"], "is a state dict (2 tensors), which needs the module it is loaded into: "
                                        "pass --policy-factory module:callable"),
        (["--policy", "whole.pt"], "holds pickled Python objects, not only tensors (torch.save(module)?), and is "
                                   "refused for safety"),
        (["--policy", "checkpoint.pt"], "holds a dict whose entries are not all tensors (keys 'model', 'step')"),
        (["--policy", "notes.pt"], "--policy notes.pt: is not a file torch can read"),
        (["--policy", "rule.pt", "--policy-factory", "policies:Rule"], "is a TorchScript module, loaded whole, "
                                                                       "and --policy-factory is only for a state dict"),
        (["--policy", "partial.pt", "--policy-factory", "policies:Rule"], "(missing head.bias)"),
        (["--policy", "misshapen.pt", "--policy-factory", "policies:Rule"], "does not fit the module of "
                                                                            "--policy-factory policies:Rule"),
        (["--policy", "rule_state.pt", "--policy-factory", "no_such_module:Rule"], "cannot import 'no_such_module'"),
        (["--policy", "rule_state.pt", "--policy-factory", "policies:Nope"], "'policies' has no 'Nope'"),
        (["--policy", "rule_state.pt", "--policy-factory", "policies"], "give module:callable"),
        (["--policy", "rule_state.pt", "--policy-factory", "policies:not_a_module"], "returned a int"),
        (["--policy", "policies:raises"], "calling it raised RuntimeError: no weights server"),
        (["--policy", "wrong.pt"], "wrong.pt (TorchScript) cannot act on CartPole-v1: RuntimeError: mat1 and mat2 "
                                   "shapes cannot be multiplied"),
        (["--policy", "fixed.pt2"], "export it with a dynamic first dim"),
        (["--policy", "logits.pt"], "logits.pt (TorchScript) cannot act on CartPole-v1: UserWarning: action: the "
                                    "policy's rows of shape [num_envs, 2] for Discrete(2) are not one-hot"),
        (["--policy-factory", "policies:Rule"], "give the state dict too: --policy PATH"),
        (["--policy-device", "cpu"], "without --policy the actions are random"),
        (["--policy", "rule.pt", "--policy-device", "gpu7"], "--policy-device 'gpu7': not a device"),
        (["--policy", "rule.pt", "--policy-threads", "0"], "--policy-threads must be >= 1"),
        (["--env-kwargs", "{max_episode_steps: 3}"], "not JSON"),
        (["--env-kwargs", "[1, 2]"], "is a JSON list, and it must be an object"),
        (["--env-kwargs", '{"no_such_option": 1}'], "with --env-kwargs {\"no_such_option\": 1}: cannot be built here: "
                                                    "TypeError"),
    ]
    if not torch.cuda.is_available():
        cases.append((["--policy", "rule.pt", "--policy-device", "cuda"], "this machine has no CUDA device"))
    for extra, expected in cases:
        assert_one_line_error(run_main(*collect, *extra), expected)
    assert not (policies / "o").exists()


class Planted:
    """Unpickled, it writes a file: a pickle that runs code (the file must never be unpickled)."""

    def __reduce__(self):
        return (Path.write_text, (Path("unpickled.txt").absolute(), "ran"))


def test_a_pickled_module_is_refused_for_safety_in_any_format(policies):
    """A file of pickled objects, in torch.save's zip format, its format before torch 1.6 or a
    bare pickle (which torch's weights-only loader refuses with advice to load it with
    weights_only=False, that is to run its code): refused as such, in one line, with the safe
    ways to give the policy; the file is never unpickled, and torch's advice never relayed."""
    module = nn.Linear(4, 2)
    torch.save(module, "whole.pt")
    torch.save(module, "legacy.pt", _use_new_zipfile_serialization=False)
    Path("module.pkl").write_bytes(pickle.dumps(module, protocol=5))  # (torch warns of the protocol)
    Path("module0.pkl").write_bytes(pickle.dumps(module, protocol=0))  # (text: read by what torch says of it)
    Path("planted.pt").write_bytes(pickle.dumps(Planted(), protocol=2))
    for name in ("module.pkl", "legacy.pt", "module0.pkl", "planted.pt", "whole.pt"):
        proc = run_main("collect", "--env", "CartPole-v1", "--workers", "0", "--frames", "100", "--out", "o",
                        "--policy", name)
        assert_one_line_error(proc, f"--policy {name}: holds pickled Python objects, not only tensors "
                                    "(torch.save(module)?), and is refused for safety: unpickling can run arbitrary "
                                    "code. Save module.state_dict() and pass --policy-factory module:callable")
        assert "torch.export.save(program, PATH.pt2)" in proc.stderr and "weights_only" not in proc.stderr
    # a file that is no pickle at all: torch's reader says why, without its advice either
    Path("notes.pt").write_text("not a tensor file")
    proc = run_main("collect", "--env", "CartPole-v1", "--workers", "0", "--frames", "100", "--out", "o",
                    "--policy", "notes.pt")
    assert_one_line_error(proc, "--policy notes.pt: is not a file torch can read (UnpicklingError: ")
    assert "weights_only" not in proc.stderr
    assert not Path("unpickled.txt").exists() and not Path("o").exists()


def test_policy_threads_beyond_the_cpus_are_refused_before_anything_starts(policies):
    """``--policy-threads`` above the machine's CPUs (``os.cpu_count()``: more threads only wait
    for one another; 100000 would have torch start them all) is refused in one line that gives
    the bound, by both commands, before any worker starts and before torch's threads change."""
    cpus = os.cpu_count()
    threads = torch.get_num_threads()
    for value in (cpus + 1, 100000):
        expected = (f"--policy-threads {value}: more than the {cpus} CPUs of this machine; give at most {cpus} "
                    "(default 1, leaving the other cores to the env workers)")
        proc = run_main("collect", "--env", "CartPole-v1", "--workers", "2", "--envs-per-worker", "2", "--frames",
                        "100", "--out", "o", "--policy", "rule.pt", "--policy-threads", str(value))
        assert_one_line_error(proc, expected)
        proc = run_main("tune", "--env", "CartPole-v1", "--workers", "1", "--envs-per-worker", "2", "--seconds", "1",
                        "--policy", "rule.pt", "--policy-threads", str(value))
        assert_one_line_error(proc, expected)
        assert torch.get_num_threads() == threads
    assert not Path("o").exists()

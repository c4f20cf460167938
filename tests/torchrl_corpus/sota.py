"""TorchRL's sota-implementations in the corpus, **as TorchRL ships them**: the folders under
``programs/sota/`` hold the scripts, their utils and their hydra configs byte for byte as in
pytorch/rl at ``TORCHRL_COMMIT`` (``BLOBS`` has their git blob ids; a test checks them).
Porting changes their ``from torchrl.collectors import`` lines only, as for every program.

What the corpus adds lives here, outside the scripts:

* **hydra overrides** (``Sota.overrides``) on the command line, as a user shrinks a run:
  CI-sized frames and networks, and ``logger.backend=csv`` so that the script's own metrics
  lines run (TorchRL's ``CSVLogger`` calls ``float()`` on every value, as the issue that
  added these found) and leave the figures the criterion reads;
* **a launcher** (``python sota.py NAME FOLDER``, run by ``corpus.run`` in a fresh
  interpreter): it seeds torch, numpy and ``random`` (``--seed``, default 0: the DQN script
  seeds nothing itself), runs the entry script with ``runpy`` as ``python script.py
  overrides...`` would (hydra reads ``sys.argv``; its run directory is ``run/`` of the
  working directory), then reads the CSV scalars the script logged and prints the
  ``RESULT {json}`` line every corpus program ends with: the collector module the script's
  modules bound, ``learned`` by the program's criterion, and the figures it used.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOTA = HERE / "programs" / "sota"

TORCHRL_COMMIT = "6e18e35b2c68be1a56afebfb0676d217925114cd"
"""pytorch/rl's "[Versioning] Bump 0.14.0": the sota folders below are unchanged from there to
the 0.14.x releases (torchrl 0.14.1 is what the venv holds)."""

BLOBS = {
    "dqn/dqn_cartpole.py": "08d237d9577679da2d75f76749909637a1a088a5",
    "dqn/utils_cartpole.py": "11c966a9adac9fa83bdde1de642efe9582d4f308",
    "dqn/config_cartpole.yaml": "399f7929de19d0422dd87a35ba052c5f2b21f259",
    "sac/sac.py": "7e25324c8a030de0c7e6ece83061c7985d5bae9c",
    "sac/sac-async.py": "56b970f14212b5c257d31286321994daf8c79dc7",
    "sac/utils.py": "0fb2702d46c5dec1ef8eee5ceb9e2bb49d785dbc",
    "sac/config.yaml": "9389b53fc56b0a3c1d8c6226521896b0db50cae6",
    "sac/config-async.yaml": "5fc8d2f3a307e64291f8ab0e3b7d7d7fd839688f",
    "ppo/ppo_mujoco.py": "b7a33bd98a194b32e6bf3ed10e15b4811eef5a9a",
    "ppo/utils_mujoco.py": "c6029638abf7d538ad30f2647725caf22bad45ec",
    "ppo/config_mujoco.yaml": "854ce7fb3f011dc1f2cd7ebb391d48ea1c0b5828",
}
"""Each file's git blob id in pytorch/rl at ``TORCHRL_COMMIT`` (``git hash-object FILE``)."""

Scalars = dict[str, list[float]]
"""What the script logged: each CSV scalar's values in step order (``"train/reward"``...)."""


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _dqn(s: Scalars) -> dict:
    # each train/episode_length is the mean length of the episodes that ended in one batch
    lengths = s.get("train/episode_length", [])
    first, last = _mean(lengths[:10]), _mean(lengths[-10:])
    return {"learned": last is not None and last >= 60, "first10_mean_length": first,
            "last10_mean_length": last, "eval_reward": s.get("eval/reward")}


def _sac(s: Scalars) -> dict:
    # batches of 200 frames of one Pendulum env: each logs the return of the episode it ends
    rewards = s.get("train/reward", [])
    first, last = _mean(rewards[:2]), _mean(rewards[-2:])
    gain = None if first is None or last is None else last - first
    return {"learned": gain is not None and gain >= 400, "first2_mean_return": first,
            "last2_mean_return": last, "gain": gain, "returns": rewards, "eval_reward": s.get("eval/reward")}


def _does_not_train(s: Scalars) -> dict:
    return {"learned": None, "train_reward": s.get("train/reward"), "eval_reward": s.get("eval/reward")}


@dataclass(frozen=True)
class Sota:
    """One sota script of the corpus."""

    folder: str
    """Its folder under ``programs/sota/`` (TorchRL's ``sota-implementations/<folder>``)."""
    entry: str
    """The script run, in that folder."""
    overrides: tuple[str, ...]
    """Hydra overrides: the CI-sized run."""
    criterion: Callable[[Scalars], dict]
    """The logged scalars -> ``{"learned": bool | None, figures...}``."""
    needs_cuda_devices: int = 0
    """CUDA devices the script needs (it runs nowhere with fewer: skipped, with the reason)."""
    skip_reason: str = field(default="")
    """Why it cannot run here even then (empty: it runs)."""
    setup: Callable[[], None] | None = None
    """Run by the launcher before the script (in its process): what a user's own launcher
    would do, e.g. register an env id the config then names."""


def register_low_gravity_pendulum() -> None:
    """``PendulumG2-v1``: gymnasium's Pendulum at gravity 2.0 (``g``, a keyword of the env),
    200 steps an episode like ``Pendulum-v1``. SAC swings it up in a few hundred updates
    where Pendulum at gravity 10 takes ~2,600 (tens of seconds more of a 2-core CI)."""
    import gymnasium

    gymnasium.register("PendulumG2-v1", entry_point="gymnasium.envs.classic_control.pendulum:PendulumEnv",
                       max_episode_steps=200, kwargs={"g": 2.0})


PROGRAMS = {
    "sota_dqn_cartpole": Sota(
        "dqn", "dqn_cartpole.py",
        ("collector.total_frames=3000", "collector.frames_per_batch=50", "collector.init_random_frames=300",
         "collector.annealing_frames=1000", "buffer.buffer_size=3000", "loss.num_updates=10",
         "loss.hard_update_freq=20", "optim.lr=2e-3", "logger.backend=csv", "logger.test_interval=2950",
         "logger.num_test_episodes=2"),
        _dqn),
    "sota_sac": Sota(
        "sac", "sac.py",
        ("env.name=PendulumG2-v1", "env.max_episode_steps=200", "collector.total_frames=1600",
         "collector.init_random_frames=400", "collector.frames_per_batch=200", "collector.env_per_collector=1",
         "collector.device=cpu", "optim.batch_size=128", "optim.lr=1e-2", "optim.alpha_init=0.1",
         "network.hidden_sizes=[64,64]", "network.device=cpu", "logger.backend=csv", "logger.eval_iter=1600"),
        _sac, setup=register_low_gravity_pendulum),
    "sota_sac_async": Sota(
        "sac", "sac-async.py",
        ("env.name=Pendulum-v1", "env.max_episode_steps=200", "collector.init_random_frames=1000",
         "collector.frames_per_batch=200", "collector.env_per_collector=2", "optim.batch_size=128",
         "network.hidden_sizes=[64,64]", "logger.backend=csv", "logger.log_freq=1000", "compile.compile=true"),
        _does_not_train, needs_cuda_devices=2,
        skip_reason="it makes its exploration policy on cuda:1 and runs 1,000,000 updates (both hard-coded), "
                    "and names compile_mode_collector only under compile.compile=true"),
    "sota_ppo_mujoco": Sota(
        "ppo", "ppo_mujoco.py",
        # two batches (the second collected with the weights the first trained), two epochs, one eval at the end
        ("env.env_name=Pendulum-v1", "collector.frames_per_batch=1024", "collector.total_frames=2048",
         "loss.ppo_epochs=2", "loss.mini_batch_size=128", "logger.backend=csv", "logger.test_interval=2048",
         "logger.num_test_episodes=1", "optim.device=cpu"),
        _does_not_train),
}


def skip_reason(program: Sota) -> str:
    """Why ``program`` cannot run on this machine ("" if it can)."""
    if program.needs_cuda_devices:
        import torch

        if torch.cuda.device_count() < program.needs_cuda_devices:
            why = f"needs {program.needs_cuda_devices} CUDA devices, this machine has {torch.cuda.device_count()}"
            return why + (f"; {program.skip_reason}" if program.skip_reason else "")
    return program.skip_reason


def read_scalars(run_dir: Path) -> Scalars:
    """The CSV logger's scalars under ``run_dir`` (``.../scalars/<group>/<name>.csv``, lines
    ``step,value``), each in step order."""
    out: Scalars = {}
    for path in sorted(run_dir.glob("**/scalars/**/*.csv")):
        name = path.relative_to(next(p for p in path.parents if p.name == "scalars")).with_suffix("").as_posix()
        with path.open() as f:
            rows = sorted((float(step), float(value)) for step, value in csv.reader(f))
        out[name] = [value for _, value in rows]
    return out


def _collector_modules(folder: Path, entry_globals: dict) -> list[str]:
    """The modules of the collector classes that the program's modules bound (its entry
    script's globals and the modules imported from its folder), ``Collector``'s first."""
    namespaces = [entry_globals]
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if file and Path(file).resolve().parent == folder:
            namespaces.append(vars(module))
    found = {}
    for ns in namespaces:
        for name, value in ns.items():
            if isinstance(value, type) and name.endswith("Collector"):
                found[value.__module__] = min(found.get(value.__module__, name), name, key=lambda n: n != "Collector")
    return sorted(found, key=lambda module: (found[module] != "Collector", module))


def main(argv: list[str]) -> int:
    """``python sota.py NAME FOLDER [--seed N] [hydra overrides...]``: run program ``NAME``
    from ``FOLDER`` (a copy of its folder, ported or not) with its overrides (then the ones
    given), in the current directory."""
    import random
    import runpy

    import numpy as np
    import torch

    name, folder, *rest = argv
    seed = 0
    if rest[:1] == ["--seed"]:
        seed, rest = int(rest[1]), rest[2:]
    program = PROGRAMS[name]
    folder_path = Path(folder).resolve()
    run_dir = Path.cwd() / "run"
    if program.setup is not None:
        program.setup()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    script = folder_path / program.entry
    sys.argv = [str(script), *program.overrides, *rest, f"hydra.run.dir={run_dir}"]
    sys.path.insert(0, str(folder_path))
    try:
        entry_globals = runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:  # hydra exits with 1 after printing the script's error
        if e.code not in (None, 0):
            raise
        entry_globals = {}
    modules = _collector_modules(folder_path, entry_globals)
    packages = {m.split(".")[0] for m in modules}
    scalars = read_scalars(run_dir)
    result = {"collector": modules[0] if len(packages) == 1 else f"mixed: {modules}", **program.criterion(scalars)}
    result = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in result.items()}
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

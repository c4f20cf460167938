"""The command line: ``aiocollect collect``, ``aiocollect tune`` and ``aiocollect bench``, their
options and help. A mistake argparse finds (an unknown option, a value of the wrong type) is
one line on stderr and exit code 2, as the commands' own checks are (see ``errors``), never a
usage dump.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .bench import BENCHMARKS


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage dump
        print(f"aiocollect: error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    """The ``aiocollect`` parser: one sub-command, its name in ``args.command``."""
    parser = _Parser(prog="aiocollect", description="Fast RL experience collection.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    c = sub.add_parser("collect", help="collect from a gymnasium env, with random actions or a --policy, "
                                       "save the frames and print an evaluation summary")
    _add_env_and_policy(c)
    c.add_argument("--workers", type=int, default=2, help="env worker processes (0: envs in this process)")
    c.add_argument("--envs-per-worker", type=int, default=8, help="envs stepped by each worker")
    c.add_argument("--frames", type=int, default=20_000, help="frames to collect (rounded up to whole batches)")
    c.add_argument("--frames-per-batch", type=int, default=None,
                   help="frames per batch (default: 100 steps of every env)")
    c.add_argument("--max-frames-per-traj", type=int, default=None, help="truncate episodes after this many steps")
    c.add_argument("--seed", type=int, default=0, help="env k is seeded with seed + k")
    c.add_argument("--out", required=True, help="directory for the memory-mapped TensorDict")
    c.add_argument("--overwrite", action="store_true", help="replace what is in --out")
    t = sub.add_parser("tune", help="measure a few splits of workers x envs per worker here and print the best")
    _add_env_and_policy(t)
    t.add_argument("--seconds", type=float, default=30.0,
                   help="about how long the whole measurement takes, start-ups included (default 30); splits left "
                        "unmeasured when it runs out are listed, with the --seconds that would measure them all")
    t.add_argument("--workers", metavar="N,N,...", type=int_list, default=None,
                   help="worker counts to try (default: 0, 1, half the cores, cores - 1 and the cores)")
    t.add_argument("--envs-per-worker", metavar="K,K,...", type=int_list, default=None,
                   help="envs per worker to try (default: 8,32)")
    t.add_argument("--frames-per-batch", type=int, default=None,
                   help="frames per batch (default: 100 steps of every env, as aiocollect collect)")
    b = sub.add_parser("bench", help="run the comparison benchmarks of a source checkout")
    b.add_argument("--quick", action="store_true",
                   help="smoke runs (seconds each) instead of full runs: every row runs, its figures are rough")
    b.add_argument("--only", choices=[name[len("bench_"):-3] for name in BENCHMARKS], action="append",
                   help="run only this benchmark (repeatable)")
    b.add_argument("--results", metavar="DIR", type=Path,
                   help="keep the results as DIR/NAME.json and draw the chart DIR/benchmarks.png")
    return parser


def _add_env_and_policy(parser: argparse.ArgumentParser) -> None:
    """The options of the env and the policy, the same for ``collect`` and ``tune``."""
    parser.add_argument("--env", required=True,
                        help="a gymnasium env id, e.g. CartPole-v1 (or module:EnvId, importing module first: "
                             "from the current directory, PYTHONPATH or the installed packages)")
    parser.add_argument("--env-kwargs", metavar="JSON", default=None,
                        help="keyword arguments of gymnasium.make, as a JSON object, e.g. "
                             "'{\"max_episode_steps\": 200}'")
    parser.add_argument("--policy", metavar="PATH", default=None,
                        help="act with this policy instead of random actions: a TorchScript file "
                             "(torch.jit.save), a torch.export program (torch.export.save, .pt2), a state dict "
                             "(torch.save(module.state_dict())) with --policy-factory, or module:callable, "
                             "a function that returns the policy")
    parser.add_argument("--policy-factory", metavar="MODULE:CALLABLE", default=None,
                        help="builds the module a --policy state dict is loaded into (called with no arguments)")
    parser.add_argument("--policy-device", metavar="DEVICE", default=None,
                        help="where the policy runs, e.g. cpu or cuda:0 (default: where its tensors are)")
    parser.add_argument("--policy-threads", metavar="N", type=int, default=1,
                        help="torch's threads for the policy's calls (torch.set_num_threads; default 1, leaving "
                             "the other cores to the env workers)")


def int_list(text: str) -> list[int]:
    """``"1,2,4"`` as ``[1, 2, 4]`` (an argparse type: a ``ValueError`` is its one-line error)."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of whole numbers, e.g. 1,2") from None
    if not values:
        raise argparse.ArgumentTypeError(f"{text!r} names no number, e.g. 1,2")
    return values

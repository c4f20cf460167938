"""The ``aiocollect`` command (the console script, and ``python -m aiocollect``): ``main``.

Its three commands, each in a module of its own:

- ``aiocollect collect`` (``collect``): collect from a gymnasium env, with random actions or a
  trained ``--policy``, save every frame as a memory-mapped TensorDict, print an evaluation.
- ``aiocollect tune`` (``tune``): measure a few splits of workers x envs per worker here
  (``aiocollect._tune.tune``) and print the best, with the ``aiocollect collect`` command to use.
- ``aiocollect bench`` (``bench``): run the comparison benchmarks of a source checkout.

What they share: the command line (``parser``); loading and checking ``--env`` (``env_loading``)
and ``--policy`` (``policy_loading``, ``policy_wrapper``, ``policy_options``), importing the
user's modules (``user_code``), one step in this process before any worker starts
(``probes``), sizes that must fit (``sizes``), and ``--out`` (``out_dir``). A mistake of the
user's ends a command before any worker starts with one line on stderr and exit code 2, never
a traceback (``errors``).
"""

from __future__ import annotations

import sys

from .errors import UsageError, one_line
from .parser import build_parser


def main(argv: list[str] | None = None) -> int:
    """``aiocollect ARGV`` (``sys.argv[1:]`` by default): the command's exit code; 2 for a
    mistake of the user's (``UsageError``), or an env that raised in a worker, each reported in
    one line; 130 for Ctrl-C."""
    from .._errors import EnvError

    args = build_parser().parse_args(argv)
    try:
        return _command(args.command)(args)
    except UsageError as exc:
        print(f"aiocollect: error: {exc}", file=sys.stderr)
        return 2
    except EnvError as exc:  # an env that raised in a worker, past the checks (one env, in this process)
        print(f"aiocollect: error: --env {args.env!r}: {one_line(exc)}; fix the env", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("aiocollect: interrupted", file=sys.stderr)
        return 130


def _command(name: str):
    """The ``run`` function of the command ``name``."""
    from . import bench, collect, tune

    return {"collect": collect.run, "tune": tune.run, "bench": bench.run}[name]

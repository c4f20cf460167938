"""The ``aiocollect`` command.

``aiocollect collect --env CartPole-v1 --workers 2 --frames 20000 --out DIR`` collects with
random actions, or with a trained ``--policy`` (a TorchScript file, a ``torch.export``
program, a state dict with ``--policy-factory module:callable``, or ``module:callable``:
``_load_policy``), with a progress bar, saves every frame under ``DIR`` as a memory-mapped
TensorDict (``TensorDict.load_memmap(DIR)`` reads it back: ``[workers, envs, time]``, or
``[envs, time]`` with ``--workers 0``), and prints a summary: the frames asked and collected,
frames/s on the progress bar's clock (from the first batch asked for to the last; the
start-up before it is reported apart), and an evaluation of the episodes that finished
(return mean and std, lengths). The save is written beside
``DIR`` and renamed to it once complete, so ``DIR`` is never half-written, and ``--overwrite``
replaces only an earlier save that its ``aiocollect.json`` proves to be one (see ``_dataset``).

``aiocollect tune --env ID [--policy ...]`` measures a few splits of workers x envs per worker
on this machine (``aiocollect._tune.tune``) and prints the best, with the command to use.

``aiocollect bench`` runs the comparison benchmarks of a source checkout
(``benchmarks/*.py``), the engine's first (its headline: CartPole with an MLP policy that reads
the observation, against TorchRL), and prints their tables; with ``--results DIR`` it also keeps each
one's JSON in ``DIR`` and draws them side by side in ``DIR/benchmarks.png``
(``benchmarks/chart.py``, needs matplotlib). A script that needs a package not installed here
(``bench_weights.py`` jax, ``bench_ray.py`` ray) prints which and how to install it and is
skipped, which is no failure (exit code 0 if nothing else failed); one that fails shows the end
of its stderr. ``--quick`` figures are rough: no goal is judged on them.

A bad env id, ``--env-kwargs`` or option, a ``--policy`` that cannot be loaded or cannot act
on the env, an env module (``--env module:EnvId``) that cannot be imported or raises
on import, an env whose first reset or step raises (one env, stepped in this process), an
``--out`` that cannot safely be written, or a size that cannot fit (``--frames`` on
the disk, ``--frames-per-batch`` in memory) ends the command before any worker starts, with one
line on stderr and exit code 2, never a traceback; an env that raises later, in a worker, ends
it the same way (``_env_error``: the env's exception and the line that raised it).

``--env module:EnvId`` finds ``module`` in the current directory whether the command runs as
``aiocollect`` or as ``python -m aiocollect`` (``_search_current_directory``).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCHMARKS = ("bench_engine.py", "bench_collect.py", "bench_workers.py", "bench_weights.py", "bench_coroutines.py",
              "bench_ray.py")


BENCH_MISSING_EXTRA = 3
"""A benchmark script's exit code when a package it needs is not installed
(``benchmarks/_common.py``'s ``MISSING_EXTRA``): the section is skipped, not failed."""


class UsageError(Exception):
    """A mistake of the user's: reported in one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage dump
        print(f"aiocollect: error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


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


def _parser() -> argparse.ArgumentParser:
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
    t.add_argument("--workers", metavar="N,N,...", type=_int_list, default=None,
                   help="worker counts to try (default: 0, 1, half the cores, cores - 1 and the cores)")
    t.add_argument("--envs-per-worker", metavar="K,K,...", type=_int_list, default=None,
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


def _int_list(text: str) -> list[int]:
    """``"1,2,4"`` as ``[1, 2, 4]`` (an argparse type: a ``ValueError`` is its one-line error)."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of whole numbers, e.g. 1,2") from None
    if not values:
        raise argparse.ArgumentTypeError(f"{text!r} names no number, e.g. 1,2")
    return values


@dataclass(frozen=True)
class _Plan:
    """What ``aiocollect collect`` will do, worked out and checked before anything starts."""

    target: Path
    """``--out``, resolved: where the save is renamed to once it is complete."""
    num_envs: int
    frames_per_batch: int
    num_batches: int
    policy: Any
    """What ``--policy`` loaded (``None``: random actions)."""
    policy_what: str
    """The policy, in words, for the summary and the save's record."""
    policy_device: Any


def _size(nbytes: float) -> str:
    for unit in ("bytes", "kB", "MB", "GB", "TB", "PB"):
        if nbytes < 1000 or unit == "PB":
            return f"{nbytes:,.0f} {unit}" if unit == "bytes" else f"{nbytes:,.1f} {unit}"
        nbytes /= 1000
    raise AssertionError  # unreachable


def _free_disk(path: Path) -> int:
    """Free bytes on the disk that holds ``path`` (or would: its nearest existing ancestor)."""
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def _env_kwargs(args: argparse.Namespace) -> dict:
    """``--env-kwargs``, a JSON object, as a dict (``{}`` without it)."""
    if args.env_kwargs is None:
        return {}
    import json

    try:
        kwargs = json.loads(args.env_kwargs)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--env-kwargs {args.env_kwargs!r}: not JSON ({exc}); give an object, e.g. "
                         """--env-kwargs '{"max_episode_steps": 200}' (keys and strings in double quotes)""") from None
    if not isinstance(kwargs, dict):
        raise UsageError(f"--env-kwargs {args.env_kwargs!r}: is a JSON {type(kwargs).__name__}, and it must be an "
                         """object of keyword arguments of gymnasium.make, e.g. '{"max_episode_steps": 200}'""")
    return kwargs


def _env_factory(args: argparse.Namespace):
    """What builds one env: ``gymnasium.make(--env, **--env-kwargs)`` (cloudpickled to the workers)."""
    import functools

    import gymnasium as gym

    return functools.partial(gym.make, args.env, **_env_kwargs(args))


def _check_env(args: argparse.Namespace) -> None:
    import importlib

    import gymnasium as gym

    kwargs = _env_kwargs(args)
    module, _, env_id = args.env.rpartition(":")  # "package.module:Env-v0" registers its envs on import
    if module:
        _search_current_directory()
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise UsageError(f"--env {args.env!r}: cannot import {module!r} ({exc}); it is looked for in the "
                             "current directory, on PYTHONPATH and among the installed packages") from None
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the module's own error, in one line
            raise UsageError(f"--env {args.env!r}: importing {module!r} raised {_one_line(exc)}; fix the module "
                             f"(python -c 'import {module}' shows the traceback)") from None
    try:
        gym.spec(env_id)
    except gym.error.Error as exc:
        raise UsageError(f"--env {args.env!r}: not a registered gymnasium env ({exc}); e.g. CartPole-v1") from None
    try:
        gym.make(args.env, **kwargs).close()
    except Exception as exc:  # noqa: BLE001 - a registered env that cannot be built here (a missing dependency...)
        if kwargs:
            raise UsageError(f"--env {args.env!r} with --env-kwargs {args.env_kwargs}: cannot be built here: "
                             f"{_one_line(exc)}; check the keyword names and values the env takes") from None
        raise UsageError(f"--env {args.env!r} cannot be built here: {_one_line(exc)}") from None


# --policy --------------------------------------------------------------------------------

_POLICY_FORMS = ("a TorchScript file (torch.jit.script(module).save(PATH)), a torch.export program "
                 "(torch.export.save(program, PATH.pt2)), a state dict (torch.save(module.state_dict(), PATH)) "
                 "with --policy-factory module:callable, or module:callable")


_PICKLE_REFUSED = (
    "{flag}: holds pickled Python objects, not only tensors (torch.save(module)?), and is refused for safety: "
    "unpickling can run arbitrary code. Save module.state_dict() and pass --policy-factory module:callable (which "
    "builds the module), or save the module as a program: torch.export.save(program, PATH.pt2) or "
    "torch.jit.script(module).save(PATH); for a file you trust, load it in a function of yours: "
    "--policy module:callable")


def _import_callable(flag: str, spec: str) -> Any:
    """The callable that ``module:name`` (``name`` may be dotted) names, imported as ``--env``'s module is."""
    import importlib

    module, _, name = spec.partition(":")
    if not module or not name:
        raise UsageError(f"{flag} {spec!r}: give module:callable, e.g. my_policies:make_actor")
    _search_current_directory()
    try:
        target = importlib.import_module(module)
    except ImportError as exc:
        raise UsageError(f"{flag} {spec!r}: cannot import {module!r} ({exc}); it is looked for in the current "
                         "directory, on PYTHONPATH and among the installed packages") from None
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the module's own error, in one line
        raise UsageError(f"{flag} {spec!r}: importing {module!r} raised {_one_line(exc)}; fix the module "
                         f"(python -c 'import {module}' shows the traceback)") from None
    for part in name.split("."):
        if not hasattr(target, part):
            raise UsageError(f"{flag} {spec!r}: {module!r} has no {name!r}; name a function or class of it "
                             "that returns the policy")
        target = getattr(target, part)
    if not callable(target):
        raise UsageError(f"{flag} {spec!r}: {name!r} is a {type(target).__name__}, not a callable; name a "
                         "function or class that returns the policy")
    return target


def _call_factory(flag: str, spec: str) -> Any:
    factory = _import_callable(flag, spec)
    try:
        return factory()
    except Exception as exc:  # noqa: BLE001 - the user's code, in one line
        raise UsageError(f"{flag} {spec!r}: calling it raised {_one_line(exc)}; it is called with no "
                         "arguments and must return the policy") from None


def _policy_file_format(path: Path) -> str:
    """``"torchscript"``, ``"export"`` or ``"pickle"`` (what ``torch.save`` writes), from the
    names in the file's zip archive, without loading it; ``"pickle"`` too for a file that is a
    pickle itself (``pickle.dump``, or ``torch.save``'s format before torch 1.6: it begins with
    the opcode of a protocol 2 to 5 pickle); ``"unknown"`` for anything else."""
    import zipfile

    if not zipfile.is_zipfile(path):
        try:
            with open(path, "rb") as file:
                head = file.read(2)
        except OSError:
            return "unknown"
        return "pickle" if len(head) == 2 and head[0] == 0x80 and 2 <= head[1] <= 5 else "unknown"
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError):
        return "unknown"
    if any(n.endswith("/archive_format") for n in names) and any("/models/" in n for n in names):
        return "export"
    if any(n.endswith("/constants.pkl") for n in names) and any("/code/" in n for n in names):
        return "torchscript"
    if any(n.endswith("/data.pkl") or n == "data.pkl" for n in names):
        return "pickle"
    return "unknown"


def _action_of(module: Any, source: tuple[str, bytes] | None = None) -> Any:
    """``module``, called by the collector with the observation tensor(s): its output is the
    action, or the first element of a tuple it returns (an actor-critic's ``action, log_prob,
    value``), or the ``"action"`` entry of a dict. A ``TensorDictModuleBase``, or a module
    whose ``forward`` takes a TensorDict, is returned as it is (aiocollect calls it so).

    ``source``: ``(format, the file's bytes)`` of a module loaded from a TorchScript or
    ``torch.export`` file, which cloudpickle cannot pickle; the wrapper pickles (and copies)
    as those bytes, loaded again (``_rebuild_policy``), so that a collector may send the
    policy to its workers."""
    import inspect

    import torch
    from tensordict.nn import TensorDictModuleBase

    if not isinstance(module, torch.nn.Module) or isinstance(module, TensorDictModuleBase):
        return module
    try:
        params = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):  # a TorchScript method has none
        params = []
    if params in (["tensordict"], ["td"]):
        return module

    class ActionOf(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module):
            super().__init__()
            self.inner = inner

        def forward(self, *observations):
            out = self.inner(*observations)
            if isinstance(out, (tuple, list)) and out:
                return out[0]
            if isinstance(out, dict) and "action" in out:
                return out["action"]
            return out

        def __reduce__(self):
            if source is None:
                return _rebuild_policy, ("module", self.inner)
            kind, data = source
            return _rebuild_policy, (kind, data, self.inner.state_dict())

    return ActionOf(module)


def _rebuild_policy(kind: str, data: Any, state: Any = None) -> Any:
    """A policy of ``_action_of`` again, from what its ``__reduce__`` gave (in a copy, or a worker)."""
    import io

    import torch

    if kind == "module":
        return _action_of(data)
    if kind == "torchscript":
        module = torch.jit.load(io.BytesIO(data), map_location="cpu")
    else:
        module = torch.export.load(io.BytesIO(data)).module()
    module.load_state_dict(state)
    return _action_of(module, (kind, data))


def _check_exported(flag: str, program: Any) -> None:
    """An exported program must take any number of envs: its inputs' first dim dynamic."""
    import torch

    nodes = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    for name in program.graph_signature.user_inputs:
        value = nodes[name].meta.get("val") if name in nodes else None
        shape = getattr(value, "shape", None)
        if shape is not None and (len(shape) == 0 or not isinstance(shape[0], torch.SymInt)):
            raise UsageError(
                f"{flag}: the exported program takes {name!r} of the fixed shape {list(shape)}, and the "
                "collector calls it on a batch of as many envs as are ready; export it with a dynamic first "
                "dim: torch.export.export(module, (obs,), dynamic_shapes=({0: torch.export.Dim('batch')},))")


def _load_policy(args: argparse.Namespace) -> tuple[Any, str]:
    """The policy of ``--policy`` (``None``: random actions) and what it is, in words.

    A path is read by what its zip archive holds, not by its name: TorchScript
    (``torch.jit.load``), a ``torch.export`` program (``torch.export.load(...).module()``), or
    a state dict (``torch.load(weights_only=True)``: tensors only, never unpickled code)
    loaded into what ``--policy-factory`` builds. A ``module:callable`` that is not a file
    returns the policy itself (any policy aiocollect takes). Tensors load on the CPU; the
    collector moves the policy to ``--policy-device``."""
    flag = f"--policy {args.policy}"
    if args.policy is None:
        if args.policy_factory is not None:
            raise UsageError(f"--policy-factory {args.policy_factory}: builds the module that a --policy state dict "
                             "is loaded into; give the state dict too: --policy PATH")
        if args.policy_device is not None:
            raise UsageError(f"--policy-device {args.policy_device}: places the --policy, and without --policy the "
                             "actions are random; give --policy, or drop --policy-device")
        return None, "random actions"
    path = Path(args.policy)
    if not path.exists():
        if ":" in args.policy and args.policy_factory is None and not args.policy.startswith((".", "/", "~")):
            return _action_of(_call_factory("--policy", args.policy)), f"{args.policy}()"
        raise UsageError(f"{flag}: no such file; give {_POLICY_FORMS}")
    if path.is_dir():
        raise UsageError(f"{flag}: is a directory; give a file: {_POLICY_FORMS}")
    import io

    import torch

    kind = _policy_file_format(path)
    if kind in ("torchscript", "export") and args.policy_factory is not None:
        what = "a TorchScript module" if kind == "torchscript" else "a torch.export program"
        raise UsageError(f"{flag}: is {what}, loaded whole, and --policy-factory is only for a state dict; "
                         "drop --policy-factory")
    try:
        if kind == "torchscript":
            data = path.read_bytes()
            module = torch.jit.load(io.BytesIO(data), map_location="cpu")
            return _action_of(module, (kind, data)), f"{args.policy} (TorchScript)"
        if kind == "export":
            data = path.read_bytes()
            program = torch.export.load(io.BytesIO(data))
            _check_exported(flag, program)
            return _action_of(program.module(), (kind, data)), f"{args.policy} (torch.export)"
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - a damaged file, or one of a newer torch
        raise UsageError(f"{flag}: cannot be loaded: {_one_line(exc)}; save it again with this torch "
                         f"({torch.__version__})") from None
    try:
        with warnings.catch_warnings():  # (of the pickle protocol the file uses: the error below says it all)
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - whatever torch.load says of a file it cannot read
        import pickle

        # torch's weights-only unpickler stopped: at an object that is not a tensor (a pickle
        # of Python objects), or at bytes that are no pickle. Its advice (load the file with
        # weights_only=False, which would run the file's code) is never relayed: its reason only.
        text = str(exc)
        if isinstance(exc, pickle.UnpicklingError) and (kind == "pickle" or "Unsupported global" in text):
            raise UsageError(_PICKLE_REFUSED.format(flag=flag)) from None
        if isinstance(exc, pickle.UnpicklingError) and "WeightsUnpickler error:" in text:
            reason = text.split("WeightsUnpickler error:", 1)[1].strip().split("\n\n", 1)[0]
            reason = re.split(r"[.]\s", reason, maxsplit=1)[0]  # (its first sentence: what it stopped at)
            why = f"UnpicklingError: {' '.join(reason.split())}"
        else:
            why = _one_line(exc)
        raise UsageError(f"{flag}: is not a file torch can read ({why}); give {_POLICY_FORMS}") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        keys = ", ".join(map(repr, list(state)[:5])) if isinstance(state, dict) else ""
        found = f"a dict whose entries are not all tensors (keys {keys})" if keys else f"a {type(state).__name__}"
        raise UsageError(f"{flag}: holds {found}, not a state dict; save the policy's module.state_dict() "
                         "alone, or torch.jit.script(module).save(PATH)")
    if args.policy_factory is None:
        raise UsageError(f"{flag}: is a state dict ({len(state)} tensors), which needs the module it is loaded "
                         "into: pass --policy-factory module:callable, a function or class that builds it")
    module = _call_factory("--policy-factory", args.policy_factory)
    if not isinstance(module, torch.nn.Module):
        raise UsageError(f"--policy-factory {args.policy_factory}: returned a {type(module).__name__}, and the "
                         "state dict is loaded into an nn.Module; return the module")
    try:
        result = module.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # shapes that differ
        raise UsageError(f"{flag}: does not fit the module of --policy-factory {args.policy_factory}: "
                         f"{_one_line(exc)}") from None
    if result.missing_keys or result.unexpected_keys:
        parts = [f"{label} {', '.join(keys[:4])}{', ...' if len(keys) > 4 else ''}"
                 for label, keys in (("missing", result.missing_keys), ("unexpected", result.unexpected_keys))
                 if keys]
        raise UsageError(f"{flag}: does not fit the module of --policy-factory {args.policy_factory} "
                         f"({'; '.join(parts)}); the factory must build the module whose state dict was saved")
    module.eval()
    return _action_of(module), f"{args.policy} (state dict, into {args.policy_factory}())"


def _set_policy_threads(args: argparse.Namespace) -> None:
    """``--policy-threads``: torch's intra-op threads in this process, where the policy runs.
    A small policy called once per step gains nothing from more, and on a busy machine
    their spinning at each call's barrier costs more than the call itself."""
    if args.policy_threads < 1:
        raise UsageError(f"--policy-threads must be >= 1, got {args.policy_threads}")
    cpus = os.cpu_count() or 1
    if args.policy_threads > cpus:  # (torch would start them all: more threads than CPUs only wait for one another)
        raise UsageError(f"--policy-threads {args.policy_threads}: more than the {cpus} CPUs of this machine; give "
                         f"at most {cpus} (default 1, leaving the other cores to the env workers)")
    if args.policy is not None:
        import torch

        torch.set_num_threads(args.policy_threads)


def _policy_device(args: argparse.Namespace) -> Any:
    """``--policy-device`` as a ``torch.device`` (``None`` without it), checked to exist here."""
    if args.policy_device is None:
        return None
    import torch

    try:
        device = torch.device(args.policy_device)
    except (RuntimeError, ValueError):
        raise UsageError(f"--policy-device {args.policy_device!r}: not a device; e.g. cpu, cuda or cuda:1") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (device.index is not None and device.index >= count):
            have = f"{count} CUDA device{'s' if count != 1 else ''}" if count else "no CUDA device"
            raise UsageError(f"--policy-device {args.policy_device}: this machine has {have} "
                             f"(torch {torch.__version__}); use --policy-device cpu")
    elif device.type != "cpu" and not getattr(torch, device.type, None):
        raise UsageError(f"--policy-device {args.policy_device}: torch has no {device.type!r} backend here; "
                         "use cpu or cuda")
    return device


def _check_policy_acts(args: argparse.Namespace, policy: Any, device: Any, what: str) -> None:
    """One step of two envs with ``policy``, in this process: a policy that cannot act on the
    env (a wrong observation shape, logits for an action) says so before any worker starts."""
    from ._collectors.collector import Collector

    try:
        with warnings.catch_warnings():
            # rows that are not one-hot (logits written as the action): a collector reads them as
            # TorchRL does, with a warning; an evaluation with them would step what nobody meant
            warnings.filterwarnings("error", message="action: the policy's rows", category=UserWarning)
            with Collector([_env_factory(args)] * 2, policy, frames_per_batch=2, total_frames=2,
                           policy_device=device) as probe:
                next(iter(probe))
    except Exception as exc:  # noqa: BLE001 - the policy's own error, in one line
        raise UsageError(f"--policy {args.policy}: {what} cannot act on {args.env}: {_one_line(exc)}; it must map "
                         "a batch of observations [envs, ...] to a batch of actions [envs, ...]") from None


def _search_current_directory() -> None:
    """Let ``--env module:EnvId`` find ``module`` in the current directory, whichever way the
    command was started: ``python -m aiocollect`` has it first on ``sys.path`` (Python's rule
    for ``-m``), the ``aiocollect`` console script not at all (its ``sys.path[0]`` is the
    script's own directory), so it is appended here, after the installed packages, where it
    cannot hide a standard module. Worker processes take this ``sys.path``."""
    cwd = os.getcwd()
    if not any(entry in ("", ".") or os.path.abspath(entry) == cwd for entry in sys.path):
        sys.path.append(cwd)


def _one_line(exc: BaseException) -> str:
    """``TYPE: message`` of ``exc`` on one line (a ``SyntaxError`` with its file and line; an
    ``EnvError``: ``_env_error``)."""
    from ._errors import EnvError

    if isinstance(exc, EnvError):
        return _env_error(exc)
    if isinstance(exc, SyntaxError):
        text = f"{exc.msg} ({exc.filename}, line {exc.lineno})"
    else:
        text = str(exc)
        if "Traceback of TorchScript" in text:  # the TorchScript stack, then the error itself, on the last line
            last = text.strip().splitlines()[-1]
            return " ".join(last.split())[:300]
    text = " ".join(text.split())
    text = text if len(text) <= 300 else f"{text[:300]}..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


_FRAME = re.compile(r'^[ |+-]*File "(.*)", line (\d+), in (.*)$', re.M)
_TRACE = re.compile(r"\n\n(Traceback of the env|Traceback in the worker|Python stack of the worker)")


def _env_error(exc: BaseException) -> str:
    """An ``EnvError`` (an env's ``reset()`` or ``step()`` raised) in one line: what its message
    says before the traceback it carries (the env, its worker, and the env's exception: type
    and message), and where the env's code raised it, the last frame of that traceback
    (``raised at FILE:LINE, in FUNCTION``), never the frames of aiocollect that led there. The
    env of a probe in this process is not named (it is the one env of the probe)."""
    text = _TRACE.split(str(exc), maxsplit=1)[0]
    place, raised, rest = text.partition(" raised ")
    if raised and "(this process, pid " in place:
        text = rest  # "RuntimeError: message"
    text = " ".join(text.split())
    text = text if len(text) <= 300 else f"{text[:300]}..."
    frames = _FRAME.findall(getattr(exc, "remote_traceback", "") or "")
    if frames:
        file, line, function = frames[-1]
        text += f" (raised at {file}:{line}, in {function})"
    return text


def _check_out(args: argparse.Namespace) -> Path:
    """``--out`` resolved, once it is sure that writing there loses nothing (see ``_dataset``)
    and that a directory can be made beside it (``_check_writable``)."""
    try:
        target = _look_at_out(args)
    except OSError as exc:  # a directory on the way that this user may not enter (EACCES), ...
        where = f"{exc.filename}: " if exc.filename else ""
        raise UsageError(f"--out {args.out}: not writable: {where}{exc.strerror or exc}; give an --out in a "
                         "directory you can write to") from None
    _check_writable(args, target)
    return target


def _look_at_out(args: argparse.Namespace) -> Path:
    from ._dataset import NotASave, check_replaceable

    given = Path(args.out)
    if given.is_symlink():
        raise UsageError(f"--out {args.out}: is a symbolic link (to {os.readlink(given)}); aiocollect collect "
                         "replaces --out by renaming a new directory onto it, so give a real path: the "
                         "directory the link points to, or a new one")
    target = given.resolve()
    cwd = Path.cwd().resolve()
    if target == cwd or target in cwd.parents:
        which = "the current directory" if target == cwd else "a directory that holds the current directory"
        raise UsageError(f"--out {args.out}: is {which}; the save goes into a directory of its own, "
                         f"e.g. --out {Path(args.out) / 'frames'}")
    if target.exists() and not target.is_dir():
        raise UsageError(f"--out {args.out}: is a file; give a directory (new, empty, or saved by aiocollect collect)")
    if target.is_dir() and any(target.iterdir()):
        if not args.overwrite:
            raise UsageError(f"--out {args.out}: exists and is not an empty directory; pick another or pass "
                             "--overwrite (which replaces only an earlier save of aiocollect collect)")
        try:
            check_replaceable(target)
        except NotASave as exc:
            raise UsageError(f"--out {args.out}: --overwrite replaces only a directory that aiocollect collect "
                             f"saved, and {exc}; delete it yourself if you mean to, or pick another --out") from None
    if target.is_dir() and target.stat().st_dev != target.parent.stat().st_dev:
        raise UsageError(f"--out {args.out}: is a mount point, and the save is renamed into place from beside it; "
                         f"give a new directory inside it, e.g. --out {Path(args.out) / 'frames'}")
    return target


def _check_writable(args: argparse.Namespace, target: Path) -> None:
    """The save is made as a new directory beside ``target`` (its missing parents made first):
    one is made, and removed, in the nearest directory that exists, so that a place nobody may
    write to (``/proc``, ``/sys``, a read-only disk, another user's directory) is refused as
    such, and not later, or as a disk without room (``/proc`` has 0 bytes free). Permission
    bits do not say it: root passes every ``os.access`` check, and a read-only mount has them."""
    import tempfile

    base = target.parent
    while not os.path.exists(base) and base != base.parent:
        base = base.parent
    if not base.is_dir():
        raise UsageError(f"--out {args.out}: cannot write there: {base} is a file, not a directory")
    try:
        probe = tempfile.mkdtemp(prefix=f".{target.name}.writable-", dir=base)
    except OSError as exc:
        raise UsageError(f"--out {args.out}: not writable: making a directory in {base} failed "
                         f"({exc.strerror or exc}); give an --out in a directory you can write to") from None
    with contextlib.suppress(OSError):
        os.rmdir(probe)


def _frame_bytes(args: argparse.Namespace, policy: Any = None, device: Any = None) -> int:
    """Bytes one frame takes in the save: one frame of one env, collected in this process
    with ``policy`` (whatever it writes is saved too)."""
    from ._collectors.collector import Collector

    try:
        with Collector([_env_factory(args)], policy, frames_per_batch=1, total_frames=1, policy_device=device,
                       max_frames_per_traj=getattr(args, "max_frames_per_traj", None)) as probe:
            batch = next(iter(probe))
    except Exception as exc:  # noqa: BLE001 - the env builds but cannot reset or step here
        raise UsageError(f"--env {args.env!r}: one step of it failed here: {_one_line(exc)}; fix the env") from None
    return batch.bytes() // batch.numel()


def _batch_too_big(flag: str, frames: int, frame_bytes: int, memory: int, fix: str) -> UsageError:
    """The error for batches of ``frames`` that do not fit three times in ``memory``."""
    return UsageError(f"{flag}: a batch of {frames:,} frames takes {_size(frames * frame_bytes)} ({frame_bytes} bytes "
                      f"a frame) and the collector holds about three, with {_size(memory)} of memory available; {fix}")


def _check_collect(args: argparse.Namespace) -> _Plan:
    """Every mistake of the command line, found before any worker starts or anything is written."""
    _check_env(args)
    if args.workers < 0:
        raise UsageError(f"--workers must be >= 0, got {args.workers}")
    for name in ("envs_per_worker", "frames", "frames_per_batch", "max_frames_per_traj"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    top = 2**63 - 1 - args.envs_per_worker * max(args.workers, 1)  # (env k is seeded with seed + k)
    if not 0 <= args.seed <= top:
        raise UsageError(f"--seed must be in 0..{top} (env k is seeded with seed + k), got {args.seed}")
    target = _check_out(args)
    _set_policy_threads(args)
    policy, what = _load_policy(args)
    device = _policy_device(args)
    num_envs = args.envs_per_worker * max(args.workers, 1)
    fpb = args.frames_per_batch or num_envs * 100
    if fpb % num_envs:
        raise UsageError(f"--frames-per-batch {fpb} does not split over {num_envs} envs; use a multiple of {num_envs}")
    num_batches = math.ceil(args.frames / fpb)
    frame_bytes = _frame_bytes(args)  # (the env alone first: an env that cannot step is not the policy's fault)
    if policy is not None:
        _check_policy_acts(args, policy, device, what)
        frame_bytes = _frame_bytes(args, policy, device)
    # Sizes are checked here, as Python ints: a typo of a few zeros must not start workers that
    # then fail to allocate, or fill the disk (a memory-mapped file that cannot grow kills the process).
    from ._workers.shm import available_memory

    batch_bytes, memory = fpb * frame_bytes, available_memory()
    if memory is not None and 3 * batch_bytes > memory:
        if args.frames_per_batch:
            flag, fix = f"--frames-per-batch {args.frames_per_batch}", "use a smaller --frames-per-batch"
        else:
            flag = (f"--envs-per-worker {args.envs_per_worker} (a default batch is 100 steps of each of "
                    f"{num_envs:,} envs)")
            fix = "use fewer envs, or a smaller --frames-per-batch"
        raise _batch_too_big(flag, fpb, frame_bytes, memory, fix)
    save_bytes, free = num_batches * batch_bytes, _free_disk(target.parent)
    if save_bytes > free:
        raise UsageError(f"--frames {args.frames}: the save of {num_batches * fpb:,} frames takes {_size(save_bytes)} "
                         f"({frame_bytes} bytes a frame) and the disk of {target.parent} has {_size(free)} free; "
                         "collect fewer frames, or give an --out on a bigger disk")
    return _Plan(target, num_envs, fpb, num_batches, policy, what, device)


class _Episodes:
    """The return and the length of every episode that finishes in the batches, summed per
    trajectory id (an episode spans batches); the episodes still going at the end are counted
    apart, as ``running``, and never averaged in."""

    def __init__(self):
        self._open: dict[int, tuple[float, int]] = {}  # trajectory id -> (return, steps) so far
        self.returns: list[float] = []
        self.lengths: list[int] = []
        self._sum = 0.0

    def add(self, batch: Any) -> None:
        import numpy as np

        ids = batch.get(("collector", "traj_ids")).reshape(-1).numpy(force=True)
        reward = batch.get(("next", "reward")).reshape(-1).double().numpy(force=True)
        done = batch.get(("next", "done")).reshape(-1).numpy(force=True)
        valid = ids >= 0
        mask = batch.get(("collector", "mask"), None)
        if mask is not None:
            valid &= mask.reshape(-1).numpy(force=True)
        ids, reward, done = ids[valid], reward[valid], done[valid]
        runs, inverse = np.unique(ids, return_inverse=True)
        sums = np.bincount(inverse, weights=reward, minlength=len(runs))
        steps = np.bincount(inverse, minlength=len(runs))
        finished = np.zeros(len(runs), dtype=bool)
        finished[inverse[done]] = True
        for tid, total, count, end in zip(runs.tolist(), sums.tolist(), steps.tolist(), finished.tolist()):
            before, before_steps = self._open.pop(tid, (0.0, 0))
            if end:
                self.returns.append(before + total)
                self._sum += before + total
                self.lengths.append(before_steps + count)
            else:
                self._open[tid] = (before + total, before_steps + count)

    @property
    def running(self) -> int:
        return len(self._open)

    @property
    def mean(self) -> float | None:
        """The mean return of every episode finished so far (the bar's, and the summary's at the end)."""
        return self._sum / len(self.returns) if self.returns else None

    def summary(self) -> list[str]:
        """The evaluation, in lines: episodes, return mean and std (min, max), lengths."""
        import statistics

        n, running = len(self.returns), self.running
        going = f" ({running:,} still running at the end, not counted)" if running else ""
        if not n:
            return [f"episodes: none finished{going}; collect more --frames for an evaluation"]
        std = statistics.pstdev(self.returns) if n > 1 else 0.0
        return [f"episodes: {n:,} finished{going}",
                f"  return: mean {statistics.fmean(self.returns):.2f}, std {std:.2f}, "
                f"min {min(self.returns):.2f}, max {max(self.returns):.2f}",
                f"  length: mean {statistics.fmean(self.lengths):.1f}, min {min(self.lengths):,}, "
                f"max {max(self.lengths):,} steps"]


def _frames_line(args: argparse.Namespace, plan: _Plan) -> str:
    """The frames asked for and collected: why they differ, when they do."""
    collected = plan.num_batches * plan.frames_per_batch
    if collected == args.frames:
        return f"frames: {collected:,} collected, as asked"
    steps = plan.frames_per_batch // plan.num_envs
    size = ("--frames-per-batch" if args.frames_per_batch else
            f"{steps} steps of each of {plan.num_envs} envs; --frames-per-batch sets it")
    return (f"frames: {collected:,} collected, {args.frames:,} asked: rounded up to {plan.num_batches:,} whole "
            f"batch{'es' if plan.num_batches != 1 else ''} of {plan.frames_per_batch:,} frames ({size})")


def collect(args: argparse.Namespace) -> int:
    plan = _check_collect(args)
    from tqdm.auto import tqdm

    from ._collectors.collector import Collector
    from ._collectors.multi_sync import MultiSyncCollector
    from ._dataset import CommitError, PartialSave, leftovers

    env_id = args.env
    make_env = _env_factory(args)
    for path in leftovers(plan.target):
        if ".replaced-" in path.name:  # killed between the two renames of a replacement
            print(f"aiocollect: note: {path} is the previous save of {plan.target}, set aside by a run that was "
                  f"killed while replacing it; if {plan.target} is missing, move it back: mv {path} {plan.target}",
                  file=sys.stderr)
        else:
            print(f"aiocollect: note: {path} is left from a run of aiocollect collect that was killed (or is still "
                  "running); it is not a save: rm -r it once no run uses it", file=sys.stderr)
    steps = plan.frames_per_batch // plan.num_envs
    about = {"env": env_id, "frames": plan.num_batches * plan.frames_per_batch, "seed": args.seed}
    if args.env_kwargs is not None:
        about["env_kwargs"] = _env_kwargs(args)
    if plan.policy is not None:
        about["policy"] = plan.policy_what
    try:
        save = PartialSave(plan.target, steps * plan.num_batches, about)
    except OSError as exc:
        raise UsageError(f"--out {args.out}: cannot write there ({exc.strerror or exc})") from None
    total = plan.num_batches * plan.frames_per_batch
    options = {"frames_per_batch": plan.frames_per_batch, "total_frames": total,
               "max_frames_per_traj": args.max_frames_per_traj, "policy_device": plan.policy_device}
    episodes = _Episodes()
    try:
        built = time.perf_counter()
        try:
            if args.workers == 0:
                collector = Collector([make_env] * args.envs_per_worker, plan.policy, **options)
            else:
                collector = MultiSyncCollector([[make_env] * args.envs_per_worker] * args.workers, plan.policy,
                                               **options)
        except (ValueError, TypeError) as exc:
            raise UsageError(str(exc)) from None
        with collector:
            collector.set_seed(args.seed)
            # One clock for the bar and the summary, the bar's: it starts when the first batch is
            # asked for (the workers are up), and with smoothing=0 its rate is frames / elapsed.
            startup = time.perf_counter() - built
            bar = tqdm(total=total, unit="frames", unit_scale=True, desc=type(collector).__name__,
                       dynamic_ncols=True, smoothing=0)
            try:
                for i, batch in enumerate(collector):
                    save.write(batch, i * steps)
                    episodes.add(batch)
                    if episodes.returns:
                        bar.set_postfix(episode_return=f"{episodes.mean:.1f}", episodes=len(episodes.returns),
                                        refresh=False)
                    bar.update(batch.numel())
                elapsed = bar.format_dict["elapsed"]
            finally:
                bar.close()
            frames = collector.statistics().frames
    except BaseException:  # Ctrl-C included: no half-written save is left behind
        save.discard()
        raise
    shape = save.shape
    try:
        save.commit()
    except CommitError as exc:
        print(f"aiocollect: error: {exc}", file=sys.stderr)
        return 1
    except BaseException:  # Ctrl-C while the record is written: the frames never reached --out
        save.discard()
        raise
    print(f"collected {frames:,} frames of {env_id} from {plan.num_envs} envs "
          f"({args.workers} worker process{'es' if args.workers != 1 else ''}) in {elapsed:.2f} s: "
          f"{frames / elapsed:,.0f} frames/s (the progress bar's clock, from the first batch asked for; "
          f"the {startup:.2f} s of start-up before it not counted)")
    print(_frames_line(args, plan))
    print(f"policy: {plan.policy_what}" + (f", on {plan.policy_device}" if plan.policy_device is not None else ""))
    for line in episodes.summary():
        print(line)
    print(f"saved {shape} to {Path(args.out)} (TensorDict.load_memmap({str(Path(args.out))!r}))")
    return 0


def tune(args: argparse.Namespace) -> int:
    """``aiocollect tune``: ``_tune.tune`` on the env and policy of the command line, with the
    ``aiocollect collect`` command of the best split, its policy options included."""
    import dataclasses
    import json
    import shlex

    from ._tune import tune as measure

    _check_env(args)
    for name in ("workers", "envs_per_worker"):
        values = getattr(args, name)
        low = 0 if name == "workers" else 1
        if values is not None and min(values) < low:
            raise UsageError(f"--{name.replace('_', '-')} must be >= {low}, got {min(values)}")
    if args.frames_per_batch is not None and args.frames_per_batch < 1:
        raise UsageError(f"--frames-per-batch must be >= 1, got {args.frames_per_batch}")
    if not (args.seconds > 0 and math.isfinite(args.seconds)):  # (nan, inf: a measurement that never ends)
        raise UsageError(f"--seconds must be > 0 and finite, got {args.seconds:g}; give about how long to measure, "
                         "e.g. --seconds 30 (the default)")
    _set_policy_threads(args)
    policy, what = _load_policy(args)
    device = _policy_device(args)
    frame_bytes = _frame_bytes(args)  # (the env alone first: an env that cannot step is not the policy's fault)
    if policy is not None:
        _check_policy_acts(args, policy, device, what)
    from ._workers.shm import available_memory

    memory = available_memory()  # (a typo of a few zeros must not start workers that cannot allocate)
    if policy is not None and args.envs_per_worker and memory is not None:
        frame_bytes = _frame_bytes(args, policy, device)  # (with what the policy writes)
    for envs in args.envs_per_worker or ():
        frames = max(args.frames_per_batch or envs * 100, envs)  # (a worker's envs, 100 steps each by default)
        if memory is not None and 3 * frames * frame_bytes > memory:
            raise _batch_too_big(f"--envs-per-worker {envs}", frames, frame_bytes, memory, "try fewer envs")
    kwargs = _env_kwargs(args)
    try:
        result = measure(args.env, policy, env_kwargs=kwargs, workers=args.workers,
                         envs_per_worker=args.envs_per_worker or (8, 32), frames_per_batch=args.frames_per_batch,
                         seconds=args.seconds, policy_device=device, progress=True)
    except ValueError as exc:
        raise UsageError(str(exc).removeprefix("tune: ")) from None
    best = result.best
    command = f"aiocollect collect --env {shlex.quote(args.env)}"
    if kwargs:
        command += f" --env-kwargs {shlex.quote(json.dumps(kwargs))}"
    command += f" --workers {best.workers} --envs-per-worker {best.envs_per_worker}"
    if args.frames_per_batch is not None:
        command += f" --frames-per-batch {args.frames_per_batch}"
    for flag in ("policy", "policy_factory", "policy_device", "policy_threads"):
        value = getattr(args, flag)
        if value is not None and not (flag == "policy_threads" and (value == 1 or args.policy is None)):
            command += f" --{flag.replace('_', '-')} {shlex.quote(str(value))}"
    command += " --frames FRAMES --out DIR"
    print(dataclasses.replace(result, policy=what, command=command, seconds_flag="--seconds "))
    return 0


def bench(args: argparse.Namespace) -> int:
    root = Path(__file__).resolve().parents[1] / "benchmarks"
    if not (root / "bench_collect.py").exists():
        raise UsageError("aiocollect bench runs the benchmarks of a source checkout, and there is no "
                         f"benchmarks/ next to this installation ({root}); clone the repository and pip install -e .")
    chosen = [f"bench_{name}.py" for name in args.only] if args.only else list(BENCHMARKS)
    results = args.results.resolve() if args.results else None
    if results is not None:
        if results.exists() and not results.is_dir():
            raise UsageError(f"--results {args.results} is a file; give a directory for the JSON files and the chart.")
        results.mkdir(parents=True, exist_ok=True)
    if args.quick:
        print("--quick: one short run per row, to see that every row runs; its figures are rough, so no goal "
              "is judged (run without --quick to measure).", flush=True)
    code, skipped = 0, []
    for script in chosen:
        print(f"\n# {script}", flush=True)
        cmd = [sys.executable, str(root / script)] + (["--quick"] if args.quick else [])
        if results is not None:
            cmd += ["--json", str(results / f"{script[len('bench_'):-3]}.json")]
        # (stderr, each row's progress, into a file, shown only if the script fails: not a pipe, which a
        # process it leaves behind, such as one of Ray's, would hold open)
        with tempfile.TemporaryFile() as stderr:
            returncode = subprocess.run(cmd, cwd=root, stderr=stderr).returncode
            stderr.seek(0)
            lines = stderr.read().decode(errors="replace").rstrip().splitlines()
        if returncode == BENCH_MISSING_EXTRA:  # (it printed what to install)
            skipped.append(script)
        elif returncode:
            tail = "\n".join("    " + line for line in lines[-15:])
            print(f"{script} failed (exit code {returncode}); the end of its stderr:\n{tail}", flush=True)
            code = 1
    if results is not None:
        code = subprocess.run([sys.executable, str(root / "chart.py"), str(results)], cwd=root).returncode or code
    if skipped:
        print(f"\nskipped, as a package they need is not installed (see each one's line above): {', '.join(skipped)}")
    return code


def main(argv: list[str] | None = None) -> int:
    from ._errors import EnvError

    args = _parser().parse_args(argv)
    try:
        return {"collect": collect, "tune": tune, "bench": bench}[args.command](args)
    except UsageError as exc:
        print(f"aiocollect: error: {exc}", file=sys.stderr)
        return 2
    except EnvError as exc:  # an env that raised in a worker, past the checks (one env, in this process)
        print(f"aiocollect: error: --env {args.env!r}: {_one_line(exc)}; fix the env", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("aiocollect: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

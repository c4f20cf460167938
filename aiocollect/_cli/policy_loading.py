"""``--policy``: the trained policy the command acts with, loaded safely, or one line saying why not.

It takes four forms: a TorchScript file (``torch.jit.save``), a ``torch.export`` program
(``torch.export.save``, ``.pt2``), a state dict (``torch.save(module.state_dict())``) with
``--policy-factory module:callable`` (which builds the module it is loaded into), or
``module:callable``, a function of the user's that returns the policy. A file is read by what
its zip archive holds, not by its name (``policy_file_format``), and never unpickled: a file of
pickled Python objects (``torch.save(module)``) is refused, as unpickling can run arbitrary
code. The module loaded is wrapped so that the collector gets its action (``policy_wrapper``).
"""

from __future__ import annotations

import argparse
import re
import warnings
from pathlib import Path
from typing import Any

from .errors import UsageError, one_line
from .policy_wrapper import action_of
from .user_code import call_factory

POLICY_FORMS = ("a TorchScript file (torch.jit.script(module).save(PATH)), a torch.export program "
                "(torch.export.save(program, PATH.pt2)), a state dict (torch.save(module.state_dict(), PATH)) "
                "with --policy-factory module:callable, or module:callable")
"""The forms ``--policy`` takes, in words, for the errors that name them."""

PICKLE_REFUSED = (
    "{flag}: holds pickled Python objects, not only tensors (torch.save(module)?), and is refused for safety: "
    "unpickling can run arbitrary code. Save module.state_dict() and pass --policy-factory module:callable (which "
    "builds the module), or save the module as a program: torch.export.save(program, PATH.pt2) or "
    "torch.jit.script(module).save(PATH); for a file you trust, load it in a function of yours: "
    "--policy module:callable")
"""The error for a file of pickled objects (``{flag}``: ``--policy PATH``)."""


def load_policy(args: argparse.Namespace) -> tuple[Any, str]:
    """The policy of ``--policy`` (``None``: random actions) and what it is, in words.

    A path is read by what its zip archive holds, not by its name: TorchScript
    (``torch.jit.load``), a ``torch.export`` program (``torch.export.load(...).module()``), or
    a state dict (``torch.load(weights_only=True)``: tensors only, never unpickled code)
    loaded into what ``--policy-factory`` builds. A ``module:callable`` that is not a file
    returns the policy itself (any policy aiocollect takes). Tensors load on the CPU; the
    collector moves the policy to ``--policy-device``."""
    flag = f"--policy {args.policy}"
    if args.policy is None:
        _check_no_policy_options(args)
        return None, "random actions"
    path = Path(args.policy)
    if not path.exists():
        if ":" in args.policy and args.policy_factory is None and not args.policy.startswith((".", "/", "~")):
            return action_of(call_factory("--policy", args.policy)), f"{args.policy}()"
        raise UsageError(f"{flag}: no such file; give {POLICY_FORMS}")
    if path.is_dir():
        raise UsageError(f"{flag}: is a directory; give a file: {POLICY_FORMS}")
    kind = policy_file_format(path)
    if kind in ("torchscript", "export"):
        return _load_program(args, flag, path, kind)
    state = _load_state_dict(flag, path, kind)
    return _load_into_factory(args, flag, state)


def _check_no_policy_options(args: argparse.Namespace) -> None:
    """Without ``--policy``, the options that only go with one are refused."""
    if args.policy_factory is not None:
        raise UsageError(f"--policy-factory {args.policy_factory}: builds the module that a --policy state dict "
                         "is loaded into; give the state dict too: --policy PATH")
    if args.policy_device is not None:
        raise UsageError(f"--policy-device {args.policy_device}: places the --policy, and without --policy the "
                         "actions are random; give --policy, or drop --policy-device")


def policy_file_format(path: Path) -> str:
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


def _load_program(args: argparse.Namespace, flag: str, path: Path, kind: str) -> tuple[Any, str]:
    """A TorchScript module or a ``torch.export`` program, loaded whole (no ``--policy-factory``)."""
    import io

    import torch

    if args.policy_factory is not None:
        what = "a TorchScript module" if kind == "torchscript" else "a torch.export program"
        raise UsageError(f"{flag}: is {what}, loaded whole, and --policy-factory is only for a state dict; "
                         "drop --policy-factory")
    try:
        data = path.read_bytes()
        if kind == "torchscript":
            module = torch.jit.load(io.BytesIO(data), map_location="cpu")
            return action_of(module, (kind, data)), f"{args.policy} (TorchScript)"
        program = torch.export.load(io.BytesIO(data))
        check_exported(flag, program)
        return action_of(program.module(), (kind, data)), f"{args.policy} (torch.export)"
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - a damaged file, or one of a newer torch
        raise UsageError(f"{flag}: cannot be loaded: {one_line(exc)}; save it again with this torch "
                         f"({torch.__version__})") from None


def check_exported(flag: str, program: Any) -> None:
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


def _load_state_dict(flag: str, path: Path, kind: str) -> dict:
    """The state dict of the file, read by ``torch.load(weights_only=True)``: tensors only, never
    unpickled code; a file of anything else is refused, saying what it holds."""
    import torch

    try:
        with warnings.catch_warnings():  # (of the pickle protocol the file uses: the error below says it all)
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - whatever torch.load says of a file it cannot read
        raise _unreadable(flag, kind, exc) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        keys = ", ".join(map(repr, list(state)[:5])) if isinstance(state, dict) else ""
        found = f"a dict whose entries are not all tensors (keys {keys})" if keys else f"a {type(state).__name__}"
        raise UsageError(f"{flag}: holds {found}, not a state dict; save the policy's module.state_dict() "
                         "alone, or torch.jit.script(module).save(PATH)")
    return state


def _unreadable(flag: str, kind: str, exc: Exception) -> UsageError:
    """The error for a file that ``torch.load(weights_only=True)`` stopped at: at an object that
    is not a tensor (a pickle of Python objects: ``PICKLE_REFUSED``), or at bytes that are no
    pickle. Its advice (load the file with ``weights_only=False``, which would run the file's
    code) is never relayed: its reason only."""
    import pickle

    text = str(exc)
    if isinstance(exc, pickle.UnpicklingError) and (kind == "pickle" or "Unsupported global" in text):
        return UsageError(PICKLE_REFUSED.format(flag=flag))
    if isinstance(exc, pickle.UnpicklingError) and "WeightsUnpickler error:" in text:
        reason = text.split("WeightsUnpickler error:", 1)[1].strip().split("\n\n", 1)[0]
        reason = re.split(r"[.]\s", reason, maxsplit=1)[0]  # (its first sentence: what it stopped at)
        why = f"UnpicklingError: {' '.join(reason.split())}"
    else:
        why = one_line(exc)
    return UsageError(f"{flag}: is not a file torch can read ({why}); give {POLICY_FORMS}")


def _load_into_factory(args: argparse.Namespace, flag: str, state: dict) -> tuple[Any, str]:
    """``state`` loaded into the module that ``--policy-factory`` builds, which must fit it exactly."""
    import torch

    if args.policy_factory is None:
        raise UsageError(f"{flag}: is a state dict ({len(state)} tensors), which needs the module it is loaded "
                         "into: pass --policy-factory module:callable, a function or class that builds it")
    module = call_factory("--policy-factory", args.policy_factory)
    if not isinstance(module, torch.nn.Module):
        raise UsageError(f"--policy-factory {args.policy_factory}: returned a {type(module).__name__}, and the "
                         "state dict is loaded into an nn.Module; return the module")
    try:
        result = module.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # shapes that differ
        raise UsageError(f"{flag}: does not fit the module of --policy-factory {args.policy_factory}: "
                         f"{one_line(exc)}") from None
    if result.missing_keys or result.unexpected_keys:
        parts = [f"{label} {', '.join(keys[:4])}{', ...' if len(keys) > 4 else ''}"
                 for label, keys in (("missing", result.missing_keys), ("unexpected", result.unexpected_keys))
                 if keys]
        raise UsageError(f"{flag}: does not fit the module of --policy-factory {args.policy_factory} "
                         f"({'; '.join(parts)}); the factory must build the module whose state dict was saved")
    module.eval()
    return action_of(module), f"{args.policy} (state dict, into {args.policy_factory}())"

"""``--policy-threads`` and ``--policy-device``: where the policy runs, checked here.

Without ``--policy`` the actions are random, and ``--policy-device`` is refused (it would place
nothing); ``--policy-threads`` is checked either way, and set only for a ``--policy``.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from .errors import UsageError


def set_policy_threads(args: argparse.Namespace) -> None:
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


def policy_device(args: argparse.Namespace) -> Any:
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

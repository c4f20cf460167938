"""One step, in this process, before any worker starts: an env that cannot reset or step, or a
policy that cannot act on it, is reported in one line here, not from a worker later; and the
step says how many bytes a frame takes (``frame_bytes``), for the checks of ``sizes``.
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any

from .env_loading import env_factory
from .errors import UsageError, one_line


def check_policy_acts(args: argparse.Namespace, policy: Any, device: Any, what: str) -> None:
    """One step of two envs with ``policy``, in this process: a policy that cannot act on the
    env (a wrong observation shape, logits for an action) says so before any worker starts."""
    from .._collectors.collector import Collector

    try:
        with warnings.catch_warnings():
            # rows that are not one-hot (logits written as the action): a collector reads them as
            # TorchRL does, with a warning; an evaluation with them would step what nobody meant
            warnings.filterwarnings("error", message="action: the policy's rows", category=UserWarning)
            with Collector([env_factory(args)] * 2, policy, frames_per_batch=2, total_frames=2,
                           policy_device=device) as probe:
                next(iter(probe))
    except Exception as exc:  # noqa: BLE001 - the policy's own error, in one line
        raise UsageError(f"--policy {args.policy}: {what} cannot act on {args.env}: {one_line(exc)}; it must map "
                         "a batch of observations [envs, ...] to a batch of actions [envs, ...]") from None


def frame_bytes(args: argparse.Namespace, policy: Any = None, device: Any = None) -> int:
    """Bytes one frame takes in the save: one frame of one env, collected in this process
    with ``policy`` (whatever it writes is saved too)."""
    from .._collectors.collector import Collector

    try:
        with Collector([env_factory(args)], policy, frames_per_batch=1, total_frames=1, policy_device=device,
                       max_frames_per_traj=getattr(args, "max_frames_per_traj", None)) as probe:
            batch = next(iter(probe))
    except Exception as exc:  # noqa: BLE001 - the env builds but cannot reset or step here
        raise UsageError(f"--env {args.env!r}: one step of it failed here: {one_line(exc)}; fix the env") from None
    return batch.bytes() // batch.numel()

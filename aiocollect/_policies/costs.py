"""Timing the policy in both places, for the choice of where it acts (``_collectors.placement``).

With cores to spare, where a small CPU policy acts is a measurement, not a rule: ``measure``
calls it on zeros of the observations as a worker's copy would (one worker's envs, on one
thread, with ``direct_calls``) and as the engine would (every worker's envs at once, on the
threads the workers leave free, plus the engine's own work per worker), and ``Costs`` says
which is cheaper. ``_policies.actor`` gives the tour of the two placements.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

from .direct_calls import direct_calls
from .probe import zeros
from .runner import PolicyRunner

ENGINE_S_PER_WORKER = 10e-6
"""What a round costs the engine for each worker it serves, over the policy's call, at the
least: the doorbells both ways, writing the observations out and the actions in, the
trajectory ids and the checks. With a small MLP over 16 envs a worker: about 160 us on the
2-core VM (py-spy of the engine thread, where the MLP's 67 us call was 28-30% of its busy
time), and at most 43 us on the 16-core machine (its main process, the policy's calls
included, served 375k frames/s over 15 workers: 2.7 us a frame). 10 us, below both, keeps
the policy here only where it clearly wins."""


@dataclass(frozen=True)
class Costs:
    """What ``measure`` timed: one step of every env, in each place."""

    worker_s: float
    """The policy's call on one worker's envs, on one thread, as a worker's copy makes it: what
    each worker's step would take longer with the policy in the workers."""
    central_s: float
    """The main process's work for one round over every worker with the policy here: its
    call on all their envs at once, on the threads the workers leave free, and
    ``ENGINE_S_PER_WORKER`` for each worker."""

    @property
    def in_workers(self) -> bool:
        """The policy goes to the workers unless the main process serves a round over every
        worker in no more time than one worker would spend on its own copy's call: only then
        does the policy here make no worker wait longer than its own copy would (a policy
        that batches well, or gains from threads the workers leave free)."""
        return self.central_s > self.worker_s

    @property
    def figures(self) -> str:
        """The two times, in words (``str()`` and the profile's report show them)."""
        return (f"one worker's call of the policy {self.worker_s * 1e6:.0f} us, a round over every worker "
                f"here {self.central_s * 1e6:.0f} us")

    def __str__(self) -> str:
        where = "in the workers" if self.in_workers else "here, batched over the workers"
        return f"{self.figures}: the policy runs {where}"


def measure(policy: Any, obs_leaves: list, exploration_type: Any, envs_per_worker: list[int],
            cores: int) -> Costs | None:
    """Time the policy's calls on zeros of the observations, in both places (``Costs``): a
    warm-up and the best of a few calls each, within about a tenth of a second, with torch's
    generator and threads as they were after. ``policy`` is called, so it is a scratch copy
    (``scratch_copy``: a call may change a module's state), which this leaves with direct
    calls (``direct_calls``). ``cores``: the machine's usable cores. ``None`` if a call fails
    (then the probe has said so)."""
    keys = [leaf.key for leaf in obs_leaves]
    per_worker, rows = max(envs_per_worker), sum(envs_per_worker)
    with _MEASURING:  # (torch's threads are the process's: two collectors built at once take turns)
        return _measure(policy, keys, obs_leaves, exploration_type, per_worker, rows, len(envs_per_worker), cores)


_MEASURING = threading.Lock()


def _measure(policy: Any, keys: list, obs_leaves: list, exploration_type: Any, per_worker: int, rows: int,
             workers: int, cores: int) -> Costs | None:
    """``measure``'s timing, under its lock."""
    threads = torch.get_num_threads()
    spare = min(threads, max(1, cores - workers))  # (the threads the policy here would get)
    state = torch.random.get_rng_state()
    try:
        runner = PolicyRunner(policy, keys, device=None, exploration_type=exploration_type)
        torch.set_num_threads(spare)
        central = _best(runner, obs_leaves, rows) + ENGINE_S_PER_WORKER * workers
        if isinstance(policy, torch.nn.Module):
            direct_calls(policy)  # (as a worker's private copy is called)
        torch.set_num_threads(1)
        return Costs(_best(runner, obs_leaves, per_worker), central)
    except Exception:  # noqa: BLE001 - then it runs centrally, where its first call says what is wrong
        return None
    finally:
        torch.set_num_threads(threads)
        torch.random.set_rng_state(state)


def _best(runner: Any, obs_leaves: list, n: int, budget_s: float = 0.05) -> float:
    """The fastest of a few calls of ``runner`` on zeros of ``n`` envs' observations, after
    one untimed: up to 7, fewer where they take more than ``budget_s`` together."""
    obs = zeros(obs_leaves, n)
    runner(obs, n)
    best, spent = float("inf"), 0.0
    for _ in range(7):
        t0 = time.perf_counter()
        runner(obs, n)
        took = time.perf_counter() - t0
        best, spent = min(best, took), spent + took
        if spent > budget_s:
            break
    return best

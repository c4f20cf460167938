"""Where the policy acts: the tour, the ``Actor`` interface, and the policy in the workers.

A worker collector's policy acts in one of two places, chosen once when the collector is
built (``_collectors.placement``: ``policy_placement``, the machine's cores, and a
measurement, ``_policies.costs``), and reported (``collector.policy_in_workers``,
``placement_costs``):

* **central** (``PolicyRunner``, ``_policies.runner``): the engine calls the policy here, in
  the main process, once per round, batched over every ready worker's envs: the place for a
  policy on a GPU, or a large one that gains from batching and from threads on cores the
  workers leave free. The engine writes its outputs into the rollout storage;
* **local** (``LocalActor`` here, ``WorkerActor`` in each worker, ``_policies.worker_actor``):
  each worker acts with its own copy, next to its envs, and steps on with no round trip at
  all. The engine posts *runs* of steps, as for random actions, and books each run as a
  whole. For a policy on the CPU that is cheap per call, a round through the main process
  costs more than the policy itself (waking the engine, its bookkeeping, the policy's own
  Python overhead, which a small MLP's arithmetic does not hide: ``docs/benchmarks.md``).

**One interface.** The rounds (``_engine.rounds``) see an ``Actor``: they call it on the
observations of the lanes that want a step (``__call__``, as a ``PolicyRunner``), or, where
it offers ``runs`` (``Runs``), post the lanes runs of steps instead: a random policy's runs
carry actions drawn here in advance, a ``LocalActor``'s are acted in the workers (``local``:
only on lanes that declare ``acts_locally``; any other lane gets the central call, which a
``LocalActor`` makes with the collector's policy here). The scheduler never asks which kind
of actor or of strategy it has: each declares what it does.

**Who writes the rows.** One ``OutputWriter`` (``_policies.output_writer``) turns a policy
call's outputs into rows of the storage, checked and converted the same way wherever the
call was made: the engine's (``RolloutStorage``, laying out each output's field at its first
call) and each worker's (``WorkerActor``, over the fields ``out{i}`` of shared memory that
the probe laid out before the workers started: ``_policies.probe``, ``shared_fields``). The
actions are checked by the same ``env_actions`` in both places, and each step's policy
``version`` is stored next to them, so the batch is the same, field for field, whatever the
placement.

**How weights travel** (``_policies.weights_board``): ``update_policy_weights_`` copies the
new weights once, in the caller's thread: central, into a snapshot that the engine loads
between two policy calls (``_policies.weights``); local, straight into the weights' board in
shared memory, whose views *are* the collector's own copy's tensors (``BoardChannel``), and
each worker's copy loads them from there before its next step (``WeightsBoard.read``, behind
a sequence lock). So each frame carries the version that computed its action, and
``max_policy_lag`` bounds what it did before. ``init_random_frames`` are drawn in the main
process either way (their steps carry ``POLICY`` 0).

**What a worker is sent** (``payload``): the pickled policy, or, for a plain
``TensorDictModule``, only the module it wraps and its keys, which the worker calls and maps
as the engine's runner does (``_policies.outputs``) without importing tensordict; its
submodules then call their ``forward`` directly (``_policies.direct_calls``: the copy is
private, and ``nn.Module.__call__``'s empty hook checks were half of a small MLP's call).

**A JAX policy** (``JaxPolicy`` on the CPU) acts in the workers the same way, through its
own worker-side actor (``ArrayPolicy.worker_actor``: ``_policies.jax_worker.JaxWorkerActor``,
a ``WorkerActor`` that rebuilds and jits the pickled policy in the worker, with JAX pinned to
the CPU on one thread): its params' leaves are the board's fields (``ArrayBoardChannel``,
``_policies.board_channel``), and the collector's own copy acts with the board's views. A JAX
policy on a GPU or TPU stays central (``_collectors.placement``).

**Cost**: a worker with a policy imports torch (the lean worker does not): about 200 MiB
more per worker (``docs/benchmarks.md`` has the measured figures), and a second or two more
to start; a worker with a JAX policy imports JAX too.
"""

from __future__ import annotations

from typing import Any, Protocol

import cloudpickle
import numpy as np
import torch

from .._envs.spaces import NestedKey
from .array import ArrayPolicy
from .runner import PolicyRunner
from .weights import WeightsChannel

POLICY_RUN_S = 0.064
"""About how long a run of steps acted in the workers lasts (sized from the lane's last
runs): each step costs more to book per run than a random one saves, and new weights do not
wait for a run to end (the workers load them at their next step)."""


class Runs(Protocol):
    """How an actor's actions go in runs of steps (``Actor.runs``), posted to lanes that take
    runs (``LaneWorker.takes_runs``)."""

    local: bool
    """The workers' own copies act at each step of a run (only on lanes that
    ``acts_locally``); otherwise the run's actions are written here before it is posted."""
    span_s: float
    """About how long a run lasts (the lane's next run is sized from its last one's pace)."""
    keys: tuple
    """The outputs a run writes."""

    def begin(self) -> None:
        """Before a round posts runs: what a new round owes (the version in effect)."""
        ...

    def fill(self, storage: Any, lane: Any, steps: int) -> None:
        """Write the actions of ``lane``'s next ``steps`` steps into ``storage`` (nothing
        when ``local``)."""
        ...


class Actor(Protocol):
    """Where the policy acts, as the rounds see it: see the module docstring."""

    version: int
    """The policy version that computed the last actions."""
    runs: Runs | None
    """How its actions go in runs of steps (``None``: one call per step, here)."""
    checks_actions: bool
    """Its actions are checked (and converted) before the envs get them (a random policy's
    draws are valid by construction, unless they are one-hot rows)."""
    aligned_inputs: bool
    """It reads its inputs in place from 64-byte aligned memory (XLA, a JAX policy)."""

    def __call__(self, obs: dict[NestedKey, torch.Tensor], num_envs: int) -> dict[NestedKey, Any]:
        """The policy's outputs for ``num_envs`` envs' observations, here."""
        ...


class LocalActor:
    """The engine's side of the policy in the workers: its ``runs`` are acted by the
    workers' copies, whose weights ``weights`` publishes (a ``BoardChannel``, or an
    ``ArrayBoardChannel`` for a JAX policy); called like a
    ``PolicyRunner`` (for a lane that does not act locally), it calls the policy here."""

    local = True
    span_s = POLICY_RUN_S
    checks_actions = True

    def __init__(self, central: PolicyRunner, weights: WeightsChannel, keys: tuple):
        self.central = central
        self.policy = central.policy
        self.weights = weights
        self.keys = keys
        """The outputs, in the order the workers write them."""
        self.runs = self
        self.aligned_inputs = central.aligned_inputs

    @property
    def version(self) -> int:
        """The version in effect: what was published last (``BoardChannel``)."""
        return self.weights.version

    def begin(self) -> None:
        """Before a round's runs: the channel looks at the user's module (it warns once if
        that changes and no update is ever published: ``CopyChannel``)."""
        self.weights.has_pending  # noqa: B018 - (the look is the property's)

    def fill(self, storage: Any, lane: Any, steps: int) -> None:
        """Nothing: the workers write each step's actions and outputs."""

    def __call__(self, obs: dict[NestedKey, torch.Tensor], num_envs: int) -> dict[NestedKey, Any]:
        return self.central(obs, num_envs)


def shared_fields(outputs: list[tuple[Any, np.dtype, tuple]], slots: int, columns: int,
                  num_envs: int) -> list[tuple[str, np.dtype, tuple]]:
    """The shared-memory fields the workers write (``Layout.plan``'s ``extra``): each output
    the probe found (``out{i}``), and each step's ``version``."""
    k, t, n = slots, columns, num_envs
    out = [(f"out{i}", dtype, (k, t, n, *shape)) for i, (_, dtype, shape) in enumerate(outputs)]
    out.append(("version", np.dtype(np.int64), (k, t, n)))
    return out


def payload(runner: PolicyRunner, keys: tuple, num_workers: int) -> dict:
    """What each worker is sent to build its ``WorkerActor``, from the collector's
    ``PolicyRunner``: the pickled policy (where the runner calls a plain
    ``TensorDictModule``'s module directly, only that module and its keys, so that the worker
    need not import tensordict), the outputs' keys in the order of the ``out{i}`` fields, the
    interaction type by name, and one seed per worker. Raises if the policy cannot be pickled."""
    policy, plain = runner.policy, runner.plain_module
    if isinstance(policy, ArrayPolicy):  # (a JAX policy: its own worker-side actor, ``worker_actor``)
        return {
            "policy": cloudpickle.dumps(policy),
            "actor": policy.worker_actor,
            "config": policy.worker_config(),
            "keys": keys,
            "seeds": seeds_for(num_workers),
        }
    return {
        "policy": cloudpickle.dumps(policy.module if plain else policy),
        "in_keys": list(policy.in_keys) if plain else None,
        "out_keys": list(policy.out_keys) if plain else None,
        "keys": keys,
        "exploration_type": runner.exploration_type.name,
        "seeds": seeds_for(num_workers),
    }


def seeds_for(num_workers: int) -> list[int]:
    """One seed per worker's policy, from torch's seed (``torch.manual_seed`` makes them
    reproducible; no draw is taken from the user's generator)."""
    base = torch.initial_seed() % 2**62
    return [base + 7919 * (i + 1) for i in range(num_workers)]

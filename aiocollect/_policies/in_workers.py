"""The policy in the workers: each worker acts with its own copy, next to its envs.

A worker collector can call its policy here, in the main process, batched over every ready
worker (*central inference*): the right place for a policy on a GPU, or a large one that
gains from batching and from threads on cores the workers leave free. For a policy on the
CPU that is cheap per call, each round through the main process costs more than the policy
itself: waking the engine, the bookkeeping, and the policy's own Python overhead, which a
small MLP's arithmetic does not hide (``docs/benchmarks.md``). Then each worker runs a copy
of the policy on its own envs' observations and steps on with no round trip at all: the
engine posts *runs* of steps, as for random actions (``_engine.rounds.RandomRuns``), and
books each run as a whole.

What stays exactly as with central inference:

* **the batch**: the policy is called the same way (``PolicyRunner``), its action checked
  (and a one-hot action turned into the envs' indices) by the same ``ActionCheck``, and
  every output it writes lands in the same rollout storage: the output fields live in
  shared memory (``out{i}``, laid out before the workers start from one call of the policy
  on zeros: ``probe``), and so does each step's policy ``version``;
* **versions and weights**: the workers' copies load new weights from shared memory
  (``SharedWeights``: every tensor of the module's ``state_dict``, behind a sequence lock)
  before the first step that starts after they were published: ``update_policy_weights_``
  writes them there as it publishes (``WorkersRunner.sync``, in the caller's thread, under
  the channel's lock; the engine does the same before it posts steps, for updates loaded
  otherwise), so each frame carries the version that computed its action, and
  ``max_policy_lag`` bounds what it did before;
* **random frames**: ``init_random_frames`` are drawn in the main process as before (its
  steps carry ``POLICY`` 0).

**When** (``placement``, then ``measure``): ``AIOCOLLECT_POLICY_IN_WORKERS=1`` forces it,
``0`` forbids it. Unset, it is chosen for a torch module on the CPU (no ``policy_device``
other than the CPU, no ``compile_policy``/``cudagraph_policy``, no lazy module) when random
actions may go in runs (``reset_when_done``, no ``interruptor``), ``probe`` finds outputs the
workers can write, and either the workers are at least as many as the usable cores (the
engine has no core of its own), or ``measure`` finds it cheaper: it times the policy's call
on one worker's envs on one thread, as a worker would make it, against the main process's
round over every worker (the call on all their envs, on the threads the workers leave free,
and the engine's own work for each worker), and keeps the policy here only if that round
costs no more than the one worker's call. A small MLP goes to the workers everywhere it was
measured: on 2 cores with one worker (1.0-2.6x the frames of central inference with 8-64
CartPole envs) and on 16 cores with 15 (1.6-2.6x); a large network on a machine with cores to
spare for its threads stays here. A recurrent policy (one that writes ``("next", key)``
state) stays central.

**What a worker is sent** (``payload``): the pickled policy, or, for a plain
``TensorDictModule``, only the module it wraps and its keys, which the worker calls and maps
as the engine's runner does (``_policies.outputs``) without importing tensordict; its
submodules then call their ``forward`` directly (``_policies.direct_calls``: the copy is
private, and ``nn.Module.__call__``'s empty hook checks were half of a small MLP's call).

**Cost**: a worker with a policy imports torch (the lean worker does not): about 200 MiB
more per worker (``docs/benchmarks.md`` has the measured figures), and a second or two more
to start.
"""

from __future__ import annotations

import copy
import os
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._workers.protocol import env_flag, usable_cores

SEQ, VERSION = 0, 1
"""The words of the weights' clock (``wclock``): a sequence lock (odd while the engine
writes) and the version of the weights there."""


def placement(policy: Any, *, num_workers: int, policy_device: Any, compiled: bool, runs: bool,
              choice: str = "auto") -> str:
    """Where the policy runs, as far as can be told before the probe (see the module docstring):

    * ``"workers"``: in the workers, asked for (``choice="workers"``, the collectors'
      ``policy_placement``; or ``AIOCOLLECT_POLICY_IN_WORKERS=1`` with ``"auto"``) or with no
      core left for the engine (as many workers as usable cores, or more);
    * ``"measure"``: it may run in either place; ``measure`` chooses;
    * ``"central"``: here, asked for (``"central"``, or ``AIOCOLLECT_POLICY_IN_WORKERS=0``);
    * ``"cannot"``: here, as the workers cannot run it (``cannot_act_in_workers`` says why).
    """
    forced = {"central": False, "workers": True}.get(choice, env_flag("AIOCOLLECT_POLICY_IN_WORKERS"))
    if forced is False:
        return "central"
    if cannot_act_in_workers(policy, policy_device=policy_device, compiled=compiled, runs=runs) is not None:
        return "cannot"
    return "workers" if forced or num_workers >= usable_cores() else "measure"


def cannot_act_in_workers(policy: Any, *, policy_device: Any, compiled: bool, runs: bool) -> str | None:
    """Why the workers cannot act with a copy of ``policy`` (``None``: they can, as far as can
    be told before the probe's call)."""
    import torch

    from .random import RandomPolicy

    if not isinstance(policy, torch.nn.Module) or isinstance(policy, RandomPolicy):
        return "it is not a torch module (random actions, a plain function, a JAX policy)"
    if compiled:
        return "it is compiled (compile_policy, cudagraph_policy), for this process"
    if not runs:
        return ("a batch may be cut after any step (interruptor) or envs wait for a reset "
                "(reset_when_done=False): the engine steps them one at a time")
    if policy_device is not None and torch.device(policy_device).type != "cpu":
        return f"it acts on {policy_device}, and the workers act on the CPU"
    from tensordict.nn import TensorDictModule
    from torch.nn.parameter import is_lazy

    from .._engine.storage import NUMPY_DTYPES  # (what numpy, so shared memory, holds)

    if isinstance(policy, TensorDictModule) and not isinstance(policy.module, torch.nn.Module):
        return "it is a TensorDictModule around a plain function (a worker's copy is built from a module)"
    tensors = policy.state_dict(keep_vars=True).values()
    if any(not isinstance(t, torch.Tensor) for t in tensors):
        return "it has extra state (get_extra_state), not weights the workers' copies could load"
    if any(is_lazy(t) or t.device.type != "cpu" or t.dtype not in NUMPY_DTYPES for t in tensors):
        # (a lazy module takes its shapes at its first call, or from the first update)
        return "it has lazy, non-CPU or non-numpy tensors, which shared memory cannot hold"
    return None


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
            cores: int | None = None) -> Costs | None:
    """Time the policy's calls on zeros of the observations, in both places (``Costs``): a
    warm-up and the best of a few calls each, within about a tenth of a second, with torch's
    generator and threads as they were after. ``policy`` is called, so it is a scratch copy
    (``scratch_copy``: a call may change a module's state), which this leaves with direct
    calls (``direct_calls``). ``None`` if a call fails (then the probe has said so)."""
    cores = usable_cores() if cores is None else cores
    keys = [leaf.key for leaf in obs_leaves]
    per_worker, rows = max(envs_per_worker), sum(envs_per_worker)
    with _MEASURING:  # (torch's threads are the process's: two collectors built at once take turns)
        return _measure(policy, keys, obs_leaves, exploration_type, per_worker, rows, len(envs_per_worker), cores)


_MEASURING = threading.Lock()


def _measure(policy: Any, keys: list, obs_leaves: list, exploration_type: Any, per_worker: int, rows: int,
             workers: int, cores: int) -> Costs | None:
    """``measure``'s timing, under its lock."""
    import torch

    from .direct_calls import direct_calls
    from .runner import PolicyRunner

    threads = torch.get_num_threads()
    spare = min(threads, max(1, cores - workers))  # (the threads the policy here would get)
    state = torch.random.get_rng_state()
    try:
        runner = PolicyRunner(policy, keys, device=None, exploration_type=exploration_type)
        torch.set_num_threads(spare)
        central = _best(runner, obs_leaves, rows) + ENGINE_S_PER_WORKER * workers
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
    import time

    obs = _zeros(obs_leaves, n)
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


def scratch_copy(policy: Any) -> Any | None:
    """A deep copy of the policy for ``probe`` and then ``measure`` to call (a call may change
    a module's state: a ``BatchNorm``'s running stats...), so that the policy the collector
    runs and sends to the workers stays as it was; ``None`` if it cannot be copied (nor then
    pickled for the workers). One copy serves both: what the probe's call changed in it does
    not change what the calls cost."""
    try:
        return copy.deepcopy(policy)
    except Exception:  # noqa: BLE001 - a module that cannot be copied cannot be pickled either
        return None


def own_state_changes(policy: Any, obs_leaves: list, exploration_type: Any) -> str | None:
    """Why ``policy`` must act here, in one place, or ``None``: it changes its own state while
    acting, so copies in the workers would each change theirs apart, unseen by
    ``collector.policy`` and the checkpoints, and act otherwise than the one policy here.

    Found two ways: a submodule that keeps running statistics (``BatchNorm``, ``InstanceNorm``
    with ``track_running_stats``: they change in train mode, which the user may switch to at
    any time), or a buffer that one call on zeros of two envs' observations changes, replaces
    or adds, in train mode and in eval mode (a counter, an estimate...). ``policy`` is called, so
    it is a scratch copy (``scratch_copy``), left in the modes it had; torch's generator is left
    as it was. A call that fails says nothing (``probe``'s call then fails too)."""
    import torch

    from .runner import PolicyRunner

    for name, module in policy.named_modules():
        if getattr(module, "track_running_stats", False) and getattr(module, "running_mean", None) is not None:
            return (f"its {type(module).__name__} {name or '(the policy itself)'!r} keeps running statistics, "
                    "which it updates while acting in train mode")
    keys = [leaf.key for leaf in obs_leaves]
    runner = PolicyRunner(policy, keys, device=None, exploration_type=exploration_type)
    modes = [(m, m.training) for m in policy.modules()]
    rng = torch.random.get_rng_state()
    obs = _zeros(obs_leaves, 2)
    try:
        for training in (policy.training, not policy.training):
            policy.train(training)
            before = {k: b.detach().clone() for k, b in policy.named_buffers()}
            runner(obs, 2)
            after = dict(policy.named_buffers())
            changed = sorted(set(before) ^ set(after)) or [
                k for k, b in before.items() if b.shape != after[k].shape or not torch.equal(b, after[k].detach())]
            if changed:
                return (f"its buffer{'s' if len(changed) > 1 else ''} {', '.join(map(repr, changed[:3]))} "
                        f"changed in a call ({'train' if training else 'eval'} mode)")
    except Exception:  # noqa: BLE001 - the probe's call fails too, and says nothing either
        return None
    finally:
        for m, training in modes:
            m.training = training
        torch.random.set_rng_state(rng)
    return None


class _NotTheirShape(Exception):  # (carries the policy's own error past ``probe``'s catch-all)
    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


def probe(policy: Any, obs_leaves: list, exploration_type: Any, check: Any) -> list[tuple[Any, np.dtype, tuple]] | None:
    """The policy's outputs as the workers will write them, ``(key, dtype, per-env
    shape)`` each, found by one call on zeros of two envs' observations, as the engine
    calls it; ``None`` if that call fails, writes what shared memory cannot hold
    (a dtype numpy lacks) or writes a recurrent state (``("next", key)``). ``policy`` is
    called, so it is a scratch copy (``scratch_copy``); torch's generator is left as it was.
    A call that fails on the shapes of its inputs (``outputs.is_shape_error``) raises, with a
    note naming them: the policy does not take the envs' observations."""
    import torch

    from .._envs.spaces import NonFiniteAction
    from .outputs import check_outputs, is_shape_error, note_policy_inputs
    from .runner import PolicyRunner

    keys = [leaf.key for leaf in obs_leaves]
    runner = PolicyRunner(policy, keys, device=None, exploration_type=exploration_type)
    if runner.kind not in ("module", "tensordict", "callable"):
        return None
    n = 2
    obs = _zeros(obs_leaves, n)
    state = torch.random.get_rng_state()
    try:
        try:
            out = runner(obs, n)
        except Exception as exc:
            if is_shape_error(exc):  # (not the zeros: its inputs' shapes) said now, before any worker starts
                note_policy_inputs(exc, obs, n, " (zeros shaped as the envs' observations, before any worker starts)")
                raise _NotTheirShape(exc) from exc
            return None  # then it runs centrally, where its first call says what is wrong
        if runner.per_env:  # (called once per env: central, where its calls are made so)
            return None
        check_outputs(out, n)
        specs = []
        for key, value in out.items():
            if isinstance(key, tuple) and key[0] == "next":
                return None
            value = _array(value)
            if key == "action":
                try:
                    value = check(value, n)
                except NonFiniteAction:  # (NaN on zeros, a division by their norm...: the layout is what counts)
                    pass
            if value.dtype.kind not in "biuf" or value.shape[0] != n:
                return None
            specs.append((key, value.dtype, tuple(value.shape[1:])))
        return specs
    except _NotTheirShape as wrapped:
        raise wrapped.error from None
    except Exception:  # noqa: BLE001 - then it runs centrally, where its first call says what is wrong
        return None
    finally:
        torch.random.set_rng_state(state)  # (the probe takes no draw from the user's generator)


def _zeros(obs_leaves: list, n: int) -> dict:
    """Zeros of ``n`` envs' observations, as the engine hands them to the policy (``probe``'s
    and ``measure``'s calls)."""
    import torch

    return {leaf.key: torch.from_numpy(np.zeros((n, *leaf.shape), dtype=leaf.dtype)) for leaf in obs_leaves}


def _array(value: Any) -> np.ndarray:
    return value if isinstance(value, np.ndarray) else value.detach().cpu().numpy()


def fields(outputs: list[tuple[Any, np.dtype, tuple]], module: Any, slots: int, columns: int,
           num_envs: int) -> list[tuple[str, np.dtype, tuple]]:
    """The shared-memory fields of the policy in the workers (``Layout.plan``'s ``extra``):
    each output, each step's version, the weights and their clock."""
    k, t, n = slots, columns, num_envs
    out = [(f"out{i}", dtype, (k, t, n, *shape)) for i, (_, dtype, shape) in enumerate(outputs)]
    out.append(("version", np.dtype(np.int64), (k, t, n)))
    for i, tensor in enumerate(module.state_dict().values()):
        out.append((f"w{i}", _array(tensor).dtype, tuple(tensor.shape)))
    out.append(("wmode", np.dtype(np.uint8), (len(list(module.modules())),)))
    out.append(("wclock", np.dtype(np.int64), (2,)))
    return out


def payload(runner: Any, keys: tuple, num_workers: int) -> dict:
    """What each worker is sent to build its ``WorkerPolicy``, from the collector's
    ``PolicyRunner``: the pickled policy (where the runner calls a plain ``TensorDictModule``'s
    module directly, ``kind`` ``"module"``, only that module and its keys, so that the worker
    need not import tensordict), the outputs' keys in the order of the ``out{i}`` fields, the
    interaction type by name, and one seed per worker. Raises if the policy cannot be pickled."""
    import cloudpickle

    policy, plain = runner.policy, runner.kind == "module"
    return {
        "policy": cloudpickle.dumps(policy.module if plain else policy),
        "in_keys": list(policy.in_keys) if plain else None,
        "out_keys": list(policy.out_keys) if plain else None,
        "keys": keys,
        "exploration_type": runner.exploration_type.name,
        "seeds": seeds_for(num_workers),
    }


class SharedWeights:
    """The module's weights in shared memory: the engine ``write``s, workers ``read``."""

    def __init__(self, arrays: dict[str, np.ndarray]):
        count = sum(1 for name in arrays if name.startswith("w") and name[1:].isdigit())
        self.arrays = [arrays[f"w{i}"] for i in range(count)]
        self.modes = arrays["wmode"]
        """Each submodule's ``training`` flag (train/eval mode), in ``modules()`` order of
        the collector's policy: they travel with the weights."""
        self.clock = arrays["wclock"]

    @property
    def version(self) -> int:
        return int(self.clock[VERSION])

    def write(self, module: Any, version: int) -> None:
        """Copy ``module``'s ``state_dict`` in, as ``version`` (in the caller's thread, or the
        engine's). An exception in the middle (a Ctrl-C between two tensors) finishes the
        copy before it propagates: the sequence word never stays odd (every worker would wait
        for it forever) and never turns even over half-copied weights."""
        tensors = list(module.state_dict().values())
        if [tuple(t.shape) for t in tensors] != [a.shape for a in self.arrays]:
            raise RuntimeError(
                f"policy: its weights are now of shapes {[list(t.shape) for t in tensors]}, the workers' copies "
                f"{[list(a.shape) for a in self.arrays]}: a policy whose weights change shape or number "
                "(a submodule replaced...) needs a new collector.")
        clock = self.clock
        clock[SEQ] += 1  # odd: being written
        try:
            self._copy(module, tensors, version)
        except BaseException:
            self._copy(module, tensors, version)
            raise
        finally:
            clock[SEQ] += 1

    def _copy(self, module: Any, tensors: list, version: int) -> None:
        for dst, tensor in zip(self.arrays, tensors):
            np.copyto(dst, _array(tensor))
        modes = [m.training for m in module.modules()]
        if len(modes) == len(self.modes):
            self.modes[:] = modes
        self.clock[VERSION] = version

    def read(self, tensors: list, seen: int, modules: list) -> tuple[int, int] | None:
        """Load the weights into ``tensors`` (a worker's copy's ``state_dict`` values), and
        the train/eval mode into ``modules`` (its submodules, in the order of the
        collector's policy's ``modules()``), if they changed since sequence ``seen``:
        ``(sequence, version)``, or ``None`` if unchanged."""
        import torch

        clock = self.clock
        while True:
            seq = int(clock[SEQ])
            if seq == seen:
                return None
            if seq & 1:
                os.sched_yield()
                continue
            version = int(clock[VERSION])
            for tensor, src in zip(tensors, self.arrays):
                tensor.copy_(torch.from_numpy(src))
            modes = self.modes.tolist()
            if int(clock[SEQ]) == seq:
                for module, mode in zip(modules, modes):
                    module.training = bool(mode)
                return seq, version


class WorkersRunner:
    """The engine's runner while the policy runs in the workers (``kind`` ``"workers"``):
    ``sync`` publishes new weights to them; called like a ``PolicyRunner`` (for lanes that
    take no runs), it calls the policy here."""

    kind = "workers"

    def __init__(self, central: Any, weights: SharedWeights, keys: tuple):
        self.central = central
        self.policy = central.policy
        self.shared = weights
        self.keys = keys
        """The outputs, in the order the workers write them."""
        self.published = 0

    @property
    def weights(self) -> Any:
        return self.central.weights

    @property
    def version(self) -> int:
        """The version of the weights here (what ``sync`` published last, or what a call
        here loaded since)."""
        return self.central.version

    def sync(self) -> None:
        """Publish the weights ``update_policy_weights_`` gave, if any, before steps are posted."""
        channel = self.central.weights
        if channel is None:
            return
        with channel.lock:
            if channel.has_pending:
                channel.apply_pending()
            if channel.version != self.published:
                try:
                    self.shared.write(self.policy, channel.version)
                finally:  # (a Ctrl-C in the copy lets it finish first: then it is published)
                    if self.shared.version == channel.version:
                        self.published = channel.version
                        self.central.version = channel.version

    def __call__(self, obs: dict, num_envs: int) -> dict:
        return self.central(obs, num_envs)


class WorkerPolicy:
    """A worker's copy of the policy (``_workers.child``): ``act`` writes one step's actions
    and outputs for one part of its envs, as the engine's ``Rounds._infer`` and
    ``RolloutStorage.write`` would."""

    def __init__(self, setup: dict, arrays: dict[str, np.ndarray], action_space: Any, obs_keys: list, seed: int,
                 *, worker: int = 0, first: int = 0):
        import sys

        import cloudpickle
        import torch

        from .._envs.spaces import ActionCheck, NonFiniteAction
        from .._errors import PolicyError
        from .direct_calls import direct_calls
        from .outputs import check_outputs, dtype_changed, host_array, module_outputs, shape_changed

        torch.set_num_threads(1)
        torch.manual_seed(seed)
        # what the engine sets around each call, set once for good: this process only acts
        torch.set_grad_enabled(False)
        self.policy = cloudpickle.loads(setup["policy"])
        if setup["in_keys"] is not None:  # a plain module: called as the runner calls it
            module, in_keys, out_keys = self.policy, setup["in_keys"], setup["out_keys"]
            self._call = lambda obs: module_outputs(module(*[obs[k] for k in in_keys]), out_keys)
        else:
            from .runner import PolicyRunner

            self._call = PolicyRunner(self.policy, obs_keys, device=None, exploration_type=None).call_bare
        self._exploration = setup["exploration_type"]
        self._modules = sys.modules
        self._interaction_unset = True
        """The interaction type (tensordict's) is not set yet: it lives in tensordict, so
        it is set once something imported tensordict (the policy's unpickling, or its own
        call: see ``_act``)."""
        if "tensordict" in sys.modules:
            self._set_interaction()
        direct_calls(self.policy)  # (a private copy: its submodules skip __call__'s empty checks)
        self.obs_keys = obs_keys
        self._columns: dict[tuple, tuple] = {}
        """Per part, slot and column (``_column``): the policy's input tensors and where each
        output and the version go, all views of the storage, made once."""
        self.check = ActionCheck.for_space(action_space)
        self.worker, self.first = worker, first
        """This worker's index, and the row of its env 0 (errors name an env as the engine does)."""
        self.keys = setup["keys"]
        self._action_at = self.keys.index("action") if "action" in self.keys else -1
        self.outputs = [arrays[f"out{i}"] for i in range(len(self.keys))]
        self.version_field = arrays["version"]
        self.weights = SharedWeights(arrays)
        self.tensors = list(self.policy.state_dict().values())
        self.modules = list(self.policy.modules())
        if setup["in_keys"] is not None:  # (the collector's policy is the TensorDictModule around it)
            self.modules.insert(0, torch.nn.Module())
        shapes = [tuple(arrays[f"w{i}"].shape) for i in range(len(self.tensors)) if f"w{i}" in arrays]
        if shapes != [tuple(t.shape) for t in self.tensors]:
            got = [list(t.shape) for t in self.tensors]
            raise RuntimeError(f"policy: this worker's copy has weights of shapes {got}, "
                               f"shared memory {[list(x) for x in shapes]}.")
        self.seen, self.version = 0, 0
        self._clock = memoryview(self.weights.clock)
        """The weights' clock, read as Python ints (no numpy scalar made at each step)."""
        self._from_numpy = torch.from_numpy
        self._check_outputs, self._shape_changed, self._dtype_changed = check_outputs, shape_changed, dtype_changed
        self._host_array = host_array
        self._non_finite_action, self._not_finite = NonFiniteAction, PolicyError.not_finite

    def _set_interaction(self) -> None:
        from tensordict.nn import InteractionType, set_interaction_type

        set_interaction_type(InteractionType[self._exploration]).__enter__()
        self._interaction_unset = False

    def reseed(self, seed: int) -> None:
        """A seeded reset (``set_seed``): the policy's own draws restart from ``seed`` too."""
        import torch

        torch.manual_seed(seed)

    def act(self, obs: list[np.ndarray], action: np.ndarray, s: int, t: int, lo: int, hi: int) -> None:
        """Column ``t`` of slot ``s`` for rows ``lo:hi``: the policy's outputs from the
        observations ``obs`` (each leaf's ``[slots, columns, envs, ...]`` view of these rows;
        column ``t`` is read as tensors made once per column), the envs' actions into ``action``."""
        try:
            self._act(obs, action, s, t, lo, hi)
        except BaseException as exc:
            try:
                exc._aiocollect_policy = True  # (the engine raises it as the policy's: ``_errors``)
            except AttributeError:
                pass
            raise

    def _act(self, obs: list[np.ndarray], action: np.ndarray, s: int, t: int, lo: int, hi: int) -> None:
        # (runs at every step of every env part: each numpy or torch call here costs a few
        # microseconds once the envs' own code has taken the caches, so there are few)
        if self._clock[SEQ] != self.seen:
            got = self.weights.read(self.tensors, self.seen, self.modules)
            if got is not None:
                self.seen, self.version = got
        column = self._columns.get((lo, s, t)) or self._column(obs, s, t, lo, hi)
        inputs, parts, version = column
        out = self._call(inputs)
        if self._interaction_unset and "tensordict" in self._modules:
            # this call imported tensordict (a policy that imports it in its forward): it read no
            # interaction type; once the collector's is set, the call is made again, under it
            self._set_interaction()
            out = self._call(inputs)
        if tuple(out) != self.keys:
            raise KeyError(f"policy: wrote {list(out)!r} at this step but {list(self.keys)!r} at its first call; "
                           "a policy must write the same keys at every step.")
        n = hi - lo
        for i, (key, part) in enumerate(zip(self.keys, parts)):
            value = out[key]
            if not isinstance(value, np.ndarray):
                try:
                    value = value.numpy()  # (no grad here, on the CPU)
                except (AttributeError, TypeError, RuntimeError):  # not a tensor, or no data: the engine's message
                    self._check_outputs(out, n)
                    value = self._host_array(value)  # (bfloat16...: as the engine stores it)
            if not value.shape or value.shape[0] != n:
                self._check_outputs(out, n)  # (the engine's message for a row count)
            if i == self._action_at:
                try:
                    value = self.check(value, n)
                except self._non_finite_action as exc:  # (the engine's error, naming the env as it does)
                    raise self._not_finite(exc.value, worker=self.worker, env=lo + exc.row - self.first,
                                           pid=os.getpid()) from None
                action[...] = self.check.env_action(value)
            if value.shape != part.shape:
                raise self._shape_changed(key, value.shape[1:], part.shape[1:])
            if value.dtype != part.dtype and (error := self._dtype_changed(key, value.dtype, part.dtype)):
                raise error
            part[...] = value
        version[...] = self.version

    def _column(self, obs: list[np.ndarray], s: int, t: int, lo: int, hi: int) -> tuple:
        """``(inputs, output parts, version part)`` of column ``t`` of slot ``s``, rows ``lo:hi``."""
        column = ({key: self._from_numpy(x[s, t]) for key, x in zip(self.obs_keys, obs)},
                  [dst[s, t, lo:hi] for dst in self.outputs], self.version_field[s, t, lo:hi])
        self._columns[(lo, s, t)] = column
        return column


def seeds_for(num_workers: int) -> list[int]:
    """One seed per worker's policy, from torch's seed (``torch.manual_seed`` makes them
    reproducible; no draw is taken from the user's generator)."""
    import torch

    base = torch.initial_seed() % 2**62
    return [base + 7919 * (i + 1) for i in range(num_workers)]

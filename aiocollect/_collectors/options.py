"""The collector options, declared once, and validated from the declaration.

Every option is one field of [`CollectorOptions`][aiocollect.CollectorOptions] (or of
``WorkerOptions``, the multi-process collectors' own), declared with its type, its
normalised default, its docstring (the documentation users read) and its ``option(...)``
metadata: the check of its value (``_collectors.checks``), the constructors' keyword
default where that differs from the normalised one (TorchRL's ``split_trajs=None``), and
what the distributed collectors do with it. From that declaration:

* ``validate_options`` and ``validate_worker_options`` (``options_from`` in the
  constructors) run each field's check, in declaration order, then the few rules that join
  several options; every constructor calls them before an env is built or a process
  started. A bad value raises ``ValueError``/``TypeError`` naming the argument and saying
  what would be accepted.
* ``FORWARDED`` (``_distributed.remote_collectors``), the options RayCollector and RPCCollector pass to
  every remote collector, are the fields marked ``FORWARD``.
* The constructors keep explicit keyword signatures (for users, IDEs and TorchRL's
  signature tests); ``tests/unit/test_options.py`` checks every one against the
  declaration: each option a constructor takes is a keyword-only argument with the
  declared default, and every other keyword is one of its own documented arguments.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

import torch
from tensordict.nn import InteractionType

from . import checks
from .checks import LONGEST_WAIT as LONGEST_WAIT
from .checks import as_int as as_int
from .checks import finite
from .checks import parse_device as parse_device
from .checks import parse_exploration_type as parse_exploration_type
from .checks import validate_start_timeout as validate_start_timeout
from .checks import validate_timeout as validate_timeout

# --------------------------------------------------------------------------- how an option is declared

FORWARD: Literal["forward"] = "forward"
"""RayCollector and RPCCollector take the option and pass it to every remote collector."""
HERE: Literal["here"] = "here"
"""RayCollector and RPCCollector take the option and apply it themselves, to the batches they gather."""

_SAME: Any = object()


@dataclass(frozen=True)
class Option:
    """How one option is given and checked: its field's ``metadata["option"]`` (see ``option``)."""

    check: Callable[[str, Any], Any]
    """``check(name, value)``: the value normalised, or an error naming the argument and the fix."""
    keyword: Any
    """The constructors' default for the keyword, as ``options_of`` gives it (``inspect.Parameter.empty``:
    required)."""
    distributed: Literal["forward", "here"] | None
    """``FORWARD``, ``HERE``, or ``None``: the distributed collectors do not take it (pass it to the
    remote collectors in ``collector_kwargs``)."""


def option(check: Callable[[str, Any], Any], distributed: Literal["forward", "here"] | None = None, *,
           keyword: Any = _SAME) -> Mapping[str, Option]:
    """A field's metadata: ``check`` its value; the ``distributed`` collectors ``FORWARD`` it to
    their remote collectors, apply it ``HERE``, or do not take it (``None``); ``keyword``: the
    constructors' default, where it is not the field's (normalised) one."""
    return {"option": Option(check, keyword, distributed)}


# --------------------------------------------------------------------------- the declaration


@dataclass(frozen=True)
class CollectorOptions:
    """The options shared by every collector, with TorchRL's names and meanings.

    Every collector takes these as keyword arguments (the distributed collectors take
    the subset in their signature), checks them all before any env is built or process
    started, and keeps the result, normalised, as ``collector.options``. A bad value
    raises ``ValueError`` or ``TypeError`` naming the argument and saying what would be
    accepted. Each field below is one argument; the defaults shown are the normalised
    ones (``init_random_frames=None`` becomes 0, ``split_trajs=None`` becomes ``False``).

    Examples:
        >>> collector = Collector(make_env, policy, frames_per_batch=200, total_frames=10_000,
        ...                       max_frames_per_traj=50, split_trajs=True)
        >>> collector.options.max_frames_per_traj
        50
    """

    frames_per_batch: int = field(metadata=option(checks.frames_per_batch, HERE))
    """Frames (env steps, summed over envs) in each batch; a value that does not split evenly
    over the envs is rounded up to one that does, with a warning, as in TorchRL."""
    total_frames: int = field(default=-1, metadata=option(checks.total_frames, HERE))
    """Frames over the collector's life, a multiple of ``frames_per_batch`` (another value is
    rounded up to one, with a warning, as in TorchRL); ``-1``: endless."""
    device: torch.device | None = field(default=None, metadata=option(checks.device, FORWARD))
    """Fills any of the three devices below that is not given."""
    storing_device: torch.device | None = field(default=None, metadata=option(checks.device, FORWARD))
    """Where batches are stored."""
    env_device: torch.device | None = field(default=None, metadata=option(checks.device, FORWARD))
    """Where the env's tensors live (gymnasium envs compute on the CPU)."""
    policy_device: torch.device | None = field(default=None, metadata=option(checks.device, FORWARD))
    """Where the policy runs; observations are moved there and actions back."""
    create_env_kwargs: dict | list[dict] = field(default_factory=dict,
                                                 metadata=option(checks.create_env_kwargs, keyword=None))
    """Keyword arguments for ``create_env_fn`` (factories and env ids only); for the
    multi-process collectors, also a list with one dict per worker, as in TorchRL."""
    max_frames_per_traj: int | None = field(default=None, metadata=option(checks.max_frames_per_traj, FORWARD))
    """Truncate (and reset) a trajectory after this many steps; ``None`` (or ``-1``): never."""
    init_random_frames: int = field(default=0, metadata=option(checks.init_random_frames, FORWARD, keyword=None))
    """Frames collected with a random policy first (rounded up to whole batches); ``None``
    or ``-1`` (TorchRL's spelling): none."""
    reset_at_each_iter: bool = field(default=False, metadata=option(checks.flag, FORWARD))
    """Reset every env at the start of each batch."""
    postproc: Callable | None = field(default=None, metadata=option(checks.postproc, HERE))
    """Applied to each batch (after ``split_trajs``)."""
    split_trajs: bool = field(default=False, metadata=option(checks.flag_or_none, HERE, keyword=None))
    """Deliver batches split into zero-padded trajectories (see
    [`split_trajectories`][aiocollect.split_trajectories])."""
    exploration_type: InteractionType = field(default=InteractionType.RANDOM,
                                              metadata=option(checks.exploration_type, FORWARD))
    """Interaction type set (tensordict's ``set_interaction_type``) around policy calls; an
    ``InteractionType`` or its name (``"random"``, ``"mode"``, ``"mean"``...)."""
    return_same_td: bool = field(default=False, metadata=option(checks.flag))
    """Reuse one TensorDict for every batch (its values are overwritten)."""
    reset_when_done: bool = field(default=True, metadata=option(checks.flag))
    """Reset an env as soon as it is done; if false, finished envs keep stepping and the
    root done flags carry over (not for coroutine envs, which are always reset)."""
    interruptor: Any = field(default=None, metadata=option(checks.interruptor))
    """An object whose ``collection_stopped()`` cuts the current batch short (see
    [`Interruptor`][aiocollect.Interruptor])."""
    set_truncated: bool = field(default=False, metadata=option(checks.flag))
    """Mark the last step of each batch as truncated (and done), as TorchRL does; the episodes
    go on in the next batch, with the same trajectory ids."""
    track_policy_version: bool = field(default=False, metadata=option(checks.flag, HERE))
    """TorchRL's keyword: batches also carry ``"policy_version"`` and ``("next",
    "policy_version")`` (every frame has ``("collector", "policy_version")`` anyway)."""
    replay_buffer: Any = field(default=None, metadata=option(checks.replay_buffer, HERE))
    """Anything with ``extend``: batches go there (to a TorchRL buffer of one-dimensional
    storage as frames, one per item, as TorchRL's collectors give it); iteration then yields ``None``."""
    progress: bool = field(default=False, metadata=option(checks.flag, HERE))
    """Show a tqdm progress bar (frames, frames/s, mean episode return; a widget in Jupyter)."""
    trajs_per_batch: int | None = field(default=None, metadata=option(checks.trajs_per_batch, HERE))
    """Deliver batches of exactly this many **complete** trajectories instead of
    ``frames_per_batch`` frames (TorchRL 0.14's keyword): frames are still collected
    ``frames_per_batch`` at a time, and each trajectory is delivered once it ended (a done
    step), whole, however many collections it spanned. With a ``replay_buffer``, each
    complete trajectory is written to it flat as soon as it ended (as TorchRL does, for
    ``SliceSampler(end_key=("next", "done"))``). ``None``: frame batches."""
    traj_format: str = field(default="padded", metadata=option(checks.traj_format, HERE, keyword=None))
    """The layout of ``trajs_per_batch``'s batches: ``"padded"``, ``[trajs, longest]``
    zero-padded with a ``("collector", "mask")`` of the real frames; or ``"cat"``,
    ``[frames]``, the trajectories one after the other."""
    trajs_per_write: int | None = field(default=None, metadata=option(checks.trajs_per_write, HERE))
    """With ``trajs_per_batch`` and a ``replay_buffer``: complete trajectories per
    ``extend`` call (``None``: all those that ended in a collection, in one call)."""

    @property
    def truncates(self) -> bool:
        """Whether the collector itself truncates episodes (``max_frames_per_traj``,
        ``set_truncated``): batches then have a ``"truncated"`` entry whatever the env has,
        as TorchRL's have (its ``StepCounter`` adds one)."""
        return self.max_frames_per_traj is not None or self.set_truncated


START_TIMEOUT_S = 300.0
"""``start_timeout``'s default: how long worker processes may take to start."""


@dataclass(frozen=True)
class WorkerOptions:
    """The options of the multi-process collectors, on top of [`CollectorOptions`][aiocollect.CollectorOptions]."""

    cat_results: str | int = field(default="stack", metadata=option(checks.cat_results, keyword=None))
    """MultiSync: ``"stack"`` the workers' batches along a new first dim, or an int:
    concatenate them along that dim (TorchRL's meaning). Checked but unused by MultiAsync."""
    preemptive_threshold: float | None = field(default=None, metadata=option(checks.preemptive_threshold))
    """MultiSync: cut the batch once this fraction of workers has its share; the frames
    the others did not collect are masked out with ``("collector", "mask")`` (left out of a
    batch concatenated along time, ``cat_results=-1``, as TorchRL does)."""
    update_at_each_batch: bool = field(default=False, metadata=option(checks.flag))
    """MultiSync: call ``update_policy_weights_()`` before each batch. Accepted but unused
    by MultiAsync."""
    max_policy_lag: int | None = field(default=None, metadata=option(checks.max_policy_lag))
    """MultiAsync: no delivered frame was produced by a policy more than this many versions
    older than the newest published when the batch is delivered (``None``: no bound)."""
    start_timeout: float | None = field(default=START_TIMEOUT_S, metadata=option(checks.start_timeout))
    """Seconds the worker processes may take, together, to start (a fresh interpreter each,
    importing what the env factories need and building their envs) before the constructor
    raises [`StartTimeoutError`][aiocollect.StartTimeoutError] naming those not up (killed)
    and those that were (stopped); ``None``: wait forever. Raise it on a loaded machine, or
    for envs that take minutes to build."""
    policy_placement: str = field(default="auto", metadata=option(checks.policy_placement))
    """Where the policy acts: ``"central"``, in this process, batched over every ready worker's
    envs; ``"workers"``, a copy in each worker (a ``ValueError`` at construction, before any
    process starts, for a policy the workers cannot run, naming why); ``"auto"``, chosen as the
    collector is built (``AIOCOLLECT_POLICY_IN_WORKERS=0``/``1`` forces it, as a fallback).
    ``collector.policy_in_workers`` says where it acts."""
    spin: bool | None = field(default=None, metadata=option(checks.auto_flag))
    """Whether the engine and the workers busy-wait for each other (about 100 us each,
    yielding the core between looks) before they sleep in the kernel: a step's hand-off
    then takes microseconds instead of a wake-up, at the price of the CPU spun. ``None``:
    on x86-64, when this process and every worker can each have a core that the machine
    does not keep busy besides (the cores this process may use, less the lesser of the
    1-minute load average and the tasks runnable right now, as the collector is built),
    both spin, else only the workers, for up to 1 ms; elsewhere nobody spins. ``True``:
    both spin; ``False``: nobody spins. ``AIOCOLLECT_SPIN=0``/``1`` forces it where the
    keyword is ``None``. ``collector.spin`` says whether the engine spins for its workers'
    steps (with random actions or the policy in the workers, steps go in runs, which the
    engine does not spin for)."""
    pipeline: bool | None = field(default=None, metadata=option(checks.auto_flag))
    """Whether each worker steps its envs in two halves, in turn, so that the policy call
    for one half (made here) overlaps the other half's steps, at the price of twice the
    policy calls. Only where the actions come from here between steps: not for a policy in
    the workers, nor for random actions, which workers take in runs of steps (unless an
    ``interruptor`` or ``reset_when_done=False`` keeps them step by step); and for workers
    whose envs are stepped one by one. ``None``: for
    workers of 8 envs or more, when the engine has cores to spare (a CPU policy: two cores
    per worker process; a GPU policy: one core for the engine); ``True``: for workers of 2
    envs or more. ``AIOCOLLECT_PIPELINE=0``/``1`` forces it where the keyword is ``None``.
    ``collector.pipeline`` says whether any worker steps in halves."""
    num_threads: int | None = field(default=None, compare=False, metadata=option(checks.threads))
    """TorchRL's keyword, checked (a positive number, or ``None``) but without effect: a worker
    runs torch only for its copy of the policy (``policy_in_workers``), and then on one thread.
    (Left out of comparisons, as it changes nothing.)"""
    num_sub_threads: int | None = field(default=1, compare=False, metadata=option(checks.threads))
    """As ``num_threads``."""


# --------------------------------------------------------------------------- validation


@functools.cache
def options_of(kind: type) -> Mapping[str, Option]:
    """The options of ``kind`` (``CollectorOptions`` or ``WorkerOptions``) by name, in
    declaration order, each ``keyword`` resolved to the constructors' default."""
    declared = {}
    for f in dataclasses.fields(kind):
        spec = f.metadata["option"]
        if spec.keyword is _SAME:
            default = inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
            spec = dataclasses.replace(spec, keyword=default)
        declared[f.name] = spec
    return MappingProxyType(declared)


def _checked(kind: type, given: Mapping[str, Any]) -> dict[str, Any]:
    """Every option of ``kind`` through its check, in declaration order: its value in ``given``,
    else the constructors' default."""
    declared = options_of(kind)
    unknown = [name for name in given if name not in declared]
    if unknown:
        raise TypeError(f"{', '.join(unknown)}: not an option of {kind.__name__}")
    values = {}
    for name, spec in declared.items():
        value = given.get(name, spec.keyword)
        if value is inspect.Parameter.empty:
            raise TypeError(f"{name} is required (see {kind.__name__}.{name})")
        values[name] = spec.check(name, value)
    return values


def validate_options(**given: Any) -> CollectorOptions:
    """Check every option given (by its field's name; the others take the constructors'
    defaults); returns them normalised. See the module docstring."""
    return _collector_options(given, stacklevel=3)


def validate_worker_options(**given: Any) -> WorkerOptions:
    """Check the multi-process options given; see ``WorkerOptions``."""
    return WorkerOptions(**_checked(WorkerOptions, given))


def options_from(arguments: Mapping[str, Any], kind: type = CollectorOptions, *, stacklevel: int = 4) -> Any:
    """The options of ``kind`` among a constructor's ``locals()``, checked. ``stacklevel``: that
    of a warning (4: the caller of the constructor that calls this)."""
    given = {name: arguments[name] for name in options_of(kind) if name in arguments}
    if kind is CollectorOptions:
        return _collector_options(given, stacklevel)
    return kind(**_checked(kind, given))


def _collector_options(given: Mapping[str, Any], stacklevel: int) -> CollectorOptions:
    """Each option's own check, then the rules that join several."""
    values = _checked(CollectorOptions, given)
    fpb, tpb = values["frames_per_batch"], values["trajs_per_batch"]
    if tpb is not None and values["split_trajs"]:
        raise ValueError("split_trajs=True and trajs_per_batch: trajs_per_batch batches already hold "
                         "whole trajectories (padded, with a mask); drop split_trajs.")
    if tpb is not None and values["set_truncated"]:
        raise ValueError("set_truncated=True and trajs_per_batch: set_truncated marks each batch's last step "
                         "truncated, which would end a trajectory there and deliver episodes in pieces under one "
                         "id; trajs_per_batch delivers whole episodes, so drop set_truncated.")
    if given.get("traj_format") is not None and tpb is None:
        raise ValueError(f"traj_format={given['traj_format']!r} shapes trajs_per_batch's batches: set "
                         "trajs_per_batch too (how many complete trajectories per batch).")
    if values["trajs_per_write"] is not None and (tpb is None or values["replay_buffer"] is None):
        raise checks.trajs_per_write_error(given["trajs_per_write"])
    for name in ("storing_device", "env_device", "policy_device"):
        values[name] = values[name] or values["device"]
    values["init_random_frames"] = -(-values["init_random_frames"] // fpb) * fpb  # whole batches
    total = values["total_frames"]
    if total > 0 and total % fpb:  # TorchRL's rule: rounded up to whole batches, with a warning
        values["total_frames"] = upper = -(-total // fpb) * fpb
        warnings.warn(
            f"total_frames={total} is not a multiple of frames_per_batch={fpb}: it is rounded up to "
            f"{upper} (whole batches), as TorchRL does; give total_frames={upper} to silence this.",
            UserWarning, stacklevel=stacklevel,
        )
    return CollectorOptions(**values)


# --------------------------------------------------------------------------- frames, seeds, workers


def fit_to_envs(options: CollectorOptions, multiple: int, what: str, stacklevel: int) -> CollectorOptions:
    """``options`` with ``frames_per_batch`` rounded up to a multiple of ``multiple`` (every
    env steps the same number of times in a batch), with a warning, as TorchRL does; then
    ``total_frames`` and ``init_random_frames`` again whole batches. ``what`` names the envs."""
    fpb = options.frames_per_batch
    if fpb % multiple == 0:
        return options
    new = -(-fpb // multiple) * multiple
    total = options.total_frames if options.total_frames < 0 else -(-options.total_frames // new) * new
    warnings.warn(
        f"frames_per_batch={fpb} does not split evenly over {what}: each batch has {new} frames, "
        f"rounded up as TorchRL does{f' (and total_frames is {total})' if total > 0 else ''}; give "
        f"frames_per_batch={new} to silence this.",
        UserWarning, stacklevel=stacklevel,
    )
    return dataclasses.replace(options, frames_per_batch=new, total_frames=total,
                               init_random_frames=-(-options.init_random_frames // new) * new)


SEED_LIMIT = 2**63
"""Seeds must be below this: they are kept in an int64 tensor until the env is reset
(gymnasium itself takes any int >= 0)."""


def env_seeds(seed: Any, num_envs: int, static_seed: bool) -> list[int]:
    """``set_seed``'s seeds, env by env: ``seed + i`` (or ``seed`` for all with ``static_seed``).

    Checked whole before any seed is queued, so a refused ``seed`` leaves the envs as they
    were: every seed must be an int gymnasium takes (``>= 0``) and that fits an int64.

    Raises:
        TypeError: ``seed`` is not an integer (numpy integers are; bools are not).
        ValueError: ``seed`` is negative, or ``seed + num_envs - 1`` is ``>= 2**63``.
    """
    first = as_int(seed)
    if first is None:
        raise TypeError(f"seed must be an integer, got {seed!r}")
    last = first if static_seed else first + num_envs - 1
    if first < 0 or last >= SEED_LIMIT:
        top = SEED_LIMIT - 1 if static_seed else SEED_LIMIT - num_envs
        raise ValueError(
            f"seed={seed!r}: give an int in 0..{top}; env k is seeded with seed + k "
            f"({num_envs} env(s)), and every env seed must be >= 0 (gymnasium's rule) and below 2**63."
        )
    return [first] * num_envs if static_seed else [first + i for i in range(num_envs)]


def next_seed(seed: int, num_envs: int, static_seed: bool) -> int:
    """What ``set_seed`` returns: the seed to give the next collector or env, as TorchRL's.

    ``seed + num_envs``, the first seed these envs did not take, so that TorchRL's chaining
    (``seed = c1.set_seed(seed); c2.set_seed(seed)``) never gives two envs the same seed;
    ``seed`` itself with ``static_seed`` (TorchRL's: the seed is not incremented).
    """
    first = as_int(seed)  # (a plain int for a numpy seed, as env_seeds gives)
    if first is None:  # (never: env_seeds checked it)
        raise TypeError(f"seed must be an integer, got {seed!r}")
    return first if static_seed else first + num_envs


def worker_indices(worker_ids: Any, count: int, what: str) -> list[int]:
    """``worker_ids`` (``None``, an int or an iterable of ints) as a list of indices in
    ``0..count-1``; ``what`` names them in the error ("worker", "remote collector")."""
    if worker_ids is None:
        return list(range(count))
    ids = [worker_ids] if as_int(worker_ids) is not None else worker_ids
    try:
        ids = [as_int(i) for i in ids]
    except TypeError:
        ids = [None]
    if any(i is None or not 0 <= i < count for i in ids):
        raise ValueError(
            f"worker_ids={worker_ids!r}: give {what} indices in 0..{count - 1} "
            f"(an int or a list of ints), or None for every {what}."
        )
    return ids


# --------------------------------------------------------------------------- coroutine envs


def validate_batching(*, max_batch_size: Any, min_batch_size: Any, batch_timeout: Any, step_timeout: Any,
                      coroutine: bool, reset_when_done: bool = True, per_env: bool = True) -> Any:
    """Check the coroutine-env knobs, and the rules coroutine envs impose; returns a ``Batching``.

    Every collector calls this with the same arguments, so coroutine envs follow the same
    rules, with the same messages, whichever collector steps them:

    * the four knobs only mean something for coroutine envs: given with other envs, they
      are an error rather than silently ignored (the worker collectors check
      ``step_timeout`` themselves, since it applies to their worker processes too);
    * a coroutine env is reset as soon as it finishes: ``reset_when_done=False`` is refused;
    * ``max_batch_size``, ``min_batch_size`` and ``batch_timeout`` shape the policy calls
      over envs that each step on their own (``per_env``: a ``Collector``); the worker
      collectors step each entry's coroutine envs together, as one worker, and refuse them.
    """
    from .._engine.scheduler import Batching

    given = {name: value for name, value in (("max_batch_size", max_batch_size), ("min_batch_size", min_batch_size),
                                              ("batch_timeout", batch_timeout), ("step_timeout", step_timeout))
             if value is not None}
    if given and not coroutine:
        raise ValueError(
            f"{', '.join(given)}: these apply to coroutine envs (aiocollect.AsyncEnv), which step one "
            "at a time; these envs step together. Remove the argument(s)."
        )
    if coroutine and not reset_when_done:
        raise ValueError(
            "reset_when_done=False: coroutine envs (aiocollect.AsyncEnv) are reset as soon as they "
            "finish; a finished coroutine env cannot be stepped on. Remove the argument."
        )
    per_call = [name for name in ("max_batch_size", "min_batch_size", "batch_timeout") if name in given]
    if per_call and not per_env:
        raise ValueError(
            f"{', '.join(per_call)}: in a worker collector each entry of coroutine envs steps as one "
            "worker, its envs together, so there is no per-env policy batch to shape. Step the coroutine "
            "envs in a Collector (one list of factories), which batches them env by env, or remove "
            "the argument(s)."
        )
    envs = {name: _batch_size(name, given.get(name)) for name in ("max_batch_size", "min_batch_size")}
    least, most = envs["min_batch_size"], envs["max_batch_size"]
    if least is not None and most is not None and least > most:
        raise ValueError(f"min_batch_size={min_batch_size} is larger than max_batch_size={max_batch_size}.")
    seconds = {name: _timeout_knob(name, given.get(name)) for name in ("batch_timeout", "step_timeout")}
    defaults = Batching()
    return Batching(
        max_batch_size=envs["max_batch_size"],
        min_batch_size=defaults.min_batch_size if envs["min_batch_size"] is None else envs["min_batch_size"],
        batch_timeout=defaults.batch_timeout if seconds["batch_timeout"] is None else seconds["batch_timeout"],
        step_timeout=seconds["step_timeout"],
    )


def _batch_size(name: str, value: Any) -> int | None:
    """``max_batch_size``/``min_batch_size``: ``None`` or a number of envs >= 1, as an int."""
    return checks.count_or_none(name, value, "a number of envs >= 1")


def _timeout_knob(name: str, value: Any) -> float | None:
    """``batch_timeout``/``step_timeout``: ``None`` or a positive, finite number of seconds.

    ``nan`` and ``inf`` are refused: ``nan`` passes every ``<= 0`` check and then makes
    each wait fail (or never end); for "no limit", ``step_timeout=None`` says it.
    """
    if value is None:
        return None
    seconds = finite(value)
    if seconds is None or seconds <= 0:
        raise ValueError(f"{name}={value!r}: give a positive, finite number of seconds, or None.")
    return seconds

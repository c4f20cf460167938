"""Validated collector options.

Every constructor argument is checked here, up front, before an env is built or a
process started; a bad value raises ``ValueError``/``TypeError`` naming the argument and
saying what would be accepted. The result is a frozen [`CollectorOptions`][aiocollect.CollectorOptions].
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import numbers
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict.nn import InteractionType


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

    frames_per_batch: int
    """Frames (env steps, summed over envs) in each batch; a value that does not split evenly
    over the envs is rounded up to one that does, with a warning, as in TorchRL."""
    total_frames: int = -1
    """Frames over the collector's life, a multiple of ``frames_per_batch`` (another value is
    rounded up to one, with a warning, as in TorchRL); ``-1``: endless."""
    device: torch.device | None = None
    """Fills any of the three devices below that is not given."""
    storing_device: torch.device | None = None
    """Where batches are stored."""
    env_device: torch.device | None = None
    """Where the env's tensors live (gymnasium envs compute on the CPU)."""
    policy_device: torch.device | None = None
    """Where the policy runs; observations are moved there and actions back."""
    create_env_kwargs: dict = field(default_factory=dict)
    """Keyword arguments for ``create_env_fn`` (factories and env ids only)."""
    max_frames_per_traj: int | None = None
    """Truncate (and reset) a trajectory after this many steps; ``None`` (or ``-1``): never."""
    init_random_frames: int = 0
    """Frames collected with a random policy first (rounded up to whole batches); ``None``
    or ``-1`` (TorchRL's spelling): none."""
    reset_at_each_iter: bool = False
    """Reset every env at the start of each batch."""
    postproc: Callable | None = None
    """Applied to each batch (after ``split_trajs``)."""
    split_trajs: bool = False
    """Deliver batches split into zero-padded trajectories (see
    [`split_trajectories`][aiocollect.split_trajectories])."""
    exploration_type: InteractionType = InteractionType.RANDOM
    """Interaction type set (tensordict's ``set_interaction_type``) around policy calls; an
    ``InteractionType`` or its name (``"random"``, ``"mode"``, ``"mean"``...)."""
    return_same_td: bool = False
    """Reuse one TensorDict for every batch (its values are overwritten)."""
    reset_when_done: bool = True
    """Reset an env as soon as it is done; if false, finished envs keep stepping and the
    root done flags carry over (not for coroutine envs, which are always reset)."""
    interruptor: Any = None
    """An object whose ``collection_stopped()`` cuts the current batch short (see
    [`Interruptor`][aiocollect.Interruptor])."""
    set_truncated: bool = False
    """Mark the last step of each batch as truncated (and done), as TorchRL does; the episodes
    go on in the next batch, with the same trajectory ids."""
    track_policy_version: bool = False
    """TorchRL's keyword: batches also carry ``"policy_version"`` and ``("next",
    "policy_version")`` (every frame has ``("collector", "policy_version")`` anyway)."""
    replay_buffer: Any = None
    """Anything with ``extend``: batches go there (to a TorchRL buffer of one-dimensional
    storage as frames, one per item, as TorchRL's collectors give it); iteration then yields ``None``."""
    progress: bool = False
    """Show a tqdm progress bar (frames, frames/s, mean episode return; a widget in Jupyter)."""
    trajs_per_batch: int | None = None
    """Deliver batches of exactly this many **complete** trajectories instead of
    ``frames_per_batch`` frames (TorchRL 0.14's keyword): frames are still collected
    ``frames_per_batch`` at a time, and each trajectory is delivered once it ended (a done
    step), whole, however many collections it spanned. With a ``replay_buffer``, each
    complete trajectory is written to it flat as soon as it ended (as TorchRL does, for
    ``SliceSampler(end_key=("next", "done"))``). ``None``: frame batches."""
    traj_format: str = "padded"
    """The layout of ``trajs_per_batch``'s batches: ``"padded"``, ``[trajs, longest]``
    zero-padded with a ``("collector", "mask")`` of the real frames; or ``"cat"``,
    ``[frames]``, the trajectories one after the other."""
    trajs_per_write: int | None = None
    """With ``trajs_per_batch`` and a ``replay_buffer``: complete trajectories per
    ``extend`` call (``None``: all those that ended in a collection, in one call)."""


def as_int(value: Any) -> int | None:
    """``value`` as a Python ``int`` if it is an integer (numpy's and torch's count), else ``None``.

    Every integer argument goes through here, so that ``np.int64(3)`` is taken wherever ``3``
    is. ``True``/``False`` are not integers here: ``max_policy_lag=True`` is a mistake, not 1.

    Examples:
        >>> as_int(np.int64(3)), as_int(3.0), as_int(True)
        (3, None, None)
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return None
    return int(value)


def _int(name: str, value: Any, *, allow: str) -> int:
    number = as_int(value)
    if number is None:
        raise TypeError(f"{name} must be an integer ({allow}), got {value!r}")
    return number


def _finite(value: Any) -> float | None:
    """``value`` as a float if it is a real, finite number (not a bool), else ``None``.

    For the float options: seconds, and ``preemptive_threshold``'s fraction.

    ``nan`` must not slip through a ``not value > 0``-style check (every comparison with
    ``nan`` is false), and ``inf`` is no number of seconds: Python's waits refuse it
    (``OverflowError``) or wait forever, which is what ``None`` already says.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


LONGEST_WAIT = threading.TIMEOUT_MAX / 4
"""The longest ``timeout`` taken, in seconds (about 73 years): the collectors add margins to
it, and Python's waits refuse anything over ``threading.TIMEOUT_MAX``."""


def validate_timeout(timeout: Any) -> float | None:
    """``shutdown``'s and ``async_shutdown``'s ``timeout``: ``None`` or seconds, as a float.

    Checked before anything is stored or stopped, so a bad value leaves the collector as it
    was (and shut-downable).

    Raises:
        TypeError: ``timeout`` is not a number (or is a bool).
        ValueError: ``timeout`` is negative, ``nan``, infinite or absurdly large.
    """
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout must be a number of seconds (an int or float >= 0), or None; got {timeout!r}")
    seconds = _finite(timeout)
    if seconds is None or not 0 <= seconds <= LONGEST_WAIT:
        raise ValueError(
            f"timeout={timeout!r}: give the seconds to wait, a finite number in 0..{LONGEST_WAIT:.0f}, "
            "or None for the default."
        )
    return seconds


def parse_device(name: str, value: Any) -> torch.device | None:
    """``value`` as a ``torch.device`` usable here; a clear error otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, torch.device)):
        raise TypeError(f"{name} must be a device such as 'cpu' or 'cuda:0', got {value!r}")
    try:
        device = torch.device(value)
    except (RuntimeError, ValueError) as exc:
        raise ValueError(
            f"{name}={value!r} is not a device; use 'cpu', 'cuda', 'cuda:<index>' or a torch.device."
        ) from exc
    backend = getattr(torch, device.type, None) if device.type != "cpu" else None
    if device.type == "mps":
        available = torch.backends.mps.is_available()
    else:
        available = device.type == "cpu" or bool(backend and backend.is_available())
    if not available:
        raise ValueError(f"{name}={value!r}: no {device.type} device is available here; use 'cpu'.")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(
            f"{name}={value!r}: this machine has {torch.cuda.device_count()} CUDA device(s)."
        )
    if device.type == "cuda" and device.index is None:
        # the GPU meant now, in the caller's thread: the collector's threads may have another
        # current device, and batches say ``cuda:N`` (as TensorDict(device="cuda") does)
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def parse_exploration_type(value: Any) -> InteractionType:
    if isinstance(value, InteractionType):
        return value
    if isinstance(value, str):
        try:
            return InteractionType(value.lower())
        except ValueError:
            pass
    choices = ", ".join(repr(t.value) for t in InteractionType)
    raise ValueError(f"exploration_type must be an InteractionType or one of {choices}; got {value!r}")


def validate_options(
    *,
    frames_per_batch: Any,
    total_frames: Any = -1,
    device: Any = None,
    storing_device: Any = None,
    env_device: Any = None,
    policy_device: Any = None,
    create_env_kwargs: Any = None,
    max_frames_per_traj: Any = None,
    init_random_frames: Any = None,
    reset_at_each_iter: Any = False,
    postproc: Any = None,
    split_trajs: Any = None,
    exploration_type: Any = InteractionType.RANDOM,
    return_same_td: Any = False,
    reset_when_done: Any = True,
    interruptor: Any = None,
    set_truncated: Any = False,
    track_policy_version: Any = False,
    replay_buffer: Any = None,
    progress: Any = False,
    trajs_per_batch: Any = None,
    traj_format: Any = None,
    trajs_per_write: Any = None,
) -> CollectorOptions:
    """Check every option; returns them normalised."""
    fpb = _int("frames_per_batch", frames_per_batch, allow="a positive number of frames")
    if fpb <= 0:
        raise ValueError(f"frames_per_batch must be positive, got {fpb}")
    total = _int("total_frames", total_frames, allow="positive, or -1 for an endless collector")
    if total == 0 or total < -1:
        raise ValueError(f"total_frames must be positive, or -1 for an endless collector; got {total}")
    if total > 0 and total % fpb:  # TorchRL's rule: rounded up to whole batches, with a warning
        upper = -(-total // fpb) * fpb
        warnings.warn(
            f"total_frames={total} is not a multiple of frames_per_batch={fpb}: it is rounded up to "
            f"{upper} (whole batches), as TorchRL does; give total_frames={upper} to silence this.",
            UserWarning, stacklevel=4,
        )
        total = upper
    dev = parse_device("device", device)
    devices = {
        name: parse_device(name, value) or dev
        for name, value in (("storing_device", storing_device), ("env_device", env_device),
                            ("policy_device", policy_device))
    }
    if create_env_kwargs is not None and not isinstance(create_env_kwargs, dict):
        raise TypeError(f"create_env_kwargs must be a dict, got {type(create_env_kwargs).__name__}")
    mfpt = None
    if max_frames_per_traj is not None:
        mfpt = _int("max_frames_per_traj", max_frames_per_traj, allow="a number of steps, or None")
        if mfpt == 0 or mfpt < -1:
            raise ValueError(
                f"max_frames_per_traj={mfpt}: give the most steps a trajectory may take (a positive "
                "int), or None (or -1, TorchRL's spelling) for no limit."
            )
        mfpt = mfpt if mfpt > 0 else None
    irf = 0
    if init_random_frames is not None:
        irf = _int("init_random_frames", init_random_frames, allow="a number of frames, or None")
        if irf < -1:
            raise ValueError(
                f"init_random_frames={irf}: give how many frames to collect with a random policy "
                "first (an int >= 0), or None (or -1, TorchRL's spelling) for none."
            )
        irf = max(irf, 0)
        irf = -(-irf // fpb) * fpb  # whole batches
    for name, value in (
        ("reset_at_each_iter", reset_at_each_iter),
        ("return_same_td", return_same_td),
        ("reset_when_done", reset_when_done),
        ("set_truncated", set_truncated),
        ("track_policy_version", track_policy_version),
        ("progress", progress),
    ):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {value!r}")
    if split_trajs is not None and not isinstance(split_trajs, bool):
        raise TypeError(f"split_trajs must be True or False, got {split_trajs!r}")
    if postproc is not None and not callable(postproc):
        raise TypeError(f"postproc must be a callable taking and returning a TensorDict, got {postproc!r}")
    if interruptor is not None and not callable(getattr(interruptor, "collection_stopped", None)):
        raise TypeError("interruptor must have a collection_stopped() method (see aiocollect.Interruptor)")
    if replay_buffer is not None and not callable(getattr(replay_buffer, "extend", None)):
        raise TypeError(
            f"replay_buffer must have an extend(batch) method (a TorchRL ReplayBuffer, say); "
            f"got {type(replay_buffer).__name__}"
        )
    tpb = tpw = None
    if trajs_per_batch is not None:
        tpb = _int("trajs_per_batch", trajs_per_batch, allow="a number of trajectories, or None")
        if tpb <= 0:
            raise ValueError(f"trajs_per_batch={tpb}: give how many complete trajectories each batch holds "
                             "(an int > 0), or None for batches of frames_per_batch frames.")
        if split_trajs:
            raise ValueError("split_trajs=True and trajs_per_batch: trajs_per_batch batches already hold "
                             "whole trajectories (padded, with a mask); drop split_trajs.")
    if traj_format is not None:
        if traj_format not in ("padded", "cat"):
            raise ValueError(f"traj_format={traj_format!r}: use 'padded' ([trajs, longest] with a mask) "
                             "or 'cat' (the trajectories one after the other).")
        if tpb is None:
            raise ValueError(f"traj_format={traj_format!r} shapes trajs_per_batch's batches: set "
                             "trajs_per_batch too (how many complete trajectories per batch).")
    if trajs_per_write is not None:
        tpw = _int("trajs_per_write", trajs_per_write, allow="a number of trajectories, or None")
        if tpw <= 0 or tpb is None or replay_buffer is None:
            raise ValueError(f"trajs_per_write={trajs_per_write!r}: it is the number of complete trajectories "
                             "per replay_buffer.extend call (an int > 0), with trajs_per_batch and a "
                             "replay_buffer set.")
    return CollectorOptions(
        frames_per_batch=fpb,
        total_frames=total,
        device=dev,
        create_env_kwargs=dict(create_env_kwargs or {}),
        max_frames_per_traj=mfpt,
        init_random_frames=irf,
        reset_at_each_iter=reset_at_each_iter,
        postproc=postproc,
        split_trajs=bool(split_trajs),
        exploration_type=parse_exploration_type(exploration_type),
        return_same_td=return_same_td,
        reset_when_done=reset_when_done,
        interruptor=interruptor,
        set_truncated=set_truncated,
        track_policy_version=track_policy_version,
        replay_buffer=replay_buffer,
        progress=progress,
        trajs_per_batch=tpb,
        traj_format=traj_format or "padded",
        trajs_per_write=tpw,
        **devices,
    )


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


def options_from(arguments: dict[str, Any]) -> CollectorOptions:
    """``validate_options`` on the options among a constructor's ``locals()``."""
    names = inspect.signature(validate_options).parameters
    return validate_options(**{name: arguments[name] for name in names if name in arguments})


@dataclass(frozen=True)
class WorkerOptions:
    """The options of the multi-process collectors, on top of [`CollectorOptions`][aiocollect.CollectorOptions]."""

    cat_results: str | int = "stack"
    """MultiSync: ``"stack"`` the workers' batches along a new first dim, or an int:
    concatenate them along that dim (TorchRL's meaning). Checked but unused by MultiAsync."""
    preemptive_threshold: float | None = None
    """MultiSync: cut the batch once this fraction of workers has its share; the frames
    the others did not collect are masked out with ``("collector", "mask")``."""
    update_at_each_batch: bool = False
    """MultiSync: call ``update_policy_weights_()`` before each batch. Accepted but unused
    by MultiAsync."""
    max_policy_lag: int | None = None
    """MultiAsync: no delivered frame was produced by a policy more than this many versions
    older than the newest published when the batch is delivered (``None``: no bound)."""
    start_timeout: float | None = 300.0
    """Seconds the worker processes may take, together, to start (a fresh interpreter each,
    importing what the env factories need and building their envs) before the constructor
    raises [`StartTimeoutError`][aiocollect.StartTimeoutError] naming those not up (killed)
    and those that were (stopped); ``None``: wait forever. Raise it on a loaded machine, or
    for envs that take minutes to build."""


START_TIMEOUT_S = 300.0
"""``start_timeout``'s default: how long worker processes may take to start."""


def validate_worker_options(*, cat_results: Any, preemptive_threshold: Any, update_at_each_batch: Any,
                            num_threads: Any, num_sub_threads: Any, max_policy_lag: Any = None,
                            start_timeout: Any = START_TIMEOUT_S) -> WorkerOptions:
    """Check the multi-process options; see ``WorkerOptions``."""
    if cat_results is None:
        cat_results = "stack"
    dim = as_int(cat_results)
    if dim is not None:
        cat_results = dim
    elif not (isinstance(cat_results, str) and cat_results == "stack"):
        raise ValueError(
            f"cat_results={cat_results!r}: use 'stack' (a new leading worker dim) or an integer "
            "dim to concatenate the workers' batches along (0, or -1 for time)."
        )
    if preemptive_threshold is not None:
        fraction = _finite(preemptive_threshold)
        if fraction is None or not 0.0 < fraction <= 1.0:
            raise ValueError(
                f"preemptive_threshold={preemptive_threshold!r}: give the fraction of workers (in "
                "(0, 1]) that must have their share before the batch is cut, or None."
            )
        preemptive_threshold = fraction
    if not isinstance(update_at_each_batch, bool):
        raise TypeError(f"update_at_each_batch must be True or False, got {update_at_each_batch!r}")
    for name, value in (("num_threads", num_threads), ("num_sub_threads", num_sub_threads)):
        if value is not None and (as_int(value) is None or value < 1):
            raise ValueError(f"{name}={value!r}: give a positive number of threads, or None.")
    if max_policy_lag is not None:
        lag = as_int(max_policy_lag)
        if lag is None or lag < 0:
            raise ValueError(
                f"max_policy_lag={max_policy_lag!r}: give how many policy versions a delivered frame may "
                "lag behind the newest (an int >= 0), or None for no bound."
            )
        max_policy_lag = lag
    start_timeout = validate_start_timeout(start_timeout)
    return WorkerOptions(cat_results, preemptive_threshold, bool(update_at_each_batch), max_policy_lag,
                         start_timeout)


def validate_start_timeout(value: Any) -> float | None:
    """``start_timeout`` (the worker collectors', ``RayCollector``'s): ``None`` or a positive,
    finite number of seconds, at most ``LONGEST_WAIT``."""
    if value is None:
        return None
    seconds = _finite(value)
    if seconds is None or not 0 < seconds <= LONGEST_WAIT:
        raise ValueError(f"start_timeout={value!r}: give the seconds the workers may take to start, a positive, "
                         "finite number, or None to wait as long as they take.")
    return seconds


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
    if None not in envs.values() and envs["min_batch_size"] > envs["max_batch_size"]:
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
    if value is None:
        return None
    envs = as_int(value)
    if envs is None or envs < 1:
        raise ValueError(f"{name}={value!r}: give a number of envs >= 1, or None.")
    return envs


def _timeout_knob(name: str, value: Any) -> float | None:
    """``batch_timeout``/``step_timeout``: ``None`` or a positive, finite number of seconds.

    ``nan`` and ``inf`` are refused: ``nan`` passes every ``<= 0`` check and then makes
    each wait fail (or never end); for "no limit", ``step_timeout=None`` says it.
    """
    if value is None:
        return None
    seconds = _finite(value)
    if seconds is None or seconds <= 0:
        raise ValueError(f"{name}={value!r}: give a positive, finite number of seconds, or None.")
    return seconds

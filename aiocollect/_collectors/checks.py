"""How one argument's value is checked: numbers, seconds, devices, and each option's own check.

An option's check is ``check(name, value)``: the value normalised (``np.int64(3)`` as ``3``,
``"mode"`` as ``InteractionType.MODE``, TorchRL's ``None``/``-1`` spellings as what they
mean), or a ``TypeError``/``ValueError`` that names the argument and says what would be
accepted. [`CollectorOptions`][aiocollect.CollectorOptions] and ``WorkerOptions``
(``_collectors.options``) declare which check each of their fields takes; the rules that
join several options (``trajs_per_write`` needs ``trajs_per_batch``...) are there too.
"""

from __future__ import annotations

import math
import numbers
import threading
from typing import Any

import torch
from tensordict.nn import InteractionType

# --------------------------------------------------------------------------- numbers


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


def integer(name: str, value: Any, *, allow: str) -> int:
    """``value`` as an int, or a ``TypeError`` naming ``name`` and what is allowed."""
    number = as_int(value)
    if number is None:
        raise TypeError(f"{name} must be an integer ({allow}), got {value!r}")
    return number


def finite(value: Any) -> float | None:
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
    seconds = finite(timeout)
    if seconds is None or not 0 <= seconds <= LONGEST_WAIT:
        raise ValueError(
            f"timeout={timeout!r}: give the seconds to wait, a finite number in 0..{LONGEST_WAIT:.0f}, "
            "or None for the default."
        )
    return seconds


def positive_seconds(value: Any) -> float | None:
    """``value`` as seconds if it is a positive, finite number at most ``LONGEST_WAIT``, else
    ``None`` (the caller's error says what its argument takes)."""
    seconds = finite(value)
    return seconds if seconds is not None and 0 < seconds <= LONGEST_WAIT else None


def validate_start_timeout(value: Any) -> float | None:
    """``start_timeout`` (the worker collectors', ``RayCollector``'s): ``None`` or a positive,
    finite number of seconds, at most ``LONGEST_WAIT``."""
    if value is None:
        return None
    seconds = positive_seconds(value)
    if seconds is None:
        raise ValueError(f"start_timeout={value!r}: give the seconds the workers may take to start, a positive, "
                         "finite number, or None to wait as long as they take.")
    return seconds


# --------------------------------------------------------------------------- devices, interaction types


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


# --------------------------------------------------------------------------- the options' checks
# (each ``check(name, value)``; which option takes which is declared in ``_collectors.options``)


def flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def flag_or_none(name: str, value: Any) -> bool:
    """TorchRL's ``None`` for a flag: ``False``."""
    return False if value is None else flag(name, value)


def auto_flag(name: str, value: Any) -> bool | None:
    """``True``, ``False``, or ``None``: the collector chooses (the option's docstring says how)."""
    if value is None or isinstance(value, bool):
        return value
    raise TypeError(f"{name} must be True, False or None (chosen for this machine), got {value!r}")


def device(name: str, value: Any) -> torch.device | None:
    if isinstance(value, (list, tuple)):
        return _one_device(name, value)
    return parse_device(name, value)


def _one_device(name: str, value: list | tuple) -> torch.device | None:
    """A device given per worker, as TorchRL's multi-process collectors take it (``device=[d] *
    num_workers``): the one device every entry names. The engine stores every worker's frames
    in one storage in this process, and runs one policy, so entries that differ cannot be
    honoured: a clear error says so, and how to get each device instead."""
    if not value:
        raise ValueError(f"{name}=[]: give a device, or one per worker (TorchRL's form).")
    named = set()
    for i, v in enumerate(value):
        try:
            d = torch.device(v)
        except (RuntimeError, ValueError, TypeError):
            return parse_device(f"{name}[{i}]", v)  # (raises, naming the entry)
        named.add((d.type, d.index or 0))
    if len(named) > 1:
        raise ValueError(
            f"{name}={list(value)!r}: a different device per worker is not supported: the workers' frames are "
            "stored together in this process and one policy acts for them all. Give one device (the envs "
            "of each worker can still make their own: pass a factory that places them)."
        )
    devices = [parse_device(f"{name}[{i}]", v) for i, v in enumerate(value)]
    return devices[0]


def exploration_type(name: str, value: Any) -> InteractionType:
    return parse_exploration_type(value)


def frames_per_batch(name: str, value: Any) -> int:
    frames = integer(name, value, allow="a positive number of frames")
    if frames <= 0:
        raise ValueError(f"{name} must be positive, got {frames}")
    return frames


def total_frames(name: str, value: Any) -> int:
    total = integer(name, value, allow="positive, or -1 for an endless collector")
    if total == 0 or total < -1:
        raise ValueError(f"{name} must be positive, or -1 for an endless collector; got {total}")
    return total


def max_frames_per_traj(name: str, value: Any) -> int | None:
    if value is None:
        return None
    steps = integer(name, value, allow="a number of steps, or None")
    if steps == 0 or steps < -1:
        raise ValueError(f"{name}={steps}: give the most steps a trajectory may take (a positive int), or None "
                         "(or -1, TorchRL's spelling) for no limit.")
    return steps if steps > 0 else None


def init_random_frames(name: str, value: Any) -> int:
    """A number of frames >= 0 (rounded up to whole batches with the other options)."""
    if value is None:
        return 0
    frames = integer(name, value, allow="a number of frames, or None")
    if frames < -1:
        raise ValueError(f"{name}={frames}: give how many frames to collect with a random policy first (an int "
                         ">= 0), or None (or -1, TorchRL's spelling) for none.")
    return max(frames, 0)


def create_env_kwargs(name: str, value: Any) -> dict | list[dict]:
    """A copy of the dict (``None``: empty), or of a list with one dict per worker (TorchRL's
    multi-process collectors take either; the collectors check the list's length, and
    ``Collector`` refuses one)."""
    if isinstance(value, (list, tuple)):
        bad = [i for i, kw in enumerate(value) if kw is not None and not isinstance(kw, dict)]
        if bad:
            raise TypeError(f"{name}[{bad[0]}] must be a dict (the keywords of worker {bad[0]}'s create_env_fn), "
                            f"got {type(value[bad[0]]).__name__}")
        return [dict(kw or {}) for kw in value]
    if value is not None and not isinstance(value, dict):
        raise TypeError(f"{name} must be a dict, or a list with one dict per worker, got {type(value).__name__}")
    return dict(value or {})


def postproc(name: str, value: Any) -> Any:
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be a callable taking and returning a TensorDict, got {value!r}")
    return value


def interruptor(name: str, value: Any) -> Any:
    if value is not None and not callable(getattr(value, "collection_stopped", None)):
        raise TypeError(f"{name} must have a collection_stopped() method (see aiocollect.Interruptor)")
    return value


def replay_buffer(name: str, value: Any) -> Any:
    if value is not None and not callable(getattr(value, "extend", None)):
        raise TypeError(f"{name} must have an extend(batch) method (a TorchRL ReplayBuffer, say); "
                        f"got {type(value).__name__}")
    return value


def trajs_per_batch(name: str, value: Any) -> int | None:
    if value is None:
        return None
    trajs = integer(name, value, allow="a number of trajectories, or None")
    if trajs <= 0:
        raise ValueError(f"{name}={trajs}: give how many complete trajectories each batch holds (an int > 0), "
                         "or None for batches of frames_per_batch frames.")
    return trajs


def traj_format(name: str, value: Any) -> str:
    if value is None:
        return "padded"
    if value not in ("padded", "cat"):
        raise ValueError(f"{name}={value!r}: use 'padded' ([trajs, longest] with a mask) or 'cat' (the "
                         "trajectories one after the other).")
    return value


def trajs_per_write(name: str, value: Any) -> int | None:
    """A number > 0 (that ``trajs_per_batch`` and a ``replay_buffer`` are set is checked with the
    other options, with the same message)."""
    if value is None:
        return None
    trajs = integer(name, value, allow="a number of trajectories, or None")
    if trajs <= 0:
        raise trajs_per_write_error(value)
    return trajs


def trajs_per_write_error(value: Any) -> ValueError:
    return ValueError(f"trajs_per_write={value!r}: it is the number of complete trajectories per "
                      "replay_buffer.extend call (an int > 0), with trajs_per_batch and a replay_buffer set.")


def cat_results(name: str, value: Any) -> str | int:
    if value is None:
        return "stack"
    dim = as_int(value)
    if dim is not None:
        return dim
    if isinstance(value, str) and value == "stack":
        return value
    raise ValueError(f"{name}={value!r}: use 'stack' (a new leading worker dim) or an integer dim to concatenate "
                     "the workers' batches along (0, or -1 for time).")


def preemptive_threshold(name: str, value: Any) -> float | None:
    if value is None:
        return None
    fraction = finite(value)
    if fraction is None or not 0.0 < fraction <= 1.0:
        raise ValueError(f"{name}={value!r}: give the fraction of workers (in (0, 1]) that must have their share "
                         "before the batch is cut, or None.")
    return fraction


def max_policy_lag(name: str, value: Any) -> int | None:
    if value is None:
        return None
    lag = as_int(value)
    if lag is None or lag < 0:
        raise ValueError(f"{name}={value!r}: give how many policy versions a delivered frame may lag behind the "
                         "newest (an int >= 0), or None for no bound.")
    return lag


def start_timeout(name: str, value: Any) -> float | None:
    return validate_start_timeout(value)


def threads(name: str, value: Any) -> int | None:
    return count_or_none(name, value, "a positive number of threads")


def count_or_none(name: str, value: Any, what: str) -> int | None:
    """``None``, or an int >= 1 (``what`` says what it counts, in the error)."""
    if value is None:
        return None
    count = as_int(value)
    if count is None or count < 1:
        raise ValueError(f"{name}={value!r}: give {what}, or None.")
    return count


PLACEMENTS = ("auto", "central", "workers")


def policy_placement(name: str, value: Any) -> str:
    """``"auto"``, ``"central"`` or ``"workers"`` (``None``: ``"auto"``)."""
    if value is None:
        return "auto"
    if isinstance(value, str) and value in PLACEMENTS:
        return value
    raise ValueError(f"{name}={value!r}: use 'auto' (chosen as the collector is built), 'central' (the policy "
                     "acts in this process, batched over the workers' envs) or 'workers' (a copy in each worker).")


def grouped_env_options(space: Any, options: Any) -> None:
    """Raise ``ValueError`` for options an env with its rewards and done flags per agent group
    (``_envs.keyed.grouped``) cannot give truthfully: ``max_frames_per_traj``, whose resets
    no group's done flag would show, and ``trajs_per_batch``, whose trajectories end on one
    done flag. ``set_truncated`` marks the env's own truncated flags (TorchRL's), so it needs
    one."""
    from .._envs.keyed import grouped

    if not grouped(space):
        return
    if options.set_truncated and not any((k if isinstance(k, tuple) else (k,))[-1] == "truncated"
                                         for k in space.not_observations):
        raise ValueError(
            "set_truncated=True: the env has its done flags per agent group (a TorchRL multi-agent env), and no "
            "truncated flag to mark. Add them before handing the env over: env.add_truncated_keys()."
        )
    for name in ("max_frames_per_traj", "trajs_per_batch"):
        value = getattr(options, name)
        if value not in (None, False):
            raise ValueError(
                f"{name}={value!r}: the env has its rewards and done flags per agent group (a TorchRL multi-agent "
                "env), and the collector would end episodes that no group's done flag shows. Truncate in the env "
                "(a TorchRL StepCounter(max_steps=...) on it), and split trajectories with split_trajs=True."
            )

"""Option checking, before any env or process exists: ``validate_options``,
``validate_worker_options``, ``validate_batching``, ``parse_device``, ``env_seeds`` and
``worker_indices`` (``aiocollect._collectors.options``); and the declaration they follow
(the fields of ``CollectorOptions`` and ``WorkerOptions``), against which every
constructor's keywords and the distributed collectors' ``FORWARDED`` are checked.

Every bad value must raise ``TypeError``/``ValueError`` with a message that names the
argument and says what would be accepted; good values come back normalised.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import re

import cloudpickle
import numpy as np
import pytest
import torch
from tensordict.nn import InteractionType

import aiocollect
from aiocollect._collectors import torchrl_compat
from aiocollect._collectors.options import (
    FORWARD,
    HERE,
    LONGEST_WAIT,
    CollectorOptions,
    Option,
    WorkerOptions,
    env_seeds,
    next_seed,
    options_from,
    options_of,
    parse_device,
    parse_exploration_type,
    validate_batching,
    validate_options,
    validate_timeout,
    validate_worker_options,
    worker_indices,
)
from aiocollect._distributed.remote_collectors import FORWARDED, plan_remotes
from aiocollect._engine.scheduler import Batching


class _Interruptor:
    def collection_stopped(self) -> bool:
        return False


class _Buffer:
    def __init__(self):
        self.batches = []

    def extend(self, batch) -> None:
        self.batches.append(batch)


# --------------------------------------------------------------------------- validate_options: bad values

def _case_id(kwargs: dict) -> str:
    """``name=value`` for a test id; the same in every process (pytest -n 2 compares them)."""
    name, value = next(iter(kwargs.items()))
    text = repr(value)
    return f"{name}={type(value).__name__ if ' at 0x' in text else text}"


BAD_OPTIONS = [
    # (kwargs on top of frames_per_batch=10, error type, substrings the message must contain)
    (dict(frames_per_batch=0), ValueError, ["frames_per_batch must be positive", "got 0"]),
    (dict(frames_per_batch=-4), ValueError, ["frames_per_batch must be positive", "got -4"]),
    (dict(frames_per_batch=2.5), TypeError, ["frames_per_batch must be an integer", "positive number of frames"]),
    (dict(frames_per_batch=True), TypeError, ["frames_per_batch must be an integer", "True"]),
    (dict(frames_per_batch="10"), TypeError, ["frames_per_batch must be an integer", "'10'"]),
    (dict(total_frames=0), ValueError, ["total_frames must be positive, or -1", "got 0"]),
    (dict(total_frames=-2), ValueError, ["total_frames must be positive, or -1", "got -2"]),
    (dict(total_frames=100.0), TypeError, ["total_frames must be an integer", "-1 for an endless collector"]),
    (dict(device="nonsense"), ValueError, ["device='nonsense' is not a device", "use 'cpu'"]),
    (dict(device=1.5), TypeError, ["device must be a device such as 'cpu'"]),
    (dict(storing_device="nonsense"), ValueError, ["storing_device='nonsense' is not a device"]),
    (dict(env_device=True), TypeError, ["env_device must be a device", "True"]),
    (dict(policy_device=[1.5]), TypeError, ["policy_device[0] must be a device", "1.5"]),
    # a device per worker (TorchRL's multi-process form): one device, or an error that says why
    (dict(device=["cpu", "cuda:1"]), ValueError, ["device=['cpu', 'cuda:1']: a different device per worker is not "
                                                  "supported", "Give one device"]),
    (dict(storing_device=[]), ValueError, ["storing_device=[]: give a device, or one per worker"]),
    (dict(create_env_kwargs=[("a", 1)]), TypeError, ["create_env_kwargs[0] must be a dict", "got tuple"]),
    (dict(create_env_kwargs="a=1"), TypeError, ["create_env_kwargs must be a dict, or a list with one dict per "
                                                "worker, got str"]),
    (dict(max_frames_per_traj=2.5), TypeError, ["max_frames_per_traj must be an integer", "or None"]),
    (dict(max_frames_per_traj=True), TypeError, ["max_frames_per_traj must be an integer"]),
    (dict(init_random_frames="100"), TypeError, ["init_random_frames must be an integer", "or None"]),
    (dict(reset_at_each_iter=1), TypeError, ["reset_at_each_iter must be True or False, got 1"]),
    (dict(return_same_td="yes"), TypeError, ["return_same_td must be True or False, got 'yes'"]),
    (dict(reset_when_done=None), TypeError, ["reset_when_done must be True or False, got None"]),
    (dict(set_truncated=0), TypeError, ["set_truncated must be True or False, got 0"]),
    (dict(progress="tqdm"), TypeError, ["progress must be True or False, got 'tqdm'"]),
    (dict(split_trajs="yes"), TypeError, ["split_trajs must be True or False, got 'yes'"]),
    (dict(split_trajs=1), TypeError, ["split_trajs must be True or False, got 1"]),
    (dict(postproc=3), TypeError, ["postproc must be a callable taking and returning a TensorDict", "got 3"]),
    (dict(interruptor=object()), TypeError, ["interruptor must have a collection_stopped() method"]),
    (dict(replay_buffer=object()), TypeError, ["replay_buffer must have an extend(batch) method", "got object"]),
    (dict(exploration_type="greedy"), ValueError,
     ["exploration_type must be an InteractionType or one of", "'random'", "'mode'", "got 'greedy'"]),
    (dict(exploration_type=3), ValueError, ["exploration_type must be an InteractionType", "got 3"]),
    (dict(trajs_per_batch=0), ValueError, ["trajs_per_batch=0", "complete trajectories", "or None"]),
    (dict(trajs_per_batch=2.0), TypeError, ["trajs_per_batch must be an integer"]),
    (dict(trajs_per_batch=4, split_trajs=True), ValueError,
     ["split_trajs=True and trajs_per_batch", "drop split_trajs"]),
    (dict(trajs_per_batch=4, set_truncated=True), ValueError,
     ["set_truncated=True and trajs_per_batch", "episodes in pieces", "drop set_truncated"]),
    (dict(traj_format="flat"), ValueError, ["traj_format='flat'", "'padded'", "'cat'"]),
    (dict(traj_format="cat"), ValueError, ["traj_format='cat'", "set trajs_per_batch too"]),
    (dict(trajs_per_write=2), ValueError, ["trajs_per_write=2", "with trajs_per_batch and a replay_buffer"]),
]


@pytest.mark.parametrize(("kwargs", "error", "parts"), BAD_OPTIONS,
                         ids=[_case_id(k) for k, _, _ in BAD_OPTIONS])
def test_validate_options_rejects_bad_values_naming_the_argument_and_the_fix(kwargs, error, parts):
    with pytest.raises(error) as info:
        validate_options(**{"frames_per_batch": 10, **kwargs})
    assert type(info.value) is error
    message = str(info.value)
    for part in parts:
        assert part in message, (part, message)


def test_validate_options_requires_frames_per_batch():
    with pytest.raises(TypeError, match="frames_per_batch"):
        validate_options()  # type: ignore[call-arg]


# --------------------------------------------------------------------------- validate_options: normalisation


def test_defaults_are_normalised_to_the_documented_values():
    opts = validate_options(frames_per_batch=10)
    assert opts == CollectorOptions(frames_per_batch=10)
    assert opts.total_frames == -1
    assert opts.init_random_frames == 0
    assert opts.max_frames_per_traj is None
    assert opts.split_trajs is False
    assert opts.exploration_type is InteractionType.RANDOM
    assert opts.create_env_kwargs == {}
    assert (opts.device, opts.storing_device, opts.env_device, opts.policy_device) == (None, None, None, None)
    assert (opts.reset_at_each_iter, opts.return_same_td, opts.set_truncated, opts.progress) == (False,) * 4
    assert opts.reset_when_done is True


@pytest.mark.parametrize(("given", "expected"), [
    (None, 0), (-1, 0), (0, 0), (1, 10), (10, 10), (11, 20), (25, 30), (30, 30),
])
def test_init_random_frames_is_rounded_up_to_whole_batches(given, expected):  # -1: none, as in TorchRL
    assert validate_options(frames_per_batch=10, init_random_frames=given).init_random_frames == expected


@pytest.mark.parametrize(("given", "expected"), [(None, None), (-1, None), (1, 1), (50, 50)])
def test_max_frames_per_traj_none_or_minus_one_means_never(given, expected):
    assert validate_options(frames_per_batch=10, max_frames_per_traj=given).max_frames_per_traj == expected


@pytest.mark.parametrize(("name", "value"), [
    ("max_frames_per_traj", 0), ("max_frames_per_traj", -5), ("init_random_frames", -5),
])
def test_counts_that_mean_nothing_are_refused(name, value):
    # issue 17: these were silently accepted (0 and -5 as "no limit", -5 random frames as 0)
    with pytest.raises(ValueError, match=f"{name}={value}: give"):
        validate_options(frames_per_batch=10, **{name: value})


@pytest.mark.parametrize(("given", "expected"), [(None, False), (False, False), (True, True)])
def test_split_trajs_none_means_false(given, expected):
    assert validate_options(frames_per_batch=10, split_trajs=given).split_trajs is expected


@pytest.mark.parametrize(("given", "expected"), [
    ("random", InteractionType.RANDOM),
    ("mode", InteractionType.MODE),
    ("MEAN", InteractionType.MEAN),
    ("Deterministic", InteractionType.DETERMINISTIC),
    ("median", InteractionType.MEDIAN),
    (InteractionType.MODE, InteractionType.MODE),
])
def test_exploration_type_accepts_its_names_in_any_case(given, expected):
    assert validate_options(frames_per_batch=10, exploration_type=given).exploration_type is expected
    assert parse_exploration_type(given) is expected


def test_device_fills_in_the_devices_that_are_not_given():
    opts = validate_options(frames_per_batch=10, device="cpu")
    assert opts.device == torch.device("cpu")
    assert opts.storing_device == opts.env_device == opts.policy_device == torch.device("cpu")
    assert all(isinstance(d, torch.device) for d in (opts.storing_device, opts.env_device, opts.policy_device))


def test_a_device_per_worker_that_is_the_same_everywhere_is_that_device():
    # issue 51: TorchRL's multi-process collectors take device=[...] (one per worker); it was a TypeError
    opts = validate_options(frames_per_batch=10, device=["cpu", "cpu"], storing_device=(torch.device("cpu"),))
    assert opts.device == opts.storing_device == opts.policy_device == torch.device("cpu")


def test_a_device_given_on_its_own_leaves_the_others_unset():
    opts = validate_options(frames_per_batch=10, policy_device="cpu")
    assert opts.policy_device == torch.device("cpu")
    assert opts.device is None and opts.storing_device is None and opts.env_device is None


def test_an_explicit_device_wins_over_device():
    opts = validate_options(frames_per_batch=10, device="cpu", storing_device=torch.device("cpu", 0))
    assert opts.storing_device == torch.device("cpu", 0)
    assert opts.env_device == opts.policy_device == torch.device("cpu")


def test_numpy_integers_and_matching_totals_are_accepted_as_plain_ints():
    opts = validate_options(frames_per_batch=np.int64(20), total_frames=np.int32(100), max_frames_per_traj=np.int16(7))
    assert (opts.frames_per_batch, opts.total_frames, opts.max_frames_per_traj) == (20, 100, 7)
    assert type(opts.frames_per_batch) is int and type(opts.total_frames) is int


def test_create_env_kwargs_is_copied():
    kwargs = {"max_len": 5}
    opts = validate_options(frames_per_batch=10, create_env_kwargs=kwargs)
    kwargs["max_len"] = 6
    assert opts.create_env_kwargs == {"max_len": 5}


def test_objects_with_the_right_methods_are_kept_as_given():
    interruptor, buffer = _Interruptor(), _Buffer()

    def postproc(td):
        return td

    opts = validate_options(frames_per_batch=10, interruptor=interruptor, replay_buffer=buffer, postproc=postproc)
    assert opts.interruptor is interruptor and opts.replay_buffer is buffer and opts.postproc is postproc


def test_options_are_frozen():
    opts = validate_options(frames_per_batch=10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.frames_per_batch = 20  # type: ignore[misc]


def test_options_from_picks_the_options_among_a_constructors_locals():
    arguments = {"self": object(), "create_env_fn": "CartPole-v1", "policy": None,
                 "frames_per_batch": 8, "total_frames": 32, "split_trajs": None, "num_workers": 3}
    opts = options_from(arguments)
    assert (opts.frames_per_batch, opts.total_frames, opts.split_trajs) == (8, 32, False)
    with pytest.warns(UserWarning, match=r"total_frames=33 is not a multiple of frames_per_batch=8"):
        assert options_from({**arguments, "total_frames": 33}).total_frames == 40


@pytest.mark.parametrize(("given", "expected"), [(25, 30), (5, 10), (30, 30)])
def test_total_frames_is_rounded_up_to_whole_batches_with_a_warning_as_in_torchrl(given, expected):
    # issue 18 item 6: TorchRL rounds up and warns; aiocollect raised
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert validate_options(frames_per_batch=10, total_frames=given).total_frames == expected
    messages = [str(w.message) for w in caught]
    if given == expected:
        assert not messages
    else:
        assert messages == [f"total_frames={given} is not a multiple of frames_per_batch=10: it is rounded up "
                            f"to {expected} (whole batches), as TorchRL does; give total_frames={expected} to "
                            "silence this."]


# --------------------------------------------------------------------------- parse_device


@pytest.mark.parametrize("value", ["cpu", "cpu:0", torch.device("cpu")])
def test_parse_device_accepts_the_cpu(value):
    device = parse_device("policy_device", value)
    assert isinstance(device, torch.device) and device.type == "cpu"


def test_parse_device_passes_none_through():
    assert parse_device("policy_device", None) is None


def test_parse_device_cuda_follows_what_this_machine_has():
    if torch.cuda.is_available():
        assert parse_device("policy_device", "cuda") == torch.device("cuda")
    else:
        with pytest.raises(ValueError, match=re.escape("policy_device='cuda': no cuda device is available here")):
            parse_device("policy_device", "cuda")


@pytest.mark.parametrize("value", ["cuda", "cuda:0", torch.device("cuda", 1)])
def test_parse_device_rejects_cuda_without_a_gpu_naming_the_argument(value, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError) as info:
        parse_device("storing_device", value)
    assert str(info.value) == f"storing_device={value!r}: no cuda device is available here; use 'cpu'."


def test_parse_device_rejects_a_cuda_index_this_machine_lacks(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert parse_device("env_device", "cuda:1") == torch.device("cuda", 1)
    with pytest.raises(ValueError) as info:
        parse_device("env_device", "cuda:2")
    assert str(info.value) == "env_device='cuda:2': this machine has 2 CUDA device(s)."


@pytest.mark.parametrize(("value", "error", "message"), [
    ("gpu", ValueError, "device='gpu' is not a device; use 'cpu', 'cuda', 'cuda:<index>' or a torch.device."),
    ("cpu:x", ValueError, "device='cpu:x' is not a device; use 'cpu', 'cuda', 'cuda:<index>' or a torch.device."),
    ("mps", ValueError, "device='mps': no mps device is available here; use 'cpu'."),
    (2.0, TypeError, "device must be a device such as 'cpu' or 'cuda:0', got 2.0"),
    (False, TypeError, "device must be a device such as 'cpu' or 'cuda:0', got False"),
    ({"type": "cpu"}, TypeError, "device must be a device such as 'cpu' or 'cuda:0', got {'type': 'cpu'}"),
])
def test_parse_device_rejects_what_is_not_a_usable_device(value, error, message, monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(error) as info:
        parse_device("device", value)
    assert type(info.value) is error and str(info.value) == message


# --------------------------------------------------------------------------- validate_worker_options

GOOD_WORKER = dict(cat_results="stack", preemptive_threshold=None, update_at_each_batch=False,
                   num_threads=None, num_sub_threads=None, max_policy_lag=None)

BAD_WORKER = [
    (dict(cat_results="cat"), ValueError, ["cat_results='cat'", "use 'stack'", "integer dim"]),
    (dict(cat_results=True), ValueError, ["cat_results=True", "use 'stack'"]),
    (dict(cat_results=1.0), ValueError, ["cat_results=1.0", "use 'stack'"]),
    (dict(preemptive_threshold=0), ValueError, ["preemptive_threshold=0", "(0, 1]"]),
    (dict(preemptive_threshold=0.0), ValueError, ["preemptive_threshold=0.0", "(0, 1]"]),
    (dict(preemptive_threshold=1.01), ValueError, ["preemptive_threshold=1.01", "or None"]),
    (dict(preemptive_threshold=-0.5), ValueError, ["preemptive_threshold=-0.5"]),
    (dict(preemptive_threshold=True), ValueError, ["preemptive_threshold=True"]),
    (dict(preemptive_threshold="0.5"), ValueError, ["preemptive_threshold='0.5'"]),
    (dict(preemptive_threshold=float("nan")), ValueError, ["preemptive_threshold=nan", "(0, 1]"]),
    (dict(preemptive_threshold=float("inf")), ValueError, ["preemptive_threshold=inf", "(0, 1]"]),
    (dict(preemptive_threshold=np.float64("nan")), ValueError, ["preemptive_threshold=", "(0, 1]"]),
    (dict(update_at_each_batch=1), TypeError, ["update_at_each_batch must be True or False, got 1"]),
    (dict(update_at_each_batch=None), TypeError, ["update_at_each_batch must be True or False, got None"]),
    (dict(num_threads=0), ValueError, ["num_threads=0: give a positive number of threads, or None."]),
    (dict(num_threads=True), ValueError, ["num_threads=True: give a positive number of threads"]),
    (dict(num_threads=2.0), ValueError, ["num_threads=2.0"]),
    (dict(num_sub_threads=-1), ValueError, ["num_sub_threads=-1: give a positive number of threads, or None."]),
    (dict(max_policy_lag=-1), ValueError, ["max_policy_lag=-1", "an int >= 0", "or None for no bound"]),
    (dict(max_policy_lag=True), ValueError, ["max_policy_lag=True"]),
    (dict(max_policy_lag=1.5), ValueError, ["max_policy_lag=1.5"]),
    (dict(max_policy_lag=np.int64(-1)), ValueError, ["max_policy_lag=", "an int >= 0"]),
    (dict(num_threads=np.float64(2)), ValueError, ["num_threads=", "positive number of threads"]),
    (dict(start_timeout=0), ValueError, ["start_timeout=0: give the seconds the workers may take to start",
                                         "or None to wait as long as they take"]),
    (dict(start_timeout=-1.0), ValueError, ["start_timeout=-1.0", "a positive, finite number"]),
    (dict(start_timeout=float("nan")), ValueError, ["start_timeout=nan", "a positive, finite number"]),
    (dict(start_timeout=float("inf")), ValueError, ["start_timeout=inf", "a positive, finite number"]),
    (dict(start_timeout=1e30), ValueError, ["start_timeout=1e+30", "a positive, finite number"]),
    (dict(start_timeout=True), ValueError, ["start_timeout=True"]),
    (dict(start_timeout="60"), ValueError, ["start_timeout='60'"]),
]


@pytest.mark.parametrize(("kwargs", "error", "parts"), BAD_WORKER,
                         ids=[_case_id(k) for k, _, _ in BAD_WORKER])
def test_validate_worker_options_rejects_bad_values_naming_the_argument(kwargs, error, parts):
    with pytest.raises(error) as info:
        validate_worker_options(**{**GOOD_WORKER, **kwargs})
    assert type(info.value) is error
    for part in parts:
        assert part in str(info.value), (part, str(info.value))


def test_validate_worker_options_defaults():
    assert validate_worker_options(**{**GOOD_WORKER, "cat_results": None}) == WorkerOptions("stack", None, False, None)
    assert validate_worker_options(**GOOD_WORKER).start_timeout == 300.0


@pytest.mark.parametrize(("kwargs", "expected"), [
    (dict(cat_results=0), WorkerOptions(0, None, False, None)),
    (dict(cat_results=-1), WorkerOptions(-1, None, False, None)),
    (dict(preemptive_threshold=1), WorkerOptions("stack", 1.0, False, None)),
    (dict(preemptive_threshold=0.25), WorkerOptions("stack", 0.25, False, None)),
    (dict(update_at_each_batch=True), WorkerOptions("stack", None, True, None)),
    (dict(max_policy_lag=0), WorkerOptions("stack", None, False, 0)),
    (dict(max_policy_lag=3, num_threads=1, num_sub_threads=4), WorkerOptions("stack", None, False, 3)),
    # numpy numbers are numbers: taken wherever a Python one is, and stored as Python's
    (dict(cat_results=np.int64(0)), WorkerOptions(0, None, False, None)),
    (dict(max_policy_lag=np.int64(2), num_threads=np.int32(2)), WorkerOptions("stack", None, False, 2)),
    (dict(preemptive_threshold=np.float32(0.5)), WorkerOptions("stack", 0.5, False, None)),
    (dict(start_timeout=0.5), WorkerOptions("stack", None, False, None, 0.5)),
    (dict(start_timeout=np.int64(600)), WorkerOptions("stack", None, False, None, 600.0)),
    (dict(start_timeout=None), WorkerOptions("stack", None, False, None, None)),
])
def test_validate_worker_options_keeps_good_values(kwargs, expected):
    opts = validate_worker_options(**{**GOOD_WORKER, **kwargs})
    assert opts == expected
    assert type(opts.cat_results) in (str, int)
    assert opts.max_policy_lag is None or type(opts.max_policy_lag) is int
    if opts.preemptive_threshold is not None:
        assert type(opts.preemptive_threshold) is float


# --------------------------------------------------------------------------- validate_batching

NO_BATCHING = dict(max_batch_size=None, min_batch_size=None, batch_timeout=None, step_timeout=None)


def test_validate_batching_defaults_match_batching():
    for coroutine in (False, True):
        assert validate_batching(**NO_BATCHING, coroutine=coroutine) == Batching()
    assert Batching() == Batching(max_batch_size=None, min_batch_size=1, batch_timeout=0.005, step_timeout=None)


@pytest.mark.parametrize("name", ["max_batch_size", "min_batch_size", "batch_timeout", "step_timeout"])
def test_validate_batching_rejects_coroutine_knobs_for_other_envs(name):
    with pytest.raises(ValueError) as info:
        validate_batching(**{**NO_BATCHING, name: 2}, coroutine=False)
    message = str(info.value)
    assert message.startswith(f"{name}: these apply to coroutine envs (aiocollect.AsyncEnv)")
    assert message.endswith("Remove the argument(s).")


def test_validate_batching_names_every_knob_given_for_other_envs():
    with pytest.raises(ValueError, match=r"^max_batch_size, step_timeout: these apply to coroutine envs"):
        validate_batching(**{**NO_BATCHING, "max_batch_size": 4, "step_timeout": 1.0}, coroutine=False)


BAD_BATCHING = [
    (dict(max_batch_size=0), "max_batch_size=0: give a number of envs >= 1, or None."),
    (dict(max_batch_size=True), "max_batch_size=True: give a number of envs >= 1, or None."),
    (dict(max_batch_size=2.0), "max_batch_size=2.0: give a number of envs >= 1, or None."),
    (dict(min_batch_size=-3), "min_batch_size=-3: give a number of envs >= 1, or None."),
    (dict(min_batch_size=5, max_batch_size=4), "min_batch_size=5 is larger than max_batch_size=4."),
    (dict(batch_timeout=0), "batch_timeout=0: give a positive, finite number of seconds, or None."),
    (dict(batch_timeout=-0.1), "batch_timeout=-0.1: give a positive, finite number of seconds, or None."),
    (dict(batch_timeout="1"), "batch_timeout='1': give a positive, finite number of seconds, or None."),
    (dict(step_timeout=True), "step_timeout=True: give a positive, finite number of seconds, or None."),
    (dict(step_timeout=0.0), "step_timeout=0.0: give a positive, finite number of seconds, or None."),
    # nan passes a `<= 0` check (every comparison with nan is false), then hangs or blames the env
    (dict(step_timeout=float("nan")), "step_timeout=nan: give a positive, finite number of seconds, or None."),
    (dict(step_timeout=float("inf")), "step_timeout=inf: give a positive, finite number of seconds, or None."),
    (dict(batch_timeout=float("nan")), "batch_timeout=nan: give a positive, finite number of seconds, or None."),
    (dict(batch_timeout=float("-inf")),
     "batch_timeout=-inf: give a positive, finite number of seconds, or None."),
]


@pytest.mark.parametrize(("kwargs", "message"), BAD_BATCHING, ids=[m.split(":")[0] for _, m in BAD_BATCHING])
def test_validate_batching_rejects_bad_knobs_for_coroutine_envs(kwargs, message):
    with pytest.raises(ValueError) as info:
        validate_batching(**{**NO_BATCHING, **kwargs}, coroutine=True)
    assert str(info.value) == message


def test_validate_batching_keeps_good_knobs_and_makes_timeouts_floats():
    b = validate_batching(max_batch_size=8, min_batch_size=8, batch_timeout=1, step_timeout=3, coroutine=True)
    assert b == Batching(max_batch_size=8, min_batch_size=8, batch_timeout=1.0, step_timeout=3.0)
    assert type(b.batch_timeout) is float and type(b.step_timeout) is float
    numpy = validate_batching(max_batch_size=np.int64(8), min_batch_size=np.int32(2),
                              batch_timeout=np.float32(0.5), step_timeout=np.int64(3), coroutine=True)
    assert numpy == Batching(max_batch_size=8, min_batch_size=2, batch_timeout=0.5, step_timeout=3.0)
    assert type(numpy.max_batch_size) is int and type(numpy.min_batch_size) is int
    only_min = validate_batching(**{**NO_BATCHING, "min_batch_size": 3}, coroutine=True)
    assert only_min == Batching(max_batch_size=None, min_batch_size=3, batch_timeout=0.005, step_timeout=None)


def test_validate_batching_refuses_reset_when_done_false_for_coroutine_envs():
    with pytest.raises(ValueError) as info:
        validate_batching(**NO_BATCHING, coroutine=True, reset_when_done=False)
    assert str(info.value) == (
        "reset_when_done=False: coroutine envs (aiocollect.AsyncEnv) are reset as soon as they "
        "finish; a finished coroutine env cannot be stepped on. Remove the argument."
    )
    # other envs may keep stepping once done
    assert validate_batching(**NO_BATCHING, coroutine=False, reset_when_done=False) == Batching()


@pytest.mark.parametrize(("kwargs", "names"), [
    (dict(max_batch_size=4), "max_batch_size"),
    (dict(min_batch_size=2), "min_batch_size"),
    (dict(batch_timeout=0.1), "batch_timeout"),
    (dict(max_batch_size=4, batch_timeout=0.1, step_timeout=1.0), "max_batch_size, batch_timeout"),
])
def test_validate_batching_refuses_per_call_knobs_where_envs_do_not_step_one_by_one(kwargs, names):
    with pytest.raises(ValueError) as info:
        validate_batching(**{**NO_BATCHING, **kwargs}, coroutine=True, per_env=False)
    message = str(info.value)
    assert message.startswith(f"{names}: in a worker collector each entry of coroutine envs steps as one worker")
    assert "Step the coroutine envs in a Collector" in message


def test_validate_batching_keeps_step_timeout_where_envs_do_not_step_one_by_one():
    b = validate_batching(**{**NO_BATCHING, "step_timeout": 2}, coroutine=True, per_env=False)
    assert b == Batching(step_timeout=2.0)


# --------------------------------------------------------------------------- env_seeds, worker_indices


def test_env_seeds_count_up_from_the_seed_or_repeat_it():
    assert env_seeds(7, 4, static_seed=False) == [7, 8, 9, 10]
    assert env_seeds(7, 4, static_seed=True) == [7, 7, 7, 7]
    assert env_seeds(0, 1, static_seed=False) == [0]
    assert env_seeds(np.int64(5), 2, static_seed=False) == [5, 6]
    assert all(type(seed) is int for seed in env_seeds(np.uint32(5), 2, static_seed=False))
    # the largest seeds that fit: every env seed below 2**63
    assert env_seeds(2**63 - 3, 3, static_seed=False)[-1] == 2**63 - 1
    assert env_seeds(2**63 - 1, 3, static_seed=True) == [2**63 - 1] * 3


def test_next_seed_is_the_first_seed_not_taken_as_a_plain_int():
    # the distributed collectors returned the user's numpy seed type from set_seed
    assert next_seed(7, 4, static_seed=False) == 11
    assert next_seed(7, 4, static_seed=True) == 7
    for static in (False, True):
        assert type(next_seed(np.int64(7), 4, static_seed=static)) is int


@pytest.mark.parametrize(("seed", "static_seed", "top"), [
    (-5, False, 2**63 - 3), (-1, True, 2**63 - 1), (2**63 - 2, False, 2**63 - 3),
    (2**64, False, 2**63 - 3), (2**63, True, 2**63 - 1), (np.int64(-1), False, 2**63 - 3),
])
def test_env_seeds_rejects_seeds_gymnasium_or_int64_cannot_hold(seed, static_seed, top):
    with pytest.raises(ValueError) as info:
        env_seeds(seed, 3, static_seed=static_seed)
    assert str(info.value).startswith(f"seed={seed!r}: give an int in 0..{top}; env k is seeded with seed + k")


@pytest.mark.parametrize("seed", [True, 1.0, "1", None])
def test_env_seeds_rejects_what_is_not_an_integer(seed):
    with pytest.raises(TypeError) as info:
        env_seeds(seed, 2, static_seed=False)
    assert str(info.value) == f"seed must be an integer, got {seed!r}"


@pytest.mark.parametrize(("worker_ids", "expected"), [
    (None, [0, 1, 2]),
    (0, [0]),
    (2, [2]),
    ([2, 0], [2, 0]),
    ((1,), [1]),
    (range(1, 3), [1, 2]),
    ([], []),
    (np.int64(1), [1]),
    ([np.int32(2), 0], [2, 0]),
    (np.array([0, 2]), [0, 2]),
])
def test_worker_indices_accepts_none_an_int_or_ints(worker_ids, expected):
    assert worker_indices(worker_ids, 3, "worker") == expected


@pytest.mark.parametrize("worker_ids", [3, -1, [0, 3], True, [True], 1.0, ["0"], "0"])
def test_worker_indices_rejects_out_of_range_or_non_int_ids(worker_ids):
    with pytest.raises(ValueError) as info:
        worker_indices(worker_ids, 3, "remote collector")
    assert str(info.value) == (
        f"worker_ids={worker_ids!r}: give remote collector indices in 0..2 "
        "(an int or a list of ints), or None for every remote collector."
    )


# --------------------------------------------------------------------------- validate_timeout (shutdown)


@pytest.mark.parametrize(("timeout", "expected"), [(None, None), (0, 0.0), (2, 2.0), (0.5, 0.5),
                                                   (np.float32(1.5), 1.5), (LONGEST_WAIT, LONGEST_WAIT)])
def test_validate_timeout_takes_none_or_finite_seconds(timeout, expected):
    seconds = validate_timeout(timeout)
    assert seconds == expected
    assert seconds is None or type(seconds) is float


@pytest.mark.parametrize("timeout", ["x", True, [1], b"1"])
def test_validate_timeout_rejects_what_is_not_a_number(timeout):
    with pytest.raises(TypeError) as info:
        validate_timeout(timeout)
    assert str(info.value) == f"timeout must be a number of seconds (an int or float >= 0), or None; got {timeout!r}"


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), -1, -0.5, 10**30, LONGEST_WAIT * 2])
def test_validate_timeout_rejects_nan_negative_and_endless_waits(timeout):
    with pytest.raises(ValueError) as info:
        validate_timeout(timeout)
    assert str(info.value).startswith(f"timeout={timeout!r}: give the seconds to wait, a finite number in 0..")


# --------------------------------------------------------------------------- the declaration, and what follows it
# The options are declared once, as the fields of CollectorOptions and WorkerOptions; the
# constructors keep explicit keyword signatures, checked here against that declaration.

TAKES_WORKER_OPTIONS = ("MultiSyncCollector", "MultiAsyncCollector", "AsyncCollector")
DISTRIBUTED = ("RayCollector", "RPCCollector")
_POLICY_ARGUMENTS = {"policy_factory", "compile_policy", "cudagraph_policy"}
_COROUTINE_KNOBS = {"max_batch_size", "min_batch_size", "batch_timeout", "step_timeout"}
OWN_ARGUMENTS = {
    # each constructor's keywords that are not options (documented in its class's docstrings,
    # or, for TorchRL's implemented keywords, in _collectors.torchrl_compat's)
    "Collector": {"create_env_fn", "policy", *_POLICY_ARGUMENTS, *_COROUTINE_KNOBS, "num_collectors", "sync",
                  "backend", "backend_options",  # (TorchRL's: which collector Collector(...) builds)
                  "start_timeout",  # (refused: it bounds worker processes, and a Collector starts none)
                  "step_ahead"},  # (coroutine envs: finished ones step on into the next batch)
    **{name: {"create_env_fn", "policy", *_POLICY_ARGUMENTS, *_COROUTINE_KNOBS, "num_workers"}
       for name in TAKES_WORKER_OPTIONS},
    "RayCollector": {"create_env_fn", "policy", "policy_factory", "collector_class", "collector_kwargs",
                     "num_workers_per_collector", "sync", "num_collectors", "update_after_each_batch",
                     "ray_init_config", "remote_configs", "start_timeout"},  # (the actors', not WorkerOptions')
    "RPCCollector": {"create_env_fn", "policy", "policy_factory", "collector_class", "collector_kwargs",
                     "num_workers_per_collector", "sync", "num_collectors", "update_after_each_batch",
                     "worker_names", "master_addr", "master_port", "tcp_port", "rpc_timeout", "start_timeout"},
}


def options_taken(name: str) -> dict[str, Option]:
    """The declared options that collector ``name`` takes as keywords."""
    if name in DISTRIBUTED:  # the rest go to the remote collectors in collector_kwargs
        return {k: spec for k, spec in options_of(CollectorOptions).items() if spec.distributed is not None}
    worker = options_of(WorkerOptions) if name in TAKES_WORKER_OPTIONS else {}
    return {**options_of(CollectorOptions), **worker}


@pytest.mark.parametrize("name", list(OWN_ARGUMENTS))
def test_every_constructor_takes_its_options_as_declared(name):
    """Every option a constructor takes is a keyword-only argument with the declared default, and
    every other keyword is one of its own arguments: an option added to the dataclass but not to a
    signature, a default that drifted, or a keyword that is neither fails here."""
    parameters = inspect.signature(getattr(aiocollect, name).__init__).parameters
    keywords = {k: p for k, p in parameters.items()
                if k != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    taken = options_taken(name)
    missing = sorted(set(taken) - set(keywords))
    assert not missing, f"{name}() lacks the option keyword(s) {missing}"
    for option_name, spec in taken.items():
        parameter = keywords[option_name]
        assert parameter.kind is parameter.KEYWORD_ONLY, (name, option_name)
        assert parameter.default == spec.keyword and type(parameter.default) is type(spec.keyword), (
            f"{name}({option_name}={parameter.default!r}): the declared default is {spec.keyword!r}")
    stray = sorted(set(keywords) - set(taken) - OWN_ARGUMENTS[name])
    assert not stray, f"{name}() takes {stray}: declare them as options, or list them as its own arguments"
    assert OWN_ARGUMENTS[name] <= set(keywords), sorted(OWN_ARGUMENTS[name] - set(keywords))


@pytest.mark.parametrize("name", list(OWN_ARGUMENTS))
def test_a_constructors_own_arguments_are_documented(name):
    cls = getattr(aiocollect, name)
    docs = [klass.__doc__ or "" for klass in cls.__mro__] + [cls.__new__.__doc__ or "", torchrl_compat.__doc__]
    undocumented = sorted(k for k in OWN_ARGUMENTS[name] if not any(f"{k}:" in d or f"``{k}``" in d for d in docs))
    assert not undocumented, f"{name}: {undocumented} documented nowhere"


@pytest.mark.parametrize("kind", [CollectorOptions, WorkerOptions])
def test_every_option_is_declared_with_a_docstring_a_check_and_a_default_that_validates_to_its_own(kind):
    """The docstring under each field is the reference users read; each keyword default, checked,
    is the field's (normalised) default."""
    tree = ast.parse(inspect.getsource(kind))
    body = tree.body[0].body
    documented = {node.target.id for node, after in itertools.pairwise(body)
                  if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr)
                  and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)}
    declared = options_of(kind)
    assert documented == set(declared) == {f.name for f in dataclasses.fields(kind)}
    for f in dataclasses.fields(kind):
        spec = declared[f.name]
        if spec.keyword is inspect.Parameter.empty:
            continue  # (frames_per_batch: required)
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        assert spec.check(f.name, spec.keyword) == default, f.name


def test_forwarded_is_the_options_declared_forward_and_reaches_the_remote_collectors_as_given():
    declared = options_of(CollectorOptions)
    assert tuple(k for k, spec in declared.items() if spec.distributed == FORWARD) == FORWARDED
    assert {spec.distributed for spec in declared.values()} == {FORWARD, HERE, None}
    for name in FORWARDED:  # RayCollector's docstring lists what goes to every remote collector
        assert f"``{name}``" in aiocollect.RayCollector.__doc__ or name.endswith("device"), name
    given = dict(device="cpu", storing_device=None, env_device=None, policy_device=None, max_frames_per_traj=-1,
                 init_random_frames=15, reset_at_each_iter=True, exploration_type="mode")
    arguments = dict(create_env_fn="CartPole-v1", policy=None, policy_factory=None, collector_class="single",
                     collector_kwargs=None, num_workers_per_collector=1, num_collectors=2, sync=True,
                     frames_per_batch=20, **given)
    options = options_from(arguments)
    count, payloads = plan_remotes(arguments, options)
    assert count == 2
    for payload in payloads:
        _, _, kwargs, _ = cloudpickle.loads(payload)
        assert {k: kwargs[k] for k in FORWARDED} == given  # as given: each remote collector checks them itself
        assert (kwargs["frames_per_batch"], kwargs["total_frames"]) == (10, -1)

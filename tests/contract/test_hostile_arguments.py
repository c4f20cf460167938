"""Hostile arguments, the same in every variant: ``nan`` and ``inf`` where seconds or a
fraction are due, numpy integers where ints are, seeds gymnasium refuses, and a bad
``shutdown(timeout=...)``. Each is refused with an error naming the argument, before any
process starts (or, on a running collector, before anything is queued or stored), so the
collector goes on working and still shuts down cleanly."""

from __future__ import annotations

import asyncio
import re
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from aiocollect import AsyncCollector, Collector, MultiSyncCollector
from aiocollect._errors import PolicyKeyError
from support.envs import CounterEnv
from support.procs import children

NAN, INF = float("nan"), float("inf")


def _refused(variant, exc, match, **kwargs) -> None:
    """``variant(**kwargs)`` raises ``exc`` matching ``match``, and no worker process started."""
    before = children()
    with pytest.raises(exc, match=match):
        variant(frames_per_batch=40, **kwargs)
    assert children() == before, "a worker process was started for a collector that was refused"


@pytest.mark.parametrize("value", [NAN, INF], ids=["nan", "inf"])
def test_a_step_timeout_that_is_not_finite_is_refused(variant, value):
    """``nan`` passed ``value <= 0``, then a worker collector waited forever and a coroutine
    env was blamed for a timeout; for other in-process envs the knob is refused anyway."""
    if variant.processes or variant.coroutine:
        _refused(variant, ValueError, rf"^step_timeout={value}: give a positive, finite number of seconds",
                 step_timeout=value)
    else:
        _refused(variant, ValueError, "^step_timeout: these apply to coroutine envs", step_timeout=value)


def test_a_batch_timeout_that_is_nan_is_refused(variant):
    match = "batch_timeout=nan: give a positive, finite" if variant.cls is Collector and variant.coroutine \
        else "^batch_timeout: "
    _refused(variant, ValueError, match, batch_timeout=NAN)


def test_preemptive_threshold_is_refused_naming_the_class_called(variant):
    name = variant.cls.__name__
    if variant.cls is Collector:
        _refused(variant, TypeError, "preemptive_threshold", preemptive_threshold=0.5)
    elif variant.cls is MultiSyncCollector:
        _refused(variant, ValueError, r"^preemptive_threshold=nan: give the fraction", preemptive_threshold=NAN)
    else:  # MultiAsyncCollector and its one-worker AsyncCollector
        _refused(variant, ValueError, f"; a {name} never waits for a slow worker", preemptive_threshold=0.5)
        _refused(variant, ValueError, f"^interruptor: a {name} delivers", interruptor=_Interruptor())


class _Interruptor:
    def collection_stopped(self) -> bool:
        return False


def test_numpy_integers_are_taken_wherever_ints_are(variant):
    """``isinstance(x, int)`` refused ``np.int64``; every integer argument takes it now."""
    if variant.cls is Collector:
        _refused(variant, TypeError, "max_policy_lag", max_policy_lag=np.int64(2))
        return
    _refused(variant, ValueError, r"^max_policy_lag=np.int64\(-1\): give how many", max_policy_lag=np.int64(-1))
    extra = {"cat_results": np.int64(0)} if variant.cls is MultiSyncCollector else {"max_policy_lag": np.int64(2)}
    with variant(frames_per_batch=40, total_frames=40, **extra) as collector:
        assert len(list(collector)) == 1
        assert collector.options.frames_per_batch == 40


def test_a_bad_seed_is_refused_before_any_seed_is_queued(variant):
    """``set_seed(-5)`` used to raise gymnasium's error and leave the seeds queued (the next
    batch then failed with ``EnvError``); ``2**64`` gave a raw ``OverflowError``."""
    with variant(frames_per_batch=40, total_frames=-1) as collector:
        batches = iter(collector)
        next(batches)
        for seed, exc in ((-5, ValueError), (2**64, ValueError), (np.int64(-1), ValueError), (3.0, TypeError)):
            with pytest.raises(exc, match=r"^seed"):
                collector.set_seed(seed)
        next(batches)  # nothing was queued: the envs step on
        chained = collector.set_seed(np.int64(3))
        assert chained == 3 + variant.num_envs and type(chained) is int
        next(batches)


BAD_TIMEOUTS = [("x", TypeError), (NAN, ValueError), (INF, ValueError), (10**30, ValueError), (-1, ValueError)]


@pytest.mark.parametrize("method", ["shutdown", "async_shutdown"])
def test_a_bad_shutdown_timeout_changes_nothing(variant, method):
    """A bad ``timeout`` was stored (then every later ``shutdown()`` failed) or overflowed;
    now it is refused first, and the collector still collects and shuts down."""
    before = children()
    collector = variant(frames_per_batch=40, total_frames=-1)
    batches = iter(collector)
    next(batches)
    for timeout, exc in BAD_TIMEOUTS:
        with pytest.raises(exc, match=r"^timeout"):
            getattr(collector, method)(timeout=timeout)
    next(batches)
    collector.shutdown()
    assert children() == before, "a worker process outlived shutdown()"


# --------------------------------------------------------------------------- policies, envs and iterations
# that name too little (issue 35, item 5): each error names what was given, what was expected and the fix


def _module(in_keys, out_keys, n_out: int = 3):
    from tensordict.nn import TensorDictModule

    return TensorDictModule(nn.Linear(3, n_out), in_keys=in_keys, out_keys=out_keys)


def _policy_refused(variant, match: str, policy) -> PolicyKeyError:
    """``variant`` over ``policy`` raises a ``PolicyKeyError`` (a ``KeyError``, as before, and a
    ``ValueError``, a bad argument) matching ``match``, before any worker process started."""
    before = children()
    with pytest.raises(PolicyKeyError, match=match) as info:
        variant(policy=policy, frames_per_batch=40)
    assert children() == before, "a worker process was started for a collector that was refused"
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    return info.value


OUT_KEYS_FIX = (r"with no 'action': the collector steps the envs with the policy's 'action' output\. Name the "
                r"output that is the action 'action' in out_keys \(out_keys=\['action'\]\)\.$")


def test_a_policy_without_an_action_output_is_refused_naming_its_out_keys(variant):
    """A ``TensorDictModule`` with ``out_keys=["act"]`` gave a bare ``KeyError: 'action'`` from
    the first round; its out_keys settle it, before any process starts. A sequence of modules
    (whose own modules might write more) is called once, on zeros, to find out."""
    _policy_refused(variant, r"^policy: its out_keys are \['act'\], " + OUT_KEYS_FIX,
                    _module(["observation"], ["act"]))
    from tensordict.nn import TensorDictSequential

    _policy_refused(variant, r"^policy: it wrote \['act'\] \(its out_keys are \['act'\]\), " + OUT_KEYS_FIX,
                    TensorDictSequential(_module(["observation"], ["act"])))


def test_a_policy_reading_a_key_the_envs_do_not_give_is_refused_naming_the_observation_keys(variant):
    """``in_keys=["obs"]`` where the envs give ``"observation"`` gave tensordict's ``the
    following inputs are None: {'obs'}`` from the first round."""
    error = _policy_refused(
        variant,
        r"^policy: in_keys \['obs'\]: the envs give no 'obs' \(the batch's observation keys are "
        r"\['observation'\]\), and the policy fails without it\. Set the policy's in_keys to the "
        r"observation keys it reads \(in_keys=\['observation'\]\)\.$",
        _module(["obs"], ["action"]),
    )
    assert "the following inputs are None: {'obs'}" in str(error.__cause__)  # tensordict's, kept as the cause


def test_a_jax_policy_reading_a_key_the_envs_do_not_give_is_refused_without_a_call(variant):
    """A ``JaxPolicy`` is called with exactly its ``in_keys``: they settle it, with no call."""
    jax_policy = pytest.importorskip("aiocollect.jax").JaxPolicy
    jnp = pytest.importorskip("jax.numpy")
    calls = []

    def apply(params, obs):
        calls.append(obs)
        return jnp.zeros(obs.shape[0], jnp.int32)

    _policy_refused(variant,
                    r"^policy: in_keys \['obs'\]: the envs give no 'obs' \(the batch's observation keys are "
                    r"\['observation'\]\)\. Set the policy's in_keys to the observation keys it reads "
                    r"\(in_keys=\['observation'\]\)\.$",
                    jax_policy(apply, jnp.zeros(1), in_keys=["obs"]))
    assert not calls


class _Optional(nn.Module):
    """A module whose second input may be missing (``strict=False`` passes ``None``)."""

    def forward(self, observation, extra=None):
        return observation[:, 0].long() % 3


def test_a_policy_whose_missing_in_key_is_optional_is_taken(variant):
    """The call on zeros finds that the policy works without the key: it collects as before."""
    from tensordict.nn import TensorDictModule

    policy = TensorDictModule(_Optional(), in_keys=["observation", "extra"], out_keys=["action"])
    with variant(policy=policy, frames_per_batch=40, total_frames=40) as collector:
        assert [batch["action"].numel() for batch in collector] == [40]


def test_an_action_of_the_wrong_shape_says_what_the_policy_should_return(variant):
    """Four scores per env for ``Discrete(3)``: the error says to return an index (or one-hot rows
    of 3 columns), not only the shapes."""
    def policy(observation):
        return torch.zeros(observation.shape[0], 4, dtype=torch.long)

    match = (r"^action: the policy returned shape \[(\d+), 4\] for \1 env\(s\), expected \[\1\] for Discrete\(3\)\. "
             r"A one-hot action has shape \[num_envs, 3\], one column per action\. The policy gave 4 values per env: "
             r"return one int64 index per env \(an argmax over the 3 actions' scores, or a Categorical sample\), "
             r"or one-hot rows of 3 columns \(a last layer with 3 outputs\)\.$")
    with variant(policy=policy, frames_per_batch=40, total_frames=40) as collector, \
            pytest.raises(ValueError, match=match):
        next(iter(collector))


def _finished_message(face: str, variant) -> str:
    return (rf"^{face}: this {variant.cls.__name__} has already collected its total_frames=80 "
            r"\(len\(collector\) == 2 batches\), so this iteration yields nothing\. To collect more, create a new "
            r"collector \(with a larger total_frames, or total_frames=-1 for an endless one\)\.$")


def test_a_second_iteration_over_a_finished_collector_warns_and_yields_nothing(variant):
    """A second ``for`` (or ``async for``) over a collector that collected its ``total_frames``
    yielded nothing without a word; it still yields nothing, as in TorchRL, with a warning
    that points at the loop. The first iteration, which ends the collection, does not warn."""
    with variant(frames_per_batch=40, total_frames=80) as collector:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert len(list(collector)) == 2 == len(collector)
        with pytest.warns(UserWarning, match=_finished_message("for batch in collector", variant)) as record:
            assert list(collector) == []
        assert record[0].filename == __file__  # (the user's loop, not aiocollect's)

        async def again() -> list:
            return [batch async for batch in collector]

        with pytest.warns(UserWarning, match=_finished_message("async for batch in collector", variant)):
            assert asyncio.run(again()) == []
        assert collector.next() is None  # TorchRL's next(): None once finished, as documented, no warning


def _make_env():
    return CounterEnv()


def _entries(variant, entry, n: int = 1):
    """``create_env_fn`` for ``variant``'s class: ``entry`` itself for a ``Collector`` and an
    ``AsyncCollector`` (``n == 1``), or a list of ``n`` of them; a list per worker otherwise."""
    if variant.cls is Collector or variant.cls is AsyncCollector:
        return entry if n == 1 else [entry] * n
    return [entry if n == 1 else [entry] * n] * variant.workers


def test_a_factory_that_returns_a_factory_says_how_to_fix_it(variant):
    # (an AsyncCollector's create_env_fn is its one worker's entry: named as given)
    where = "create_env_fn" if variant.cls in (Collector, AsyncCollector) else "create_env_fn[0]"
    before = children()
    with pytest.raises(TypeError, match=(
            rf"^{re.escape(where)} gave builtins.function, not a gymnasium env, a TorchRL env or a coroutine env "
            r"\(aiocollect.AsyncEnv\)\. It returned a callable \(_make_env\), a factory of a factory\? Pass the "
            r"factory that builds the env \(`make_env`, not `lambda: make_env`\), or have yours return the env "
            r"\(`lambda: make_env\(\)`\)\.$")):
        variant.cls(_entries(variant, lambda: _make_env), None, frames_per_batch=40)
    assert children() == before


def test_an_env_instance_is_taken_where_its_envs_step_here_and_refused_where_a_worker_builds_them(variant):
    """One rule: a ``Collector`` steps its envs in this process and takes an env instance (as
    TorchRL's does); a worker collector builds its envs in a worker process, where an instance
    cannot go, and refuses one before any process starts, naming the argument and the fix.
    ``[env] * n`` (or a factory returning one env it keeps) would step one env as n: refused."""
    before = children()
    if variant.cls is Collector:
        with variant.cls(CounterEnv(), None, frames_per_batch=40, total_frames=40) as collector:
            assert [batch.shape for batch in collector] == [(40,)]
        env = CounterEnv()
        with pytest.raises(ValueError, match=(
                r"^create_env_fn\[1\] gave the same env object as create_env_fn\[0\] \(support.envs.CounterEnv\); "
                r"each entry of the list is an env of its own: pass a factory per env, e.g. "
                r"`\[lambda: gym.make\(...\)\] \* n`, not `\[env\] \* n`\.$")):
            variant.cls([env] * 2, None, frames_per_batch=40)
    else:
        where = r"create_env_fn" if variant.cls is AsyncCollector else r"create_env_fn\[0\]"
        with pytest.raises(TypeError, match=(
                rf"^{where} is an env instance \(support.envs.CounterEnv\); a worker builds its own envs: pass a "
                r"factory instead, e.g. `lambda: gym.make\(...\)` or `lambda: GymEnv\(...\)` for a TorchRL env, "
                r"or the env id string\.$")):
            variant.cls(_entries(variant, CounterEnv()), None, frames_per_batch=40)
    env = CounterEnv()
    # (a worker's list; an AsyncCollector's create_env_fn is that list)
    same = "create_env_fn" if variant.cls in (Collector, AsyncCollector) else r"create_env_fn\[0\]"
    with pytest.raises(ValueError, match=(
            rf"^{same}\[1\] gave the same env object as {same}\[0\] \(support.envs.CounterEnv\); each entry of the "
            r"list is an env of its own: a factory must build a new env at each call \(`lambda: gym.make\(...\)`, "
            r"not `lambda: env`\)\.$")):
        variant.cls(_entries(variant, lambda: env, n=2), None, frames_per_batch=40)
    assert children() == before

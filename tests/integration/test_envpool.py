"""EnvPool's envs (C++ envs stepped by its own threads) as a collector's vector env.

EnvPool's gymnasium interface is a ``VectorEnv`` that answers a partial reset with the rows of
the envs it reset only, and says which env each row is (``info["env_id"]``), where gymnasium's
vector envs return a row for every env. Both are read into the right env's place; a vector env
whose rows come in another order is put in order; an asynchronous pool (some envs per step) is
refused. The first tests hold the same semantics in hand-written vector envs over
``CounterEnv`` (whose observations say which episode and step they are); the last run EnvPool
itself (a dev dependency, Linux x86-64 only).
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import warnings

import numpy as np
import pytest
import torch
from gymnasium.vector import SyncVectorEnv
from tensordict.nn import TensorDictModule

from aiocollect import Collector, MultiAsyncCollector, MultiSyncCollector
from support.checks import check_batch, check_continuity, rows
from support.envs import CounterEnv

HAVE_ENVPOOL = importlib.util.find_spec("envpool") is not None

pytestmark = pytest.mark.filterwarnings("ignore:.*precision lowered by casting to float32")
"""(EnvPool's spaces have float64 bounds, which gymnasium casts with a warning each time.)"""


class OnlyResetRows(SyncVectorEnv):
    """A vector env that answers a partial reset as EnvPool does: the reset envs' rows only,
    named by ``info["env_id"]`` (or, with ``say_ids=False``, in the order of the mask)."""

    def __init__(self, n: int = 4, say_ids: bool = True, reverse: bool = True):
        super().__init__([CounterEnv] * n)
        self.say_ids, self.reverse = say_ids, reverse
        self.partial_resets = 0

    def reset(self, *, seed=None, options=None):
        mask = (options or {}).get("reset_mask")  # (gymnasium's reset takes it out of options)
        obs, info = super().reset(seed=seed, options=options)
        if mask is None or mask.all():
            return obs, info
        self.partial_resets += 1
        ids = np.flatnonzero(mask)
        if self.say_ids and self.reverse:
            ids = ids[::-1].copy()  # (named, so any order will do)
        return obs[ids], ({"env_id": ids} if self.say_ids else {})


class Shuffled(SyncVectorEnv):
    """A vector env whose steps give every env's row, in a new order each step, named by
    ``info["env_id"]``; with ``drop=True``, all but the last env's (an asynchronous pool)."""

    def __init__(self, n: int = 4, drop: bool = False):
        super().__init__([CounterEnv] * n)
        self.drop = drop
        self.rng = np.random.default_rng(0)

    def step(self, actions):
        obs, reward, terminated, truncated, _ = super().step(actions)
        order = self.rng.permutation(self.num_envs)
        if self.drop:
            order = order[:-1]
        return obs[order], reward[order], terminated[order], truncated[order], {"env_id": order}


def _batches(collector, n: int) -> list:
    with collector:
        return list(itertools.islice(collector, n))


def _check(batches: list, across: bool = True) -> int:
    """The invariants on every batch and (``across``) from one batch to the next; returns the
    episodes that ended. (A ``MultiAsyncCollector``'s batches are each one worker's, in any
    order: they do not continue one another.)"""
    for b in batches:
        check_batch(b)
    for prev, cur in itertools.pairwise(batches if across else []):
        check_continuity(prev, cur)
    return sum(int(b["next", "done"].sum()) for b in batches)


@pytest.mark.parametrize("say_ids", [True, False], ids=["rows named", "rows in mask order"])
def test_a_vector_env_that_returns_only_the_reset_rows_gives_each_env_its_own(say_ids):
    venv = OnlyResetRows(4, say_ids=say_ids)
    batches = _batches(Collector(venv, None, frames_per_batch=120, total_frames=600), 5)
    assert venv.partial_resets > 5  # (CounterEnv's episodes differ in length: the resets are partial)
    assert _check(batches) > 10
    for b in batches:  # each episode starts at step 0, in its own env's row
        r = rows(b)
        obs, nxt, done = r["observation"][..., 0], r["next", "observation"][..., 0], r["next", "done"][..., 0]
        assert (nxt == obs + 1)[~done].all()
        assert (obs[:, 1:][done[:, :-1]] == 0).all()


def test_rows_given_in_another_order_are_put_in_env_order():
    batches = _batches(Collector(Shuffled(4), None, frames_per_batch=120, total_frames=600), 5)
    assert _check(batches) > 10
    for b in batches:
        r = rows(b)
        assert (r["next", "observation"][..., 0] == r["observation"][..., 0] + 1)[~r["next", "done"][..., 0]].all()


class SaysItsId(CounterEnv):
    """An env whose own info has an ``"env_id"`` (a name, or a number that is not its row)."""

    def __init__(self, value=None):
        super().__init__()
        self.value = value

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        return obs, {**info, "env_id": self.value}

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated, truncated, {**info, "env_id": self.value}


@pytest.mark.parametrize("value", ["cartpole-a", 7], ids=["a name", "a number"])
def test_an_env_id_in_the_envs_own_infos_is_not_taken_for_the_rows_order(value):
    venv = SyncVectorEnv([lambda: SaysItsId(value)] * 3)  # (gymnasium gathers it, with an "_env_id" mask)
    assert _check(_batches(Collector(venv, None, frames_per_batch=90, total_frames=450), 5)) > 10


def test_an_asynchronous_pool_is_refused_naming_what_to_change():
    with pytest.raises(ValueError, match=r"asynchronous pool.*batch_size=num_envs"):
        _batches(Collector(Shuffled(4, drop=True), None, frames_per_batch=40, total_frames=40), 1)


def test_worker_processes_step_such_vector_envs_too():
    batches = _batches(MultiSyncCollector([OnlyResetRows, OnlyResetRows], None, frames_per_batch=160,
                                          total_frames=800), 5)
    assert _check(batches) > 10


# EnvPool itself ---------------------------------------------------------------------------

needs_envpool = pytest.mark.skipif(not HAVE_ENVPOOL, reason="envpool is not installed (Linux x86-64 wheels only)")


def envpool_cartpole(num_envs: int = 8, batch_size: int | None = None):
    """EnvPool's CartPole-v1 (C++), one thread; its spaces' float64 bounds warn as they are built."""
    import envpool

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return envpool.make_gymnasium("CartPole-v1", num_envs=num_envs, num_threads=1,
                                      batch_size=batch_size or num_envs)


def _mlp() -> TensorDictModule:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    return TensorDictModule(lambda obs: net(obs).argmax(-1), in_keys=["observation"], out_keys=["action"])


def _check_cartpole(batches: list, across: bool = True) -> None:
    assert _check(batches, across) > 10
    for b in batches:
        r = rows(b)
        assert (r["next", "reward"] == 1).all()  # a fake autoreset step would pay 0
        x, angle = r["observation"][..., 0], r["observation"][..., 2]
        assert (x.abs() <= 2.4).all() and (angle.abs() <= 0.2095).all()  # no step from a terminal state


@needs_envpool
@pytest.mark.parametrize("policy", [None, "mlp"])
def test_envpool_cartpole_in_a_collector(policy):
    batches = _batches(Collector(envpool_cartpole, _mlp() if policy else None, frames_per_batch=400,
                                 total_frames=4000), 10)
    _check_cartpole(batches)


@needs_envpool
@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
def test_envpool_cartpole_in_worker_processes_with_a_policy_that_reads_the_observation(cls):
    batches = _batches(cls([envpool_cartpole, envpool_cartpole], _mlp(), frames_per_batch=800,
                           total_frames=8000), 10)
    _check_cartpole(batches, across=cls is MultiSyncCollector)


@needs_envpool
@pytest.mark.parametrize("cls", [Collector, MultiSyncCollector])
def test_an_asynchronous_envpool_is_refused_as_the_collector_is_built(cls):
    make = functools.partial(envpool_cartpole, 8, batch_size=4)
    entry = make if cls is Collector else [make, make]
    with pytest.raises(ValueError, match=r"asynchronous pool \(batch_size=4 of num_envs=8\).*MultiAsyncCollector"):
        cls(entry, None, frames_per_batch=80, total_frames=80)  # (a worker collector: before any worker starts)


async def test_rows_named_by_the_vector_env_through_the_async_face():
    venv = OnlyResetRows(4)
    async with Collector(venv, None, frames_per_batch=120, total_frames=600) as collector:
        batches = [b async for b in collector]
    assert len(batches) == 5 and venv.partial_resets > 5
    assert _check(batches) > 10


@needs_envpool
async def test_envpool_cartpole_in_worker_processes_through_the_async_face():
    async with MultiAsyncCollector([envpool_cartpole, envpool_cartpole], _mlp(), frames_per_batch=800,
                                   total_frames=8000) as collector:
        batches = [b async for b in collector]
    assert len(batches) == 10
    _check_cartpole(batches, across=False)

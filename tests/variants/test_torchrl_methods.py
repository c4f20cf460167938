"""TorchRL's collector methods and attributes beyond iteration (``policy_version``,
``increment_version``, ``getattr_policy``/``getattr_env``/``getattr_rb``, ``n_env``,
``requested_frames_per_batch``, ``frames_per_batch_worker``, ``env``), TorchRL's
``track_policy_version=True`` keys, and weight updates of a policy without parameters; on
the in-process ``Collector`` and the worker collectors (2 workers)."""

from __future__ import annotations

import pytest
import torch
from tensordict.nn import TensorDictModule
from torch import nn

import aiocollect
from aiocollect import Collector, MultiAsyncCollector, MultiSyncCollector
from support.envs import CounterEnv
from support.torchrl_marks import QUIET_TORCHRL

pytestmark = QUIET_TORCHRL

FPB = 20
VERSION = ("collector", "policy_version")


class NoParams(nn.Module):
    """A torch policy with no parameter and no buffer: action 0 everywhere."""

    def forward(self, observation):
        return torch.zeros(observation.shape[:-1], dtype=torch.int64)


class Linear(nn.Module):
    """A torch policy with weights."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, observation):
        return self.lin(observation).argmax(-1)


def build(name: str, policy, **kwargs):
    """``name``'s collector over 2 ``CounterEnv``s: in this process, or one per worker."""
    if name == "Collector":
        return Collector([CounterEnv, CounterEnv], policy, frames_per_batch=FPB, **kwargs)
    cls = MultiSyncCollector if name == "MultiSync" else MultiAsyncCollector
    return cls([CounterEnv, CounterEnv], policy, frames_per_batch=FPB, **kwargs)


NAMES = ["Collector", "MultiSync", "MultiAsync"]
WORKERS = ["MultiSync", "MultiAsync"]


# ---------------------------------------------------------------------------- weights


@pytest.mark.parametrize("name", NAMES)
def test_an_update_of_a_policy_without_parameters_is_a_new_version_with_nothing_copied(name):
    """TorchRL's update does nothing to such a policy; here it is still a version (as every update)."""
    with build(name, NoParams(), total_frames=2 * FPB) as collector:
        assert collector.update_policy_weights_() == 1
        batches = list(collector)
        assert len(batches) == 2
        assert {int(v) for b in batches for v in b[VERSION].flatten()} == {1}
        assert collector.statistics().latest_policy_version == 1


def test_update_at_each_batch_with_a_policy_without_parameters():
    """The first batch used to fail (``torch._foreach_copy_`` of an empty list)."""
    with build("MultiSync", NoParams(), total_frames=3 * FPB, update_at_each_batch=True) as collector:
        versions = [sorted({int(v) for v in b[VERSION].flatten()}) for b in collector]
    assert versions == [[1], [2], [3]]  # each batch's update is in effect for the whole batch


# ---------------------------------------------------------------------------- track_policy_version


@pytest.mark.parametrize("name", NAMES)
def test_track_policy_version_adds_torchrl_keys_holding_each_frames_version(name):
    with build(name, Linear(), total_frames=6 * FPB, track_policy_version=True) as collector:
        batches = [collector.next()]
        collector.update_policy_weights_()
        for batch in collector:  # (MultiAsync delivers the batches it collected ahead first)
            batches.append(batch)
            if 1 in batch[VERSION]:
                break
    for batch in batches:
        ours = batch[VERSION]
        for key in ("policy_version", ("next", "policy_version")):
            theirs = batch[key]
            assert theirs.dtype == torch.int64 and theirs.shape == batch.shape
            assert torch.equal(theirs, ours)
            assert theirs.data_ptr() != ours.data_ptr()  # copies: changing one leaves the others alone
    assert set(batches[0]["policy_version"].flatten().tolist()) == {0}
    assert 1 in batches[-1]["policy_version"]


@pytest.mark.parametrize("name", ["Collector", "MultiSync"])
def test_without_track_policy_version_batches_stay_as_they_are(name):
    with build(name, None, total_frames=FPB, track_policy_version=False) as collector:
        batch = collector.next()
    assert "policy_version" not in batch and ("next", "policy_version") not in batch
    assert VERSION in batch.keys(True)


def test_track_policy_version_is_an_option_checked_with_the_others():
    """``Collector(num_collectors=N)`` passes it to the worker collector it builds; a value
    that is not a bool is refused before anything starts."""
    with pytest.raises(TypeError, match="track_policy_version must be True or False, got 'yes'"):
        Collector(CounterEnv, None, frames_per_batch=FPB, track_policy_version="yes")
    with Collector(CounterEnv, None, num_collectors=2, sync=True, frames_per_batch=FPB, total_frames=FPB,
                   track_policy_version=True) as multi:
        assert isinstance(multi, MultiSyncCollector)
        assert multi.options.track_policy_version
        assert "policy_version" in multi.next()


def test_track_policy_version_has_torchrl_s_dtype_and_shape():
    torchrl_collectors = pytest.importorskip("torchrl.collectors")
    from torchrl.envs import GymEnv

    def make_env():
        return GymEnv("CartPole-v1", categorical_action_encoding=True)

    def policy(td):
        return td.set("action", torch.zeros(td.shape, dtype=torch.int64))

    batches = []
    for lib in (torchrl_collectors, aiocollect):
        collector = lib.Collector(make_env, policy, frames_per_batch=8, total_frames=8, track_policy_version=True)
        batches.append(next(iter(collector)))
        collector.shutdown()
    for key in ("policy_version", ("next", "policy_version")):
        theirs, ours = (b[key] for b in batches)
        assert (ours.dtype, ours.shape) == (theirs.dtype, theirs.shape) == (torch.int64, torch.Size([8]))
        assert ours.tolist() == theirs.tolist() == [0] * 8


# ---------------------------------------------------------------------------- versions


@pytest.mark.parametrize("name", NAMES)
def test_policy_version_get_policy_version_and_increment_version(name):
    with build(name, Linear(), total_frames=FPB) as collector:
        assert collector.policy_version == collector.get_policy_version() == 0
        assert collector.increment_version() == 1  # update_policy_weights_() with no argument
        assert collector.policy_version == collector.get_policy_version() == 1
        batch = collector.next()
        assert set(batch[VERSION].flatten().tolist()) == {1}
        assert collector.statistics().policy_version == 1


def test_a_policy_without_weights_keeps_its_one_version():
    with build("Collector", lambda observation: torch.zeros(observation.shape[:-1], dtype=torch.int64),
               total_frames=FPB) as collector:
        assert collector.increment_version() == 0
        assert collector.policy_version == 0


# ---------------------------------------------------------------------------- getattr_*


@pytest.mark.parametrize("name", NAMES)
def test_getattr_policy_reads_the_policy_the_collector_runs(name):
    policy = TensorDictModule(Linear(), in_keys=["observation"], out_keys=["action"])
    with build(name, policy, total_frames=FPB) as collector:
        assert collector.getattr_policy("in_keys") == ["observation"]
        assert collector.getattr_policy("module") is collector.policy.module
        if name != "Collector":  # the worker collectors run their own copy
            assert collector.getattr_policy("module") is not policy.module
        with pytest.raises(AttributeError, match="no attribute 'nope'"):
            collector.getattr_policy("nope")


def test_getattr_policy_of_a_torchrl_random_policy_reads_the_object_given():
    pytest.importorskip("torchrl")
    from torchrl.data import Categorical
    from torchrl.envs.utils import RandomPolicy

    policy = RandomPolicy(Categorical(3))
    with Collector(CounterEnv, policy, frames_per_batch=FPB, total_frames=FPB) as collector:
        assert collector.getattr_policy("action_spec") is policy.action_spec


def test_getattr_rb_reads_the_replay_buffer():
    class Buffer:
        size = 7

        def extend(self, batch):
            pass

    with Collector(CounterEnv, None, frames_per_batch=FPB, replay_buffer=Buffer()) as collector:
        assert collector.getattr_rb("size") == 7
    with Collector(CounterEnv, None, frames_per_batch=FPB) as collector, \
            pytest.raises(AttributeError, match="has no replay_buffer"):
        collector.getattr_rb("size")


def test_collector_env_and_getattr_env_read_the_envs_of_this_process():
    with Collector(CounterEnv, None, frames_per_batch=FPB) as one:
        assert isinstance(one.env, CounterEnv)
        assert one.getattr_env("max_len") == 12
    with Collector([CounterEnv, lambda: CounterEnv(max_len=5)], None, frames_per_batch=FPB) as two:
        assert [env.max_len for env in two.env] == [12, 5]
        assert two.getattr_env("max_len") == 12  # the first env's, as TorchRL's multi collectors answer
        with pytest.raises(AttributeError):
            two.getattr_env("nope")


def test_getattr_env_of_a_torchrl_env_is_torchrl_s_answer():
    torchrl_collectors = pytest.importorskip("torchrl.collectors")
    from torchrl.envs import EnvBase, GymEnv

    answers = []
    for lib in (torchrl_collectors, aiocollect):
        collector = lib.Collector(lambda: GymEnv("CartPole-v1"), None, frames_per_batch=8, total_frames=8)
        assert isinstance(collector.env, EnvBase)
        answers.append((collector.getattr_env("batch_size"), collector.n_env, collector.requested_frames_per_batch))
        collector.shutdown()
    assert answers[0] == answers[1] == (torch.Size([]), 1, 8)


@pytest.mark.parametrize("name", WORKERS)
def test_worker_collectors_refuse_getattr_env_saying_why(name):
    with build(name, None) as collector:
        assert not hasattr(collector, "env")
        with pytest.raises(NotImplementedError, match=r"getattr_env\('max_len'\).*workers"):
            collector.getattr_env("max_len")


# ---------------------------------------------------------------------------- sizes


def test_n_env_and_requested_frames_per_batch_follow_torchrl():
    with pytest.warns(UserWarning, match="rounded up"):
        collector = Collector([CounterEnv] * 3, None, frames_per_batch=FPB)
    with collector:
        # TorchRL's Collector: n_env = 3, requested_frames_per_batch = ceil(20 / 3) * 3
        assert (collector.n_env, collector.requested_frames_per_batch) == (3, 21)


@pytest.mark.parametrize("name", WORKERS)
def test_frames_per_batch_worker(name):
    with build(name, None) as collector:
        assert collector.n_env == 2 and collector.requested_frames_per_batch == FPB
        # TorchRL: MultiSync ceil(frames_per_batch / num_workers); MultiAsync frames_per_batch
        expected = FPB // 2 if name == "MultiSync" else FPB
        assert collector.frames_per_batch_worker() == expected
        assert collector.frames_per_batch_worker(worker_idx=1) == expected
        with pytest.raises(ValueError, match="names no worker"):
            collector.frames_per_batch_worker(worker_idx=2)


def test_frames_per_batch_worker_with_workers_of_different_env_counts():
    with MultiSyncCollector([[CounterEnv] * 2, [CounterEnv]], None, frames_per_batch=30,
                            cat_results=0) as collector:
        assert [collector.frames_per_batch_worker(worker_idx=i) for i in (0, 1)] == [20, 10]
        with pytest.raises(ValueError, match="shares differ"):
            collector.frames_per_batch_worker()


# ---------------------------------------------------------------------------- the rest of TorchRL's methods


def test_updater_and_scheme_receiver():
    with Collector(CounterEnv, None, frames_per_batch=FPB) as collector:
        assert collector.init_updater() is None  # TorchRL's no-op without a weight_updater
        assert collector.register_scheme_receiver({}) is None
        with pytest.raises(NotImplementedError, match="update_policy_weights_"):
            collector.register_scheme_receiver({"policy": object()})

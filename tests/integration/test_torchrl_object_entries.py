"""TorchRL env entries with no fixed shape, in every collector, compared with TorchRL's own
collector on the same env and policy (issue 51): an entry whose shape changes every step
(``EnvWithDynamicSpec``: the batch is lazily stacked along time, as TorchRL's is) and a
non-tensor entry (a string per step, TorchRL's ``TestCollectorsNonTensor`` env: a
``NonTensorStack`` in the batch). Both travel as pickled objects beside shared memory
(``aiocollect._envs.objects``)."""

from __future__ import annotations

import warnings

import pytest
import torch

import aiocollect
from support.torchrl_marks import QUIET_TORCHRL

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    torchrl = pytest.importorskip("torchrl")
    from tensordict import LazyStackedTensorDict, NonTensorData
    from torchrl.collectors import Collector as TorchRLCollector
    from torchrl.data import NonTensor
    from torchrl.envs import GymEnv, StepCounter, Transform
    from torchrl.envs.utils import RandomPolicy as TorchRLRandomPolicy
    from torchrl.testing.mocking_classes import EnvWithDynamicSpec

pytestmark = QUIET_TORCHRL

ALL = ["Collector", "MultiSyncCollector", "MultiAsyncCollector", "AsyncCollector"]


def _collector(name, make_env, policy, **kwargs):
    cls = getattr(aiocollect, name)
    if name == "Collector":
        return cls(make_env(), policy, **kwargs)
    if name == "AsyncCollector":
        return cls(make_env, policy, **kwargs)
    if name == "MultiSyncCollector":
        kwargs.setdefault("cat_results", "stack")
    return cls([make_env], policy, **kwargs)


def _mean_policy(td):
    """A policy that reads the dynamic observation (its mean, whatever its shape) in every env."""
    if isinstance(td, LazyStackedTensorDict) and td.stack_dim == 0:
        means = torch.stack([t["observation"].mean() for t in td.tensordicts])
    elif td.batch_dims:
        means = torch.stack([t["observation"].mean() for t in td.unbind(0)])
    else:
        means = td["observation"].mean()
    td.set("action", means.unsqueeze(-1).expand(*td.batch_size, 2).clamp(-1, 1) / 10)
    return td


@pytest.mark.parametrize("name", ALL)
def test_a_dynamic_entry_gives_lazily_stacked_batches_as_torchrl(name):
    # TorchRL's TestDynamicEnvs, in every collector, with values: the observation grows by one
    # row each step ([3, count + 1, 2], count reset every 5 steps)
    spec = EnvWithDynamicSpec().action_spec
    with _collector(name, EnvWithDynamicSpec, TorchRLRandomPolicy(spec), frames_per_batch=20, total_frames=40) as c:
        batches = list(c)
    assert len(batches) == 2
    for data in batches:
        assert isinstance(data, LazyStackedTensorDict)
        assert data.names[-1] == "time"
        frames = data if data.batch_dims == 1 else data[0]
        for frame in frames.unbind(0):
            count = int(frame["observation"][0, 0, 0])
            assert frame["observation"].shape == (3, count + 1, 2)
            assert torch.all(frame["observation"] == count)
            nxt = frame["next", "observation"]
            assert nxt.shape == (3, count + 2, 2) and torch.all(nxt == count + 1)
            assert bool(frame["next", "done"]) == (count + 1 >= 5)
        assert frames["action"].shape == (20, 2)


def test_a_dynamic_entry_is_in_the_policys_input_and_the_batch_equals_torchrl():
    def run(cls):
        c = cls(EnvWithDynamicSpec(), _mean_policy, frames_per_batch=12, total_frames=24)
        try:
            return torch.cat(list(c), 0) if cls is TorchRLCollector else LazyStackedTensorDict.lazy_stack(
                [f for b in c for f in b.unbind(0)], 0)
        finally:
            c.shutdown()

    theirs = LazyStackedTensorDict.lazy_stack(list(run(TorchRLCollector).unbind(0)), 0)
    ours = run(aiocollect.Collector)
    assert len(theirs.tensordicts) == len(ours.tensordicts) == 24
    for a, b in zip(theirs.tensordicts, ours.tensordicts):
        for key in ("observation", ("next", "observation"), "action", ("next", "done"), ("next", "reward")):
            assert a[key].shape == b[key].shape, key
            assert torch.equal(a[key], b[key]), key
    assert torch.equal(theirs["collector", "traj_ids"], ours["collector", "traj_ids"])


class AddNonTensorData(Transform):
    """TorchRL's ``TestCollectorsNonTensor`` transform: a string entry at every step and reset."""

    def _call(self, next_tensordict):
        next_tensordict["nt"] = f"a string! - {next_tensordict.get('step_count').item()}"
        return next_tensordict

    def _reset(self, tensordict, tensordict_reset):
        return tensordict_reset.set("nt", NonTensorData("reset!"))

    def transform_observation_spec(self, observation_spec):
        observation_spec["nt"] = NonTensor(shape=())
        return observation_spec


def make_string_env():
    return GymEnv("CartPole-v1").append_transform(StepCounter()).append_transform(AddNonTensorData())


def check_strings(result):
    """TorchRL's own check of the strings of one env's frames; the episodes it saw begin."""
    begun = 0
    for i, val in enumerate(result["nt"][1:]):
        if val == "a string! - 1":
            assert result["nt"][i] == "reset!"
            begun += 1
        elif val.startswith("a string!"):
            assert result["next", "nt"][i] == val
            assert int(result["nt"][i].split(" - ")[-1]) + 1 == int(val.split(" - ")[-1])
        elif val == "reset!":
            assert result["next", "nt"][i + 1] == "a string! - 1", i
    return begun


def _left(td):
    action = torch.zeros(*td.batch_size, 2, dtype=torch.long)
    action[..., 0] = 1
    return td.set("action", action)


@pytest.mark.parametrize("name", ALL)
def test_a_non_tensor_entry_is_kept_in_every_collector(name):
    # TorchRL's TestCollectorsNonTensor (test_simple, test_sync, test_async), with random actions
    with _collector(name, make_string_env, None, frames_per_batch=10, total_frames=100) as c:
        batches = list(c)
    rows = []
    for b in batches:
        rows += list(b.unbind(0)) if b.batch_dims == 2 else [b]
    begun = sum(check_strings(r) for r in rows)
    assert begun >= 2  # (random CartPole episodes end within 100 frames)
    assert all(isinstance(s, str) for r in rows for s in r["nt"])


def test_non_tensor_entries_equal_torchrl_for_the_same_actions():
    # always pushing left: CartPole's episodes are the same in both (same seed), so are the strings
    def run(cls):
        env = make_string_env()
        env.set_seed(0)
        c = cls(env, _left, frames_per_batch=10, total_frames=40)
        try:
            return torch.cat(list(c), 0)
        finally:
            c.shutdown()

    theirs, ours = run(TorchRLCollector), run(aiocollect.Collector)
    assert list(ours["nt"]) == list(theirs["nt"])
    assert list(ours["next", "nt"]) == list(theirs["next", "nt"])
    assert "reset!" in list(ours["nt"])
    assert torch.equal(ours["observation"], theirs["observation"])


class LongString(Transform):
    def _call(self, next_tensordict):
        next_tensordict["nt"] = "x" * 10_000
        return next_tensordict

    def _reset(self, tensordict, tensordict_reset):
        return tensordict_reset.set("nt", NonTensorData("y" * 10_000))

    def transform_observation_spec(self, observation_spec):
        observation_spec["nt"] = NonTensor(shape=())
        return observation_spec


def make_long_string_env():
    return GymEnv("CartPole-v1").append_transform(LongString())


@pytest.mark.parametrize("name", ["Collector", "MultiSyncCollector"])
def test_an_entry_too_big_for_its_row_names_itself_and_the_variable_to_raise(name, monkeypatch):
    with _collector(name, make_long_string_env, None, frames_per_batch=10, total_frames=10) as c, \
            pytest.raises(aiocollect.CollectorError) as info:
        list(c)
    message = str(info.value)
    assert "'nt'" in message and "AIOCOLLECT_OBJECT_BYTES" in message
    monkeypatch.setenv("AIOCOLLECT_OBJECT_BYTES", "20000")
    with _collector(name, make_long_string_env, None, frames_per_batch=10, total_frames=10) as c:
        (batch,) = list(c)
    strings = list(batch["nt"]) if batch.batch_dims == 1 else list(batch[0]["nt"])
    assert strings[0] == "y" * 10_000 and set(strings[1:]) <= {"x" * 10_000, "y" * 10_000}


def test_a_bad_object_bytes_variable_is_refused_naming_it(monkeypatch):
    monkeypatch.setenv("AIOCOLLECT_OBJECT_BYTES", "lots")
    with pytest.raises(ValueError, match="AIOCOLLECT_OBJECT_BYTES='lots'"):
        aiocollect.Collector(make_string_env(), None, frames_per_batch=10, total_frames=10)


def test_a_policy_reading_an_entry_of_no_fixed_shape_acts_here_where_it_gets_it(monkeypatch):
    # the workers' copies would see the pickled row, not the entry: the policy stays central,
    # even where the switch asks for the workers, and refuses the workers when told to go there
    monkeypatch.setenv("AIOCOLLECT_POLICY_IN_WORKERS", "1")
    with aiocollect.MultiSyncCollector([EnvWithDynamicSpec], _mean_policy, frames_per_batch=10,
                                       total_frames=10, cat_results="stack") as c:
        assert c.policy_in_workers is False
        (batch,) = list(c)
    frames = batch[0]
    for frame in frames.unbind(0):
        expected = (frame["observation"].mean().clamp(-1, 1) / 10).expand(2)
        assert torch.equal(frame["action"], expected)
    with pytest.raises(ValueError, match="entries of no fixed shape"):
        aiocollect.MultiSyncCollector([EnvWithDynamicSpec], _mean_policy, frames_per_batch=10, total_frames=10,
                                      policy_placement="workers")


def test_whole_trajectories_of_a_dynamic_entry_are_lazily_stacked_as_torchrls():
    # trajs_per_batch: two whole episodes of 5 steps, [2, 5], each frame with its own shape
    spec = EnvWithDynamicSpec().action_spec
    got = {}
    for cls in (TorchRLCollector, aiocollect.Collector):
        c = cls(EnvWithDynamicSpec(), TorchRLRandomPolicy(spec), frames_per_batch=10, total_frames=20,
                trajs_per_batch=2)
        try:
            got[cls] = next(iter(c))
        finally:
            c.shutdown()
    theirs, ours = got[TorchRLCollector], got[aiocollect.Collector]
    assert isinstance(ours, LazyStackedTensorDict) and ours.batch_size == theirs.batch_size == (2, 5)
    for i in range(2):
        for t in range(5):
            for key in ("observation", ("next", "observation"), ("next", "done")):
                assert torch.equal(ours[i, t][key], theirs[i, t][key]), (i, t, key)


def test_return_same_td_gives_each_batch_its_own_entries_of_no_fixed_shape():
    # their shapes and values are each batch's own: a new batch each time (TorchRL writes the
    # strings of the first batch into every later one there)
    with aiocollect.Collector(make_string_env(), _left, frames_per_batch=5, total_frames=15,
                              return_same_td=True) as c:
        batches = [(list(b["nt"]), b["step_count"].flatten().tolist()) for b in c]
    for strings, counts in batches:  # (each batch's strings are its own frames')
        assert strings == ["reset!" if n == 0 else f"a string! - {n}" for n in counts]
    assert batches[1][0] != batches[0][0]
    with aiocollect.Collector(EnvWithDynamicSpec(), _mean_policy, frames_per_batch=7, total_frames=21,
                              return_same_td=True) as c:
        shapes = [[tuple(b[t]["observation"].shape) for t in range(2)] for b in c]
    assert shapes[1] != shapes[0]


@pytest.mark.parametrize("make", [EnvWithDynamicSpec, make_string_env])
def test_compact_obs_leaves_out_the_next_copy_of_an_entry_of_no_fixed_shape_as_torchrl(make):
    policy = _mean_policy if make is EnvWithDynamicSpec else _left
    keys = {}
    for cls in (TorchRLCollector, aiocollect.Collector):
        c = cls(make(), policy, frames_per_batch=5, total_frames=5, compact_obs=True)
        try:
            keys[cls] = sorted(next(iter(c))["next"].keys())
        finally:
            c.shutdown()
    assert keys[aiocollect.Collector] == keys[TorchRLCollector] == ["done", "reward", "terminated", "truncated"]


def test_fake_tensordict_of_an_env_with_entries_of_no_fixed_shape_says_to_zero_a_real_batch():
    with aiocollect.Collector(make_string_env(), None, frames_per_batch=5, total_frames=5) as c, \
            pytest.raises(NotImplementedError, match=r"no fixed shape.*zero_\(\)"):
        c.fake_tensordict()


def test_an_action_of_a_dynamic_shape_is_refused_naming_it():
    class DynamicAction(EnvWithDynamicSpec):
        def __init__(self):
            super().__init__()
            self.action_spec = torchrl.data.Unbounded(shape=(-1,))

    with pytest.raises(TypeError, match=r"action spec 'action' has shape \[-1\].*not as actions"):
        aiocollect.Collector(DynamicAction(), None, frames_per_batch=4, total_frames=4)

"""What TorchRL's own collector tests (``test/test_collectors.py``, run with aiocollect's
collectors in place of TorchRL's) found that aiocollect did otherwise, each checked here
against TorchRL's own collector on the same env where that runs in this process."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest
import torch
from tensordict.nn import TensorDictModule, TensorDictModuleBase

import aiocollect
from support.envs import CounterEnv

torchrl_collectors = pytest.importorskip("torchrl.collectors")


def capped_counter(max_len: int = 12):
    """A ``CounterEnv`` as a TorchRL env, its episodes at most ``max_len - 1`` steps long:
    a factory that takes a keyword, as ``create_env_kwargs`` calls it."""
    from torchrl.envs import GymWrapper

    return GymWrapper(CounterEnv(max_len=max_len), categorical_action_encoding=True)


def gym_counter(max_len: int = 12):
    """The same env for aiocollect, as gymnasium's. (The first ``GymWrapper`` built in a
    process pins the frames that built it, with their locals, for good: see
    ``segment_left_after_a_first_gym_wrapper``.)"""
    return CounterEnv(max_len=max_len)


def segment_left_after_a_first_gym_wrapper() -> tuple[int, int, bool]:
    """In a fresh interpreter: a MultiSyncCollector whose constructor builds the process's first
    TorchRL ``GymWrapper`` (to read its specs), collected from, shut down and dropped. Returns
    the descriptors and the mappings of aiocollect segments left, and whether the collector
    object itself is still alive. (With gym not installed, TorchRL keeps the ``ImportError`` of
    its ``import gym``, whose traceback holds every frame that was on the stack, the
    constructor's ``self`` among them.)"""
    import gc
    import weakref

    collector = aiocollect.MultiSyncCollector([capped_counter] * 2, None, frames_per_batch=40, total_frames=40)
    list(collector)
    collector.shutdown()
    alive = weakref.ref(collector)
    del collector
    gc.collect()
    fds = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds += "memfd:aiocollect" in os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
    with open("/proc/self/maps") as f:
        maps = sum("memfd:aiocollect" in line for line in f)
    return fds, maps, alive() is not None


def longest_episode_per_worker(module, cls_name: str, kwargs) -> list[int]:
    """The longest episode (in steps) each worker's envs gave over 120 steps per worker,
    ``create_env_kwargs=kwargs``."""
    cls = getattr(module, cls_name)
    make = gym_counter if module is aiocollect else capped_counter
    collector = cls([make] * 2, None, frames_per_batch=240, total_frames=240,
                    create_env_kwargs=kwargs, cat_results="stack")
    try:
        batch = next(iter(collector))
    finally:
        collector.shutdown()
    steps = batch["next", "observation"][..., 0]  # (the step within the episode)
    return [int(steps[w].max()) for w in range(2)]


@pytest.mark.parametrize("cls_name", ["MultiSyncCollector", "MultiAsyncCollector"])
def test_create_env_kwargs_may_give_each_worker_its_own(cls_name):
    if cls_name == "MultiAsyncCollector":  # (a batch is one worker's: both kinds of batch come)
        collector = aiocollect.MultiAsyncCollector([gym_counter] * 2, None, frames_per_batch=60, total_frames=-1,
                                                   create_env_kwargs=[{"max_len": 3}, {"max_len": 30}])
        longest: set[bool] = set()  # whether a batch's episodes went past step 2
        try:  # (until both kinds came: on a busy machine one worker may deliver many before the other's first)
            for batch, _ in zip(collector, range(500)):
                longest.add(int(batch["next", "observation"][..., 0].max()) > 2)
                if len(longest) == 2:
                    break
        finally:
            collector.shutdown()
        assert sorted(longest) == [False, True]
        return
    ours = longest_episode_per_worker(aiocollect, cls_name, [{"max_len": 3}, {"max_len": 30}])
    theirs = longest_episode_per_worker(torchrl_collectors, cls_name, [{"max_len": 3}, {"max_len": 30}])
    assert ours[0] <= 2 and ours[1] > 2, ours  # worker 0's episodes end by step 2, worker 1's go on
    assert theirs[0] <= 2 and theirs[1] > 2, theirs  # (as TorchRL's)


def test_create_env_kwargs_list_is_checked_before_any_process_starts():
    with pytest.raises(ValueError, match=r"create_env_kwargs: a list of 3 dicts for create_env_fn's 2 workers"):
        aiocollect.MultiSyncCollector([gym_counter] * 2, None, frames_per_batch=20,
                                      create_env_kwargs=[{}, {}, {}])
    with pytest.raises(TypeError, match=r"create_env_kwargs\[1\] must be a dict"):
        aiocollect.MultiSyncCollector([gym_counter] * 2, None, frames_per_batch=20,
                                      create_env_kwargs=[{}, 3])
    with pytest.raises(TypeError, match="a Collector builds its envs here: give one dict"):
        aiocollect.Collector(gym_counter, None, frames_per_batch=20, create_env_kwargs=[{}])


def serial_counting():
    from torchrl.envs import SerialEnv
    from torchrl.testing.mocking_classes import CountingEnv

    return SerialEnv(2, lambda: CountingEnv(max_steps=100))


def two_dim_buffer_after(module, cls_name: str):
    """A ``LazyTensorStorage(512, ndim=2)`` buffer fed by ``cls_name`` over batched envs
    (``SerialEnv(2)`` per worker), and what was extended into it."""
    from torchrl.data import LazyTensorStorage, ReplayBuffer
    from torchrl.envs.utils import RandomPolicy

    extended: list = []

    class Buffer(ReplayBuffer):  # (ours: TorchRL's workers extend a shared copy in their processes)
        def extend(self, data, *args, **kwargs):
            extended.append(tuple(data.batch_size))
            return super().extend(data, *args, **kwargs)

    kind = Buffer if module is aiocollect else ReplayBuffer
    buffer = kind(storage=LazyTensorStorage(512, ndim=2), batch_size=5)
    envs = [serial_counting] * 2 if cls_name == "MultiSyncCollector" else serial_counting
    collector = getattr(module, cls_name)(envs, RandomPolicy(serial_counting().action_spec), replay_buffer=buffer,
                                          total_frames=64, frames_per_batch=32)
    try:
        for _ in collector:
            pass
    finally:
        collector.shutdown()
    return buffer, extended


@pytest.mark.parametrize("cls_name", ["MultiSyncCollector", "Collector"])
def test_a_storage_with_two_batch_dims_gets_each_worker_s_envs_by_time(cls_name):
    """A MultiSyncCollector's stacked ``[workers, envs, T]`` batch went into such a buffer
    whole: the storage took the time dim for a feature dim (``[256, 2, 8]``, 8 items for 64
    frames); each worker's ``[envs, T]`` goes in on its own, as TorchRL's workers extend it."""
    ours, extended = two_dim_buffer_after(aiocollect, cls_name)
    theirs, _ = two_dim_buffer_after(torchrl_collectors, cls_name)
    assert tuple(ours.storage._storage.batch_size) == tuple(theirs.storage._storage.batch_size) == (256, 2)
    assert len(ours) == len(theirs) == 64
    assert extended == ([(2, 8)] * 4 if cls_name == "MultiSyncCollector" else [(2, 16)] * 2)  # (TorchRL's extends)
    sample = ours.sample()
    assert tuple(sample.batch_size) == (5,)
    assert sample["next", "observation"].shape == theirs.sample()["next", "observation"].shape == (5, 1)  # a frame each


class ArgmaxLinear(torch.nn.Module):
    """A policy with weights whose actions are the env's: ``CounterEnv``'s three."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)

    def forward(self, observation):
        return self.linear(observation).argmax(-1)


def policy():
    return TensorDictModule(ArgmaxLinear(), in_keys=["observation"], out_keys=["action"])


def restored_version(module, cls_name: str) -> tuple[int, int, set]:
    """A checkpoint saved after two updates, loaded by a new collector: the version saved,
    the one restored, and the versions of the restored collector's first batch."""

    cls = getattr(module, cls_name)
    make = capped_counter if module is not aiocollect else gym_counter
    envs = [make] * 2 if cls_name == "MultiSyncCollector" else make
    kwargs = dict(frames_per_batch=20, total_frames=40, track_policy_version=True)
    first = cls(envs, policy(), **kwargs)
    try:
        first.update_policy_weights_()
        first.update_policy_weights_()
        state, saved = first.state_dict(), first.policy_version
    finally:
        first.shutdown()
    second = cls(envs, policy(), **kwargs)
    try:
        second.load_state_dict(state)
        restored = second.policy_version
        batch = next(iter(second))
    finally:
        second.shutdown()
    return saved, restored, set(batch["policy_version"].unique().tolist())


@pytest.mark.parametrize("cls_name", ["Collector", "MultiSyncCollector"])
def test_a_checkpoint_s_weights_take_up_their_saved_version(cls_name):
    """``load_state_dict`` made the saved weights a new version (1 after a checkpoint of
    version 2): TorchRL saves ``policy_version`` and restores it."""
    saved, restored, in_batch = restored_version(aiocollect, cls_name)
    assert saved == restored == 2 and in_batch == {2}
    if cls_name == "Collector":  # (TorchRL's multi-process collectors restore no version: theirs is None)
        assert restored_version(torchrl_collectors, cls_name)[:2] == (2, 2)


def test_a_checkpoint_s_policy_version_is_checked_before_anything_loads():
    collector = aiocollect.Collector(gym_counter, policy(), frames_per_batch=20, total_frames=40)
    try:
        state = collector.state_dict()
        with pytest.raises((TypeError, ValueError), match="policy_version"):
            collector.load_state_dict({**state, "policy_version": -3})
        assert collector.policy_version == 0  # (nothing was loaded)
        collector.load_state_dict({**state, "policy_version": 5})
        assert collector.policy_version == 5
        collector.load_state_dict({**state, "policy_version": 1})  # older than what it has: the next one
        assert collector.policy_version == 6
    finally:
        collector.shutdown()


def trace_files(module, tmp_path) -> list[str]:
    collector = module.Collector(capped_counter if module is not aiocollect else gym_counter, None,
                                 frames_per_batch=10, total_frames=40)
    save = tmp_path / module.__name__.split(".")[0]
    save.mkdir()
    try:
        collector.enable_profile(num_rollouts=2, warmup_rollouts=1, save_path=str(save / "trace_{worker_idx}.json"))
        for _ in collector:
            pass
    finally:
        collector.shutdown()
    return sorted(p.name for p in save.iterdir())


def test_enable_profile_names_the_trace_as_torchrl_does(tmp_path):
    """``save_path="trace_{worker_idx}.json"`` was written under that very name."""
    assert trace_files(aiocollect, tmp_path) == trace_files(torchrl_collectors, tmp_path) == ["trace_0.json"]


def stats_after(module, cls_name: str, **kwargs) -> tuple[dict, dict]:
    make = capped_counter if module is not aiocollect else gym_counter
    envs = [make] * 2 if cls_name != "Collector" else make
    collector = getattr(module, cls_name)(envs, None, frames_per_batch=10, total_frames=20, **kwargs)
    try:
        before = collector.stats()
        for _ in collector:
            pass
        return before, collector.stats("both") if cls_name != "Collector" else collector.stats()
    finally:
        collector.shutdown()


@pytest.mark.parametrize("cls_name", ["Collector", "MultiSyncCollector"])
def test_stats_gives_torchrl_s_counters(cls_name):
    """TorchRL's public ``stats()`` (what its ``LoggerMonitor`` reads) was missing."""
    ours_before, ours = stats_after(aiocollect, cls_name, track_policy_version=True)
    theirs_before, theirs = stats_after(torchrl_collectors, cls_name, track_policy_version=True)
    shared = ["frames", "batches", "total_frames", "completed", "requested_frames_per_batch"]
    assert {k: ours[k] for k in shared} == {k: theirs[k] for k in shared} == {
        "frames": 20, "batches": 2, "total_frames": 20, "completed": True, "requested_frames_per_batch": 10}
    assert ours_before["frames"] == theirs_before.get("frames", 0) == 0 and not ours_before["completed"]
    if cls_name == "Collector":
        assert ours["policy_version"] == theirs["policy_version"] == 0
    else:
        assert ours["workers"] == ours["workers_alive"] == theirs["workers"] == 2
        assert ours["worker_0/frames"] + ours["worker_1/frames"] == 20  # (TorchRL's: its workers' own collectors)
    with pytest.raises(ValueError, match="workers='all'"):
        aiocollect.Collector(gym_counter, None, frames_per_batch=10).stats("all")


def test_get_distant_attr_reads_a_path_of_the_collector():
    collector = aiocollect.Collector(gym_counter, None, frames_per_batch=10, total_frames=20)
    try:
        assert collector.get_distant_attr("options.frames_per_batch") == 10
        assert collector.get_distant_attr("options.create_env_kwargs") == {}
    finally:
        collector.shutdown()
    workers = aiocollect.MultiSyncCollector([gym_counter] * 2, None, frames_per_batch=10, total_frames=20)
    try:
        with pytest.raises(NotImplementedError, match="hold no collector of their own"):
            workers.get_distant_attr("env.batch_size")
    finally:
        workers.shutdown()


class AlternatingPolicy(TensorDictModuleBase):
    """TorchRL's ``TestMultiKeyEnvsCollector`` policy: group ``nested_2`` counts every step,
    the root every other step."""

    in_keys: list = []
    out_keys = ["action", ("nested_1", "action"), ("nested_2", "azione")]

    def __init__(self, spec):
        super().__init__()
        self.spec = spec

    def forward(self, tensordict):
        action = self.spec.zero()
        action["nested_2", "azione"] += 1
        even = tensordict["nested_2", "observation"][..., 0, 0] % 2 == 0
        action["action"][..., 1] = even.to(action["action"].dtype)
        action["action"][..., 0] = (~even).to(action["action"].dtype)
        return tensordict.update(action)


def group_counts(module) -> tuple[list, list, list]:
    from torchrl.testing.mocking_classes import MultiKeyCountingEnv

    env = MultiKeyCountingEnv(batch_size=(2,), max_steps=3)
    collector = module.Collector(env, AlternatingPolicy(env.full_action_spec), frames_per_batch=12, total_frames=12)
    try:
        batch = next(iter(collector))
    finally:
        collector.shutdown()
    return (batch["observation"][0, :, 0, 0, 0].int().tolist(),
            batch["nested_2", "observation"][0, :, 0, 0].int().tolist(),
            batch["next", "nested_2", "done"][0, :, 0].squeeze(-1).int().tolist())


def test_a_group_done_alone_is_reset_alone():
    """A TorchRL env with done flags per group, one group done: every group was reset, the
    root's observation restarting with no done flag of its own; TorchRL resets that group."""
    ours, theirs = group_counts(aiocollect), group_counts(torchrl_collectors)
    assert ours == theirs
    root, nested_2, nested_2_done = ours
    assert root == [0, 1, 1, 2, 2, 3] and nested_2 == [0, 1, 2, 3, 4, 5]  # (the root counts on)
    assert nested_2_done[3:] == [1, 1, 1]


def in_a_process_of_its_own(expression: str):
    """The value of ``expression`` (a literal; ``t`` is this module) computed in a fresh
    interpreter: for TorchRL's collectors where they leave a socket open after shutdown, which
    the leak check of this folder would blame on the test."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = (f"import sys; sys.path[:0] = [{here!r}, {os.path.dirname(here)!r}]; import test_torchrl_sweep as t; "
            f"print({expression})")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return ast.literal_eval(run.stdout.strip().splitlines()[-1])


def bias_policy(bias: float = 0.0):
    """``observation + bias`` as a TensorDictModule: a policy whose weights show in its actions."""
    from torchrl.testing.modules import BiasModule

    return TensorDictModule(BiasModule(bias), in_keys=["observation"], out_keys=["action"])


def mock_env():
    from torchrl.testing.mocking_classes import ContinuousActionVecMockEnv

    return ContinuousActionVecMockEnv()


def biases_with_a_weights_source(module, cls_name: str) -> tuple[set, set]:
    """The biases (action - observation) of a worker collector's first batch and of a batch after
    an update, when ``policy`` (bias 5, then 6) is the weights' source of ``policy_factory``'s
    policies (bias 0), with TorchRL's ``weight_sync_schemes``."""
    from torchrl.weight_update import MultiProcessWeightSyncScheme

    source = bias_policy(5.0)
    collector = getattr(module, cls_name)([mock_env] * 2, policy=source, policy_factory=bias_policy,
                                          frames_per_batch=16, total_frames=-1,
                                          weight_sync_schemes={"policy": MultiProcessWeightSyncScheme()})
    try:
        batches = iter(collector)
        first = next(batches)
        with torch.no_grad():
            source.module.bias.add_(1.0)
        collector.update_policy_weights_()
        for _ in range(4):
            later = next(batches)
    finally:
        collector.shutdown()

    def biases(batch) -> set:
        return {round(float(b), 3) for b in (batch["action"] - batch["observation"]).flatten()}

    return biases(first), biases(later)


@pytest.mark.parametrize("cls_name", ["MultiSyncCollector", "MultiAsyncCollector"])
def test_policy_with_a_factory_and_weight_sync_schemes_is_the_source_of_the_weights(cls_name):
    ours = biases_with_a_weights_source(aiocollect, cls_name)
    assert ours == ({5.0}, {6.0})  # the source's weights from the first step, and its update
    # (TorchRL's in a process of its own: its scheme leaves a socket open after shutdown)
    theirs = in_a_process_of_its_own(f"[sorted(b) for b in t.biases_with_a_weights_source(t.torchrl_collectors, "
                                     f"{cls_name!r})]")
    assert [sorted(b) for b in ours] == theirs


def test_policy_with_a_factory_is_refused_where_torchrl_refuses_it():
    from torchrl.weight_update import MultiProcessWeightSyncScheme

    schemes = {"policy": MultiProcessWeightSyncScheme()}
    for module in (aiocollect, torchrl_collectors):  # Collector: never both; the others: only with schemes
        with pytest.raises(TypeError):
            module.Collector(mock_env, policy=bias_policy(), policy_factory=bias_policy, frames_per_batch=8,
                             total_frames=8, weight_sync_schemes=schemes)
    with pytest.raises(TypeError, match="weight_sync_schemes"):
        aiocollect.MultiSyncCollector([mock_env] * 2, policy=bias_policy(), policy_factory=bias_policy,
                                      frames_per_batch=16, total_frames=16)


def test_a_weights_source_that_does_not_fit_the_factory_s_policy_is_refused_before_any_process():
    from torchrl.weight_update import MultiProcessWeightSyncScheme

    def other():
        return TensorDictModule(torch.nn.Linear(7, 7), in_keys=["observation"], out_keys=["action"])

    with pytest.raises(ValueError, match="policy_factory") as error:
        aiocollect.MultiSyncCollector([mock_env] * 2, policy=bias_policy(), policy_factory=other,
                                      frames_per_batch=16, total_frames=16,
                                      weight_sync_schemes={"policy": MultiProcessWeightSyncScheme()})
    assert "missing ['module.weight']" in str(error.value)  # (the Linear's; both have a bias)


def multi_key_env():
    from torchrl.testing.mocking_classes import MultiKeyCountingEnv

    return MultiKeyCountingEnv(batch_size=(2,)).add_truncated_keys()


def nested_env():
    from torchrl.envs import InitTracker, TransformedEnv
    from torchrl.testing.mocking_classes import NestedCountingEnv

    return TransformedEnv(NestedCountingEnv(), InitTracker()).add_truncated_keys()


class OnesPolicy(TensorDictModuleBase):
    """Every action of a TorchRL env's action spec at one: these counting envs' steps the same
    in both libraries (their counts follow the actions)."""

    in_keys: list = []

    def __init__(self, spec):
        super().__init__()
        self.spec = spec
        self.out_keys = list(spec.keys(True, True))

    def forward(self, tensordict):
        return tensordict.update(self.spec.one())


def flags_of_two_batches(module, make) -> list[tuple[int, dict]]:
    """Every done flag (``"next"``'s and the root's) of two batches of a ``Collector`` with
    ``set_truncated=True``, each batch's with its time dim."""
    spec = make().full_action_spec
    policy = AlternatingPolicy(spec) if make is multi_key_env else OnesPolicy(spec)
    collector = module.Collector(make, policy, frames_per_batch=20, total_frames=40, set_truncated=True)
    try:
        batches = list(collector)
    finally:
        collector.shutdown()
    return [(batch.batch_dims - 1, {key: batch[key].int().tolist() for key in batch.keys(True, True)
                                    if (key if isinstance(key, str) else key[-1]) in FLAGS})
            for batch in batches]


FLAGS = ("done", "terminated", "truncated")


@pytest.mark.parametrize("make", [multi_key_env, nested_env], ids=["MultiKeyCountingEnv", "NestedCountingEnv"])
def test_set_truncated_marks_every_group_s_truncated_flag_as_torchrl_does(make):
    """An env with done flags per group: each group's truncated (and done) flag is set at the
    batch's last step, as TorchRL's collector sets them, and the next batch starts from the
    env's own flags (it was refused)."""
    ours = flags_of_two_batches(aiocollect, make)
    assert ours == flags_of_two_batches(torchrl_collectors, make)
    for time_dim, flags in ours:
        groups = [key for key in flags if key[0] == "next" and key[-1] == "truncated" and len(key) > 2]
        assert groups  # (the groups' own flags are compared, not just the root's)
        for key in groups:
            assert torch.tensor(flags[key]).select(time_dim, -1).all(), key
            assert torch.tensor(flags[(*key[:-1], "done")]).select(time_dim, -1).all(), key


def test_set_truncated_on_grouped_flags_needs_a_truncated_flag():
    from torchrl.testing.mocking_classes import NestedCountingEnv

    with pytest.raises(ValueError, match="add_truncated_keys"):
        aiocollect.Collector(NestedCountingEnv, None, frames_per_batch=20, total_frames=20, set_truncated=True)


DEVICE_KEYWORDS = [{}, {"env_device": "cpu"}, {"policy_device": "cpu"}, {"env_device": "cpu", "policy_device": "cpu"},
                   {"device": "cpu"}, {"storing_device": "cpu"}]


def batch_device(module, keywords: dict):
    from torchrl.envs import GymEnv

    collector = module.Collector(lambda: GymEnv("CartPole-v1"), None, frames_per_batch=8, total_frames=8, **keywords)
    try:
        return next(iter(collector)).device
    finally:
        collector.shutdown()


@pytest.mark.parametrize("keywords", DEVICE_KEYWORDS, ids=lambda k: ",".join(k) or "none")
def test_a_batch_says_the_device_torchrl_s_batch_says(keywords):
    """TorchRL's rule: the storing device (or ``device``), else the env's and the policy's when
    both are given and the same, else ``None`` (aiocollect said ``cpu`` for every one)."""
    assert batch_device(aiocollect, keywords) == batch_device(torchrl_collectors, keywords)


def test_a_replay_buffer_is_extended_with_its_storage_s_device():
    """A batch that says no device says its buffer storage's when it extends it, as TorchRL's
    collectors align it (its ``trajs_per_batch`` test reads the device ``extend`` gets)."""
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    for module in (aiocollect, torchrl_collectors):
        buffer = ReplayBuffer(storage=LazyTensorStorage(64, device="cpu"))
        devices: list = []
        extend = buffer.extend
        buffer.extend = lambda data, extend=extend, devices=devices: (devices.append(data.device), extend(data))[1]
        collector = module.Collector(gym_counter if module is aiocollect else capped_counter, None,
                                     frames_per_batch=8, total_frames=16, replay_buffer=buffer)
        try:
            list(collector)
        finally:
            collector.shutdown()
        assert devices == [torch.device("cpu")] * 2 and len(buffer) == 16, (module.__name__, devices)


def worker_entries_after_an_update(module, cls_name: str) -> list[list[str]]:
    """The keys of each worker's entry of a worker collector's ``state_dict()`` taken after an
    update; each entry's ``policy_state_dict`` is checked against the updated weights."""
    make = gym_counter if module is aiocollect else capped_counter
    source = policy()
    collector = getattr(module, cls_name)([make] * 2, source, frames_per_batch=20, total_frames=40)
    try:
        with torch.no_grad():
            for p in source.parameters():
                p.add_(1.0)
        collector.update_policy_weights_()
        state = collector.state_dict()
    finally:
        collector.shutdown()
    for w in range(2):
        for name, value in source.state_dict().items():
            torch.testing.assert_close(state[f"worker{w}"]["policy_state_dict"][name], value)
    return [sorted(state[f"worker{w}"]) for w in range(2)]


@pytest.mark.parametrize("cls_name", ["MultiSyncCollector", "MultiAsyncCollector"])
def test_each_worker_s_checkpoint_entry_has_the_policy_weights_as_torchrl_s(cls_name):
    """TorchRL's worker collectors save each worker's ``policy_state_dict`` (its
    ``test_update_weights`` reads them); here every worker acts with the one policy, so each
    entry holds the collector's weights, saved once."""
    ours = worker_entries_after_an_update(aiocollect, cls_name)
    # (TorchRL's in a process of its own: after an update its collector may leave a socket open)
    theirs = in_a_process_of_its_own(f"t.worker_entries_after_an_update(t.torchrl_collectors, {cls_name!r})")
    for keys in ours + theirs:
        assert {"policy_state_dict", "env_state_dict"} <= set(keys), (ours, theirs)


def collector_keys(module, cls_name: str, **kwargs) -> tuple[set, object]:
    """The ``"collector"`` keys of a first batch over ``capped_counter`` (TorchRL's side) or
    ``gym_counter`` (ours), and that batch."""
    make = capped_counter if module is torchrl_collectors else gym_counter
    envs = make() if cls_name == "Collector" else [make] * 2
    collector = getattr(module, cls_name)(envs, None, frames_per_batch=20, total_frames=20, **kwargs)
    try:
        batch = next(iter(collector))
    finally:
        collector.shutdown()
    return {k for k in batch.keys(True, True) if isinstance(k, tuple) and k[0] == "collector"}, batch


def test_track_traj_ids_false_leaves_the_ids_out_as_torchrl_does():
    """``track_traj_ids=False`` was taken and ignored: the batches still held the ids."""
    theirs_on, _ = collector_keys(torchrl_collectors, "Collector")
    theirs_off, _ = collector_keys(torchrl_collectors, "Collector", track_traj_ids=False)
    ours_on, _ = collector_keys(aiocollect, "Collector")
    ours_off, batch = collector_keys(aiocollect, "Collector", track_traj_ids=False)
    ids = ("collector", "traj_ids")
    assert ids in theirs_on and ids in ours_on
    assert ids not in theirs_off and ids not in ours_off
    # (aiocollect's batches also say each frame's policy version, with or without the ids)
    assert theirs_on - theirs_off == ours_on - ours_off == {ids}
    assert batch["next", "done"].any()  # (episodes ended, and the batch is whole without the ids)


@pytest.mark.parametrize("cls_name", ["MultiSyncCollector", "MultiAsyncCollector"])
def test_track_traj_ids_false_in_the_worker_collectors(cls_name):
    """TorchRL's worker collectors refuse the keyword; aiocollect's take it, as its ``Collector``."""
    keys, batch = collector_keys(aiocollect, cls_name, track_traj_ids=False)
    assert ("collector", "traj_ids") not in keys and ("next", "reward") in batch.keys(True, True)
    keys, _ = collector_keys(aiocollect, cls_name)
    assert ("collector", "traj_ids") in keys


def test_track_traj_ids_false_refuses_what_needs_the_ids_before_any_process_starts():
    with pytest.raises(ValueError, match=r"split_trajs=True requires track_traj_ids=True"):
        torchrl_collectors.Collector(capped_counter(), None, frames_per_batch=20, split_trajs=True,
                                     track_traj_ids=False)
    with pytest.raises(ValueError, match=r"split_trajs=True requires track_traj_ids=True.*remove track_traj_ids"):
        aiocollect.Collector(gym_counter, None, frames_per_batch=20, split_trajs=True, track_traj_ids=False)
    # (TorchRL's fails at the first batch, with a KeyError; aiocollect's before any process starts)
    with pytest.raises(ValueError, match=r"trajs_per_batch requires track_traj_ids=True"):
        aiocollect.MultiSyncCollector([gym_counter] * 2, None, frames_per_batch=20, trajs_per_batch=2,
                                      track_traj_ids=False)


def test_the_distributed_collectors_send_track_traj_ids_to_their_remote_collectors():
    from aiocollect._collectors.torchrl_compat import DISTRIBUTED_KEYWORDS, check_torchrl_keywords

    with pytest.raises(ValueError, match=r"collector_kwargs=\{'track_traj_ids': False\}"):
        check_torchrl_keywords("RayCollector", {"track_traj_ids": False}, DISTRIBUTED_KEYWORDS)
    check_torchrl_keywords("RayCollector", {"track_traj_ids": True}, DISTRIBUTED_KEYWORDS)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memfd segments are Linux's")
def test_a_collector_pinned_by_torchrl_s_stored_traceback_holds_no_shared_memory():
    """A MultiSyncCollector over TorchRL ``GymWrapper`` envs kept a descriptor and a mapping of
    its segment after shutdown: TorchRL's stored traceback pins the collector object (which
    aiocollect cannot prevent), and the object held them."""
    fds, maps, pinned = in_a_process_of_its_own("t.segment_left_after_a_first_gym_wrapper()")
    assert (fds, maps) == (0, 0)
    try:
        import gym  # noqa: F401
    except ImportError:  # (TorchRL stores the traceback only then)
        assert pinned


@pytest.mark.parametrize("cls_name", ["Collector", "MultiSyncCollector"])
async def test_track_traj_ids_false_on_the_async_face(cls_name):
    """The same batches through ``async for``: no ids, and the trajectories still counted."""
    envs = gym_counter if cls_name == "Collector" else [gym_counter] * 2
    async with getattr(aiocollect, cls_name)(envs, None, frames_per_batch=20, total_frames=40,
                                             track_traj_ids=False) as collector:
        batches = [batch async for batch in collector]
        assert len(batches) == 2
        assert all(("collector", "traj_ids") not in b.keys(True, True) for b in batches)
        assert all(("next", "done") in b.keys(True, True) for b in batches)
        assert collector.statistics().completed_trajectories > 0

"""TorchRL 0.14's collector keywords, round 2 (issue 51): ``pre_collect_hook`` and
``post_collect_hook``, ``backend``, ``compact_obs``, ``extend_buffer=False``, ``worker_idx``,
``weight_updater``, ``auto_register_policy_transforms``; each compared with TorchRL's own
collector on the same env where that runs in this process."""

from __future__ import annotations

import pytest
import torch
from tensordict.nn import TensorDictModule

import aiocollect
from support.checks import layout
from support.envs import CounterEnv
from support.plain_modules import ArgmaxMLP

torchrl_collectors = pytest.importorskip("torchrl.collectors")


def torchrl_counter():
    """``CounterEnv`` as a TorchRL env: the same env for both libraries."""
    from torchrl.envs import GymWrapper

    return GymWrapper(CounterEnv(), categorical_action_encoding=True)


def step_policy():
    return TensorDictModule(lambda obs: obs[..., 0].long() % 3, in_keys=["observation"], out_keys=["action"])


def hook_calls(module, **kwargs):
    """What the hooks of ``module``'s ``Collector`` saw, over a whole collection."""
    calls = []
    collector = module.Collector(torchrl_counter, step_policy(), frames_per_batch=10, total_frames=20,
                                 pre_collect_hook=lambda: calls.append("pre"),
                                 post_collect_hook=lambda td: calls.append(sorted(map(str, td.keys()))),
                                 **kwargs)
    try:
        for _ in collector:
            pass
    finally:
        collector.shutdown()
    return calls


@pytest.mark.parametrize("kwargs", [{}, {"postproc": lambda td: td.set("seen", td["action"].clone())},
                                    {"split_trajs": True}], ids=["plain", "postproc", "split_trajs"])
def test_collector_hooks_are_called_as_torchrl_calls_them(kwargs):
    ours = hook_calls(aiocollect, **kwargs)
    theirs = hook_calls(torchrl_collectors, **kwargs)
    assert [c for c in ours if c == "pre"] == [c for c in theirs if c == "pre"] == ["pre", "pre"]
    # the post hook sees the delivered batch: after split_trajs and postproc (its keys), in order
    assert [c == "pre" for c in ours] == [c == "pre" for c in theirs]
    if "postproc" in kwargs:
        assert all("seen" in c for c in ours if c != "pre")


def test_extend_buffer_false_writes_each_step_and_skips_the_post_hook_as_torchrl():
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    seen = {}
    for name, module in (("ours", aiocollect), ("theirs", torchrl_collectors)):
        buffer = ReplayBuffer(storage=LazyTensorStorage(100))
        calls = []
        collector = module.Collector(torchrl_counter, step_policy(), frames_per_batch=10, total_frames=20,
                                     replay_buffer=buffer, extend_buffer=False,
                                     pre_collect_hook=lambda: calls.append("pre"),  # noqa: B023
                                     post_collect_hook=lambda td: calls.append("post"))  # noqa: B023
        with collector if module is aiocollect else _closing(collector):
            assert list(collector) == [None, None]
        frames = buffer[:]
        seen[name] = (calls, len(buffer), frames.batch_size, {k for k in frames.keys(True, True)
                                                                 if k != ("collector", "policy_version")})
        # one item per step: each a transition (the observation follows its step)
        obs, nxt = frames["observation"], frames["next", "observation"]
        assert torch.equal(nxt[:, 0][~frames["next", "done"].squeeze(-1)],
                           obs[:, 0][~frames["next", "done"].squeeze(-1)] + 1)
    assert seen["ours"] == seen["theirs"]
    assert seen["ours"][0] == ["pre", "pre"] and seen["ours"][1] == 20


def test_extend_buffer_false_adds_each_step_of_every_env_and_refuses_what_torchrl_refuses():
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    buffer = ReplayBuffer(storage=LazyTensorStorage(100))
    with aiocollect.Collector([CounterEnv] * 2, None, frames_per_batch=20, total_frames=20, replay_buffer=buffer,
                              extend_buffer=False) as collector:
        list(collector)
    assert len(buffer) == 10 and buffer[:].batch_size == (10, 2)  # TorchRL: rb.add of each [envs] step
    buffer = ReplayBuffer(storage=LazyTensorStorage(100))
    with aiocollect.MultiSyncCollector([CounterEnv] * 2, None, frames_per_batch=20, total_frames=20,
                                       replay_buffer=buffer, extend_buffer=False) as collector:
        list(collector)
    assert len(buffer) == 20 and buffer[:].batch_size == (20,)  # each worker adds its [] steps
    for bad, message in (({"postproc": lambda td: td}, "postproc must be None when a replay buffer"),
                         ({"split_trajs": True}, "split_trajs must be None/False when a replay buffer")):
        with pytest.raises(TypeError, match=message):
            aiocollect.Collector(CounterEnv, None, frames_per_batch=10, replay_buffer=buffer, extend_buffer=False,
                                 **bad)
    # without a replay buffer it changes nothing, as in TorchRL
    with aiocollect.Collector(CounterEnv, None, frames_per_batch=10, total_frames=10, extend_buffer=False) as c:
        assert next(iter(c)).shape == (10,)


class _closing:
    def __init__(self, collector):
        self.collector = collector

    def __enter__(self):
        return self.collector

    def __exit__(self, *exc):
        self.collector.shutdown()


@pytest.mark.parametrize("name", ["MultiSyncCollector", "MultiAsyncCollector", "AsyncCollector"])
def test_worker_collectors_call_the_hooks_per_worker_batch_in_this_process(name):
    calls = []
    env = CounterEnv if name == "AsyncCollector" else [CounterEnv, CounterEnv]

    def post(td):
        calls.append(tuple(td.shape))
        td["action"].fill_(7)  # a view of the batch delivered, as TorchRL's shared buffers are

    with getattr(aiocollect, name)(env, None, frames_per_batch=10, total_frames=20,
                                   pre_collect_hook=lambda: calls.append("pre"), post_collect_hook=post) as c:
        batches = list(c)
    if name == "MultiSyncCollector":  # each worker before and after its share, [T] each
        assert calls == ["pre", "pre", (5,), (5,)] * 2
    else:
        assert calls == ["pre", (10,)] * 2
    assert all((b["action"] == 7).all() for b in batches)


def test_hooks_may_be_set_later_and_a_raising_hook_fails_the_iteration():
    with aiocollect.Collector(CounterEnv, None, frames_per_batch=10) as collector:
        collector.rollout()
        collector.pre_collect_hook = lambda: (_ for _ in ()).throw(RuntimeError("hook says no"))
        with pytest.raises(RuntimeError, match="hook says no"):
            collector.rollout()
    with pytest.raises(ValueError, match=r"^pre_collect_hook=3: give a callable"):
        aiocollect.Collector(CounterEnv, None, frames_per_batch=10, pre_collect_hook=3)


def test_compact_obs_leaves_out_the_next_observation_as_torchrl():
    keys = {}
    for name, module in (("ours", aiocollect), ("theirs", torchrl_collectors)):
        collector = module.Collector(torchrl_counter, step_policy(), frames_per_batch=10, total_frames=10,
                                     compact_obs=True)
        batch = next(iter(collector))
        collector.shutdown()
        keys[name] = set(batch.keys(True, True)) - {("collector", "policy_version")}
    assert keys["ours"] == keys["theirs"] and ("next", "observation") not in keys["ours"]
    assert ("next", "reward") in keys["ours"]
    with aiocollect.MultiSyncCollector([CounterEnv] * 2, None, frames_per_batch=10, total_frames=10,
                                       compact_obs=True) as collector:
        batch = next(iter(collector))
    assert ("next", "observation") not in batch.keys(True) and ("next", "done") in batch.keys(True)


@pytest.mark.parametrize(("backend", "sync", "cls"), [("process", None, "MultiAsyncCollector"),
                                                      ("multiprocessing", True, "MultiSyncCollector"),
                                                      ("direct", None, "Collector"),
                                                      (None, None, "Collector")])
def test_backend_builds_the_collector_torchrl_builds(backend, sync, cls):
    with aiocollect.Collector(CounterEnv, None, frames_per_batch=10, total_frames=10, backend=backend,
                              sync=sync) as collector:
        assert type(collector).__name__ == cls
        assert next(iter(collector)).numel() == 10
    if cls != "Collector":
        assert collector.num_workers == 1  # TorchRL's process backend: one worker for one factory


def test_backend_refuses_what_torchrl_refuses_and_names_the_supported_values():
    for backend in ("thread", "distributed", "submitit", "nonsense"):
        with pytest.raises(ValueError, match=rf"^backend='{backend}': aiocollect's Collector takes 'direct', "
                                             r"'process', 'multiprocessing', 'ray', 'rpc', None"):
            aiocollect.Collector(CounterEnv, None, frames_per_batch=10, backend=backend)
        if backend == "thread":  # TorchRL refuses it too
            with pytest.raises(ValueError, match="Collector does not support backend='thread'"):
                torchrl_collectors.Collector(torchrl_counter, None, frames_per_batch=10, backend=backend)
    with pytest.raises(ValueError, match="backend='direct' supports at most one collector"):
        aiocollect.Collector(CounterEnv, None, frames_per_batch=10, backend="direct", num_collectors=2)
    with pytest.raises(ValueError, match="backend_options are only valid for non-direct collectors"):
        aiocollect.Collector(CounterEnv, None, frames_per_batch=10, backend_options={"cat_results": "stack"})
    with pytest.raises(ValueError, match=r"duplicate top-level collector arguments: \['total_frames'\]"):
        aiocollect.Collector(CounterEnv, None, frames_per_batch=10, total_frames=10, backend="process",
                             backend_options={"total_frames": 20})
    with pytest.raises(ValueError, match=r"^backend='process': it is Collector's keyword"):
        aiocollect.MultiSyncCollector([CounterEnv], None, frames_per_batch=10, backend="process")


def test_backend_options_reach_the_collector_built():
    with aiocollect.Collector([CounterEnv] * 2, None, frames_per_batch=10, total_frames=10, backend="process",
                              sync=True, backend_options={"cat_results": 0}) as collector:
        assert type(collector).__name__ == "MultiSyncCollector"
        assert next(iter(collector)).shape == (10,)


def test_worker_idx_is_stored_and_weight_updaters_of_torchrl_are_taken():
    from torchrl.collectors import VanillaWeightUpdater, WeightUpdaterBase

    with aiocollect.Collector(CounterEnv, None, frames_per_batch=10, worker_idx=2) as collector:
        assert collector.worker_idx == 2
    with aiocollect.MultiSyncCollector([CounterEnv], None, frames_per_batch=10) as collector:
        assert collector.worker_idx is None
    from tensordict import TensorDict

    updater = VanillaWeightUpdater(policy_weights=TensorDict())
    with aiocollect.Collector(CounterEnv, step_policy(), frames_per_batch=10, weight_updater=updater) as collector:
        assert collector.weight_updater is updater
        collector.update_policy_weights_()

    class Mine(WeightUpdaterBase):
        def _push_weights(self, *args, **kwargs):
            pass

        def _sync_weights_with_worker(self, *args, **kwargs):
            pass

        def _get_server_weights(self):
            return None

        def _maybe_map_weights(self, weights):
            return weights

        def all_worker_ids(self):
            return None

    with pytest.raises(ValueError, match=r"^weight_updater=.*an updater of your own pushes weights"):
        aiocollect.Collector(CounterEnv, None, frames_per_batch=10, weight_updater=Mine())


def test_auto_register_policy_transforms_has_nothing_to_do_for_a_policy_without_recurrent_modules():
    with aiocollect.Collector(CounterEnv, step_policy(), frames_per_batch=10,
                              auto_register_policy_transforms=True) as collector:
        assert collector.rollout().shape == (10,)
    from support.recurrent import lstm_actor, recurrent_cartpole

    _, actor = lstm_actor()
    # a gymnasium env takes no TorchRL transform: what the recurrent policy lacks is named
    with pytest.raises(ValueError, match=r"auto_register_policy_transforms=True: the policy has recurrent modules "
                                         r"\(LSTMModule\), .* not TorchRL envs"):
        aiocollect.Collector(CounterEnv, actor, frames_per_batch=10, auto_register_policy_transforms=True)
    # an env that has them already: nothing to register (TorchRL's check is on the specs too)
    with aiocollect.Collector(recurrent_cartpole, actor, frames_per_batch=10,
                              auto_register_policy_transforms=True) as collector:
        assert collector.rollout().shape == (10,)
        env = collector.env
    assert [type(t).__name__ for t in env.transform] == ["InitTracker", "TensorDictPrimer"]


@pytest.mark.parametrize("policy_kind", ["lstm", "mlp"])
@pytest.mark.parametrize("as_instance", [False, True])
def test_auto_register_policy_transforms_adds_torchrl_s_transforms_to_a_torchrl_env(policy_kind, as_instance):
    """TorchRL's rule (``auto_register_policy_transforms=True``): an ``InitTracker`` for any
    module policy, and a recurrent module's ``TensorDictPrimer``, appended to the env when its
    specs lack them; the batches then have TorchRL's keys, shapes and dtypes, whether the env
    is given as an instance or a factory (TorchRL's recurrent-sequence tutorial gives one)."""
    from support.recurrent import HIDDEN, lstm_actor

    actor = lstm_actor()[1] if policy_kind == "lstm" else TensorDictModule(
        ArgmaxMLP(4, 2), in_keys=["observation"], out_keys=["action"])
    layouts = []
    for make in (torchrl_collectors.Collector, aiocollect.Collector):
        torch.manual_seed(0)
        env = torchrl_counter_cartpole() if as_instance else torchrl_counter_cartpole
        collector = make(env, actor, frames_per_batch=10, total_frames=10, auto_register_policy_transforms=True)
        try:
            batch = next(iter(collector))
        finally:
            collector.shutdown()
        layouts.append(layout(batch))
        # the InitTracker's flag: true at the first frame and after each end of an episode
        is_init, done = batch["is_init"].squeeze(-1), batch["next", "done"].squeeze(-1)
        assert is_init[0] and torch.equal(is_init[1:], done[:-1])
    assert layouts[1] == layouts[0]
    assert ("next", "is_init") in layouts[1]
    if policy_kind == "lstm":
        assert layouts[1]["recurrent_state_h"] == ((10, 1, HIDDEN), torch.float32)


def torchrl_counter_cartpole():
    from torchrl.envs import GymEnv

    return GymEnv("CartPole-v1", categorical_action_encoding=True)


@pytest.mark.parametrize("name", ["Collector", "MultiSyncCollector"])
def test_policy_with_policy_factory_is_torchrls_type_error(name):
    env = CounterEnv if name == "Collector" else [CounterEnv]
    with pytest.raises(TypeError, match="policy and policy_factory: give one of them"):
        getattr(aiocollect, name)(env, step_policy(), policy_factory=step_policy, frames_per_batch=10)
    with pytest.raises(TypeError, match="policy_factory cannot be used with policy argument"):
        torchrl_collectors.Collector(torchrl_counter, step_policy(), policy_factory=step_policy, frames_per_batch=10)


@pytest.mark.parametrize("kwargs", [{}, {"compact_obs": True}, {"track_policy_version": True}])
def test_fake_tensordict_is_a_batch_of_zeros_laid_out_as_the_batches_and_torchrl_s(kwargs):
    """TorchRL's ``fake_tensordict()`` (for a buffer's storage, a compiled loss): the layout of
    ``next(iter(collector))``, zeros, no env stepped; TorchRL's multi-process collectors do not
    implement it, nor do aiocollect's (issue 51)."""
    from torchrl.envs import GymEnv

    policy = TensorDictModule(torch.nn.Linear(4, 2), in_keys=["observation"], out_keys=["logits"])

    def layout(td):
        return {k: (tuple(v.shape), v.dtype) for k, v in td.items(True, True)}

    def act(td):
        return policy(td).set("action", td["logits"].argmax(-1))

    theirs = torchrl_collectors.Collector(GymEnv("CartPole-v1", categorical_action_encoding=True), act,
                                          frames_per_batch=10, total_frames=10, **kwargs)
    try:
        expected = theirs.fake_tensordict()
    finally:
        theirs.shutdown()
    with aiocollect.Collector(GymEnv("CartPole-v1", categorical_action_encoding=True), act, frames_per_batch=10,
                              total_frames=10, **kwargs) as collector:
        fake = collector.fake_tensordict()
        assert collector.statistics().env_steps == 0  # nothing stepped
        batch = next(iter(collector))
    assert layout(fake) == layout(batch)
    assert all((v == 0).all() for v in fake.values(True, True))
    assert set(layout(fake)) - set(layout(expected)) == {("collector", "policy_version")}
    assert {k: v for k, v in layout(fake).items() if k in layout(expected)} == layout(expected)
    collector = aiocollect.MultiSyncCollector([CounterEnv], None, frames_per_batch=10, total_frames=10)
    try:
        with pytest.raises(NotImplementedError, match="fake_tensordict"):
            collector.fake_tensordict()
    finally:
        collector.shutdown()
    del collector  # (the exception's traceback holds this frame: the storage's memory goes with the object)


def test_profile_config_says_what_enable_profile_was_given():
    with aiocollect.Collector(CounterEnv, None, frames_per_batch=10, total_frames=20) as collector:
        assert collector.profile_config is None
        collector.enable_profile(num_rollouts=5, warmup_rollouts=2)
        config = collector.profile_config
        assert (config.num_rollouts, config.warmup_rollouts, config.activities, config.save_path) == (5, 2, ["cpu"],
                                                                                                   None)


def test_torchrl_0_14_s_base_names_check_and_build_as_torchrl_s():
    """``BaseCollector`` and ``MultiCollector``, which TorchRL 0.14 exports (its redq script
    imports the first for its annotations): the same ``issubclass`` answers as TorchRL's, and
    ``MultiCollector(..., sync=...)`` builds the collector ``sync`` names."""
    assert aiocollect.BaseCollector is aiocollect.DataCollectorBase
    for name in ("Collector", "MultiSyncCollector", "MultiAsyncCollector", "AsyncCollector"):
        for base in ("BaseCollector", "MultiCollector"):
            theirs = issubclass(getattr(torchrl_collectors, name), getattr(torchrl_collectors, base))
            assert issubclass(getattr(aiocollect, name), getattr(aiocollect, base)) == theirs, (name, base)
    built = {}
    for sync in (True, False):
        collector = aiocollect.MultiCollector([CounterEnv] * 2, None, sync=sync, frames_per_batch=20, total_frames=40)
        with collector:
            built[sync] = (type(collector).__name__, [b.shape for b in collector])
        assert isinstance(collector, aiocollect.MultiCollector) and isinstance(collector, aiocollect.BaseCollector)
    assert built == {True: ("MultiSyncCollector", [(2, 10)] * 2), False: ("MultiAsyncCollector", [(20,)] * 2)}
    with pytest.raises(TypeError, match=r"sync must be True .* or False"):
        aiocollect.MultiCollector([CounterEnv] * 2, None, frames_per_batch=20)

"""TorchRL envs as env sources (``aiocollect._envs.torchrl_env``).

A TorchRL ``EnvBase`` (``GymEnv``, a ``TransformedEnv``, a ``SerialEnv``), given as an
instance or returned by a factory, is stepped by every collector, in this process and in
worker processes, and the batches have the layout TorchRL's own ``Collector`` gives on the
same env: same keys (the env's own observation keys, transforms' keys included), dtypes,
shapes, batch size and names, plus aiocollect's ``("collector", "policy_version")``.
"""

from __future__ import annotations

import gc
import warnings

import pytest
import torch

import aiocollect
from support.checks import check_batch
from support.envs import DictEnv
from support.torchrl_marks import QUIET_TORCHRL

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    torchrl = pytest.importorskip("torchrl")
    from torchrl.collectors import Collector as TorchRLCollector
    from torchrl.envs import (
        Compose,
        EnvCreator,
        GymEnv,
        GymWrapper,
        InitTracker,
        RewardSum,
        SerialEnv,
        StepCounter,
        TransformedEnv,
    )

pytestmark = QUIET_TORCHRL


def cartpole():
    return GymEnv("CartPole-v1", categorical_action_encoding=True)


def pendulum():
    return GymEnv("Pendulum-v1")


def counted_cartpole():
    return TransformedEnv(cartpole(), Compose(StepCounter(), RewardSum()))


def serial_cartpole():
    return SerialEnv(2, counted_cartpole)


def dict_env():
    """Nested observation keys, Discrete/MultiBinary/MultiDiscrete observations, MultiCategorical actions."""
    return GymWrapper(DictEnv(), categorical_action_encoding=True)


def serial_pendulum():
    return SerialEnv(2, lambda: TransformedEnv(pendulum(), StepCounter()))


def onehot_cartpole():
    return TransformedEnv(GymEnv("CartPole-v1"), StepCounter())  # GymEnv's default: OneHot actions


def tracked_pendulum():
    return TransformedEnv(pendulum(), InitTracker())  # a bool observation, "is_init" (SAC's sota env)


def layout(td):
    return {k: (td.get(k).dtype, tuple(td.get(k).shape)) for k in td.keys(include_nested=True, leaves_only=True)}


def first_batch(collector, seed=0):
    collector.set_seed(seed)
    try:
        return next(iter(collector))
    finally:
        collector.shutdown()


def assert_torchrl_layout(ours, theirs):
    """Key by key the layout of TorchRL's batch, plus aiocollect's policy version."""
    mine = layout(ours)
    assert mine.pop(("collector", "policy_version")) == (torch.int64, tuple(ours.batch_size))
    expected = layout(theirs)
    assert set(mine) == set(expected), (set(mine) - set(expected), set(expected) - set(mine))
    for key in expected:
        assert mine[key] == expected[key], (key, mine[key], expected[key])
    assert ours.batch_size == theirs.batch_size and ours.names == theirs.names


# name: (aiocollect create_env_fn, TorchRL env for its Collector, observation keys, batch size)
LAYOUTS = {
    "gymenv-cartpole": (cartpole, cartpole, {"observation"}, (20,)),
    "gymenv-pendulum": (pendulum, pendulum, {"observation"}, (20,)),
    "transformed-stepcounter-rewardsum": (counted_cartpole, counted_cartpole,
                                          {"observation", "step_count", "episode_reward"}, (20,)),
    "serialenv-one-entry": (serial_cartpole, serial_cartpole,
                            {"observation", "step_count", "episode_reward"}, (2, 10)),
    "gymwrapper-nested-dict-multicategorical": (dict_env, dict_env, {"pos", "cell", "flags", "md", "nest"}, (20,)),
    "list-of-gymenv-factories": ([cartpole] * 2, lambda: SerialEnv(2, cartpole), {"observation"}, (2, 10)),
    "inittracker-bool-observation": (tracked_pendulum, tracked_pendulum, {"observation", "is_init"}, (20,)),
    "onehot-action-spec": (onehot_cartpole, onehot_cartpole, {"observation", "step_count"}, (20,)),
}


@pytest.mark.parametrize("case", list(LAYOUTS))
def test_layout_matches_torchrl_collector_on_the_same_env(case):
    ours_env, theirs_env, obs_keys, batch_size = LAYOUTS[case]
    ours = first_batch(aiocollect.Collector(ours_env, None, frames_per_batch=20, total_frames=20))
    theirs = TorchRLCollector(theirs_env(), None, frames_per_batch=20, total_frames=20)
    try:
        theirs_batch = next(iter(theirs))
    finally:
        theirs.shutdown()
    assert_torchrl_layout(ours, theirs_batch)
    assert tuple(ours.batch_size) == batch_size
    assert set(ours.keys()) - {"action", "done", "terminated", "truncated", "next", "collector"} == obs_keys
    check_batch(ours)


def test_env_instance_and_its_transforms_state_are_stepped():
    """An instance works like a factory; StepCounter and RewardSum count per episode across
    the collector's resets (their state travels in the TensorDict the adapter keeps)."""
    env = counted_cartpole()
    collector = aiocollect.Collector(env, None, frames_per_batch=60, total_frames=120)
    collector.set_seed(1)
    try:
        batches = list(collector)
    finally:
        collector.shutdown()
    assert env.is_closed  # the collector owns the env it was given, as with gymnasium envs
    for td in batches:
        check_batch(td)
        done = td["next", "done"][:, 0]
        assert done.any(), "no episode ended; the reset path went untested"
        sc, nsc = td["step_count"][:, 0], td["next", "step_count"][:, 0]
        assert torch.equal(nsc, sc + 1)
        assert (sc[1:][done[:-1]] == 0).all()  # a new episode after every end
        ret, nret = td["episode_reward"][:, 0], td["next", "episode_reward"][:, 0]
        torch.testing.assert_close(nret, ret + td["next", "reward"][:, 0])
        assert (ret[1:][done[:-1]] == 0).all()


def test_serial_env_partial_resets_keep_the_other_envs_going():
    """SerialEnv(2): envs end at different times; each is reset alone (TorchRL's partial
    reset) while the other's episode, step count and observations continue."""
    collector = aiocollect.Collector(serial_cartpole, None, frames_per_batch=120, total_frames=120)
    td = first_batch(collector, seed=3)
    check_batch(td)  # next obs == following obs and the same trajectory where not done
    done = td["next", "done"][..., 0]
    assert done[0].nonzero().flatten().tolist() != done[1].nonzero().flatten().tolist()
    sc, nsc = td["step_count"][..., 0], td["next", "step_count"][..., 0]
    assert torch.equal(nsc, sc + 1)
    assert (sc[:, 1:][done[:, :-1]] == 0).all() and (sc[:, 1:][~done[:, :-1]] > 0).all()


def test_onehot_action_env_gets_one_hot_actions_and_the_batch_indices():
    """GymEnv's default OneHot action spec: the policy gives int64 indices (stored so), and
    the env gets the one-hot vector. Always pushing right (1) accelerates the cart to the
    right: an env given anything else (an index where a one-hot vector belongs reads as
    action 0) would push it left."""
    def push_right(observation, step_count):  # plain policies get every observation key, in order
        return torch.ones(observation.shape[:-1], dtype=torch.int64)

    collector = aiocollect.Collector(onehot_cartpole, push_right, frames_per_batch=8, total_frames=8)
    td = first_batch(collector)
    assert td["action"].dtype == torch.int64 and td["action"].shape == (8,)
    assert (td["action"] == 1).all()
    velocity, next_velocity = td["observation"][:, 1], td["next", "observation"][:, 1]
    assert (next_velocity > velocity).all(), (velocity, next_velocity)


RANDOM_ONEHOT = {  # name: (build the collector from env factories and keywords, batch shape)
    "Collector": (lambda mk, **kw: aiocollect.Collector(mk, None, **kw), (40,)),
    "Collector-list": (lambda mk, **kw: aiocollect.Collector([mk, mk], None, **kw), (2, 20)),
    "MultiSyncCollector": (lambda mk, **kw: aiocollect.MultiSyncCollector([mk, mk], None, **kw), (2, 20)),
    "MultiAsyncCollector": (lambda mk, **kw: aiocollect.MultiAsyncCollector([mk, mk], None, **kw), (40,)),
    "AsyncCollector": (lambda mk, **kw: aiocollect.AsyncCollector(mk, None, **kw), (40,)),
}


@pytest.mark.usefixtures("leak_check")
@pytest.mark.parametrize("variant", list(RANDOM_ONEHOT))
def test_random_actions_of_a_onehot_env_are_one_hot_rows_as_torchrl_draws_them(variant):
    """policy=None on a TorchRL env whose action spec is OneHot (GymEnv's default, the DQN
    sota's env): TorchRL's collector draws RandomPolicy(env.full_action_spec), one-hot rows
    [.., 2], and so must every collector here, whether the envs step inline, in a worker
    process that takes runs of steps, or one step per round. The env is stepped with the
    drawn rows' index: on CartPole, pushing right (column 1) speeds the cart up."""
    build, shape = RANDOM_ONEHOT[variant]
    theirs = TorchRLCollector(onehot_cartpole(), None, frames_per_batch=40, total_frames=40)
    try:
        expected = next(iter(theirs))["action"]
    finally:
        theirs.shutdown()
    assert expected.shape == (40, 2) and expected.dtype == torch.int64
    td = first_batch(build(onehot_cartpole, frames_per_batch=40, total_frames=40))
    action = td["action"]
    assert action.shape == (*shape, 2) and action.dtype == expected.dtype
    assert (action.sum(-1) == 1).all() and ((action == 0) | (action == 1)).all()
    assert 0 < action[..., 1].sum() < action[..., 1].numel()  # both actions drawn
    faster = td["next", "observation"][..., 1] > td["observation"][..., 1]
    assert torch.equal(faster, action[..., 1] == 1)
    check_batch(td)


def test_init_random_frames_of_a_onehot_env_are_one_hot_rows_in_every_phase():
    """A one-hot policy (the DQN sota's QValueActor and EGreedyModule) with
    init_random_frames: the random batches and the policy's hold one-hot rows, as TorchRL's,
    so the sota's metrics line, (action_value * action).sum(), holds for every batch."""
    from tensordict.nn import TensorDictSequential
    from torchrl.modules import MLP, EGreedyModule, QValueActor

    env = onehot_cartpole()
    actor = QValueActor(MLP(in_features=4, out_features=2, num_cells=[16]), spec=env.action_spec,
                        in_keys=["observation"])
    policy = TensorDictSequential(actor, EGreedyModule(env.action_spec, eps_init=0.5))
    batches = {}
    for name, lib in (("ours", aiocollect), ("theirs", torchrl.collectors)):
        collector = lib.Collector(onehot_cartpole(), policy, frames_per_batch=20, total_frames=60,
                                  init_random_frames=40)
        try:
            batches[name] = list(collector)
        finally:
            collector.shutdown()
    assert len(batches["ours"]) == len(batches["theirs"]) == 3
    for ours, theirs in zip(batches["ours"], batches["theirs"]):
        assert ours["action"].shape == theirs["action"].shape == (20, 2)
        assert ours["action_value"].shape == theirs["action_value"].shape
        assert (ours["action"].sum(-1) == 1).all()
        (ours["action_value"] * ours["action"]).sum()


@pytest.mark.usefixtures("leak_check")
def test_worker_collectors_build_and_step_torchrl_envs_in_their_workers():
    """MultiSync: a lambda and an EnvCreator, each built in its worker (OneHot actions,
    a StepCounter); MultiAsync: a SerialEnv of Pendulums (continuous actions) as the entry."""
    sync = aiocollect.MultiSyncCollector([onehot_cartpole, EnvCreator(onehot_cartpole)], None,
                                         frames_per_batch=40, total_frames=80)
    sync.set_seed(0)
    try:
        batches = list(sync)
    finally:
        sync.shutdown()
    assert len(batches) == 2
    for td in batches:
        assert td.batch_size == (2, 20)
        check_batch(td)
        assert td["action"].dtype == torch.int64 and td["step_count"].dtype == torch.int64
        assert torch.equal(td["next", "step_count"], td["step_count"] + 1)
    asy = aiocollect.MultiAsyncCollector([serial_pendulum], None, frames_per_batch=20, total_frames=20)
    td = first_batch(asy)
    assert td.batch_size == (2, 10)
    assert td["action"].dtype == torch.float32 and td["action"].shape == (2, 10, 1)
    assert (td["action"].abs() <= 2).all()  # drawn from the Bounded action spec
    assert {"observation", "step_count"} <= set(td.keys())
    check_batch(td)


def test_what_cannot_be_a_torchrl_env_source_says_what_to_pass():
    env = cartpole()
    try:
        with pytest.raises(ValueError, match=r"create_env_kwargs: given with an env instance \(create_env_fn\[0\]\)"):
            aiocollect.MultiSyncCollector([env], None, frames_per_batch=10, create_env_kwargs={"a": 1})
        with pytest.raises(ValueError, match="create_env_kwargs: given with an env instance"):
            aiocollect.Collector(env, None, frames_per_batch=10, create_env_kwargs={"a": 1})
    finally:
        env.close()
    with pytest.raises(TypeError, match=r"is a TorchRL object .* but not an env"):
        aiocollect.Collector(StepCounter(), None, frames_per_batch=10)
    with pytest.raises(TypeError, match=r"gave a VectorEnv \(or a batched TorchRL env\)"):
        aiocollect.Collector([serial_cartpole], None, frames_per_batch=10)


@pytest.mark.usefixtures("leak_check")
def test_an_env_class_is_a_factory_in_every_collector_as_in_torchrl():
    """TorchRL calls an env class given as ``create_env_fn`` (its test envs are used that way);
    an aiocollect collector did the same only for functions and refused the class as "a
    TorchRL object but not an env" (issue 51)."""
    from torchrl.collectors import MultiSyncCollector as TorchRLMultiSync
    from torchrl.testing.mocking_classes import ContinuousActionVecMockEnv

    theirs = TorchRLCollector(ContinuousActionVecMockEnv, None, frames_per_batch=10, total_frames=10)
    try:
        expected = next(iter(theirs))
    finally:
        theirs.shutdown()
    ours = first_batch(aiocollect.Collector(ContinuousActionVecMockEnv, None, frames_per_batch=10, total_frames=10))
    assert_torchrl_layout(ours, expected)
    theirs = TorchRLMultiSync([ContinuousActionVecMockEnv] * 2, None, frames_per_batch=20, total_frames=20)
    try:
        expected = next(iter(theirs))
    finally:
        theirs.shutdown()
    ours = first_batch(aiocollect.MultiSyncCollector([ContinuousActionVecMockEnv] * 2, None, frames_per_batch=20,
                                                     total_frames=20))
    assert ours.batch_size == expected.batch_size == (2, 10)
    assert set(layout(ours)) - {("collector", "policy_version")} >= set(layout(expected)) - {
        ("collector", "traj_ids"), ("collector", "mask")}
    check_batch(ours)
    ours = first_batch(aiocollect.MultiAsyncCollector([ContinuousActionVecMockEnv], None, frames_per_batch=10,
                                                      total_frames=10))
    assert ours.batch_size == (10,)
    check_batch(ours)


@pytest.fixture
def torchrl_batch_of_an_env_instance():
    """A ``SerialEnv`` instance and the first batch of TorchRL's ``MultiSyncCollector`` with it
    as both workers' entry. Taken before the test's leak check begins: TorchRL's collector may
    close its pipes after its ``shutdown()`` returns, and they are not aiocollect's to answer for."""
    from torchrl.collectors import MultiSyncCollector as TorchRLMultiSync
    from torchrl.testing.mocking_classes import ContinuousActionVecMockEnv

    env = SerialEnv(2, ContinuousActionVecMockEnv)
    theirs = TorchRLMultiSync([env, env], None, frames_per_batch=40, total_frames=40)
    try:
        expected = next(iter(theirs))
    finally:
        theirs.shutdown()
    del theirs
    gc.collect()
    yield env, expected
    env.close()


def test_a_torchrl_env_instance_as_a_worker_entry_is_copied_to_its_worker_as_in_torchrl(
        torchrl_batch_of_an_env_instance, leak_check):
    """TorchRL's multi-process collectors take a (batched) env instance as a worker's entry and
    step a copy of it in the worker; aiocollect refused it ("a worker builds its own envs";
    issue 51). The instance stays the caller's, untouched and open."""
    env, expected = torchrl_batch_of_an_env_instance
    ours = first_batch(aiocollect.MultiSyncCollector([env, env], None, frames_per_batch=40, total_frames=40))
    assert ours.batch_size == expected.batch_size == (2, 2, 10)
    check_batch(ours)
    for collector in (aiocollect.MultiAsyncCollector([env], None, frames_per_batch=20, total_frames=20),
                      aiocollect.AsyncCollector(env, None, frames_per_batch=20, total_frames=20)):
        assert first_batch(collector).batch_size == (2, 10)
    assert env.rollout(3).batch_size == (2, 3)  # (the caller's instance: still usable)


@pytest.mark.parametrize("max_frames_per_traj", [None, 3])
def test_an_env_without_truncated_has_none_in_batches_unless_the_collector_truncates(max_frames_per_traj):
    """A TorchRL env whose done spec has no ``"truncated"`` (TorchRL's mock envs): no
    ``"truncated"`` in the batch, as in TorchRL's; with ``max_frames_per_traj``, TorchRL's
    ``StepCounter`` adds one, and so does aiocollect (issue 51)."""
    from torchrl.testing.mocking_classes import ContinuousActionVecMockEnv

    theirs = TorchRLCollector(ContinuousActionVecMockEnv(), None, frames_per_batch=10, total_frames=10,
                              max_frames_per_traj=max_frames_per_traj)
    try:
        expected = next(iter(theirs))
    finally:
        theirs.shutdown()
    ours = first_batch(aiocollect.Collector(ContinuousActionVecMockEnv, None, frames_per_batch=10, total_frames=10,
                                            max_frames_per_traj=max_frames_per_traj))
    assert_torchrl_layout(ours, expected)
    assert ("next", "truncated") in ours.keys(True) if max_frames_per_traj else "truncated" not in ours
    if max_frames_per_traj:
        assert ours["next", "truncated"][2::3].all() and ours["next", "done"][2::3].all()


def delta_cartpole():
    from torchrl.envs import GymEnv, TransformedEnv
    from torchrl.envs.transforms import NextObservationDelta

    return TransformedEnv(GymEnv("CartPole-v1"), NextObservationDelta())


def test_a_transform_that_rewrites_the_step_after_step_mdp_is_refused_with_what_to_do():
    """TorchRL's ``NextObservationDelta`` (the memory-efficient tutorial) stores the next
    observation as a float16 delta outside the env's specs, in a hook that TorchRL's
    ``step_and_maybe_reset`` runs: aiocollect collects what the specs say, so its batches would
    hold the full next observation instead. Refused, naming the transform and the fix, before
    any worker starts (the worker collectors read their envs' specs here first)."""
    with pytest.raises(TypeError, match=r"create_env_fn: the env's NextObservationDelta rewrites .* compact_obs=True"):
        aiocollect.Collector(delta_cartpole, None, frames_per_batch=10)
    with pytest.raises(TypeError, match=r"create_env_fn\[0\]: the env's NextObservationDelta rewrites"):
        aiocollect.MultiSyncCollector([delta_cartpole], None, frames_per_batch=10)

"""A ``JaxPolicy`` in the worker processes (``_policies.jax_worker``): real JAX in real workers.

Each worker rebuilds the policy from its pickle, jits it there and acts on its own envs; the
batches are what the central path gives, new params reach every worker whole (the poison
test), ``policy_placement`` chooses, a JAX policy on an accelerator stays here, and JAX is
imported by the workers only, never by the warm launcher that forks them.
"""

from __future__ import annotations

import functools
import threading
import time

import gymnasium as gym
import jax
import numpy as np
import pytest
import torch

from aiocollect import AsyncCollector, MultiAsyncCollector, MultiSyncCollector
from aiocollect._collectors import placement as placement_module
from aiocollect._collectors.placement import cannot_act_in_workers, placement
from aiocollect._workers import launcher
from aiocollect.jax import JaxPolicy
from support.envs import IntObsEnv
from support.jax_policies import int_leaf_apply, mlp_apply, mlp_logits, mlp_params, noisy_apply
from support.procs import children
from support.weights import jax_linear_apply, versions_while_training

cartpole = functools.partial(gym.make, "CartPole-v1")
COLLECTORS = [MultiSyncCollector, MultiAsyncCollector]


def mlp_policy(seed: int = 0) -> JaxPolicy:
    return JaxPolicy(mlp_apply, mlp_params(seed), out_keys=["logits", "action"])


def build(cls, policy, where: str, make=cartpole, steps: int = 10, **kwargs):
    """``cls`` over 2 workers x 2 envs (``AsyncCollector``: one worker of 2), ``policy_placement=where``."""
    frames = 2 * steps * (2 if cls is MultiSyncCollector else 1)
    envs = [make] * 2 if cls is AsyncCollector else [[make] * 2] * 2
    return cls(envs, policy, frames_per_batch=frames, policy_placement=where, **kwargs)


def frames(batch):
    return batch.reshape(-1)


def collect(cls, policy, where: str, batches: int = 3, seed: int = 3):
    with build(cls, policy, where) as c:
        assert c.policy_in_workers is (where == "workers")
        c.set_seed(seed)
        out = []
        for batch in c:
            out.append(batch.clone())
            if len(out) == batches:
                break
    return out


@pytest.mark.parametrize("cls", COLLECTORS)
def test_the_workers_act_as_the_central_policy_does(cls):
    """Every frame's outputs are the policy's on its observation, whether the workers or the
    main process computed them (a pytree of params, two outputs); ``MultiSyncCollector``'s
    batches, seeded, are the same field for field in both places."""
    params = mlp_params(0)
    got = {where: collect(cls, mlp_policy(0), where) for where in ("workers", "central")}
    for where, batches in got.items():
        for batch in batches:
            f = frames(batch)
            want = np.asarray(mlp_logits(params, f["observation"].numpy()))
            np.testing.assert_allclose(f["logits"].numpy(), want, rtol=1e-5, atol=1e-5, err_msg=where)
            assert torch.equal(f["action"], f["logits"].argmax(-1).to(f["action"].dtype)), where
            assert f["action"].dtype == torch.int32  # (JAX's default integer, as central)
            assert (batch["collector", "policy_version"] == 0).all()
    if cls is MultiSyncCollector:
        for a, b in zip(got["workers"], got["central"]):
            for key in ("observation", "action", ("next", "observation"), ("next", "reward"), ("next", "done")):
                assert torch.equal(a[key], b[key]), key
            torch.testing.assert_close(a["logits"], b["logits"], rtol=1e-5, atol=1e-5)


class JaxTrainer(threading.Thread):
    """``support.weights.Trainer`` for ``jax_linear_apply``: sends ``{"v": k}`` as version ``k``,
    then poisons its own array."""

    def __init__(self, collector):
        super().__init__(daemon=True)
        self.collector = collector
        self.stop, self.sent, self.error = threading.Event(), 0, None

    def run(self):
        try:
            while not self.stop.is_set():
                params = {"v": np.full((), self.sent + 1, np.float32)}
                version = self.collector.update_policy_weights_(params)
                assert version == self.sent + 1, (version, self.sent)
                self.sent = version
                params["v"][...] = -1e9  # poison: any frame computed from it would show
                time.sleep(0.0005)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


@pytest.mark.filterwarnings("ignore:`for batch in collector` in the async function")
@pytest.mark.parametrize(("cls", "face"), [(MultiSyncCollector, "sync"), (MultiSyncCollector, "async"),
                                         (MultiAsyncCollector, "sync"), (MultiAsyncCollector, "async")])
async def test_new_params_reach_the_workers_whole(cls, face):
    """The poison test: a trainer publishes version after version and poisons its own params at
    once; every frame's action, computed in a worker, is exactly its version's."""
    policy = JaxPolicy(jax_linear_apply, {"v": np.float32(0.0)})
    collector = cls([[IntObsEnv] * 2] * 2, policy, frames_per_batch=40, total_frames=40 * 30,
                    policy_placement="workers")
    assert collector.policy_in_workers
    trainer = JaxTrainer(collector)
    await versions_while_training(collector, trainer, face)
    assert float(collector.policy.params["v"]) == trainer.sent  # (the collector's copy: the board's views)


def test_update_without_an_argument_sends_the_policy_s_params_and_checks_new_ones():
    """``update_policy_weights_()`` sends the params of the policy given; a pytree that is not
    the policy's is refused, before anything is published."""
    policy = JaxPolicy(jax_linear_apply, {"v": np.float32(2.0)})
    with MultiSyncCollector([[IntObsEnv] * 2] * 2, policy, frames_per_batch=40, total_frames=-1,
                            policy_placement="workers") as c:
        assert c.policy_in_workers
        batches = iter(c)
        next(batches)
        policy.params = {"v": np.float32(5.0)}
        assert c.update_policy_weights_() == 1
        with pytest.raises(ValueError, match="structure"):
            c.update_policy_weights_({"w": np.float32(1.0)})
        with pytest.raises(ValueError, match="shape"):
            c.update_policy_weights_({"v": np.zeros(3, np.float32)})
        for batch in batches:
            version = batch["collector", "policy_version"]
            if (version == 1).all():
                obs = batch["observation"].sum(-1) + 1
                assert torch.equal(batch["action"][..., 0], 5.0 * obs)
                break
        assert c.statistics().latest_policy_version == 1


@pytest.mark.parametrize("where", ["workers", "central"])
def test_an_update_of_another_dtype_kind_is_refused_whole_and_takes_no_version(where):
    """A float for an int leaf is refused, naming the leaf, before anything is copied, wherever
    the policy acts: the workers kept acting with the old params under their version (the board
    was once left half-copied, the new float leaf in use under the old version), and the refused
    update took no version number (``latest`` once counted it, so ``max_policy_lag=0`` dropped
    every frame as stale: no batch came again)."""
    policy = JaxPolicy(int_leaf_apply, {"b": np.float32(-1.0), "k": np.int32(0)})  # action 0
    with MultiAsyncCollector([[cartpole] * 2] * 2, policy, frames_per_batch=20, total_frames=-1,
                             policy_placement=where, max_policy_lag=0) as c:
        batches = iter(c)
        next(batches)
        with pytest.raises(ValueError, match=r"params leaf \['k'\] is float32, the policy's is int32"):
            c.update_policy_weights_({"b": np.float32(1.0), "k": np.float32(0.0)})
        stats = c.statistics()
        assert (stats.policy_version, stats.latest_policy_version) == (0, 0)
        for _ in range(3):
            batch = next(batches)  # (none dropped as stale)
            assert not batch["action"].any() and not batch["collector", "policy_version"].any()
        assert c.update_policy_weights_({"b": np.float32(1.0), "k": np.int32(0)}) == 1
        for batch in batches:
            if (batch["collector", "policy_version"] == 1).all():
                assert batch["action"].all()
                break


@pytest.mark.parametrize("choice", ["workers", "central", "auto-1", "auto-0"])
def test_policy_placement_chooses_where_a_jax_policy_acts(choice, monkeypatch):
    """``policy_placement="workers"`` puts a CPU JAX policy in the workers, ``"central"`` keeps it
    here; with ``"auto"``, ``AIOCOLLECT_POLICY_IN_WORKERS`` forces either."""
    where = choice
    if choice.startswith("auto"):
        monkeypatch.setenv("AIOCOLLECT_POLICY_IN_WORKERS", choice[-1])
        where = "auto"
    with build(MultiSyncCollector, mlp_policy(), where) as c:
        assert c.policy_in_workers is (choice in ("workers", "auto-1"))
        batch = next(iter(c))
        assert torch.equal(batch["action"], batch["logits"].argmax(-1).to(torch.int32))


def test_a_jax_policy_is_measured_where_the_engine_has_cores_to_spare(monkeypatch):
    """With cores to spare, ``"auto"`` times a JAX policy's calls in both places, as a torch
    policy's, and acts where ``placement_costs`` says."""
    monkeypatch.delenv("AIOCOLLECT_POLICY_IN_WORKERS", raising=False)
    monkeypatch.setattr(placement_module, "usable_cores", lambda: 16)
    with build(MultiSyncCollector, mlp_policy(), "auto") as c:
        costs = c.placement_costs
        assert costs is not None and c.policy_in_workers is costs.in_workers, costs
        assert 0 < costs.worker_s < 1 and 0 < costs.central_s < 1
        batch = next(iter(c))
        assert torch.equal(batch["action"], batch["logits"].argmax(-1).to(torch.int32))


class OnAccelerator(JaxPolicy):
    """A JAX policy as it is on a GPU (``accelerated``), on a machine without one."""

    @property
    def accelerated(self) -> bool:
        return True


def test_a_jax_policy_on_an_accelerator_stays_central(monkeypatch):
    """Only a JAX policy on the CPU acts in the workers: one on a GPU or TPU acts here, batched
    (whatever is asked: ``"workers"`` is refused, saying why), as does one given a
    ``policy_device`` off the CPU."""
    monkeypatch.delenv("AIOCOLLECT_POLICY_IN_WORKERS", raising=False)
    gpu = OnAccelerator(mlp_apply, mlp_params(), out_keys=["logits", "action"])
    assert gpu.worker_actor is None
    why = cannot_act_in_workers(gpu, policy_device=None, compiled=False, runs=True)
    assert why is not None and "GPU" in why
    for choice in ("auto", "workers"):
        assert placement(gpu, num_workers=64, policy_device=None, compiled=False, runs=True, choice=choice) == "cannot"
    cpu = mlp_policy()
    assert cpu.worker_actor is not None
    assert cannot_act_in_workers(cpu, policy_device=None, compiled=False, runs=True) is None
    assert placement(cpu, num_workers=64, policy_device=None, compiled=False, runs=True) == "workers"
    assert "cuda" in cannot_act_in_workers(cpu, policy_device="cuda", compiled=False, runs=True)
    assert "interruptor" in cannot_act_in_workers(cpu, policy_device=None, compiled=False, runs=False)
    before = children()
    with pytest.raises(ValueError, match=r"policy_placement='workers'.*GPU"):
        build(MultiSyncCollector, gpu, "workers")
    assert children() == before, "a worker process was started for a collector that was refused"


def test_bfloat16_params_stay_central():
    """Params of a dtype shared memory does not hold (bfloat16) keep the policy here."""
    params = jax.tree.map(lambda x: jax.numpy.asarray(x, jax.numpy.bfloat16), mlp_params())
    policy = JaxPolicy(mlp_apply, params, out_keys=["logits", "action"])
    why = cannot_act_in_workers(policy, policy_device=None, compiled=False, runs=True)
    assert why is not None and "bfloat16" in why


def test_a_stochastic_jax_policy_draws_its_own_stream_in_each_worker_and_set_seed_repeats_it():
    """Each worker folds the policy's key with its own index (then with its seed, at
    ``set_seed``): the workers draw different actions, and two seeded runs the same ones."""
    def run():
        policy = JaxPolicy(noisy_apply, {}, key=0)
        return collect(MultiSyncCollector, policy, "workers", batches=2)

    first, second = run(), run()
    for a, b in zip(first, second):
        assert torch.equal(a["action"], b["action"])
        assert torch.equal(a["observation"], b["observation"])
    actions = first[0]["action"]  # [workers * envs, T]
    assert set(actions.unique().tolist()) <= {0, 1}
    assert not torch.equal(actions[:2], actions[2:])  # (2 workers x 2 envs: worker 0's rows, then worker 1's)


def _maps(pid: int, library: str) -> bool:
    with open(f"/proc/{pid}/maps") as f:
        return library in f.read()


@pytest.mark.parametrize("cls", [*COLLECTORS, AsyncCollector,
                                 pytest.param(MultiSyncCollector, marks=pytest.mark.cold_start, id="cold-start")])
def test_jax_loads_in_the_workers_only_and_no_worker_outlives_shutdown(cls):
    """The workers given a JAX policy load JAX (XLA's library) and act with it; the warm
    launcher that forks them never loads it (a process that forks must not have started JAX);
    workers started as fresh interpreters do the same; ``shutdown()`` leaves no worker behind."""
    before = children()
    c = build(cls, mlp_policy(), "workers")
    try:
        assert c.policy_in_workers
        batch = next(iter(c))
        assert torch.equal(batch["action"], batch["logits"].argmax(-1).to(torch.int32))
        pids = [w.pid for w in c.statistics().workers]
        assert all(_maps(pid, "jaxlib") for pid in pids)
        warm = launcher.current()
        if warm is not None:
            assert not _maps(warm.pid, "jaxlib")
    finally:
        c.shutdown()
    assert children() == before, "a worker process outlived shutdown()"

"""JAX interop: JaxPolicy in every collector variant, versioned JAX params, zero-copy batches."""

from __future__ import annotations

import functools
import subprocess
import sys
import textwrap
import threading

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn as nn
from tensordict.nn import TensorDictModule

from aiocollect import AsyncCollector, Collector, MultiAsyncCollector, MultiSyncCollector
from aiocollect.jax import JaxPolicy, from_jax, to_jax
from support.checks import check_batch
from support.envs import EchoBoxEnv, IntObsEnv

# (a partial of gym.make: a function of this module would make every worker import it, and
# JAX and torch with it)
cartpole = functools.partial(gym.make, "CartPole-v1")


class ArgmaxLinear(nn.Module):
    def __init__(self, w: np.ndarray, b: np.ndarray):
        super().__init__()
        self.w = nn.Parameter(torch.from_numpy(w.copy()))
        self.b = nn.Parameter(torch.from_numpy(b.copy()))

    def forward(self, obs):
        return torch.argmax(obs @ self.w + self.b, dim=-1)


def jax_argmax(params, obs):
    return jnp.argmax(obs @ params["w"] + params["b"], axis=-1)


WEIGHTS = {"w": np.random.default_rng(0).normal(size=(4, 2)).astype(np.float32),
           "b": np.array([0.1, -0.1], np.float32)}

MAKERS = {
    "Collector": lambda policy: Collector([cartpole] * 4, policy, frames_per_batch=200, total_frames=600),
    "MultiSync": lambda policy: MultiSyncCollector([[cartpole] * 2] * 2, policy, frames_per_batch=200,
                                                   total_frames=600),
    "MultiAsync-1-worker": lambda policy: MultiAsyncCollector([[cartpole] * 4], policy, frames_per_batch=200,
                                                              total_frames=600),
    "AsyncCollector": lambda policy: AsyncCollector([cartpole] * 4, policy, frames_per_batch=200,
                                                    total_frames=600),
}


def collect(collector, seed=3):
    with collector:
        collector.set_seed(seed)
        return list(collector)


@pytest.mark.parametrize("variant", list(MAKERS))
def test_jax_and_torch_policies_collect_the_same_data(variant):
    torch_policy = TensorDictModule(ArgmaxLinear(WEIGHTS["w"], WEIGHTS["b"]), in_keys=["observation"],
                                    out_keys=["action"])
    ours = collect(MAKERS[variant](JaxPolicy(jax_argmax, WEIGHTS)))
    theirs = collect(MAKERS[variant](torch_policy))
    assert len(ours) == len(theirs) == 3
    for a, b in zip(ours, theirs):
        for part in (a.unbind(0) if a.ndim == 3 else [a]):
            check_batch(part)
        assert torch.equal(a["observation"], b["observation"])
        assert torch.equal(a["next", "observation"], b["next", "observation"])
        assert torch.equal(a["action"].long(), b["action"])
        assert torch.equal(a["next", "done"], b["next", "done"])
    # not a trivial policy: both actions occur
    assert set(torch.cat([x["action"].flatten() for x in ours]).tolist()) == {0, 1}


@pytest.mark.parametrize("variant", ["Collector", "MultiSync", "MultiAsync"])
def test_jax_params_updates_are_versioned_and_snapshotted(variant):
    def linear(params, obs):
        return obs @ params["w"] + params["b"]

    def params_of(k):  # numpy params: mutable, so the snapshot must copy them
        return {"w": np.full((3, 1), float(k), np.float32), "b": np.full((1,), float(k), np.float32)}

    policy = JaxPolicy(linear, params_of(0))
    make = {"Collector": lambda: Collector([IntObsEnv] * 2, policy, frames_per_batch=40, total_frames=40 * 30),
            "MultiSync": lambda: MultiSyncCollector([IntObsEnv] * 2, policy, frames_per_batch=40,
                                                    total_frames=40 * 30),
            "MultiAsync": lambda: MultiAsyncCollector([IntObsEnv] * 2, policy, frames_per_batch=20,
                                                      total_frames=20 * 60)}[variant]
    stop, errors = threading.Event(), []

    def trainer():
        try:
            k = 0
            while not stop.is_set():
                k += 1
                params = params_of(k)
                assert collector.update_policy_weights_(params) == k
                params["w"][:] = -1e9  # poison the trainer's own arrays
                params["b"][:] = -1e9
                stop.wait(0.001)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    collector = make()
    seen = set()
    with collector:
        thread = threading.Thread(target=trainer, daemon=True)
        thread.start()
        try:
            for batch in collector:
                version = batch["collector", "policy_version"].to(torch.float32)
                assert torch.equal(batch["action"][..., 0], version * (batch["observation"].sum(-1) + 1))
                seen |= set(batch["collector", "policy_version"].unique().tolist())
        finally:
            stop.set()
            thread.join()
    assert not errors, errors
    assert len(seen) >= 5, seen


def test_copies_of_a_policy_share_what_it_compiled():
    """A collector runs a copy of the ``JaxPolicy``; every copy calls the same jitted function,
    so a second collector of the same policy compiles nothing it compiled before (XLA compiles
    once per row count: here one per number of ready workers), while its weights stay its own."""
    policy = JaxPolicy(jax_argmax, WEIGHTS)

    def run():
        with MultiSyncCollector([[cartpole]] * 3, policy, frames_per_batch=60, total_frames=300) as c:
            list(c)
            return c.policy

    first = run()
    assert policy._jitted._cache_size() >= 1  # what the collector compiled is the policy's
    second = run()
    assert first._jitted is second._jitted is policy._jitted
    assert first is not second and first.params is not second.params is not policy.params


def test_prepare_compiles_for_every_row_count_at_once_and_leaves_nothing_running():
    """``prepare`` (a worker collector calls it for a JAX policy on a GPU): one compile per row
    count, done before it returns, on zeros, without moving the key; a count whose call fails
    is left to the real call."""
    def apply(params, key, obs):
        if obs.shape[0] == 6:
            raise ValueError("not for six rows")
        return jax.random.categorical(key, obs @ params["w"])

    policy = JaxPolicy(apply, WEIGHTS, key=3)
    twin = policy.copy()
    threads = threading.active_count()
    policy.prepare([2, 4, 6, 8], [(np.dtype(np.float32), (4,))])
    assert threading.active_count() == threads
    compiled = policy._jitted._cache_size()
    assert compiled >= 3
    obs = np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32)
    assert np.array_equal(policy(obs)[0], twin(obs)[0])  # the key did not move
    for n in (2, 8):
        policy(np.zeros((n, 4), np.float32))
    assert policy._jitted._cache_size() == compiled  # nothing left to compile for those
    with pytest.raises(ValueError, match="six rows"):
        policy(np.zeros((6, 4), np.float32))


def test_the_row_counts_of_rounds_are_the_sums_of_lanes():
    from aiocollect._policies.setup import round_sizes

    assert round_sizes([4, 4, 4]) == [4, 8, 12]
    assert round_sizes([3, 5]) == [3, 5, 8]
    assert round_sizes([1] * 64) == list(range(1, 65))
    assert round_sizes([1] * 65) is None  # too many to compile ahead: left to the calls


def test_a_policy_on_the_cpu_backend_is_not_accelerated():
    """(which keeps the worker collectors' CPU-policy pipelining rule: ``_workers.plan.pipeline``)"""
    assert jax.default_backend() == "cpu" and not JaxPolicy(jax_argmax, WEIGHTS).accelerated


def test_a_policy_pickles_with_its_params_and_key():
    """Sent to a remote collector (cloudpickle): the same function, params and key, so the
    copy draws what the original would; the jitted function is made anew there."""
    import cloudpickle

    policy = JaxPolicy(lambda p, key, obs: jax.random.categorical(key, obs @ p["w"]), WEIGHTS, key=7)
    twin = cloudpickle.loads(cloudpickle.dumps(policy))
    obs = np.random.default_rng(1).normal(size=(64, 4)).astype(np.float32)
    for _ in range(3):  # the key moves on alike
        assert np.array_equal(twin(obs)[0], policy(obs)[0])
    np.testing.assert_array_equal(np.asarray(twin.params["w"]), WEIGHTS["w"])


def test_stochastic_policy_threads_its_key():
    def sample(params, key, obs):
        return jax.random.categorical(key, obs @ params["w"])

    def run(seed):
        policy = JaxPolicy(sample, {"w": jnp.zeros((4, 2))}, key=seed)
        (batch,) = collect(Collector([cartpole] * 4, policy, frames_per_batch=400, total_frames=400))
        return batch["action"]

    a, b, c = run(0), run(0), run(1)
    assert torch.equal(a, b)  # a seeded key replays
    assert not torch.equal(a, c)
    # zero logits: a fair coin at every step, not one draw repeated
    assert 0.4 < a.float().mean() < 0.6
    assert (a[:, 1:] != a[:, :-1]).any()


def test_flax_module_apply_is_an_apply_fn():
    import flax.linen as fnn

    class MLP(fnn.Module):
        @fnn.compact
        def __call__(self, obs):
            return jnp.argmax(fnn.Dense(2)(fnn.tanh(fnn.Dense(32)(obs))), axis=-1)

    model = MLP()
    variables = model.init(jax.random.key(0), jnp.zeros((1, 4)))
    with Collector([cartpole] * 4, JaxPolicy(model.apply, variables), frames_per_batch=100,
                   total_frames=100) as c:
        (batch,) = list(c)
        check_batch(batch)
        expected = model.apply(variables, jnp.asarray(batch["observation"].numpy()))
        assert np.array_equal(np.asarray(expected), batch["action"].numpy())
        new = jax.tree.map(jnp.zeros_like, variables)
        assert c.update_policy_weights_(new) == 1
        batch = c.rollout()
        assert (batch["collector", "policy_version"] == 1).all() and (batch["action"] == 0).all()
        with pytest.raises(ValueError, match="structure"):
            c.update_policy_weights_({"params": {}})


def test_to_jax_shares_memory_and_from_jax_returns_it():
    (batch,) = collect(MultiSyncCollector([[cartpole] * 2] * 2, None, frames_per_batch=40, total_frames=40))
    arrays = to_jax(batch)
    assert set(arrays) >= {"observation", "action", "next", "collector"}
    shared = 0
    for key in batch.keys(include_nested=True, leaves_only=True):
        tensor = batch.get(key)
        leaf = arrays
        for part in (key if isinstance(key, tuple) else (key,)):
            leaf = leaf[part]
        assert isinstance(leaf, jax.Array) and leaf.shape == tuple(tensor.shape)
        assert np.array_equal(np.asarray(leaf), tensor.numpy())
        if tensor.dtype != torch.int64:  # see the module docstring: JAX's int64 needs x64
            assert leaf.unsafe_buffer_pointer() == tensor.data_ptr(), key
            shared += 1
    assert shared >= 8
    back = from_jax(arrays)
    assert back.batch_size == batch.batch_size
    assert back["observation"].data_ptr() == batch["observation"].data_ptr()
    assert torch.equal(back["next", "reward"], batch["next", "reward"])


def test_to_jax_shares_int64_leaves_with_x64():
    with jax.enable_x64(True):
        (batch,) = collect(Collector([cartpole] * 2, None, frames_per_batch=20, total_frames=20))
        arrays = to_jax(batch)
        ids = arrays["collector"]["traj_ids"]
        assert ids.dtype == jnp.int64
        assert ids.unsafe_buffer_pointer() == batch["collector", "traj_ids"].data_ptr()


def jax_bf16(params, obs):
    """bf16 outputs, as a policy under ``jax.default_matmul_precision`` or with bf16 params gives."""
    a = (params["b"] + 0.3 * obs[:, :1]).astype(jnp.bfloat16)
    return a, (obs * 0.3).astype(jnp.bfloat16)


@pytest.mark.parametrize("variant", ["Collector", "MultiSync", "MultiAsync"])
def test_bfloat16_outputs_of_a_jax_policy_are_stored_as_bfloat16(variant):
    """JAX gives bf16 as numpy arrays of ``ml_dtypes.bfloat16``, which torch cannot take from
    numpy: they are stored as torch's bfloat16 (the same bits), and the envs get the value."""
    policy = JaxPolicy(jax_bf16, {"b": np.float32(0.1)}, out_keys=["action", "scaled"])
    layout = {"Collector": [EchoBoxEnv] * 2, "MultiSync": [[EchoBoxEnv]] * 2, "MultiAsync": [[EchoBoxEnv]] * 2}
    cls = {"Collector": Collector, "MultiSync": MultiSyncCollector, "MultiAsync": MultiAsyncCollector}[variant]
    with cls(layout[variant], policy, frames_per_batch=20, total_frames=20) as collector:
        (batch,) = list(collector)
    assert batch["action"].dtype == batch["scaled"].dtype == torch.bfloat16
    assert torch.equal(batch["action"], (0.1 + 0.3 * batch["observation"][..., :1]).to(torch.bfloat16))
    assert torch.equal(batch["scaled"], (0.3 * batch["observation"]).to(torch.bfloat16))
    assert torch.equal(batch["next", "reward"], batch["action"].float())  # the env echoes its action


def test_an_output_of_a_type_torch_lacks_names_it():
    policy = JaxPolicy(lambda p, obs: (jnp.zeros(obs.shape[0], jnp.int32), obs.astype(jnp.int4)), {},
                       out_keys=["action", "packed"])
    with Collector([cartpole], policy, frames_per_batch=10) as collector, \
            pytest.raises(TypeError, match=r"output 'packed' has dtype int4.*cast it in the policy"):
        next(iter(collector))


def test_bad_jax_policy_arguments():
    with pytest.raises(ValueError, match="'action'"):
        JaxPolicy(jax_argmax, WEIGHTS, out_keys=["logits"])
    with pytest.raises(TypeError, match="apply_fn"):
        JaxPolicy("not a function", WEIGHTS)
    with pytest.raises(KeyError, match="in_keys"):
        Collector([cartpole], JaxPolicy(jax_argmax, WEIGHTS, in_keys=["pixels"]), frames_per_batch=10)
    with pytest.raises(TypeError, match="to_jax"):
        to_jax({"a": 1})


def test_import_without_jax_names_the_extra():
    code = textwrap.dedent("""
        import sys
        class NoJax:
            def find_spec(self, name, path=None, target=None):
                if name == "jax" or name.startswith("jax."):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        sys.meta_path.insert(0, NoJax())
        import aiocollect
        c = aiocollect.Collector(lambda: __import__("gymnasium").make("CartPole-v1"), None,
                                 frames_per_batch=10, total_frames=10)
        assert len(list(c)) == 1
        try:
            import aiocollect.jax
        except ImportError as exc:
            print("ERROR:", exc)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ERROR:" in out.stdout and "aiocollect[jax]" in out.stdout, out.stdout

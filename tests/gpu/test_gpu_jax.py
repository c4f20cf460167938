"""JAX on the GPU: a GPU batch goes to JAX and back without a copy, and a ``JaxPolicy`` whose
params live on the GPU collects (its actions checked against the same policy in numpy)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from aiocollect import MultiSyncCollector
from aiocollect.jax import JaxPolicy, from_jax, to_jax
from support.envs import CounterEnv
from support.gpu import Argmax


@pytest.fixture(scope="module")
def gpu():
    devices = [d for d in jax.devices() if d.platform == "gpu"]
    if not devices:
        pytest.fail(f"JAX sees no GPU ({jax.devices()}): install JAX with CUDA (jax[cuda12])")
    return devices[0]


def collector(policy=None, **kwargs) -> MultiSyncCollector:
    return MultiSyncCollector([[CounterEnv] * 2] * 2, policy, frames_per_batch=40, total_frames=-1, **kwargs)


def test_to_jax_of_a_gpu_batch_shares_its_memory(gpu):
    with collector(storing_device="cuda") as c:
        batch = c.rollout()
    assert batch.device.type == "cuda"
    data = to_jax(batch)
    for key in ("observation", ("next", "observation"), ("next", "reward"), ("next", "done")):
        tensor = batch[key]
        array = data[key] if isinstance(key, str) else data[key[0]][key[1]]
        assert array.devices() == {gpu}, key
        assert array.unsafe_buffer_pointer() == tensor.data_ptr(), key
        np.testing.assert_array_equal(np.asarray(array), tensor.cpu().numpy())


def test_from_jax_of_gpu_arrays_shares_their_memory(gpu):
    advantage = jax.device_put(jnp.arange(40.0, dtype=jnp.float32).reshape(4, 10), gpu)
    td = from_jax({"advantage": advantage}, [4, 10], names=[None, "time"])
    assert td["advantage"].is_cuda
    assert td["advantage"].data_ptr() == advantage.unsafe_buffer_pointer()
    assert torch.equal(td["advantage"].cpu(), torch.arange(40.0).reshape(4, 10))


def argmax_params(scale: float = 1.0) -> dict:
    net = Argmax().net
    return {"w": jnp.asarray(net.weight.detach().numpy().T) * scale, "b": jnp.asarray(net.bias.detach().numpy())}


def apply(params, obs):
    # full float32 on the GPU too (JAX's default there is TF32, which would round the logits)
    logits = jnp.matmul(obs / 1000, params["w"], precision=jax.lax.Precision.HIGHEST) + params["b"]
    return jnp.argmax(logits, axis=-1)


def test_a_jax_policy_on_the_gpu_is_compiled_for_every_round_before_collecting(gpu):
    from aiocollect._policies.setup import round_sizes

    with collector(JaxPolicy(apply, argmax_params())) as c:
        sizes = round_sizes([lane.num_envs for lane in c._scheduler.lanes])
        assert sizes and c.policy._jitted._cache_size() >= len(sizes)


def test_a_jax_policy_on_the_gpu_fills_gpu_batches(gpu):
    policy = JaxPolicy(apply, argmax_params())
    assert policy.accelerated
    assert all(leaf.devices() == {gpu} for leaf in jax.tree.leaves(policy.params))
    with collector(policy, storing_device="cuda") as c:
        assert all(leaf.devices() == {gpu} for leaf in jax.tree.leaves(c.policy.params))
        first = c.rollout()
        c.update_policy_weights_(argmax_params(-1.0))  # the opposite preferences
        later = [c.rollout() for _ in range(3)]
    for batch in (first, *later):
        assert batch.device.type == "cuda"
        host = batch.cpu()
        version = host["collector", "policy_version"]
        obs = host["observation"].numpy()
        for v in (0, 1):
            rows = (version == v).numpy()
            expected = np.asarray(apply(jax.device_get(argmax_params(1.0 if v == 0 else -1.0)), obs[rows]))
            assert np.array_equal(host["action"].numpy()[rows], expected), v
    assert (later[-1]["collector", "policy_version"] == 1).all()

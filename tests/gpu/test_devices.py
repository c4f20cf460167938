"""The device options on a CUDA machine, in every local variant (``support.variants``).

TorchRL's meanings: ``policy_device`` runs the collector's copy of the policy there;
``storing_device`` is where batches are delivered; ``device`` is both. A policy on the GPU
acts as the same policy on the CPU does (an argmax policy, checked frame by frame), its
weight updates keep the versions honest (the poison test), and a batch stored on the GPU
holds every field there with the same values.
"""

from __future__ import annotations

import pytest
import torch

from support.envs import CounterEnv, IntObsEnv
from support.gpu import acts_as_the_cpu_policy, argmax_policy
from support.variants import VARIANTS
from support.weights import Trainer, linear, versions_while_training

CUDA = torch.device("cuda", 0)


def batches(variant, count: int = 3, **kwargs) -> list:
    with variant(CounterEnv, argmax_policy(), frames_per_batch=variant.num_envs * 10, total_frames=-1,
                 **kwargs) as collector:
        collector.set_seed(0)
        out = []
        for batch in collector:
            out.append(batch)
            if len(out) == count:
                return out
    return out


def test_policy_device_cuda_acts_as_the_same_policy_on_the_cpu(variant):
    for batch in batches(variant, policy_device="cuda"):
        assert batch.device in (None, torch.device("cpu")) and not batch["action"].is_cuda
        acts_as_the_cpu_policy(batch)


def test_storing_device_cuda_delivers_every_field_on_the_gpu(variant):
    for batch in batches(variant, storing_device="cuda"):
        assert batch.device == CUDA
        assert all(t.device == CUDA for t in batch.values(True, True))
        acts_as_the_cpu_policy(batch)


def test_device_cuda_runs_the_policy_and_stores_the_batches_there(variant):
    with variant(CounterEnv, argmax_policy(), frames_per_batch=variant.num_envs * 10, total_frames=-1,
                 device="cuda") as collector:
        assert all(p.device == CUDA for p in collector.policy.parameters())
        batch = collector.rollout()
    assert batch.device == CUDA
    acts_as_the_cpu_policy(batch)


def test_cpu_and_cuda_copies_give_the_same_rollouts():
    variant = next(v for v in VARIANTS if v.name == "MultiSync-process")  # deterministic order
    cpu = batches(variant, count=2)
    cuda = batches(variant, count=2, policy_device="cuda")
    for a, b in zip(cpu, cuda):
        for key in ("observation", "action", ("next", "reward"), ("next", "done")):
            assert torch.equal(a[key], b[key]), key


async def test_weight_updates_of_a_cuda_policy_never_mix_versions(variant):
    collector = variant(IntObsEnv, linear(0.0), frames_per_batch=40, total_frames=40 * 30, policy_device="cuda")
    await versions_while_training(collector, Trainer(collector))


def test_a_cuda_index_names_the_device():
    variant = VARIANTS[0]
    with variant(CounterEnv, argmax_policy(), frames_per_batch=40, total_frames=-1, device="cuda:0") as collector:
        assert collector.rollout().device == CUDA
    bad = f"cuda:{torch.cuda.device_count()}"
    with pytest.raises(ValueError, match="CUDA device"):
        variant(CounterEnv, argmax_policy(), frames_per_batch=40, device=bad)

"""What crosses the bus, and how (``docs/gpu.md``), read off the CUDA profiler's memcpy records.

* a batch for a GPU ``storing_device`` reaches it in **one** host-to-device copy, from
  pinned memory (``_engine.staging``);
* a GPU policy's observations go over, and its outputs come back, through pinned memory:
  no copy from or to pageable memory at all (``_policies.transfer``).

Kineto names CUDA's memcpy records ``Memcpy HtoD (Pinned -> Device)``, ``Memcpy DtoH
(Device -> Pageable)`` and so on; every name seen is in the failure messages.
"""

from __future__ import annotations

import itertools

import torch
from torch.profiler import ProfilerActivity, profile

from support.envs import CounterEnv
from support.gpu import acts_as_the_cpu_policy, argmax_policy


def memcpys(run) -> list[str]:
    """The memcpy records of the GPU while ``run()`` runs (every thread of this process)."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.name.startswith("Memcpy")]


def profiled(variant, policy, count: int, **devices) -> tuple[list[str], list]:
    """``count`` batches of ``variant`` after a first one (it sizes the staging block), and the
    memcpy records of the GPU while they were collected."""
    with variant(CounterEnv, policy, frames_per_batch=variant.num_envs * 10, total_frames=-1, **devices) as collector:
        batches = iter(collector)
        next(batches)
        got: list = []
        names = memcpys(lambda: got.extend(itertools.islice(batches, count)))
    return names, got


def test_each_batch_reaches_the_storing_device_in_one_pinned_copy(variant):
    names, got = profiled(variant, None, 3, storing_device="cuda")
    to_device = [n for n in names if "HtoD" in n]
    assert len(to_device) == 3, names
    assert all("Pinned" in n for n in to_device), names
    for batch in got:
        assert all(t.is_cuda for t in batch.values(True, True))


def test_a_gpu_policys_inputs_and_outputs_cross_in_pinned_memory(variant):
    names, got = profiled(variant, argmax_policy(), 2, policy_device="cuda")
    assert any("HtoD" in n for n in names) and any("DtoH" in n for n in names), names
    assert not [n for n in names if "Pageable" in n], names
    for batch in got:
        acts_as_the_cpu_policy(batch)


def test_storing_and_policy_on_the_gpu_together(variant):
    """``device="cuda"``: both of the above at once, and the batch holds what the policy did."""
    names, got = profiled(variant, argmax_policy(), 2, device="cuda")
    assert not [n for n in names if "Pageable" in n], names
    for batch in got:
        assert batch.device.type == "cuda"
        acts_as_the_cpu_policy(batch)


def test_a_module_on_the_gpu_runs_there_without_policy_device(variant):
    """As in TorchRL: with no ``policy_device`` the module's own device is the policy's."""
    with variant(CounterEnv, argmax_policy().cuda(), frames_per_batch=variant.num_envs * 10,
                 total_frames=-1) as collector:
        batch = collector.rollout()
        assert all(p.is_cuda for p in collector.policy.parameters())
    assert batch.device in (None, torch.device("cpu"))
    acts_as_the_cpu_policy(batch)


def test_a_batch_on_the_gpu_is_the_users_after_the_next_one_is_staged(variant):
    """The staging blocks are refilled for later batches: a batch already delivered must
    keep its values (the device copy is the user's own)."""
    with variant(CounterEnv, argmax_policy(), frames_per_batch=variant.num_envs * 10, total_frames=-1,
                 storing_device="cuda") as collector:
        batches = iter(collector)
        first = next(batches)
        kept = first.clone()
        for _ in range(4):
            next(batches)
        torch.cuda.synchronize()
    assert (first == kept).all()


def test_a_batch_is_ready_on_the_stream_of_the_thread_that_asked_for_it(variant):
    """``with torch.cuda.stream(s): next(batches)``: ``s`` waits for the batch's copy, which a
    sleep queued on the copy stream holds back ~50 ms, so a kernel queued on ``s`` at once
    still reads the batch's data (the loop thread's stream waiting would not order ``s``)."""
    s = torch.cuda.Stream()
    with variant(CounterEnv, argmax_policy(), frames_per_batch=variant.num_envs * 10, total_frames=-1,
                 storing_device="cuda") as collector:
        batches = iter(collector)
        next(batches)  # (the first batch makes the staging)
        for _ in range(3):
            with torch.cuda.stream(collector._staging._copies):
                torch.cuda._sleep(100_000_000)
            with torch.cuda.stream(s):
                batch = next(batches)
                seen = batch["observation"].clone()  # queued on s at once
            torch.cuda.synchronize()
            assert torch.equal(seen, batch["observation"])
            acts_as_the_cpu_policy(batch)

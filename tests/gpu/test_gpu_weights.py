"""Weights on the GPU: an update is a queued device-to-device copy that never waits for the
collector's policy calls, and versions stay exact when the trainer uses another stream."""

from __future__ import annotations

import statistics
import threading
import time

import pytest
import torch
import torch.nn as nn
from tensordict.nn import TensorDictModule

from aiocollect import Collector
from support.envs import IntObsEnv
from support.weights import Trainer, check_versions, linear, versions_while_training

GPU_SLEEP_CYCLES = 40_000_000
"""``torch.cuda._sleep`` cycles: some 20 ms of GPU time at an H100's clock."""


class SlowLinear(nn.Module):
    """``linear``'s policy, but each call first keeps the GPU busy for ~20 ms."""

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(3, 1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        torch.cuda._sleep(GPU_SLEEP_CYCLES)
        return self.net(obs)


def test_an_update_does_not_wait_for_the_policy_calls(variant):
    policy = TensorDictModule(SlowLinear(), in_keys=["observation"], out_keys=["action"])
    trainer = TensorDictModule(SlowLinear(), in_keys=["observation"], out_keys=["action"]).cuda()  # (not called)
    times: list[float] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def train() -> None:
        try:
            while not stop.is_set():
                t0 = time.perf_counter()
                collector.update_policy_weights_(trainer)
                times.append(time.perf_counter() - t0)
                time.sleep(0.002)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    collector = variant(IntObsEnv, policy, frames_per_batch=variant.num_envs * 4, total_frames=-1,
                        policy_device="cuda")
    with collector:
        thread = threading.Thread(target=train, daemon=True)
        thread.start()
        try:
            for i, _ in enumerate(collector):
                if i == 3:
                    break
        finally:
            stop.set()
            thread.join()
    assert not errors, errors
    assert len(times) >= 10
    # a policy call holds the GPU ~20 ms: an update that waited for one would take that long
    assert statistics.median(times) < 0.005, sorted(times)[len(times) // 2:]


class StreamTrainer(threading.Thread):
    """The poison test's trainer (``support.weights.Trainer``), on the GPU and on a stream of
    its own, with the GPU kept busy before each write so that a snapshot taken without
    waiting for the trainer's stream would see the weights before the write (or the poison)."""

    def __init__(self, collector):
        super().__init__(daemon=True)
        self.collector, self.policy = collector, linear(0.0).cuda()
        self.stream = torch.cuda.Stream()
        self.stop, self.sent, self.error = threading.Event(), 0, None

    def run(self):
        params = list(self.policy.parameters())
        try:
            with torch.cuda.stream(self.stream), torch.no_grad():
                while not self.stop.is_set():
                    torch.cuda._sleep(2_000_000)  # ~1 ms: the write below happens late on the GPU
                    for p in params:
                        p.fill_(self.sent + 1)
                    self.sent = self.collector.update_policy_weights_(self.policy)
                    for p in params:
                        p.fill_(-1e9)  # poison: any frame computed from it would show
                    self.stream.synchronize()  # keep the stream's queue short (one sleep at a time)
                    time.sleep(0.0005)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


async def test_a_trainer_on_another_stream_never_mixes_versions(variant):
    collector = variant(IntObsEnv, linear(0.0), frames_per_batch=40, total_frames=40 * 30, policy_device="cuda")
    await versions_while_training(collector, StreamTrainer(collector))


async def test_a_shared_cuda_module_loaded_on_the_trainers_stream_never_mixes_versions():
    """A ``Collector`` acting with the user's own CUDA module: weights published from the
    trainer's stream are loaded into that module there (the update call finds no policy call
    under way), and the next policy call, on the loop thread's stream, waits for them."""
    collector = Collector([IntObsEnv] * 4, linear(0.0).cuda(), frames_per_batch=40, total_frames=40 * 30)
    assert collector.policy is not None and next(collector.policy.parameters()).is_cuda
    await versions_while_training(collector, StreamTrainer(collector))


class PinnedTrainer(Trainer):
    """``Trainer`` publishing a state dict in page-locked host memory, poisoned right after the
    call: a queued copy from it would read the poison."""

    def run(self):
        state = {k: v.detach().clone().pin_memory() for k, v in self.policy.state_dict().items()}
        try:
            while not self.stop.is_set():
                for v in state.values():
                    v.fill_(self.sent + 1)
                torch.cuda._sleep(2_000_000)  # ~1 ms: a copy queued behind it would read the poison
                self.sent = self.collector.update_policy_weights_(state)
                for v in state.values():
                    v.fill_(-1e9)
                time.sleep(0.0005)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


async def test_pinned_host_weights_are_copied_before_the_update_returns(variant):
    collector = variant(IntObsEnv, linear(0.0), frames_per_batch=40, total_frames=40 * 30, policy_device="cuda")
    await versions_while_training(collector, PinnedTrainer(collector))


@pytest.mark.parametrize("face", ["sync", "async"])
async def test_a_shared_module_changed_on_the_users_stream_is_read_after_the_change(face):
    """``Collector`` acting with the user's CUDA module: an in-place change queued on a stream
    of the user's own (held back on the GPU by a sleep), then a batch asked for on that stream
    with no publish (``rollout()``, or ``await arollout()``). The change is a new version, and
    its first policy call, on the loop thread's stream, waits for it (``FollowChannel.follow_caller``)."""
    policy = linear(0.0).cuda()
    params = list(policy.parameters())
    stream = torch.cuda.Stream()
    with (Collector([IntObsEnv] * 4, policy, frames_per_batch=40, total_frames=-1) as collector,
          torch.cuda.stream(stream), torch.no_grad()):
        for k in range(1, 6):
            torch.cuda._sleep(GPU_SLEEP_CYCLES)  # ~20 ms: the writes below happen late on the GPU
            for p in params:
                p.fill_(k)
            batch = collector.rollout() if face == "sync" else await collector.arollout()
            assert check_versions(batch) == {k}, k

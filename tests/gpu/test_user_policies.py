"""Policies users bring to a GPU: a ``torch.compile``d module, and one under ``torch.autocast``
whose outputs are bf16 (stored as they are, on the storing device)."""

from __future__ import annotations

import torch
import torch.nn as nn
from tensordict.nn import TensorDictModule

from aiocollect import Collector, MultiSyncCollector
from support.envs import CounterEnv
from support.gpu import Argmax, acts_as_the_cpu_policy, compile_backend


def test_a_compiled_module_on_the_gpu_acts_as_the_module():
    module = torch.compile(Argmax(), backend=compile_backend())
    compiled = TensorDictModule(module, in_keys=["observation"], out_keys=["action"])
    with MultiSyncCollector([[CounterEnv] * 2] * 2, compiled, frames_per_batch=40, total_frames=-1,
                            device="cuda") as collector:
        batches = [collector.rollout() for _ in range(3)]
        collector.update_policy_weights_(TensorDictModule(Argmax(), in_keys=["observation"], out_keys=["action"]))
        batches.append(collector.rollout())
    for batch in batches:
        acts_as_the_cpu_policy(batch)


class AutocastLogits(nn.Module):
    """``Argmax``'s linear layer under bf16 autocast: bf16 logits and their argmax."""

    def __init__(self):
        super().__init__()
        self.inner = Argmax()

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = self.inner.net(obs / 1000)
        return logits, logits.float().argmax(-1)


def test_bf16_outputs_under_autocast_are_stored_as_bf16_on_the_storing_device():
    policy = TensorDictModule(AutocastLogits(), in_keys=["observation"], out_keys=["logits", "action"])
    for cls, envs in ((Collector, [CounterEnv] * 4), (MultiSyncCollector, [[CounterEnv] * 2] * 2)):
        with cls(envs, policy, frames_per_batch=40, total_frames=-1, device="cuda") as collector:
            batch = collector.rollout()
        assert batch["logits"].dtype == torch.bfloat16 and batch["logits"].is_cuda
        assert batch["logits"].shape[-1] == 3
        assert torch.equal(batch["action"], batch["logits"].float().argmax(-1)), cls.__name__

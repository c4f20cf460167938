"""TorchRL's "Get started with data collection and storage" (getting-started 3), as a user
runs it: a random policy on CartPole through a collector, the batches into a replay buffer
on memmap storage, then a sample. Nothing trains (``learned`` is null)."""

import json
import tempfile

import torch
from torchrl.collectors import Collector
from torchrl.data.replay_buffers import LazyMemmapStorage, ReplayBuffer
from torchrl.envs import GymEnv
from torchrl.envs.utils import RandomPolicy

torch.manual_seed(0)

env = GymEnv("CartPole-v1")
env.set_seed(0)

policy = RandomPolicy(env.action_spec)
collector = Collector(env, policy, frames_per_batch=200, total_frames=-1)

for data in collector:
    print(data)
    break

print(data["collector", "traj_ids"])
assert data.batch_size == torch.Size([200])

buffer_scratch_dir = tempfile.TemporaryDirectory().name
buffer = ReplayBuffer(storage=LazyMemmapStorage(max_size=1000, scratch_dir=buffer_scratch_dir))
indices = buffer.extend(data)
assert len(buffer) == collector.frames_per_batch

sample = buffer.sample(batch_size=30)
print(sample)
assert sample.batch_size == torch.Size([30])
assert set(sample.keys(True, True)) >= {"observation", "action", ("next", "reward"), ("next", "done")}
collector.shutdown()

print("RESULT " + json.dumps({"collector": type(collector).__module__, "learned": None,
                              "frames": int(data.numel())}))

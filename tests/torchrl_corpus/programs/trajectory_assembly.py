"""TorchRL's "Collectors Deep Dive: Trajectory Assembly" tutorial (tutorials/sphinx-tutorials/
collector_trajectory_assembly.py), as a user runs it: fixed-size batches of a random CartPole
policy, ``split_trajectories`` (padded and ``as_nested``), complete trajectories from
``trajs_per_batch`` with ``traj_format="padded"`` and ``"cat"``, flat transitions into a
``ReplayBuffer`` with a ``SliceSampler``, and background collection into a shared buffer with
``start()`` / ``async_shutdown()``.

Nothing trains (``learned`` is null). The asserts check what the tutorial says of each layout:
200 frames a batch, one padded row per trajectory id with a prefix mask covering every frame,
``trajs_per_batch=5`` rows that are whole episodes (one id each, ``done`` on the last real step
only), a flat ``"cat"`` batch of 5 episodes ending with ``done``, slices that respect episode
boundaries, and a buffer the background collector fills.
"""

import json
import time

import torch
from torchrl.collectors import Collector
from torchrl.collectors.utils import split_trajectories
from torchrl.data import LazyTensorStorage, ReplayBuffer, SliceSampler
from torchrl.envs import GymEnv
from torchrl.modules import RandomPolicy

torch.manual_seed(0)

# Why collectors return fixed-size chunks
env = GymEnv("CartPole-v1")
env.set_seed(0)

policy = RandomPolicy(env.action_spec)
collector = Collector(env, policy, frames_per_batch=200, total_frames=-1)

for data in collector:
    print(data)
    break

print(data["collector", "traj_ids"])
print(data["next", "done"].squeeze(-1))

n_episodes = data["next", "done"].sum().item()
print(f"This batch of {data.shape[0]} frames contains {n_episodes} episodes.")
assert data.batch_size == torch.Size([200])
traj_ids = data["collector", "traj_ids"]
assert (traj_ids[1:] >= traj_ids[:-1]).all(), "one env: trajectory ids never go back"

# Reassembling trajectories with split_trajectories
split_data = split_trajectories(data)

print(split_data)
print(f"Shape: {split_data.shape}  ->  (num_trajectories, max_episode_length)")
print(split_data["collector", "mask"])

mask = split_data["collector", "mask"]
assert split_data.shape[0] == traj_ids.unique().numel()
assert int(mask.sum()) == 200, "the mask covers every collected frame, once"
lengths = mask.sum(-1)
assert (mask == (torch.arange(mask.shape[-1]) < lengths[:, None])).all(), "valid steps come first"
assert split_data.shape[1] == int(lengths.max())
for row in range(split_data.shape[0]):  # one trajectory id per row
    assert split_data["collector", "traj_ids"][row][mask[row]].unique().numel() == 1
# every row but the last ends on a done (the last one may run on past the batch)
ends = split_data["next", "done"].squeeze(-1).gather(-1, (lengths - 1)[:, None]).squeeze(-1)
assert ends[:-1].all()

# done vs truncated and the mask
print("done shape:     ", split_data["next", "done"].shape)
print("truncated shape:", split_data["next", "truncated"].shape)

# Padded vs nested tensors
padded = split_trajectories(data, as_nested=False)
nested = split_trajectories(data, as_nested=True)

print(f"Padded shape : {padded.shape}")
print(f"Nested result: {type(nested).__name__}, batch_size={nested.batch_size}")
assert padded.shape == split_data.shape
assert nested.batch_size[0] == split_data.shape[0]

# Getting complete trajectories with trajs_per_batch
collector_trajs = Collector(
    env,
    policy,
    frames_per_batch=200,
    total_frames=-1,
    trajs_per_batch=5,
    traj_format="padded",
)

for traj_data in collector_trajs:
    print(traj_data)
    break
print(f"Shape: {traj_data.shape}  ->  (trajs_per_batch, max_episode_length)")
print(traj_data["collector", "mask"])

traj_mask = traj_data["collector", "mask"]
assert traj_data.shape[0] == 5
traj_lengths = traj_mask.sum(-1)
assert (traj_mask == (torch.arange(traj_mask.shape[-1]) < traj_lengths[:, None])).all()
assert traj_data.shape[1] == int(traj_lengths.max())
traj_done = traj_data["next", "done"].squeeze(-1)
for row in range(5):  # a whole episode: one id, done on its last step and nowhere before
    n = int(traj_lengths[row])
    assert traj_data["collector", "traj_ids"][row, :n].unique().numel() == 1
    assert traj_done[row, n - 1] and not traj_done[row, : n - 1].any()

collector_trajs.shutdown()
collector_cat = Collector(
    env,
    policy,
    frames_per_batch=200,
    total_frames=-1,
    trajs_per_batch=5,
    traj_format="cat",
)

traj_data_cat = next(iter(collector_cat))
print(f"Shape: {traj_data_cat.shape}  ->  (sum of the 5 episode lengths,)")
print(traj_data_cat["next", "done"].squeeze(-1))

cat_done = traj_data_cat["next", "done"].squeeze(-1)
assert traj_data_cat.ndim == 1
assert int(cat_done.sum()) == 5 and bool(cat_done[-1])
assert traj_data_cat["collector", "traj_ids"].unique().numel() == 5
collector_cat.shutdown()

# Storing transitions and sampling trajectory slices
rb = ReplayBuffer(
    storage=LazyTensorStorage(max_size=10_000),
    sampler=SliceSampler(
        slice_len=16,
        end_key=("next", "done"),
    ),
    batch_size=32,
)
rb.extend(data)

print(f"Buffer length after one batch: {len(rb)}")

sample = rb.sample()
print(sample)

sample_ids = sample["collector", "traj_ids"]
print(f"Unique trajectories in sample: {sample_ids.unique().numel()}")
assert len(rb) == 200
assert sample.batch_size == torch.Size([32])
for piece in sample_ids.split(16):  # a slice never straddles two episodes
    assert piece.unique().numel() == 1

# Asynchronous collection with collector.start()
rb_async = ReplayBuffer(
    storage=LazyTensorStorage(max_size=10_000),
    sampler=SliceSampler(
        slice_len=16,
        end_key=("next", "done"),
    ),
    shared=True,
)

collector_async = Collector(
    env,
    policy,
    replay_buffer=rb_async,
    frames_per_batch=200,
    total_frames=-1,
)

collector_async.start()

for _ in range(10):
    time.sleep(0.1)
    if len(rb_async) > 0:
        break

print(f"Buffer length after background collection: {len(rb_async)}")
filled = len(rb_async)

if len(rb_async) >= 16:
    sample = rb_async.sample(batch_size=32)
    print(sample)

collector_async.async_shutdown()
collector.shutdown()
assert filled >= 200, "the background collector writes whole batches into the buffer"

print("RESULT " + json.dumps({"collector": type(collector).__module__, "learned": None,
                              "frames": int(data.numel()), "trajectories": int(split_data.shape[0]),
                              "trajs_batch_shape": list(traj_data.shape),
                              "cat_frames": int(traj_data_cat.numel()), "async_buffer": filled}))

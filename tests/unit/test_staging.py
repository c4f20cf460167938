"""``DeviceStaging``: a batch built in one host block reaches its device in one copy.

On a CUDA machine the block is pinned and the copy non-blocking (``tests/gpu`` checks
that); the packing, the views and the block reuse are the same code for any target, so
they are tested here with the CPU as the "device" (and through real collectors in
``variants/test_staged_batches.py``).
"""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict

from aiocollect._engine.staging import DeviceStaging

CPU = torch.device("cpu")


def build(staging: DeviceStaging, envs: int = 4, steps: int = 5) -> TensorDict:
    """A batch as ``RolloutStorage.batch`` builds one: every field from ``staging.empty``."""
    staging.begin()
    obs, obs_np = staging.empty((envs, steps, 3), np.float32)
    obs_np[:] = np.arange(obs_np.size, dtype=np.float32).reshape(obs_np.shape)
    action, action_np = staging.empty((envs, steps), np.int64)
    action_np[:] = 7
    done, done_np = staging.empty((envs, steps), np.bool_)
    done_np[:] = False
    done_np[:, -1] = True
    td = TensorDict({"observation": obs, "action": action, "next": {"done": done.unsqueeze(-1)}},
                    batch_size=[envs, steps])
    td.refine_names(None, "time")
    return td


def test_a_batch_is_one_copy_of_one_block_and_every_field_a_view_of_it():
    staging = DeviceStaging(CPU)
    host = build(staging)
    expected = host.clone()
    out = staging.upload(host)
    assert staging.copies == 1
    assert out.names == [None, "time"] and out.batch_size == torch.Size([4, 5])
    assert (out == expected).all()
    assert out["next", "done"].shape == (4, 5, 1) and out["next", "done"].dtype == torch.bool
    storages = {t.untyped_storage().data_ptr() for t in out.values(True, True)}
    assert len(storages) == 1  # one device allocation holds the batch
    base = out["observation"].untyped_storage().data_ptr()
    assert all((t.data_ptr() - base) % 256 == 0 for t in out.values(True, True))  # (JAX wants 64)


def test_the_device_copy_is_the_users_own():
    staging = DeviceStaging(CPU)
    first = staging.upload(build(staging))
    kept = first.clone()
    for _ in range(3):  # the blocks are refilled: the delivered batch must not change
        staging.upload(build(staging))
    assert (first == kept).all()


def test_a_tensor_built_elsewhere_joins_the_one_copy():
    staging = DeviceStaging(CPU)
    host = build(staging)
    outside = torch.arange(20.0).reshape(4, 5)  # e.g. a torch.cat of two workers' parts
    host["extra"] = outside
    transposed = torch.arange(20).reshape(5, 4).T  # not contiguous
    host["strided"] = transposed
    logits = torch.linspace(-1, 1, 40).reshape(4, 5, 2).to(torch.bfloat16)  # a dtype numpy lacks
    host["logits"] = logits
    out = staging.upload(host)
    assert staging.copies == 1
    assert torch.equal(out["extra"], outside) and torch.equal(out["strided"], transposed)
    assert out["logits"].dtype == torch.bfloat16 and torch.equal(out["logits"], logits)
    assert out["extra"].untyped_storage().data_ptr() == out["observation"].untyped_storage().data_ptr()


def test_the_first_batch_learns_the_size_the_next_ones_take_one_copy():
    staging = DeviceStaging(CPU)
    big = (1 << 20) // 4 + 1000  # more float32 than the first block holds
    for round_ in range(3):
        staging.begin()
        a, a_np = staging.empty((big,), np.float32)
        b, b_np = staging.empty((big,), np.float32)
        a_np[:] = 1.0
        b_np[:] = 2.0
        before = staging.copies
        out = staging.upload(TensorDict({"a": a, "b": b}, batch_size=[big]))
        assert float(out["a"].sum()) == big and float(out["b"].sum()) == 2 * big
        if round_:
            assert staging.copies - before == 1
    assert len(staging._pool) <= 3


def test_a_batch_built_but_never_uploaded_gives_its_blocks_back():
    staging = DeviceStaging(CPU)
    build(staging)  # collected, then the caller was cancelled before the upload
    host = build(staging)
    staging.upload(host)
    assert staging.copies == 1
    assert len(staging._pool) == 1


def test_an_empty_field_stays_empty():
    staging = DeviceStaging(CPU)
    staging.begin()
    x, _ = staging.empty((4, 0), np.float32)
    y, y_np = staging.empty((4, 2), np.float32)
    y_np[:] = 3
    out = staging.upload(TensorDict({"x": x, "y": y}, batch_size=[4]))
    assert out["x"].shape == (4, 0) and torch.equal(out["y"], torch.full((4, 2), 3.0))

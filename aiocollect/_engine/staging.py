"""Batches onto a GPU in one host-to-device copy each: a pinned staging arena.

With ``storing_device="cuda"`` (or ``device="cuda"``) a batch is still assembled on the
host, by numpy on one thread (``RolloutStorage.batch``), but every one of its fields is
carved out of one page-locked *block* instead of being allocated apart. Once the
collector has read what it needs on the host (episode returns, the policy lag), the
block goes to the GPU in **one non-blocking copy**, and the batch's tensors become views
of the device copy at the same offsets. Per batch that is one ``cudaMemcpyAsync`` from
pinned memory (a DMA the host does not wait for), where a field-by-field ``.to("cuda")``
of pageable memory costs one synchronous copy per field.

* **What the user gets**: a TensorDict on the storing device whose tensors share one
  device allocation (freed once every field is dropped). The copy runs on a stream of
  its own, beside the trainer's kernels; the current stream of the thread that uploads
  waits for it on the GPU (the loop thread's default stream for ``for batch in
  collector``, to which the asking thread's own stream is then ordered; the iterating
  thread's for ``async for``), so kernels queued there afterwards see the data.
  Work on another stream must wait for that one (``stream.wait_stream``), as with any
  ``non_blocking`` copy in torch.
* **Blocks are recycled**: a block is filled again only once the event recorded after
  its copy has completed (by then the user holds the batch on the device). The first
  batch learns the size; later batches fit in one block, so the copy count per batch
  is one. A tensor the block does not hold (built elsewhere, e.g. by ``torch.cat``) is
  copied into it first: a host memcpy, still inside the one transfer.
* **Anywhere it runs**: the same code stages to a CPU "device" (an ordinary copy, no
  pinning, no events), which is how its packing is unit-tested on machines without CUDA.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

_ALIGN = 256
"""Offset alignment of each field in a block: CUDA's allocation granularity for typed
views, and more than JAX's 64 bytes for taking a field without a copy."""

_FIRST_BLOCK = 1 << 20
_MAX_BLOCKS = 3


def _round_up(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class _Block:
    """One host block: page-locked for a CUDA target; ``used`` bytes carved so far."""

    def __init__(self, nbytes: int, pinned: bool):
        self.host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
        self.base = self.host.data_ptr()
        self.capacity = nbytes
        self.used = 0
        self.event: Any = None
        """Recorded after the block's last copy to the device (CUDA only)."""

    def holds(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == "cpu" and self.base <= tensor.data_ptr() < self.base + self.used

    def idle(self) -> bool:
        return self.event is None or self.event.query()


class DeviceStaging:
    """Packs each batch into one host block and copies it to ``device`` at once (see the
    module docstring). ``empty`` is ``RolloutStorage``'s allocator for batches; ``begin``
    starts a batch, ``upload`` ends it."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self._copies = torch.cuda.Stream(device) if self.cuda else None
        """The stream the uploads go on, beside the trainer's kernels (see ``upload``)."""
        self._lock = threading.Lock()
        self._pool: list[_Block] = []
        self._filling: list[_Block] = []
        self._want = _FIRST_BLOCK
        self.copies = 0
        """Host-to-device copies made so far (one per block per batch)."""

    # ------------------------------------------------------------------ building a batch

    def begin(self) -> None:
        """A new batch: blocks filled for one that was never uploaded are reused."""
        with self._lock:
            self._pool.extend(self._filling)
            self._filling = []

    def empty(self, shape: tuple, dtype: Any) -> tuple[torch.Tensor, np.ndarray]:
        """A host tensor of ``shape`` and numpy ``dtype`` inside the batch's block, and its
        numpy view (``storage.host_empty``'s contract)."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        flat = self._carve(nbytes)
        view = flat.numpy().view(dtype).reshape(shape)
        return torch.from_numpy(view), view

    def _carve(self, nbytes: int) -> torch.Tensor:
        with self._lock:
            block = self._filling[-1] if self._filling else None
            if block is None or block.used + nbytes > block.capacity:
                block = self._block(nbytes)
                self._filling.append(block)
            start = block.used
            block.used = _round_up(start + nbytes)
            return block.host[start : start + nbytes]

    def _block(self, nbytes: int) -> _Block:
        """A free block of at least ``max(nbytes, the size batches need)`` bytes."""
        want = max(nbytes, self._want)
        for i, block in enumerate(self._pool):
            if block.capacity >= want and block.idle():
                del self._pool[i]
                block.used = 0
                return block
        if len(self._pool) >= _MAX_BLOCKS:  # too small, or still copying: let the oldest go
            self._pool.pop(0)
        return _Block(_round_up(want), pinned=self.cuda)

    # ------------------------------------------------------------------ to the device

    def upload(self, batch: TensorDictBase) -> TensorDictBase:
        """``batch`` (built with ``empty``) on the device: one copy per block, every field a
        view of it. Fields outside the blocks are copied into them first."""
        for key, tensor in list(batch.items(True, True)):  # what the storage did not build (a cat)
            if tensor.numel() and not any(b.holds(tensor) for b in self._filling):
                staged = self._carve(tensor.numel() * tensor.element_size()).view(tensor.dtype).view(tensor.shape)
                staged.copy_(tensor)
                batch.set(key, staged)
        with self._lock:
            blocks, self._filling = self._filling, []
        total = sum(b.used for b in blocks)
        self._want = max(self._want, total)
        copies = [(block, self._copy(block)) for block in blocks]
        self.copies += len(copies)

        def move(tensor: torch.Tensor) -> torch.Tensor:
            if not tensor.numel():
                return torch.empty(tensor.shape, dtype=tensor.dtype, device=self.device)
            for block, dev in copies:
                if block.holds(tensor):
                    size = tensor.element_size()
                    typed = dev[: block.used // size * size].view(tensor.dtype)
                    offset = (tensor.data_ptr() - block.base) // size
                    return typed.as_strided(tensor.shape, tensor.stride(), offset)
            raise AssertionError("staged tensor outside its blocks")  # upload put them all in one

        try:
            return batch.apply(move, device=self.device)  # (keeps the dim names)
        finally:
            with self._lock:
                self._pool.extend(blocks)
                if len(blocks) > 1:  # the first batch: make the block later batches fit in now
                    self._pool.append(_Block(_round_up(total), pinned=self.cuda))
                    del self._pool[: -_MAX_BLOCKS]

    def hand_over(self, batch: Any) -> Any:
        """``batch``, uploaded on the loop thread, made ready on the calling thread's current
        stream: its upload was waited for by the loop thread's stream (the default stream),
        so a stream of the caller's own (``with torch.cuda.stream(s): for batch in
        collector``) waits for the default stream too, on the GPU, and is recorded as a
        user of the batch's memory. Nothing to do on the default stream, off CUDA, or for
        what is not a TensorDict (``None`` from a replay-buffer collection)."""
        if not self.cuda or not isinstance(batch, TensorDictBase):
            return batch
        here = torch.cuda.current_stream(self.device)
        default = torch.cuda.default_stream(self.device)
        if here != default:
            here.wait_stream(default)
            for tensor in batch.values(True, True):
                tensor.record_stream(here)
        return batch

    def _copy(self, block: _Block) -> torch.Tensor:
        """The block's bytes on the device. On CUDA the copy goes on a stream of its own, so
        it overlaps the kernels on the others; the current stream of the thread that uploads
        waits for it on the GPU, and the device memory is released only after the work
        queued there when the batch is freed."""
        if not self.cuda:
            dev = torch.empty(block.used, dtype=torch.uint8, device=self.device)
            return dev.copy_(block.host[: block.used])
        consumer, copies = torch.cuda.current_stream(self.device), self._copies
        assert copies is not None  # (made with a CUDA device)
        with torch.cuda.stream(copies):
            dev = torch.empty(block.used, dtype=torch.uint8, device=self.device)
            dev.copy_(block.host[: block.used], non_blocking=True)
            block.event = copies.record_event()
        consumer.wait_event(block.event)
        dev.record_stream(consumer)
        return dev

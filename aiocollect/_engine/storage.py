"""The main process's side of the rollout storage: policy inputs, what it writes, batches out.

Workers write observations, rewards and flags into the shared storage
(``_workers.shm``, time-major ``[K, T, N, ...]``). This side

* hands the policy its input: column ``t`` of slot ``s`` for a block of rows is one
  contiguous block of shared memory, so the input is a view, never a copy;
* writes what the main process owns, once per round and per block of rows, never per
  env: the policy's outputs (the action included, with the policy's own dtype), the
  policy version, trajectory ids and step counts. These live in private arrays of the
  same shape (the workers never read them);
* turns a finished batch into the user's tensors with one bulk copy per field (the
  transpose to TorchRL's ``[envs, time]`` layout), after which the slot is free again.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .._envs.keyed import ENGINE_FLAGS, NO_ENTRIES
from .._envs.spaces import Leaf, NestedKey
from .._policies.output_writer import OutputSpec, OutputWriter
from .._policies.outputs import NUMPY_DTYPES
from .._workers.shm import SharedArrays
from .batch_plan import BatchPlan
from .batch_plan import StoredValueError as StoredValueError  # (the scheduler's, from here)
from .batch_plan import check_values as check_values  # (named from here by the workers' side)
from .staging import DeviceStaging

_ALIGN = 64


def host_empty(shape: tuple, dtype: np.dtype) -> tuple[torch.Tensor, np.ndarray]:
    """A new CPU tensor and the numpy array it shares its memory with, for numpy to fill.

    * numpy fills it on one thread: torch's copy kernels run large copies on its OpenMP
      threads, which then spin for milliseconds, taking cores from the workers;
    * numpy allocates it: glibc hands numpy's large blocks back for reuse, while torch's
      allocator took fresh pages for every batch (a page fault every few KiB);
    * aligned to 64 bytes, as JAX needs to take the batch without a copy (``to_jax``).
    """
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    start = -raw.ctypes.data % _ALIGN
    view = raw[start : start + nbytes].view(dtype).reshape(shape)
    return torch.from_numpy(view), view


def concat(tensors: list[torch.Tensor], empty: Any = host_empty) -> torch.Tensor:
    """``torch.cat(tensors)``, filled by numpy where it can (see ``host_empty``; ``empty``:
    the allocator, ``host_empty``'s signature)."""
    if all(t.device.type == "cpu" and t.dtype in NUMPY_DTYPES for t in tensors):
        return concat_arrays([t.numpy() for t in tensors], empty)
    return torch.cat(tensors)


def concat_arrays(arrays: list[np.ndarray], empty: Any = host_empty) -> torch.Tensor:
    """``np.concatenate(arrays)`` into a tensor from ``empty`` (``host_empty``'s signature)."""
    out, view = empty((sum(len(a) for a in arrays), *arrays[0].shape[1:]), arrays[0].dtype)
    np.concatenate(arrays, out=view)
    return out


def _concat_plain(arrays: list[np.ndarray]) -> torch.Tensor:
    return torch.from_numpy(np.concatenate(arrays))


class RolloutStorage:
    """See the module docstring. ``step_count``: keep ``step_count`` entries (TorchRL does
    when ``max_frames_per_traj`` is set); ``staging``: build batches in its pinned blocks (a
    GPU storing device); ``outputs``: the policy acts in the workers, which write these
    outputs into ``shared`` (``adopt``)."""

    def __init__(self, shared: SharedArrays, obs_leaves: list[Leaf], *, step_count: bool,
                 entries: tuple = NO_ENTRIES, staging: DeviceStaging | None = None,
                 outputs: list[tuple[NestedKey, np.dtype, tuple]] | None = None):
        layout = shared.layout
        self.next_only, self.engine_flags, self.group_shapes, self.env_batch = entries
        """What the env's batches hold besides observations (``_envs.keyed.batch_entries``):
        leaves kept under ``"next"`` only (a TorchRL env's rewards per group), which of the
        engine's own root entries a batch holds, each nested group's batch dims, and the batch
        dims of an env with several (its envs are rows here)."""
        if self.engine_flags not in ((), ENGINE_FLAGS, ENGINE_FLAGS[:3]):
            raise ValueError(f"entries: the engine's root entries are all kept, none, or all but truncated, "
                             f"not {self.engine_flags}")
        k, t, n = layout.slots, layout.columns, shared.arrays["reward"].shape[2]
        self.slots, self.columns, self.num_envs = k, t, n
        self.keys = [leaf.key for leaf in obs_leaves]
        a = shared.arrays
        self.control = shared.control
        """The workers' control block (``_workers.protocol``), which the scheduler reads its lanes' completions from."""
        self.obs = shared.obs("obs")
        self.next_obs = shared.obs("next_obs")
        self._inputs: dict[tuple[int, int, int, int], dict[NestedKey, torch.Tensor]] = {}
        self._flags: dict[tuple[int, int, int, int], tuple] = {}
        self.reward, self.terminated, self.truncated = a["reward"], a["terminated"], a["truncated"]
        self.action = a["action"]
        self.reset_mask, self.seed, self.seed_set = a["reset_mask"], a["seed"], a["seed_set"]
        self.traj_ids = np.full((k, t, n), -1, dtype=np.int64)
        self.policy_version = np.full((k, t, n), -1, dtype=np.int64)
        self.step_count = np.zeros((k, t, n), dtype=np.int64) if step_count else None
        self.next_step_count = np.zeros((k, t, n), dtype=np.int64) if step_count else None
        self.outputs = OutputWriter(k, t, n)
        """The policy's outputs (``_policies.output_writer``): checked and written as a worker
        acting with its own copy writes them."""
        self.specs: dict[NestedKey, OutputSpec] = self.outputs.specs
        self._out_t = self.outputs.tensors
        self._out_np = self.outputs.arrays
        self._plans: dict[tuple, BatchPlan] = {}
        """Each batch layout's plan (``batch``)."""
        self.staging = staging
        """For a GPU storing device: batches are built in its pinned blocks."""
        if outputs is not None:
            self.adopt(outputs, shared.arrays)

    def adopt(self, outputs: list[tuple[NestedKey, np.dtype, tuple]], arrays: dict[str, np.ndarray]) -> None:
        """The policy's outputs (``(key, dtype, per-env shape)`` each) and versions live in
        the shared fields ``out{i}`` and ``version`` of ``arrays``: the policy runs in the
        workers (``_policies.actor``), which write them."""
        self.outputs.adopt(outputs, arrays)
        self.policy_version = arrays["version"]
        self._plans.clear()  # (they copy from the fields they saw)
        self.policy_version.fill(-1)

    @property
    def empty(self) -> Any:
        """The allocator of batch tensors: ``host_empty``, or the staging's pinned blocks."""
        return host_empty if self.staging is None else self.staging.empty

    # ------------------------------------------------------------------ rounds

    def policy_input(self, s: int, t: int, lo: int, hi: int) -> dict[NestedKey, torch.Tensor]:
        """The observations of envs ``lo:hi`` at column ``t`` of slot ``s``: views (made
        once per block and column: indexing a tensor costs microseconds)."""
        key = (s, t, lo, hi)
        views = self._inputs.get(key)
        if views is None:
            views = self._inputs[key] = {k: torch.from_numpy(x[s, t, lo:hi]) for k, x in zip(self.keys, self.obs)}
        return views

    def policy_inputs(self, blocks: list[tuple[int, int, int, int]],
                      aligned: bool = False) -> dict[NestedKey, torch.Tensor]:
        """The observations of several blocks of envs, ``(s, t, lo, hi)`` each (as in
        ``policy_input``), one block after the other: one ``np.concatenate`` per field
        (``aligned``: into 64-byte aligned memory, which XLA reads in place)."""
        join = concat_arrays if aligned else _concat_plain
        return {k: join([x[s, t, lo:hi] for s, t, lo, hi in blocks]) for k, x in zip(self.keys, self.obs)}

    def flags(self, s: int, t: int, lo: int, hi: int, cache: bool = True) -> tuple:
        """``terminated``, ``truncated`` and ``next_step_count`` (``None`` if not kept) of
        envs ``lo:hi`` at column ``t`` of slot ``s``: views, made once per block and column
        (``cache=False``: made now, for blocks too many to keep)."""
        key = (s, t, lo, hi)
        views = self._flags.get(key)
        if views is None:
            nsc = self.next_step_count
            views = (self.terminated[s, t, lo:hi], self.truncated[s, t, lo:hi],
                     None if nsc is None else nsc[s, t, lo:hi])
            if cache:
                self._flags[key] = views
        return views

    def gather(self, s: int | np.ndarray, cols: np.ndarray, rows: np.ndarray) -> dict[NestedKey, torch.Tensor]:
        """The observations of envs ``rows``, each at its own column ``cols`` of slot ``s``
        (one fancy index per field: a copy of just those envs; ``s`` may be one slot per env)."""
        return {k: torch.from_numpy(x[s, cols, rows]) for k, x in zip(self.keys, self.obs)}

    def write_rows(self, s: int | np.ndarray, cols: np.ndarray, rows: np.ndarray, out: dict[NestedKey, Any],
                   version: int, traj_ids: np.ndarray, step_count: np.ndarray, action: np.ndarray | None) -> None:
        """``write`` for envs ``rows``, each at its own column ``cols`` of slot ``s`` (or of
        its own slot, ``s[j]``): row ``j`` of each output goes to env ``rows[j]`` (fancy
        indexing, no loop)."""
        self.policy_version[s, cols, rows] = version
        self.traj_ids[s, cols, rows] = traj_ids[rows]
        if self.step_count is not None:
            self.step_count[s, cols, rows] = step_count[rows]
        self.outputs.write((s, cols, rows), out, action)

    def write(self, s: int, t: int, lo: int, hi: int, out: dict[NestedKey, Any], start: int, version: int,
              traj_ids: np.ndarray, step_count: np.ndarray, action: np.ndarray | None = None) -> None:
        """Column ``t`` of slot ``s`` for envs ``lo:hi``: the policy's outputs (rows
        ``start:start + hi - lo`` of each value in ``out``; ``action``: ``out["action"]``
        as a numpy array, if the caller made one), its version, ids, step counts."""
        stop = start + hi - lo
        self.policy_version[s, t, lo:hi] = version
        self.traj_ids[s, t, lo:hi] = traj_ids[lo:hi]
        if self.step_count is not None:
            self.step_count[s, t, lo:hi] = step_count[lo:hi]
        whole = start == 0 and stop == len(action if action is not None else next(iter(out.values())))
        self.outputs.write_block(s, t, lo, hi, out, action, None if whole else slice(start, stop))

    def write_run(self, s: int, t: int, lo: int, hi: int, action: np.ndarray, version: int,
                  stored: np.ndarray | None = None) -> None:
        """Columns ``t`` to ``t + len(action) - 1`` of envs ``lo:hi``, before a run of steps
        with actions drawn in advance (``[steps, envs, ...]``, the only output): the envs'
        actions, the stored ones (``stored``, if the batch holds them in another encoding:
        a one-hot env's rows, ``RandomPolicy.encode``), the version. Ids and step counts
        come after the run (``ran``): they depend on which steps ended an episode."""
        stop = t + len(action)
        self.action[t:stop, lo:hi] = action
        stored = action if stored is None else stored
        field = self.outputs.field("action", stored[0])
        assert field is not None  # (an action numpy has the dtype of: drawn in the workers)
        field[s, t:stop, lo:hi] = stored
        self.policy_version[s, t:stop, lo:hi] = version

    def ran(self, s: int, t: int, lo: int, hi: int, ids: np.ndarray, counts: np.ndarray) -> None:
        """After that run: the trajectory ids and step counts before each of its steps
        (``Timelines.ran``'s, ``[steps + 1, envs]``)."""
        stop = t + len(ids) - 1
        self.traj_ids[s, t:stop, lo:hi] = ids[:-1]
        if self.step_count is not None and self.next_step_count is not None:
            self.step_count[s, t:stop, lo:hi] = counts[:-1]
            np.add(counts[:-1], 1, out=self.next_step_count[s, t:stop, lo:hi])

    def carried(self, keys: tuple) -> list[tuple[int, NestedKey]]:
        """The policy outputs among ``keys`` that the next step starts from: ``("next", k)``
        for an observation ``k`` (a recurrent state, which an env's ``TensorDictPrimer``
        keys), as ``(index of k, output key)``. See ``carry``."""
        pairs: list[tuple[int, NestedKey]] = []
        for key in keys:
            if isinstance(key, tuple) and len(key) > 1 and key[0] == "next":
                root = key[1] if len(key) == 2 else key[1:]
                if root in self.keys:
                    pairs.append((self.keys.index(root), key))
        return pairs

    def carry(self, s: int, t: int, lo: int, hi: int, pairs: list[tuple[int, NestedKey]], reset: bool) -> None:
        """After the step at column ``t`` of envs ``lo:hi``: the policy's ``("next", k)``
        outputs (``pairs``, from ``carried``) become ``k`` of the next observation, and of
        the observation the next step starts from, as TorchRL's ``step_mdp`` carries a
        recurrent policy's state (a primer copies the state it is given, so the env's own
        value is the one it started from). Envs the step ended (``reset``: and that their
        worker reset) keep the reset's value, as after TorchRL's reset."""
        rows = slice(lo, hi)
        keep = None
        if reset:
            keep = ~(self.terminated[s, t, rows] | self.truncated[s, t, rows])
        for i, key in pairs:
            value = self._out_np[key]
            value = (self._out_t[key][s, t, rows].float().numpy() if value is None else value[s, t, rows])
            self.next_obs[i][s, t, rows] = value
            if keep is None:
                self.obs[i][s, t + 1, rows] = value
            else:
                np.copyto(self.obs[i][s, t + 1, rows], value, where=keep.reshape(-1, *[1] * (value.ndim - 1)))

    def reserve(self, out: dict[NestedKey, Any]) -> None:
        """Allocate the policy outputs ``out`` (a call's, one row per env) that have no field yet."""
        for key, value in out.items():
            self.outputs.field(key, value)

    def check_outputs(self, out: dict[NestedKey, Any], keys: tuple) -> None:
        """The policy wrote the same keys, shapes and dtypes as on the batch's first step."""
        if tuple(out) != keys:
            new = [k for k in out if k not in keys]
            raise KeyError(
                f"policy: wrote {new or list(out)!r} at this step but {list(keys)!r} on the batch's "
                "first step; a policy must write the same keys at every step."
            )

    # ------------------------------------------------------------------ batches

    def shift(self, s: int, lo: int, hi: int, count: int, filled: int) -> None:
        """Forget the first ``count`` of the ``filled`` columns of envs ``lo:hi``: the
        others (and the observation the next step starts from) move to the front."""
        rows = slice(lo, hi)
        for x in self.obs:
            x[s, : filled + 1 - count, rows] = x[s, count : filled + 1, rows].copy()
        fields: list[np.ndarray | torch.Tensor] = [
            *self.next_obs, self.reward, self.terminated, self.truncated, self.traj_ids, self.policy_version,
            *(x for x in (self.step_count, self.next_step_count) if x is not None)]
        fields += [x if x is not None else self._out_t[k] for k, x in self._out_np.items()]
        for f in fields:
            part = f[s, count:filled, rows]
            f[s, : filled - count, rows] = part.clone() if isinstance(part, torch.Tensor) else part.copy()

    def batch(self, s: int, lo: int, hi: int, frames: int, valid: np.ndarray, keys: tuple,
              start_flags: np.ndarray | None, mask: bool, empty: Any = None,
              fresh: Any = ()) -> dict[NestedKey | tuple, torch.Tensor]:
        """The tensors of envs ``lo:hi``, ``[envs, frames, ...]``, copied out of slot ``s``
        (by the plan of that layout, made at its first batch: ``_engine.batch_plan``).

        ``valid[i]``: the columns env ``lo + i`` filled (the rest is blanked: zeros, ids
        and versions -1); ``keys``: the policy outputs written; ``start_flags``: the root
        done flags of the first column, when ``reset_when_done`` is off (``None``: all false),
        and ``fresh``, the ``(column, envs)`` of resets later in the batch (false there too);
        ``empty``: the allocator (by default one block of host memory per batch, or the
        staging's pinned blocks; parts to be joined take ``host_empty``).
        """
        layout = (s, lo, hi, frames, keys, mask)
        plan = self._plans.get(layout)
        if plan is None:
            plan = self._plans[layout] = BatchPlan(self, s, lo, hi, frames, keys, mask)
        return plan.run(valid, start_flags, fresh, empty or (None if self.staging is None else self.staging.empty))

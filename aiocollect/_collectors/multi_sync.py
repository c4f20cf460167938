"""``MultiSyncCollector``: envs in worker processes, one batch from all of them at a time.

The variant only says when a batch is cut (every worker has its share, or a fraction
``preemptive_threshold`` of them) and how the workers' batches are joined
(``cat_results``); the class docstring says what users see.
"""

from __future__ import annotations

import time

import torch
from tensordict import TensorDictBase

from .._workers.plan import WorkerPlan
from .delivery import MASK
from .options import CollectorOptions, WorkerOptions, as_int, fit_to_envs
from .worker_collectors import WorkerCollectorBase


class MultiSyncCollector(WorkerCollectorBase):
    """Collects each batch from envs in worker processes, all workers at once, on demand.

    TorchRL's ``MultiSyncCollector``; it is also exported as ``MultiSyncDataCollector``,
    TorchRL's seed-era name. Each entry of ``create_env_fn`` is one worker process (a fresh
    interpreter, nothing forked); the policy runs in this process once per round, batched
    over the envs of every worker that is ready, or, where that costs more than the policy
    itself (a small policy on the CPU), each worker acts with its own copy
    (``policy_in_workers``). Workers step at their own
    pace, and the batch is delivered when every worker has its share: each env takes
    ``frames_per_batch // num_envs`` steps, ``num_envs`` counted over all workers. A list
    ``frames_per_batch`` (TorchRL's, one share per worker) is its sum, the shares in
    proportion to the workers' envs.

    **When to use it.** On-policy training (PPO, A2C) with envs whose step costs real CPU
    time: nothing is collected between batches, so every batch comes from the weights
    current when it was asked for. With 8 envs whose step spins ~1 ms of CPU, 2 workers
    collect 1.85x as fast as one process on 2 cores (``benchmarks/``). For envs that cost
    microseconds per step, [`Collector`][aiocollect.Collector] is faster; to keep
    collecting while you train, or when a slow worker must not hold back the others, use
    [`MultiAsyncCollector`][aiocollect.MultiAsyncCollector].

    **Batches.** With ``cat_results="stack"`` (the default), ``[num_workers, T]`` when each
    worker has one env, ``[num_workers, envs_per_worker, T]`` when each has a list of
    factories or a ``VectorEnv``; every worker then needs the same number of envs. An
    integer ``cat_results`` concatenates the workers' batches along that dim instead
    (``cat_results=0`` with 2 workers of 3 envs: ``[6, T]``). The last dim is named
    ``"time"``. The number of workers is ``len(create_env_fn)`` (there is no
    ``num_workers`` argument; ``collector.num_workers`` holds it).

    Args:
        create_env_fn: one entry per worker: an env factory (a callable returning a
            gymnasium env, a coroutine env or a gymnasium ``VectorEnv``), an env id, or a
            list of those (several envs stepped one after the other in that worker). Not
            env instances: each worker builds its own envs. Entries travel with
            cloudpickle: lambdas and closures work, no ``if __name__ == "__main__"``
            guard needed. An entry that builds coroutine envs runs on the engine loop, in
            this process, instead of in a worker process.
        policy: as for [`Collector`][aiocollect.Collector]; it runs in this process,
            batched over every ready worker's envs, or as a copy in each worker, chosen as
            the collector is built: a torch module on the CPU goes there when the workers
            take every core or when its call there costs less than a round here (a small
            MLP, usually); a GPU or JAX policy, a plain function, one that changes its
            own state while acting, or one for an env with several action keys (a TorchRL
            multi-agent env) stays here (``policy_in_workers`` says which,
            ``placement_costs`` what was measured).
        cat_results: ``"stack"`` (default; ``None`` means the same) or an int: the dim
            along which to concatenate the workers' batches.
        preemptive_threshold: a fraction in (0, 1]: deliver the batch as soon as
            ``ceil(p * num_workers)`` workers have their share. The others stop after the
            step they are taking; the frames they did not collect are zeros, marked
            ``False`` in ``("collector", "mask")`` (their trajectory id and policy version
            are -1). Concatenated along time (``cat_results=-1``), they are left out
            instead, as TorchRL leaves them out: the batch is shorter, has no mask, and
            each trajectory's frames follow each other.
        update_at_each_batch: call ``update_policy_weights_()`` before each batch, sending
            the weights of the policy object given at construction.
        step_timeout: seconds a worker may take to answer a step or reset (``None``, the
            default: wait forever). For an entry of coroutine envs, an env call that takes
            longer is cancelled; a worker process with a command outstanding longer is
            killed, after its Python stack is read (or it is named as stopped, if it was
            stopped with ``SIGSTOP``). Either way the collection fails with a
            [`StepTimeoutError`][aiocollect.StepTimeoutError] naming the worker, its pid and
            envs, between ``step_timeout`` and ``step_timeout + 2`` s after the step was sent;
            the other workers are stopped. Give the slowest step you accept, with room to spare.
        start_timeout: seconds the worker processes may take to start (each a fresh
            interpreter that imports what the env factories need and builds its envs;
            default 300, ``None``: no bound). The constructor returns once every worker is
            up; past the bound it raises a [`StartTimeoutError`][aiocollect.StartTimeoutError]
            naming the workers not up (killed, their Python stacks in the message) and those
            that were (stopped). Raise it on a loaded machine, or for envs slow to build.
        max_batch_size: not accepted (``ValueError``), nor ``min_batch_size`` and
            ``batch_timeout``: they shape per-env policy calls over coroutine envs, and
            here each entry's envs step together; step such envs in a
            [`Collector`][aiocollect.Collector]. ``reset_when_done=False`` is refused for
            coroutine envs, as in every collector.
        max_policy_lag: not accepted (``ValueError``): a batch is collected after you
            ask for it, so only updates made during that batch can age it. The bound is
            [`MultiAsyncCollector`][aiocollect.MultiAsyncCollector]'s.
        num_threads: accepted for TorchRL compatibility; no effect (a worker runs torch
            only for its copy of the policy, on one thread).
        num_sub_threads: as ``num_threads``.

    The other arguments are the options every collector shares: see
    [`CollectorOptions`][aiocollect.CollectorOptions]. With an ``interruptor``, the batch
    is cut as soon as it reports ``collection_stopped()``, the rest masked out as above.

    Everything is checked before any process starts: every entry is cloudpickled (a
    failure names it), and each distinct entry is built once here and closed, to learn its
    spaces.

    Raises:
        ValueError: the workers' spaces differ, ``cat_results="stack"`` with workers of different env counts,
            an out-of-range ``cat_results`` dim, or ``max_policy_lag`` given.
        TypeError: ``create_env_fn`` is not a list, or an entry is an env instance or
            cannot be pickled.

    Examples:
        >>> from aiocollect import MultiSyncCollector, GymEnv
        >>> env_maker = lambda: GymEnv("Pendulum-v1")
        >>> collector = MultiSyncCollector([env_maker] * 4, policy, frames_per_batch=400,
        ...                                total_frames=40_000, max_frames_per_traj=50)
        >>> for data in collector:          # data.shape == (4, 100): [workers, time]
        ...     train(data)
        ...     collector.update_policy_weights_()
        >>> collector.shutdown()

        Two workers of 8 envs each, batches ``[2, 8, 25]``; cut when one worker is done:

        >>> collector = MultiSyncCollector([[env_maker] * 8] * 2, policy, frames_per_batch=400,
        ...                                preemptive_threshold=0.5)
    """

    def _check_plan(self, plan: WorkerPlan, options, worker_options: WorkerOptions) -> CollectorOptions:
        n = plan.num_envs
        shares = self._worker_frames
        if shares is not None and any(share * n != options.frames_per_batch * w.num_envs
                                      for share, w in zip(shares, plan.workers)):
            envs = [w.num_envs for w in plan.workers]
            raise ValueError(
                f"frames_per_batch={list(shares)!r}: a MultiSyncCollector steps every env as many times per "
                f"batch (one batch of [workers, envs, time]), so each worker's share is its envs ({envs}) "
                f"times the steps per env; these shares give their envs different numbers of steps. Give "
                f"shares in proportion to the envs, one int ({options.frames_per_batch}) for the whole batch, "
                "or use MultiAsyncCollector, whose batches are each one worker's."
            )
        options = fit_to_envs(options, n, f"the {n} envs of {len(plan.workers)} workers", stacklevel=4)
        cat = worker_options.cat_results
        counts = {w.num_envs for w in plan.workers}
        if cat == "stack" and len(counts) > 1:
            raise ValueError(
                f"cat_results='stack' needs the same number of envs in every worker, got "
                f"{[w.num_envs for w in plan.workers]}; give every worker the same number of envs, "
                "or concatenate with cat_results=0."
            )
        ndim = 2 if plan.workers[0].batched else 1
        if isinstance(cat, int) and not -ndim <= cat < ndim:  # (else "stack")
            raise ValueError(
                f"cat_results={cat}: each worker's batch has {ndim} dim(s) "
                f"({'[envs, time]' if ndim == 2 else '[time]'}); use a dim in {-ndim}..{ndim - 1} or 'stack'."
            )
        if worker_options.max_policy_lag is not None:
            raise ValueError(
                "max_policy_lag: a MultiSyncCollector collects each batch after you ask for it, "
                "so only updates made during that batch can age it; the bound is for "
                "MultiAsyncCollector, which collects ahead. Remove the argument."
            )
        self._mask = options.interruptor is not None or worker_options.preemptive_threshold is not None
        return options

    def _steps_per_env(self, num_envs: int) -> int:
        return self.options.frames_per_batch // self.num_envs

    def frames_per_batch_worker(self, *, worker_idx: int | None = None) -> int:
        """Frames each worker contributes to a batch: TorchRL's ``frames_per_batch_worker()``.

        Each env takes ``frames_per_batch // num_envs`` steps, so a worker's share is that
        times its env count (TorchRL's ``ceil(frames_per_batch / num_workers)`` when every
        worker has the same number of envs).

        Args:
            worker_idx: the worker; ``None``: the share every worker has.

        Returns:
            The worker's frames per batch.

        Raises:
            ValueError: ``worker_idx`` is ``None`` and the workers' shares differ (their env
                counts do, with an integer ``cat_results``), or it names no worker.
        """
        steps = self._steps_per_env(0)
        shares = [steps * w.num_envs for w in self._plan.workers]
        if worker_idx is None:
            if len(set(shares)) > 1:
                raise ValueError(f"frames_per_batch_worker: the workers' shares differ ({shares}); "
                                 "pass worker_idx=...")
            return shares[0]
        index = as_int(worker_idx)
        if index is None or not 0 <= index < len(shares):
            raise ValueError(f"frames_per_batch_worker: worker_idx={worker_idx!r} names no worker "
                             f"(0..{len(shares) - 1}).")
        return shares[index]

    async def _collect_here(self) -> tuple[TensorDictBase, int]:
        opts, wopts = self.options, self.worker_options
        sched = self._scheduler
        lanes = sched.lanes
        if wopts.update_at_each_batch:
            self.update_policy_weights_()
        if all(lane.held for lane in lanes):  # not resuming a batch an earlier call left midway
            await sched.settle()
            if opts.reset_at_each_iter:
                sched.timelines.request_reset()
            steps = self._steps_per_env(0)
            for lane in lanes:
                sched.begin(lane, steps, self._mask)
        workers = self._worker_lanes
        need = len(workers)
        if wopts.preemptive_threshold is not None:
            need = max(1, min(need, int(-(-wopts.preemptive_threshold * len(workers) // 1))))
        interruptor = opts.interruptor
        profile = sched.profile
        first_share: list[float] = []  # when the first worker had its share (profiled only)

        def cut() -> bool:
            if interruptor is not None and interruptor.collection_stopped():
                return any(lane.t for lane in lanes)  # as Collector (and TorchRL): every batch takes a step
            if profile is not None and not first_share and any(all(lane.full for lane in p) for p in workers):
                first_share.append(time.perf_counter())
            if need == len(workers):
                return all(lane.full for lane in lanes)
            return sum(all(lane.full for lane in parts) for parts in workers) >= need

        runner = self._runner()
        await sched.pump(lambda: runner, cut)
        if profile is not None and first_share:
            profile.straggled(time.perf_counter() - first_share[0])
        if not all(lane.full for lane in lanes):
            await sched.settle()  # the stragglers finish the step they are taking
        sealed = [sched.seal(lane, opts.set_truncated) for lane in lanes]
        try:
            tensors = sched.batch_all(sealed)
        finally:
            for b in sealed:
                sched.release(b)
        frames = sum(b.valid * b.lane.num_envs for b in sealed)
        return self._join(tensors, sealed[0].frames), frames

    _part_sizes: tuple = ([], None)
    """The workers' sizes along the dim their batches are concatenated on, and that dim
    (``None``: stacked), as the last ``_join`` made them."""

    def _hooked_parts(self) -> int:
        return self.num_workers  # (each TorchRL worker calls pre_collect_hook before its share)

    def _worker_parts(self, batch: TensorDictBase) -> list:
        """The joined batch as each worker's batch (views): along the workers' dim when stacked,
        split along the dim of concatenation otherwise (by the sizes ``_join`` recorded)."""
        if self.worker_options.cat_results == "stack":
            return list(batch.unbind(0))
        sizes, dim = self._part_sizes
        if dim is None or sum(sizes) != batch.shape[dim]:
            return [batch]
        return list(batch.split(sizes, dim))

    def _join(self, tensors: dict, steps: int) -> TensorDictBase:
        """The ``[num_envs, T]`` tensors of every worker joined as ``cat_results`` says."""
        workers = self._plan.workers
        n, w = self.num_envs, len(workers)
        cat = self.worker_options.cat_results
        batched = workers[0].batched
        self._part_sizes = ([], None)
        if not batched:  # one env per worker: each worker's batch is [T]
            if cat == "stack":
                return self._tensordict(tensors, [w, steps])
            if self._mask:  # each worker's [T], less the steps it did not take (as TorchRL)
                parts = [_filled(self._tensordict({k: v[i] for k, v in tensors.items()}, [steps])) for i in range(w)]
                self._part_sizes = ([p.shape[0] for p in parts], 0)
                return _filled(torch.cat(parts, 0))
            self._part_sizes = ([steps] * w, 0)
            return self._tensordict({k: v.reshape(w * steps, *v.shape[2:]) for k, v in tensors.items()}, [w * steps])
        if cat == "stack":
            e = n // w
            return self._tensordict({k: v.reshape(w, e, *v.shape[1:]) for k, v in tensors.items()}, [w, e, steps])
        if cat in (0, -2):
            self._part_sizes = ([spec.num_envs for spec in workers], 0)
            return self._tensordict(tensors, [n, steps])
        # along time: [envs, workers * T], each worker's [envs, T] side by side
        parts, lo = [], 0
        for spec in workers:
            part = self._tensordict({k: v[lo:spec.hi] for k, v in tensors.items()}, [spec.num_envs, steps])
            parts.append(_filled(part) if self._mask else part)
            lo = spec.hi
        self._part_sizes = ([p.shape[-1] for p in parts], -1)
        out: TensorDictBase = torch.cat(parts, cat)
        if self._mask:
            out = _filled(out)
        out.refine_names(*([None] * (out.ndim - 1)), "time")
        return out



def _filled(part: TensorDictBase) -> TensorDictBase:
    """A worker's batch along time (``cat_results=-1``) as TorchRL's ``MultiSyncCollector`` gives
    it when ``preemptive_threshold`` (or an ``interruptor``) cut the batch: the time steps no env
    of the worker took are left out, so each trajectory's frames follow each other (TorchRL's
    ``split_trajectories`` counts each id's frames), and the ``("collector", "mask")`` goes
    once every frame left is real; a step some envs took and others not (a worker stepped in
    halves) keeps its masked frames, and the mask with them."""
    mask = part.get(MASK, None)
    if mask is None:
        return part
    if mask.all():
        return part.exclude(MASK)
    taken = mask.reshape(-1, mask.shape[-1]).any(0)
    part = part[..., taken]
    return part.exclude(MASK) if part.get(MASK).all() else part


MultiSyncDataCollector = MultiSyncCollector

"""``MultiSyncCollector``: envs in worker processes, one batch from all of them at a time.

>>> from aiocollect import MultiSyncCollector, GymEnv
>>> env_maker = lambda: GymEnv("Pendulum-v1")
>>> collector = MultiSyncCollector([env_maker] * 4, policy, frames_per_batch=400,
...                                total_frames=40_000, max_frames_per_traj=50)
>>> for data in collector:          # data.shape == (4, 100): [workers, time]
...     collector.update_policy_weights_()

Each env takes ``frames_per_batch // num_envs`` steps per batch. Workers step at their own
pace (the policy runs on whichever are ready) and the batch is delivered when every
worker has its share, or, with ``preemptive_threshold=p``, as soon as a fraction ``p`` of
them has it: the others stop after the step they are taking, and the frames they did not
collect are zeros masked out by ``("collector", "mask")``. Nothing is collected between
batches, so every batch comes from the weights current when it was asked for (on-policy).

Batches are ``[workers, (envs per worker,) T]`` with ``cat_results="stack"``; an integer
``cat_results`` concatenates the workers' batches along that dim instead.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

from .._engine.scheduler import Slot
from .._workers.plan import WorkerPlan
from .options import WorkerOptions
from .workers import WorkerCollectorBase


class MultiSyncCollector(WorkerCollectorBase):
    """Synchronous multi-process collector (TorchRL's ``MultiSyncCollector``); see the module docstring."""

    def _check_plan(self, plan: WorkerPlan, options, worker_options: WorkerOptions) -> None:
        n, fpb = plan.num_envs, options.frames_per_batch
        if fpb % n:
            lower = fpb // n * n
            raise ValueError(
                f"frames_per_batch={fpb} does not split evenly over the {n} envs of "
                f"{len(plan.workers)} workers; use a multiple of {n}, such as {lower or n} or {lower + n}."
            )
        cat = worker_options.cat_results
        counts = {w.num_envs for w in plan.workers}
        if cat == "stack" and len(counts) > 1:
            raise ValueError(
                f"cat_results='stack' needs the same number of envs in every worker, got "
                f"{[w.num_envs for w in plan.workers]}; give every worker the same number of envs, "
                "or concatenate with cat_results=0."
            )
        ndim = 2 if plan.workers[0].batched else 1
        if cat != "stack" and not -ndim <= cat < ndim:
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

    def _steps_per_env(self, slot: Slot) -> int:
        return self.options.frames_per_batch // self.num_envs

    async def _collect_here(self) -> tuple[TensorDictBase, int]:
        opts, wopts = self.options, self.worker_options
        sched = self._scheduler
        slots = sched.slots
        if wopts.update_at_each_batch:
            self.update_policy_weights_()
        if all(s.held for s in slots):  # not resuming a batch an earlier call left midway
            await sched.settle()
            for s in slots:
                if opts.reset_at_each_iter:
                    s.engine.request_reset()
                s.begin(self._steps_per_env(s), self._mask)
        need = len(slots)
        if wopts.preemptive_threshold is not None:
            need = max(1, min(need, int(-(-wopts.preemptive_threshold * len(slots) // 1))))
        interruptor = opts.interruptor

        def cut() -> bool:
            if interruptor is not None and interruptor.collection_stopped():
                return True
            return sum(s.full for s in slots) >= need

        runner = self._runner()
        await sched.pump(lambda: runner, cut)
        if not all(s.full for s in slots):
            await sched.settle()  # the stragglers finish the step they are taking
        like = next((s.buffer for s in slots if s.buffer is not None), None)
        parts = [self._slot_batch(s, like) for s in slots]
        frames = sum(f for _, f in parts)
        tds = [td for td, _ in parts]
        if wopts.cat_results == "stack":
            out = torch.stack(tds, 0)
        else:
            out = torch.cat(tds, wopts.cat_results)
        out.refine_names(*([None] * (out.ndim - 1)), "time")
        return out, frames


MultiSyncDataCollector = MultiSyncCollector

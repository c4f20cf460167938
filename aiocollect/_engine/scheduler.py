"""The scheduler: many worker groups, each at its own pace, one policy call per round.

Each worker is a *slot*: an ``Engine`` (trajectory ids, step counts,
resets: the same bookkeeping the lockstep collector uses) over the worker's rows of the
shared-memory arrays, plus a cursor into the slot's current batch buffer. A slot is
``READY`` (its observations are fresh: it wants actions), ``STEPPING`` (its worker is
stepping the envs) or ``RESETTING`` (its worker is resetting some envs).

``Scheduler.pump()`` runs rounds until the caller's condition holds. Everything
happens in the loop's callbacks, with no task switch per step:

1. a worker's reply arrives (the socket's reader callback): a stepped slot writes its
   column at once and moves its cursor;
2. a round starts right away if no other worker is in flight, else on the next loop
   pass, so that replies landing together share a round;
3. the round resets the ready slots that need it (envs the worker already reset after
   they finished just swap in the observation it left aside; anything else, seeds or
   truncation by ``max_frames_per_traj``, is a ``RESET`` round trip), runs the policy
   **once** on the observations of every ready slot (a view of shared memory when they
   are all ready, a concatenation otherwise), writes the actions into shared memory and
   sends each of those workers one ``STEP`` byte.

So inference is batched over whatever is ready, and a slow worker never holds back a
fast one. *When* a batch is cut is the collector's business: ``until``, ``on_full`` and
``hold`` are its levers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import anyio
import numpy as np
import torch

from .._envs.group import _GroupBase
from .._policies.runner import PolicyRunner
from .._workers import protocol
from .._workers.pool import Worker, WorkerPool
from .buffer import RolloutBuffer
from .engine import Engine, IdPool

READY, STEPPING, RESETTING = "ready", "stepping", "resetting"  # compared with ``is``

_SLICE_S = 0.001
"""Longest stretch of spinning rounds before the loop gets a turn."""
_RECHECK_S = 0.002
"""After spinning: how soon to look again for a completion whose doorbell was missed."""


class Slot:
    """One worker as the scheduler sees it."""

    def __init__(self, worker: Worker, engine: Engine, rows: dict[str, np.ndarray], num_obs: int):
        self.worker = worker
        self.index = worker.index
        self.engine = engine
        self.num_envs = engine.num_envs
        self.lo, self.hi = worker.lo, worker.hi
        self.obs = [rows[f"obs{i}"] for i in range(num_obs)]
        self.reset_obs = [rows[f"reset_obs{i}"] for i in range(num_obs)]
        self.pre_reset = rows["pre_reset"]
        self.reset_mask = rows["reset_mask"]
        self.seed, self.seed_set = rows["seed"], rows["seed_set"]
        self.action = rows["action"]
        self.state = READY
        self.held = True
        """No new steps while held (between batches, or while its last batch waits)."""
        self.buffer: RolloutBuffer | None = None
        self.frames = 0
        self.t = 0
        self.mask = False
        self.start_flags = engine.start_flags()
        self._resetting: np.ndarray | None = None

    @property
    def full(self) -> bool:
        return self.t >= self.frames

    @property
    def in_flight(self) -> bool:
        return self.state is not READY

    def swap_in_resets(self, finished: np.ndarray) -> None:
        """Envs that just finished and that the worker already reset: their next
        episode's first observation, left aside in ``reset_obs``, becomes current now."""
        if not self.engine.has_seeds and self.pre_reset[finished].all():
            self.take_worker_resets(finished)
        # else a reset round trip will do it

    def take_worker_resets(self, idx: np.ndarray) -> None:
        """Envs ``idx``, which the worker reset on its own, start their next episode."""
        for obs, fresh in zip(self.obs, self.reset_obs):
            obs[idx] = fresh[idx]
        self.pre_reset[idx] = False
        self.engine.resets_done(idx)

    def drop_older_than(self, version: int) -> int:
        """Drop the steps of the batch in progress whose actions came from a policy older
        than ``version`` (a prefix: versions only grow); returns the frames dropped."""
        buffer = self.buffer
        if buffer is None or self.t == 0:
            return 0
        count = int(np.searchsorted(buffer.policy_version[0, : self.t], version))
        if count == 0:
            return 0
        term, trunc = buffer.terminated[:, count - 1], buffer.truncated[:, count - 1]
        self.start_flags = np.stack([term | trunc, term, trunc])  # the kept part's first root flags
        buffer.drop_first(count, self.t)
        self.t -= count
        return count * self.num_envs

    def begin(self, frames: int, mask: bool) -> None:
        """Start a new batch of ``frames`` steps per env (its buffer comes with the first step)."""
        self.buffer, self.frames, self.t, self.mask = None, frames, 0, mask
        self.start_flags = self.engine.start_flags()
        self.held = False

    def finish(self, set_truncated: bool, like: RolloutBuffer | None = None) -> tuple[RolloutBuffer, int]:
        """Close the batch: ``(buffer, valid steps)``. ``like`` lends its layout to a slot
        that never stepped (a preempted straggler)."""
        if self.buffer is None:
            self.buffer = self.engine.new_buffer(like.outputs, self.frames, self.mask)
        valid = self.t
        self.engine.finish(self.buffer, valid, self.start_flags, set_truncated)
        buffer, self.buffer = self.buffer, None
        self.held = True
        return buffer, valid


class Scheduler:
    """Drives every worker of a ``WorkerPool``; see the module docstring."""

    def __init__(self, pool: WorkerPool, *, max_frames_per_traj: int | None, reset_when_done: bool):
        plan, shared = pool.plan, pool.shared
        self.ids = IdPool()
        self.slots: list[Slot] = []
        num_obs = shared.layout.num_obs
        template = _GroupBase(plan.observation_space, plan.action_space, 1, None)
        self.obs_leaves = template.obs_leaves
        self.check_action = template.check_action
        for worker in pool.workers:
            rows = shared.rows(worker.lo, worker.hi)
            group = _GroupBase(plan.observation_space, plan.action_space, worker.num_envs, None)
            group.bind({leaf.key: rows[f"obs{i}"] for i, leaf in enumerate(group.obs_leaves)},
                       rows["reward"], rows["terminated"], rows["truncated"])
            engine = Engine(group, max_frames_per_traj=max_frames_per_traj,
                            reset_when_done=reset_when_done, ids=self.ids)
            self.slots.append(Slot(worker, engine, rows, num_obs))
            worker.on_reply = self._on_reply
        self.num_envs = plan.num_envs
        self._all_obs = {
            leaf.key: torch.from_numpy(shared.arrays[f"obs{i}"]) for i, leaf in enumerate(self.obs_leaves)
        }
        self._action = shared.arrays["action"]
        self._pumping: tuple[Callable[[], PolicyRunner], Callable[[], bool]] | None = None
        self._on_full: Callable[[Slot], None] | None = None
        self._waiter: asyncio.Future | None = None
        self._advance_soon = False
        self._recheck_armed = False
        self._delivered = False
        self._failed: Worker | None = None
        self._error: BaseException | None = None
        self.spin_s = pool.spin_s
        """How long to spin for a completion before sleeping (0: never; see ``_workers.protocol``)."""
        self.spin = False
        """Set by the collector while spinning is welcome: while its consumer waits for a
        batch, the engine thread has the GIL to itself. (Spinning while the user trains in
        another thread would take the GIL away from the training.)"""

    # ------------------------------------------------------------------ events
    #
    # Completions are taken in the loop's callbacks, with no task switch: a doorbell's
    # reader callback takes every completed command at once, and the next round starts
    # right there when no other worker is in flight (else on the next loop pass, so that
    # replies landing together share one policy call). When spinning is on, a round is
    # followed by a short spin for the next completion, which saves the round trip its
    # two kernel wakeups. The pump task only sleeps until its condition holds.

    def _on_reply(self, worker: Worker) -> None:
        """A doorbell or an error report from ``worker`` (its socket's reader callback)."""
        if worker.error is not None:
            if self._failed is None:
                self._failed = worker
            self._wake()
            return
        self._harvest()
        if self._pumping is None:
            self._wake()  # nobody pumping: let a settle() see it
        elif self.idle():
            self._advance()
        else:
            self.poke()

    def _harvest(self) -> bool:
        """Take in every completed command; ``True`` if there was one."""
        got = False
        for slot in self.slots:
            if slot.state is not READY and slot.worker.completed():
                self._take(slot)
                got = True
        return got

    def _take(self, slot: Slot) -> None:
        if slot.state is STEPPING:
            finished = slot.engine.write_after(slot.buffer, slot.t)
            if finished is not None:
                slot.swap_in_resets(finished)
            slot.worker.env_steps += slot.num_envs
            slot.t += 1
            slot.state = READY
            if slot.t >= slot.frames and self._on_full is not None:
                self._on_full(slot)
                self._delivered = True
        else:
            slot.engine.resets_done(slot._resetting)
            slot.state = READY

    def poke(self) -> None:
        """Run a round on the next loop pass (a reply arrived, or the collector released a slot)."""
        if not self._advance_soon:
            self._advance_soon = True
            asyncio.get_running_loop().call_soon(self._advance)

    def _advance(self) -> None:
        """Rounds, for as long as completions keep coming while we spin (or just one round)."""
        self._advance_soon = False
        if self._pumping is None or self._failed is not None or self._error is not None:
            return
        runner, until = self._pumping
        try:
            if not (self.spin and self.spin_s):
                if until():
                    self._wake()
                else:
                    self._round(runner())
                    if self.spin_s and not self.idle():
                        self._arm_recheck()  # a worker may still read the E_ASLEEP of our last spin
                return
            self._spin_rounds(runner, until)
        except BaseException as exc:  # noqa: BLE001 - the pump raises it
            self._error = exc
            self._wake()

    def _spin_rounds(self, runner: Callable[[], PolicyRunner], until: Callable[[], bool]) -> None:
        clock, spin_s = time.perf_counter, self.spin_s
        give_back = clock() + _SLICE_S  # let the loop run its other callbacks now and then
        self._delivered = False
        self._engine_asleep(0)
        try:
            while True:
                if until():
                    self._wake()
                    return
                self._round(runner())
                if self.idle():
                    return  # every slot is held or full: the collector pokes us later
                end = clock() + spin_s
                while not self._harvest():
                    if clock() > end:
                        return
                if self._delivered or clock() > give_back:  # a batch to hand over, or time's up
                    self._delivered = False
                    self.poke()
                    return
        finally:
            self._engine_asleep(1)
            if self._harvest():  # landed after our last look, before the flag
                self.poke()
            elif not self.idle():
                self._arm_recheck()

    def _engine_asleep(self, flag: int) -> None:
        for slot in self.slots:
            slot.worker.control[protocol.E_ASLEEP] = flag

    def _arm_recheck(self) -> None:
        """After spinning, a doorbell may be missed (see ``_workers.protocol``): look again soon."""
        if not self._recheck_armed:
            self._recheck_armed = True
            asyncio.get_running_loop().call_later(_RECHECK_S, self._recheck)

    def _recheck(self) -> None:
        self._recheck_armed = False
        if self._pumping is None or self.idle():
            return
        if self._harvest():
            self.poke()
        else:
            self._arm_recheck()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # ------------------------------------------------------------------ the loop

    def idle(self) -> bool:
        """No worker is stepping or resetting."""
        return all(s.state is READY for s in self.slots)

    async def pump(self, runner: Callable[[], PolicyRunner], until: Callable[[], bool],
                   on_full: Callable[[Slot], None] | None = None) -> None:
        """Run rounds until ``until()``; ``on_full(slot)`` when a slot's batch is complete.

        A failed worker's [`WorkerError`][aiocollect.WorkerError], or the policy's exception,
        is raised here.
        """
        if self._pumping is not None:
            raise RuntimeError("the scheduler is already pumping")
        self._pumping, self._on_full = (runner, until), on_full
        loop = asyncio.get_running_loop()
        try:
            while True:
                if self._failed is not None:
                    await self._raise(self._failed)
                if self._error is not None:
                    error, self._error = self._error, None
                    raise error
                if until():
                    return
                self._advance()
                if self._failed is None and self._error is None and not until():
                    self._waiter = loop.create_future()
                    try:
                        await self._waiter
                    finally:
                        self._waiter = None
        finally:
            self._pumping, self._on_full = None, None

    async def _raise(self, worker: Worker) -> None:
        error = worker.error
        if error.remote_type is None and error.exitcode is None and worker.process is not None:
            with anyio.move_on_after(2):  # name the signal that killed it, if it was one
                await worker.process.wait()
            error = type(error).died(worker.index, worker.pid, worker.process.returncode)
            worker.error = error
        raise error

    def _round(self, runner: PolicyRunner) -> None:
        ready = [s for s in self.slots if s.state is READY and not s.held and s.t < s.frames]
        if not ready:
            return
        ready = [s for s in ready if not s.engine.any_reset or self._reset(s)]
        if not ready:
            return
        whole = len(ready) == len(self.slots)
        if len(ready) == 1:
            slot = ready[0]
            out = runner(self._all_obs if whole else slot.engine.obs_tensors, slot.num_envs)
            action = self._actions_of(runner, out, slot.num_envs)
            self._before_step(slot, out, runner.version)
            slot.action[...] = action
            slot.state = STEPPING
            slot.worker.post(protocol.STEP_CODE)
            return
        n = sum(s.num_envs for s in ready)
        if whole:
            obs = self._all_obs
        else:
            obs = {
                leaf.key: torch.from_numpy(np.concatenate([s.obs[i] for s in ready]))
                for i, leaf in enumerate(self.obs_leaves)
            }
        out = runner(obs, n)
        action = self._actions_of(runner, out, n)
        if whole:
            self._action[...] = action
        start = 0
        for s in ready:
            stop = start + s.num_envs
            self._before_step(s, {k: v[start:stop] for k, v in out.items()}, runner.version)
            if not whole:
                s.action[...] = action[start:stop]
            start = stop
        for s in ready:
            s.state = STEPPING
            s.worker.post(protocol.STEP_CODE)

    def _actions_of(self, runner: PolicyRunner, out: dict, n: int) -> np.ndarray:
        action = out["action"]
        if not isinstance(action, np.ndarray):
            action = action.numpy(force=True)
        if runner.kind != "random":
            self.check_action(action, n)
        return action

    @staticmethod
    def _before_step(slot: Slot, out: dict, version: int) -> None:
        """Write column ``t`` of the slot's batch: observations, ids, the policy's outputs
        and the policy ``version`` that computed them."""
        if slot.buffer is None:
            slot.buffer = slot.engine.new_buffer(out, slot.frames, slot.mask)
        slot.engine.write_before(slot.buffer, slot.t)
        slot.buffer.write_outputs(slot.t, out, version)

    def _reset(self, slot: Slot) -> bool:
        """Reset what ``slot`` needs; ``True`` if done here, ``False`` if its worker is on it."""
        idx, seeds = slot.engine.take_resets()
        if seeds is None and slot.pre_reset[idx].all():
            slot.take_worker_resets(idx)
            return True
        slot.reset_mask[:] = False
        slot.reset_mask[idx] = True
        if seeds is None:
            slot.seed_set[:] = False
        else:
            slot.seed[:] = seeds
            slot.seed_set[:] = True
        slot._resetting = idx
        slot.state = RESETTING
        slot.worker.post(protocol.RESET_CODE)
        return False

    async def settle(self) -> None:
        """Hold every slot and let in-flight steps and resets land."""
        for s in self.slots:
            s.held = True
        if not self.idle():
            await self.pump(lambda: None, self.idle)

"""The scheduler: many workers, each at its own pace, one policy call per round.

Each worker is a *lane*: its rows ``lo:hi`` of the rollout storage (``_engine.storage``,
shared with the workers), the slot and column its next step writes, and its state:
``READY`` (the observations its next step starts from are in the storage: it wants
actions), ``STEPPING`` or ``RESETTING`` (its worker is on it). Per-env bookkeeping
(trajectory ids, step counts, pending resets) is one ``Timelines`` over all rows.

``Scheduler.pump()`` runs rounds until the caller's condition holds. Everything
happens in the loop's callbacks, with no task switch per step:

1. a worker's completion arrives: the lane's rows are booked (``Timelines.stepped``,
   vectorised over the worker's envs; the worker wrote the observations, rewards and flags
   itself, and already reset the envs that finished) and its column moves on;
2. a round starts right away if no other worker is in flight, else on the next loop
   pass, so that completions landing together share a round;
3. the round sends a ``RESET`` to the ready lanes that need one (``reset()``, seeds,
   ``set_truncated``), runs the policy **once** on the observations of every other ready
   lane (a view of the storage when they sit side by side at the same column, as in a
   lockstep round; a concatenation otherwise), writes the outputs, ids and version per
   block of rows, the actions into shared memory, and posts each of those workers one
   ``STEP`` with its slot and column.

So inference is batched over whatever is ready, and a slow worker never holds back a
fast one.

With ``policy=None`` (a ``RandomPolicy``, whose actions do not depend on the observations)
a round needs no policy call: each ready process lane is given a *run* instead, a command
for up to ``_RUN_S`` worth of steps (``_workers.protocol``), with every step's actions drawn
at once from the lane's own stream (``RandomPolicy.sample_steps``). The worker steps on
with no round trip, and the run is booked as a whole when it completes
(``Timelines.ran``): the main process does a few array operations per run, not per step.

*When* a batch is cut is the collector's business: ``until``, ``on_full`` and
``hold`` are its levers, and ``seal``/``batch``/``release`` turn a lane's full (or cut)
batch into tensors.

``Collector``'s in-process envs are a lane too: an ``InlineWorker``
(``_workers.inline_worker``) carries a command out inside ``post``, so ``run_inline``, the
synchronous fast path, runs round after round with no callback at all (same storage, same
timelines, same batches).

A ``Collector``'s coroutine envs are one lane each (``_workers.coroutine_envs``), hundreds
of them, each at its own column: with ``batching`` given, ready lanes wait in a queue in
the order they became ready, a round takes them as ``Batching`` says (EnvPool's
``max_batch_size``/``min_batch_size``/``batch_timeout``), gathers their observations with
one fancy index per field and writes their outputs the same way (``_env_round``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import numpy as np

from .._envs.spaces import ActionCheck
from .._errors import EnvError
from .._policies.runner import PolicyRunner, check_outputs
from .._workers import protocol
from .._workers.pool import Port, Worker
from .._workers.shm import SharedArrays
from .storage import RolloutStorage, StoredValueError, concat, host_empty
from .timelines import Timelines

READY, STEPPING, RESETTING = "ready", "stepping", "resetting"  # compared with ``is``


@dataclass(frozen=True)
class Batching:
    """How per-env rounds (a ``Collector``'s coroutine envs, each a lane of its own) group
    ready envs into policy calls: EnvPool's knobs."""

    max_batch_size: int | None = None
    """At most this many envs per policy call (``None``: every ready env)."""
    min_batch_size: int = 1
    """A round waits for this many ready envs while others are still stepping..."""
    batch_timeout: float = 0.005
    """...but no longer than this many seconds after the first of them became ready."""
    step_timeout: float | None = None
    """A step or reset that takes longer fails the collection, naming the env (``None``: no limit)."""


_SLICE_S = 0.001
"""Longest stretch of spinning rounds before the loop gets a turn."""
_RECHECK_S = 0.002
"""After spinning: how soon to look again for a completion whose doorbell was missed."""
_RUN_S = 0.016
"""About how long a run of steps lasts (sized from the lane's last runs): long enough that
booking it costs little per frame, short enough that what the collector asks next (a new
batch, a reset, ``CLOSE``) waits little."""


@dataclass
class Sealed:
    """A lane's finished (or cut) batch, still in the storage until ``release``."""

    lane: Lane
    slot: int
    frames: int
    valid: int
    keys: tuple
    start_flags: np.ndarray | None
    mask: bool

    def oldest_version(self, storage: RolloutStorage) -> int:
        if not self.valid:
            return 1 << 62
        return int(storage.policy_version[self.slot, : self.valid, self.lane.lo : self.lane.hi].min())


class Lane:
    """One worker as the scheduler sees it."""

    def __init__(self, worker: Worker):
        self.worker = worker
        self.index = worker.index
        self.lo, self.hi = worker.lo, worker.hi
        self.num_envs = worker.num_envs
        self.state = READY
        self.held = True
        """No new steps while held (between batches, or while its batches wait)."""
        self.slot = 0
        self.t = 0
        """The column of the next step; the observations it starts from are at ``t``."""
        self.frames = 0
        self.mask = False
        self.keys: tuple | None = None
        """The policy outputs of this batch (known after its first step)."""
        self.carry: list = []
        """Those the next step starts from (``RolloutStorage.carried``): a recurrent state."""
        self.start_flags: np.ndarray | None = None
        self.completed_trajectories = 0
        self.reserved: list[int] = []
        """Slots holding this lane's sealed batches, not yet released."""
        self.queued = False
        """In the scheduler's queue of ready lanes (per-env rounds only)."""
        self._resetting: np.ndarray | None = None
        self.runs = getattr(worker, "runs", False)
        """Its worker takes runs of steps (a process's port; see the module docstring)."""
        self.run = 0
        """The steps of the run under way (0: none)."""
        self.run_steps = 1
        """How many steps the next run may take (``_RUN_S`` at the last runs' pace)."""
        self.run_posted = 0.0

    @property
    def full(self) -> bool:
        return self.t >= self.frames

    @property
    def in_flight(self) -> bool:
        return self.state is not READY


class Scheduler:
    """Drives workers (processes, coroutine entries, or one inline group); see the module docstring."""

    def __init__(self, shared: SharedArrays, workers: list, obs_leaves, action_check: ActionCheck, *,
                 step_count: bool, reset_when_done: bool, spin_s: float = 0.0, batching: Batching | None = None,
                 runs: bool = False):
        self.storage = RolloutStorage(shared, obs_leaves, step_count=step_count)
        self.num_envs = self.storage.num_envs
        self.timelines = Timelines(self.num_envs, reset_when_done=reset_when_done, count_steps=step_count)
        self.reset_when_done = reset_when_done
        self.runs = runs
        """Random actions go in runs of steps (see the module docstring). The collector
        decides: never where a batch must be cut after any step (an interruptor) or finished
        envs wait for a reset (no ``reset_when_done``)."""
        self.check_action = action_check
        self.lanes = [Lane(w) for w in workers]
        for worker in workers:
            worker.on_reply = self._on_reply
        self._lanes_of: dict[int, list[Lane]] = {}
        """The lanes of each process (or coroutine entry) that calls ``_on_reply``: its
        doorbell says that one of them completed, so only those are looked at."""
        for lane in self.lanes:
            owner = lane.worker.worker if isinstance(lane.worker, Port) else lane.worker
            self._lanes_of.setdefault(id(owner), []).append(lane)
        self._pumping: tuple[Callable[[], PolicyRunner], Callable[[], bool]] | None = None
        self._on_full: Callable[[Lane], None] | None = None
        self._waiter: asyncio.Future | None = None
        self._advance_soon = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._recheck_armed = False
        self._delivered = False
        self._failed: Worker | None = None
        self._error: BaseException | None = None
        self.spin_s = spin_s
        """How long to spin for a completion before sleeping (0: never; see ``_workers.protocol``)."""
        self.spin = False
        """Set by the collector while spinning is welcome: while its consumer waits for a
        batch, the engine thread has the GIL to itself. (Spinning while the user trains in
        another thread would take the GIL away from the training.)"""
        self._busy = 0
        """Lanes stepping or resetting."""
        self.batching = batching
        """Per-env rounds (``None``: rounds over whole workers); see ``_env_round``."""
        self._queue: list[Lane] | None = None
        self._landed: list[Lane] | None = None
        if batching is not None:
            if any(lane.num_envs != 1 or lane.lo != i for i, lane in enumerate(self.lanes)):
                raise ValueError("per-env rounds drive lanes of one env each, lane i on row i")
            self._queue, self._landed = [], []
        self._first_ready: float | None = None
        self._timer: asyncio.TimerHandle | None = None

    @property
    def ids(self):
        return self.timelines.ids

    # ------------------------------------------------------------------ batches

    def begin(self, lane: Lane, frames: int, mask: bool) -> None:
        """Start a new batch of ``frames`` steps per env for ``lane``, in a free slot."""
        slot = next(k for k in range(self.storage.slots) if k not in lane.reserved)
        if (slot, 0) != (lane.slot, lane.t):  # the observations the next step starts from
            for x in self.storage.obs:
                x[slot, 0, lane.lo : lane.hi] = x[lane.slot, lane.t, lane.lo : lane.hi]
        lane.slot, lane.t, lane.frames, lane.mask, lane.keys = slot, 0, frames, mask, None
        lane.start_flags = None if self.reset_when_done else self.timelines.root_flags[:, lane.lo : lane.hi].copy()
        lane.held = False
        if self._queue is not None and lane.state is READY:
            self._enqueue(lane)

    def seal(self, lane: Lane, set_truncated: bool) -> Sealed:
        """Close ``lane``'s batch; its slot stays reserved until ``release``."""
        valid = lane.t
        if set_truncated and valid:
            # TorchRL's set_truncated: the batch's last step says truncated (so done), and value
            # targets bootstrap there; the envs and their trajectories (ids, step counts) go on
            self.storage.truncated[lane.slot, valid - 1, lane.lo : lane.hi] = True
        sealed = Sealed(lane, lane.slot, lane.frames, valid, lane.keys or (), lane.start_flags, lane.mask)
        lane.reserved.append(lane.slot)
        lane.held = True
        return sealed

    def batch(self, sealed: Sealed, keys: tuple | None = None, empty: Any = None) -> dict:
        """The tensors of a sealed batch, ``[envs, frames]`` (``keys``: the policy outputs
        to include, for a lane cut before its first step; ``empty``: their allocator).

        Raises:
            EnvError: an env returned a reward or flag that is not a number or a boolean
                (``storage.check_values``).
        """
        lane = sealed.lane
        valid = np.full(lane.num_envs, sealed.valid, dtype=np.int64)
        with self._naming_bad_values():
            return self.storage.batch(sealed.slot, lane.lo, lane.hi, sealed.frames, valid, keys or sealed.keys,
                                      sealed.start_flags, sealed.mask, empty)

    @contextlib.contextmanager
    def _naming_bad_values(self) -> Iterator[None]:
        """A ``StoredValueError`` of the storage as an ``EnvError`` naming the env and its worker."""
        try:
            yield
        except StoredValueError as exc:
            lane = next(lane for lane in self.lanes if lane.lo <= exc.row < lane.hi)
            first = min(other.lo for other in self.lanes if other.index == lane.index)  # the worker's env 0
            in_process = not isinstance(lane.worker, Port)
            pid = os.getpid() if in_process else lane.worker.pid
            raise EnvError.bad_value(exc.what, exc.step, worker=lane.index, pid=pid, env=exc.row - first,
                                     in_process=in_process) from None

    def batch_all(self, sealed: list[Sealed]) -> dict:
        """The tensors of the sealed batches of lanes that sit side by side (every lane, or
        a worker's parts), ``[envs, frames]``: one copy per field when the lanes share
        their slot (as they do unless a lane's batch was begun apart)."""
        first = sealed[0]
        storage = self.storage
        if storage.staging is not None:
            storage.staging.begin()
        keys = next((b.keys for b in sealed if b.keys), ())
        valid = np.concatenate([np.full(b.lane.num_envs, b.valid, dtype=np.int64) for b in sealed])
        flags = None if first.start_flags is None else np.concatenate([b.start_flags for b in sealed], axis=1)
        if all(b.slot == first.slot for b in sealed):
            with self._naming_bad_values():
                return storage.batch(first.slot, first.lane.lo, sealed[-1].lane.hi, first.frames, valid, keys,
                                     flags, first.mask)
        parts = [self.batch(b, keys, host_empty) for b in sealed]  # only the joined batch is staged
        return {k: concat([p[k] for p in parts], storage.empty) for k in parts[0]}

    def release(self, sealed: Sealed) -> None:
        """The batch was copied out: its slot may be filled again."""
        sealed.lane.reserved.remove(sealed.slot)

    def drop_older_than(self, lane: Lane, version: int) -> int:
        """Drop the steps of ``lane``'s batch in progress whose actions came from a policy
        older than ``version`` (a prefix: versions only grow); returns the frames dropped."""
        if lane.t == 0:
            return 0
        st = self.storage
        count = int(np.searchsorted(st.policy_version[lane.slot, : lane.t, lane.lo], version))
        if count == 0:
            return 0
        if lane.start_flags is not None:  # the kept part's first root flags
            rows = slice(lane.lo, lane.hi)
            term, trunc = st.terminated[lane.slot, count - 1, rows], st.truncated[lane.slot, count - 1, rows]
            lane.start_flags = np.stack([term | trunc, term, trunc])
        st.shift(lane.slot, lane.lo, lane.hi, count, lane.t)
        lane.t -= count
        return count * lane.num_envs

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
        if self._landed is not None:  # per-env lanes: each reports its own completion
            self._landed.append(self.lanes[worker.lo])
        try:
            self._harvest(self._lanes_of.get(id(worker)))  # (it may call the collector's on_full)
        except BaseException as exc:  # noqa: BLE001 - the pump raises it; a callback must not
            self._error = exc
            self._wake()
            return
        if self._pumping is None:
            self._wake()  # nobody pumping: let a settle() see it
        elif self.idle():
            self._advance()
        else:
            self.poke()

    def _harvest(self, lanes: list[Lane] | None = None) -> bool:
        """Take in every completed command (of ``lanes``, by default of every lane); ``True``
        if there was one. (A completion whose doorbell was missed, see ``_workers.protocol``,
        is found by the next full look: a spin, or ``_recheck``.)"""
        if self._landed is not None:
            landed, self._landed = self._landed, []
            for lane in landed:
                if lane.worker.completed():
                    self._take(lane)
            return bool(landed)
        got = False
        for lane in self.lanes if lanes is None else lanes:
            if lane.state is not READY and lane.worker.completed():
                self._take(lane)
                got = True
        return got

    def poke(self) -> None:
        """Run a round on the next loop pass (a reply arrived, or the collector released a slot)."""
        if not self._advance_soon:
            self._advance_soon = True
            (self._loop or asyncio.get_running_loop()).call_soon(self._advance)

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
        clock, spin_s, yield_ = time.perf_counter, self.spin_s, os.sched_yield
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
                if all(lane.run or not lane.in_flight for lane in self.lanes):
                    return  # runs only: each lasts about _RUN_S, far longer than a spin
                end = clock() + spin_s
                while not self._harvest():
                    if clock() > end:
                        return
                    yield_()  # our core to any process that wants it (see _workers.protocol)
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
        for lane in self.lanes:
            lane.worker.control[protocol.E_ASLEEP] = flag

    def _arm_recheck(self) -> None:
        """After spinning, a doorbell may be missed (see ``_workers.protocol``): look again soon."""
        if not self._recheck_armed:
            self._recheck_armed = True
            asyncio.get_running_loop().call_later(_RECHECK_S, self._recheck)

    def _recheck(self) -> None:
        self._recheck_armed = False
        if self._pumping is None or self.idle():
            return
        try:
            got = self._harvest()
        except BaseException as exc:  # noqa: BLE001 - as in _on_reply
            self._error = exc
            self._wake()
            return
        if got:
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
        return self._busy == 0

    async def pump(self, runner: Callable[[], PolicyRunner], until: Callable[[], bool],
                   on_full: Callable[[Lane], None] | None = None) -> None:
        """Run rounds until ``until()``; ``on_full(lane)`` when a lane's batch is complete.

        A failed worker's [`WorkerError`][aiocollect.WorkerError], or the policy's exception,
        is raised here.
        """
        if self._pumping is not None:
            raise RuntimeError("the scheduler is already pumping")
        self._pumping, self._on_full = (runner, until), on_full
        self._loop = loop = asyncio.get_running_loop()  # (``poke`` runs per step: no lookup there)
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
            self._pumping, self._on_full, self._loop = None, None, None

    async def run_inline(self, runner: Callable[[], PolicyRunner], until: Callable[[], bool]) -> None:
        """``pump()``'s synchronous fast path, for one lane whose worker steps inside
        ``post`` (``_workers.inline_worker``; ``Collector``): round after round in this one
        loop, with no callback, no search for ready lanes and no harvest; the event loop
        gets a turn about every millisecond (so that collection stays cancellable). A
        command an exception cut short counts as undone: those envs are reset before
        their next step, with new trajectory ids."""
        if len(self.lanes) != 1:
            raise ValueError(f"run_inline drives one inline lane, not {len(self.lanes)}")
        lanes = self.lanes
        lane = lanes[0]
        worker, tl, act, take = lane.worker, self.timelines, self._act, self._take
        clock = time.perf_counter
        last = clock()
        try:
            while not until():
                if tl.any_reset and tl.wants_reset(lane.lo, lane.hi):
                    self._reset(lane)
                else:
                    act(lanes, runner(), True)
                worker.completed()
                take(lane)
                if clock() - last > _SLICE_S:
                    await anyio.lowlevel.checkpoint()
                    last = clock()
        except BaseException:
            self.abandon([lane])
            raise

    def abandon(self, lanes: list[Lane]) -> None:
        """The commands under way on ``lanes`` were cut short (an exception, Ctrl-C, a
        cancelled task): they count as undone. Those envs are reset before their next step
        and start new trajectories, with new ids; the step before, if it is in the batch
        under way, is marked truncated (so that within a batch a trajectory id changes only
        after a done step). Completions that landed before are taken in first."""
        if self._landed:
            self._harvest()
        st = self.storage
        for lane in lanes:
            if lane.state is not READY:
                lane.state = READY
                lane.run = 0
                self._busy -= 1
                if lane.t > 0:
                    st.truncated[lane.slot, lane.t - 1, lane.lo : lane.hi] = True
                self.timelines.request_reset(None, lane.lo, lane.hi)
                if self._queue is not None and not lane.held and lane.t < lane.frames:
                    self._enqueue(lane)

    async def _raise(self, worker: Worker) -> None:
        error = worker.error
        if error.remote_type is None and error.exitcode is None and worker.process is not None:
            with anyio.move_on_after(2):  # name the signal that killed it, if it was one
                await worker.process.wait()
            error = type(error).died(worker.index, worker.pid, worker.process.returncode)
            worker.error = error
        raise error

    def _round(self, runner: PolicyRunner) -> None:
        if self._queue is not None:
            self._env_round(runner)
            return
        tl = self.timelines
        ready = [lane for lane in self.lanes if lane.state is READY and not lane.held and lane.t < lane.frames]
        if not ready:
            return
        if tl.any_reset:
            ready = [lane for lane in ready if not (tl.wants_reset(lane.lo, lane.hi) and self._reset(lane))]
            if not ready:
                return
        if self.runs and runner.kind == "random":
            ready = self._post_runs(ready, runner)
            if not ready:
                return
        s, t = ready[0].slot, ready[0].t
        side_by_side = all(
            lane.slot == s and lane.t == t and (i == 0 or ready[i - 1].hi == lane.lo) for i, lane in enumerate(ready)
        )
        self._act(ready, runner, side_by_side)

    def _act(self, ready: list[Lane], runner: PolicyRunner, side_by_side: bool) -> None:
        """One policy call over the ``ready`` lanes, its outputs written, their steps posted."""
        st, tl = self.storage, self.timelines
        first = ready[0]
        s, t = first.slot, first.t
        gather = self._queue is not None  # one-env lanes, one slot, any columns: fancy indexing
        if side_by_side:  # one block of rows at one column: a view
            lo, hi = first.lo, ready[-1].hi
            obs = st.policy_input(s, t, lo, hi)
            n = hi - lo
        elif gather:
            n = len(ready)
            rows = np.fromiter([lane.lo for lane in ready], dtype=np.int64, count=n)
            cols = np.fromiter([lane.t for lane in ready], dtype=np.int64, count=n)
            obs = st.gather(s, cols, rows)
        else:
            obs = st.policy_inputs([(lane.slot, lane.t, lane.lo, lane.hi) for lane in ready],
                                   aligned=runner.kind == "array")  # (a JAX policy reads it in place)
            n = sum(lane.num_envs for lane in ready)
        out = runner(obs, n)
        if ready[0].keys is None or any(not v.shape or v.shape[0] != n for v in out.values()):
            check_outputs(out, n)  # a lane's first call, or a row count that would broadcast
        action = out["action"]
        if not isinstance(action, np.ndarray):
            try:
                action = action.numpy(force=True)
            except TypeError:  # bfloat16, float8 (autocast): numpy lacks them; the batch keeps them
                action = action.float().numpy(force=True)
        to_env = action  # what the envs are given; ``action``: what the batch stores
        if runner.kind != "random":
            check = self.check_action
            checked = check(action, n)
            if checked is not action:  # converted (booleans for a discrete space): store that
                out = {**out, "action": checked}
                action = checked
            to_env = check.env_action(action)  # one-hot rows: their indices
        version = runner.version
        keys = tuple(out)
        for lane in ready:
            if lane.keys is None:
                lane.keys = keys
                lane.carry = st.carried(keys)
            elif lane.keys != keys:
                st.check_outputs(out, lane.keys)
        if side_by_side:
            st.write(s, t, lo, hi, out, 0, version, tl.traj_ids, tl.step_count, action)
            st.action[t, lo:hi] = to_env
        elif gather:
            st.write_rows(s, cols, rows, out, version, tl.traj_ids, tl.step_count, action)
            st.action[cols, rows] = to_env
        else:
            start = 0
            for lane in ready:
                st.write(lane.slot, lane.t, lane.lo, lane.hi, out, start, version, tl.traj_ids, tl.step_count,
                         action)
                st.action[lane.t, lane.lo : lane.hi] = to_env[start : start + lane.num_envs]
                start += lane.num_envs
        self._busy += len(ready)
        for lane in ready:
            lane.state = STEPPING
            lane.worker.post(protocol.STEP_CODE, lane.slot, lane.t)

    def _post_runs(self, ready: list[Lane], runner: PolicyRunner) -> list[Lane]:
        """Give each of the ``ready`` lanes that takes runs a run of steps with random
        actions (``runner``'s ``RandomPolicy``); returns the others."""
        st, random = self.storage, runner.policy
        if runner.weights is not None:
            runner.version = runner.weights.version
        rest = []
        now = time.perf_counter()
        for lane in ready:
            if not lane.runs:
                rest.append(lane)
                continue
            left = lane.frames - lane.t
            k = left if 2 * left <= 3 * lane.run_steps else lane.run_steps  # (no short run at the end)
            if lane.keys is None:
                lane.keys, lane.carry = ("action",), []
            st.write_run(lane.slot, lane.t, lane.lo, lane.hi, random.sample_steps(lane.lo, k, lane.num_envs),
                         runner.version)
            lane.run, lane.run_posted, lane.state = k, now, STEPPING
            self._busy += 1
            lane.worker.post(protocol.RUN_CODE, lane.slot, lane.t, k)
        return rest

    def _book_run(self, lane: Lane) -> int:
        """A completed run: the ids and step counts of all its steps at once, and the size
        of the lane's next run (``_RUN_S`` at this one's pace, growing at most twofold).
        Returns the steps it took."""
        s, t, lo, hi = lane.slot, lane.t, lane.lo, lane.hi
        k = lane.worker.steps_done()  # all of the run, unless settle() cut it short
        st, cols = self.storage, slice(t, t + k)
        ids, counts = self.timelines.ran(lo, hi, st.terminated[s, cols, lo:hi], st.truncated[s, cols, lo:hi])
        st.ran(s, t, lo, hi, ids, counts)
        per_step = (time.perf_counter() - lane.run_posted) / k
        lane.run_steps = max(1, min(int(_RUN_S / per_step) if per_step > 0 else k, 2 * max(k, lane.run_steps)))
        lane.run = 0
        return k

    def _take(self, lane: Lane) -> None:
        self._busy -= 1
        if lane.state is STEPPING:
            t, lo, hi = lane.t, lane.lo, lane.hi
            tl = self.timelines
            before = tl.completed_trajectories
            steps = 1
            if lane.run:
                steps = self._book_run(lane)
            else:
                # (one-env lanes: no cached views, there would be one per env and column)
                tl.stepped(lo, hi, *self.storage.flags(lane.slot, t, lo, hi, cache=self._queue is None))
                if lane.carry:
                    self.storage.carry(lane.slot, t, lo, hi, lane.carry, self.reset_when_done)
            lane.completed_trajectories += tl.completed_trajectories - before
            lane.worker.env_steps += lane.num_envs * steps
            lane.t = t + steps
            lane.state = READY
            if lane.t >= lane.frames:
                if self._on_full is not None:
                    self._on_full(lane)
                    self._delivered = True
            elif self._queue is not None and not lane.held:
                self._enqueue(lane)
        else:
            self.timelines.resets_done(lane.lo, lane._resetting)
            lane.state = READY
            if self._queue is not None and not lane.held and lane.t < lane.frames:
                self._enqueue(lane)

    # ------------------------------------------------------------------ per-env rounds
    #
    # With one-env lanes (a Collector's coroutine envs, hundreds of them, each stepping at
    # its own pace) a scan of every lane per round would cost more than the round: ready
    # lanes wait in a queue, in the order they became ready, and a round gathers their
    # observations (one fancy index per field: each env sits at its own column) and writes
    # their outputs the same way. ``Batching`` shapes the calls.

    def _enqueue(self, lane: Lane) -> None:
        if not lane.queued:
            lane.queued = True
            self._queue.append(lane)

    def _env_round(self, runner: PolicyRunner | None) -> None:
        queue, tl = self._queue, self.timelines
        keep = []
        for lane in queue:  # drop what is no longer ready (held between batches, or full)
            if lane.state is READY and not lane.held and lane.t < lane.frames:
                if tl.any_reset and tl.needs_reset[lane.lo]:
                    lane.queued = False
                    self._reset(lane)
                else:
                    keep.append(lane)
            else:
                lane.queued = False
        if not keep:
            queue.clear()
            return
        b, clock = self.batching, time.perf_counter
        if len(keep) < b.min_batch_size and self._busy:  # wait for more, but not for long
            now = clock()
            if self._first_ready is None:
                self._first_ready = now
            waited = now - self._first_ready
            if waited < b.batch_timeout:
                queue[:] = keep
                if self._timer is None:
                    self._timer = asyncio.get_running_loop().call_later(b.batch_timeout - waited, self._on_timer)
                return
        cap = b.max_batch_size or len(keep)
        take, queue[:] = keep[:cap], keep[cap:]
        self._first_ready = clock() if queue else None
        for lane in take:
            lane.queued = False
        self._act(take, runner, False)
        if queue:
            self.poke()  # the rest, capped out of this call, in the next

    def _on_timer(self) -> None:
        self._timer = None
        self.poke()

    def _reset(self, lane: Lane) -> bool:
        """Send ``lane`` a ``RESET`` for the envs that need one; ``True`` (it is busy now)."""
        st, lo, hi, tl = self.storage, lane.lo, lane.hi, self.timelines
        idx, seeds = tl.take_resets(lo, hi)
        if lane.t > 0 and tl.renew[lo:hi].any():
            # trajectories this reset cuts end at the batch's last step: marked truncated
            # there (as TorchRL's set_truncated does), so that within a batch an id changes
            # only after a done step and value targets do not bootstrap across the cut
            s, t = lane.slot, lane.t - 1
            term, trunc = st.terminated[s, t, lo:hi], st.truncated[s, t, lo:hi]
            trunc |= tl.renew[lo:hi] & ~term
        st.reset_mask[lo:hi] = False
        st.reset_mask[idx + lo] = True
        if seeds is None:
            st.seed_set[lo:hi] = False
        else:
            st.seed_set[lo:hi] = [v is not None for v in seeds]
            st.seed[lo:hi] = [0 if v is None else v for v in seeds]
        lane._resetting = idx
        lane.state = RESETTING
        self._busy += 1
        lane.worker.post(protocol.RESET_CODE, lane.slot, lane.t)
        return True

    async def settle(self) -> None:
        """Hold every lane and let in-flight steps and resets land (a run stops after the
        step under way)."""
        for lane in self.lanes:
            lane.held = True
            if lane.run:
                lane.worker.cut_run()
        if not self.idle():
            await self.pump(lambda: None, self.idle)

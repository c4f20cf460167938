"""The scheduler: many lanes, each at its own pace, one policy call per round.

A *lane* (``_engine.lanes``) is a block of rows ``lo:hi`` of the rollout storage
(``_engine.storage``, shared with the workers) that steps as one, driven through a
``_workers.lane.LaneWorker``: a worker process's part, a coroutine worker, one coroutine
env, or a ``Collector``'s in-process envs. The scheduler keeps the slot and column each
lane's next step writes, and its state: ``READY`` (the observations its next step starts
from are in the storage: it wants actions), ``STEPPING`` or ``RESETTING`` (its worker is on
it). Per-env bookkeeping (trajectory ids, step counts, pending resets) is one
``Timelines`` over all rows.

``Scheduler.pump()`` runs rounds until the caller's condition holds. Everything
happens in the loop's callbacks, with no task switch per step:

1. a lane's completion arrives (``on_reply``; the workers' doorbells share one pipe, and
   every process lane's completion is read from the control block at once,
   ``_harvest_block``): the lane's rows are booked (``take``: ``Timelines.stepped``,
   vectorised over the lane's envs, and over the lanes at one slot that completed together,
   side by side or through index arrays, ``Timelines.stepped_rows``;
   the worker wrote the observations, rewards and flags itself, and already reset the envs
   that finished) and its column moves on;
2. a round starts right away if no other lane is in flight, else on the next loop pass,
   so that completions landing together share a round;
3. the round (``_engine.rounds``: one strategy per kind of lanes, chosen once) sends a
   ``RESET`` to the ready lanes that need one (``post_reset``: ``reset()``, seeds,
   ``set_truncated``), runs the policy **once** on the observations of the other ready
   lanes, writes the outputs, ids and version, the actions into shared memory, and posts
   each of those lanes one ``STEP`` with its slot and column (or, for random actions, a
   run of steps). The workers a round posts to are woken together when it ends, with one
   system call (``_workers.bell``).

So inference is batched over whatever is ready, and a slow worker never holds back a
fast one. ``run_inline`` is the synchronous fast path of a ``Collector``'s in-process
envs: the same rounds, storage, timelines and batches, with no callback at all.

*When* a batch is cut is the collector's business: ``until``, ``on_full`` and
``hold`` are its levers, and ``begin``/``seal``/``batch``/``release`` turn a lane's full
(or cut) batch into tensors.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, cast

import anyio
import numpy as np

from .._envs.spaces import ActionCheck
from .._errors import EnvError
from .._workers import protocol
from .._workers.lane import LaneOwner, LaneWorker, ProcessLane
from .lanes import READY, RESETTING, STEPPING, Lane, Sealed, rows_and_columns
from .profile import Profile
from .rounds import SLICE_S, Batching, rounds_for
from .storage import RolloutStorage, StoredValueError, concat, host_empty
from .timelines import Timelines

if TYPE_CHECKING:
    from .._policies.actor import Actor
    from .._workers.bell import Bell

_RECHECK_S = 0.002
"""After spinning: how soon to look again for a completion whose doorbell was missed."""


class Scheduler:
    """Drives lanes (process parts, coroutine workers and envs, or one inline group); see
    the module docstring."""

    def __init__(self, storage: RolloutStorage, timelines: Timelines, workers: list[LaneWorker],
                 action_check: ActionCheck, *, spin_s: float = 0.0, batching: Batching | None = None,
                 runs: bool = False):
        self.storage = storage
        self._block = storage.control
        """The control block: every process lane's line (``_workers.protocol``)."""
        self.profile: Profile | None = None
        """Set by ``enable_profile()``: the policy calls and batches are timed (``_engine.profile``)."""
        self.num_envs = storage.num_envs
        self.timelines = timelines
        """The bookkeeping of the same rows as ``storage`` (``_engine.timelines``)."""
        self.reset_when_done = timelines.reset_when_done
        self.runs = runs
        """Actions go in runs of steps where the actor offers them (``rounds.RunRounds``): random
        ones, or the workers' own policy's. The collector decides: never where a batch must be
        cut after any step (an interruptor) or finished envs wait for a reset (no
        ``reset_when_done``)."""
        self.check_action = action_check
        self.lanes = [Lane(w) for w in workers]
        for worker in workers:
            worker.on_reply = self._on_reply
        self._lanes_of: dict[int, list[Lane]] = {}
        """The lanes of each owner that calls ``_on_reply`` (a process, or the lane itself):
        its doorbell says that one of them completed, so only those are looked at."""
        for lane in self.lanes:
            self._lanes_of.setdefault(id(lane.worker.owner), []).append(lane)
        ports = [(lane, cast(ProcessLane, lane.worker)) for lane in self.lanes if not lane.worker.in_process]
        self._lines = [port.control for _, port in ports]
        """The control lines of the lanes in other processes, where ``E_ASLEEP`` tells
        their workers whether we spin (``_workers.protocol``)."""
        self._process_lanes = [(lane, port.line) for lane, port in ports]
        """The lanes in other processes (``ProcessLane``s) and their rows of the control block,
        where their completions are read all at once (``_harvest_block``); the others are asked
        one by one."""
        self._other_lanes = [lane for lane in self.lanes if lane.worker.in_process]
        self._seen = ports[0][1].seen if ports else np.zeros(0, np.int64)

        self._pumping: tuple[Callable[[], Actor], Callable[[], bool]] | None = None
        self._on_full: Callable[[Lane], None] | None = None
        self._waiter: asyncio.Future | None = None
        self._advance_soon = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._recheck_armed = False
        self._delivered = False
        self._failed: LaneOwner | None = None
        self._error: BaseException | None = None
        self.spin_s = spin_s
        """How long to spin for a completion before sleeping (0: never; see ``_workers.protocol``)."""
        self.spin = False
        """Set by the collector while spinning is welcome: while its consumer waits for a
        batch, the engine thread has the GIL to itself. (Spinning while the user trains in
        another thread would take the GIL away from the training.)"""
        self.busy = 0
        """Lanes stepping or resetting (the rounds count those they post)."""
        self.batching = batching
        """Per-env rounds (``None``: rounds over whole lanes); see ``rounds.EnvQueueRounds``."""
        self.rounds = rounds_for(self, batching, runs)
        """The round strategy (``_engine.rounds``)."""
        self._bells = _bells(port for _, port in ports)
        """The pools' futex doorbells (``_workers.bell``), held over each round (``_rung_round``)."""
        self._round = self._rung_round if self._bells else self.rounds.round
        self._ready = self.rounds.ready
        self._cache_flags = self.rounds.cache_flags

    @property
    def ids(self):
        return self.timelines.ids

    # ------------------------------------------------------------------ batches

    def begin(self, lane: Lane, frames: int, mask: bool, slot: int | None = None) -> None:
        """Start a new batch of ``frames`` steps per env for ``lane``, in a free slot (``slot``,
        if given: lanes a batch apart keep each batch in one slot, ``Collector``'s ``step_ahead``)."""
        if slot is None:
            slot = next(k for k in range(self.storage.slots) if k not in lane.reserved)
        if (slot, 0) != (lane.slot, lane.t):  # the observations the next step starts from
            for x in self.storage.obs:
                x[slot, 0, lane.lo : lane.hi] = x[lane.slot, lane.t, lane.lo : lane.hi]
        lane.slot, lane.t, lane.frames, lane.mask, lane.keys = slot, 0, frames, mask, None
        lane.start_flags = None if self.reset_when_done else self.timelines.root_flags[:, lane.lo : lane.hi].copy()
        lane.fresh = []
        lane.held = False
        self._ready(lane)

    def seal(self, lane: Lane, set_truncated: bool) -> Sealed:
        """Close ``lane``'s batch; its slot stays reserved until ``release``."""
        valid = lane.t
        if set_truncated and valid:
            # TorchRL's set_truncated: the batch's last step says truncated (so done), and value
            # targets bootstrap there; the envs and their trajectories (ids, step counts) go on
            self.storage.truncated[lane.slot, valid - 1, lane.lo : lane.hi] = True
        sealed = Sealed(lane, lane.slot, lane.frames, valid, lane.keys or (), lane.start_flags, lane.mask,
                        tuple(lane.fresh), truncated=bool(set_truncated and valid))
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
        out = self._copy_out(sealed.slot, lane.lo, lane.hi, sealed.frames, valid, keys or sealed.keys,
                             sealed.start_flags, sealed.mask, empty, fresh=sealed.fresh)
        return _truncate_flags(out, valid) if sealed.truncated else out

    def _copy_out(self, *args: Any, **kwargs: Any) -> dict:
        """``storage.batch(*args, **kwargs)``, its bad values named (``_naming_bad_values``),
        timed when profiled."""
        with self._naming_bad_values():
            if self.profile is None:
                return self.storage.batch(*args, **kwargs)
            return self.profile.batch(lambda: self.storage.batch(*args, **kwargs))

    @contextlib.contextmanager
    def _naming_bad_values(self) -> Iterator[None]:
        """A ``StoredValueError`` of the storage as an ``EnvError`` naming the env and its worker."""
        try:
            yield
        except StoredValueError as exc:
            lane = next(lane for lane in self.lanes if lane.lo <= exc.row < lane.hi)
            first = min(other.lo for other in self.lanes if other.index == lane.index)  # the worker's env 0
            in_process = lane.worker.in_process
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
            fresh = [(t, envs + b.lane.lo - first.lane.lo) for b in sealed for t, envs in b.fresh]
            out = self._copy_out(first.slot, first.lane.lo, sealed[-1].lane.hi, first.frames, valid, keys, flags,
                                 first.mask, fresh=fresh)
            return _truncate_flags(out, valid) if any(b.truncated for b in sealed) else out
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
            fresh, lane.fresh = lane.fresh, []
            for t, envs in fresh:  # (the resets in the dropped part are gone with it)
                if t == count:
                    lane.start_flags[:, envs] = False
                elif t > count:
                    lane.fresh.append((t - count, envs))
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

    def _on_reply(self, owner: LaneOwner) -> None:
        """A doorbell or an error report from ``owner`` (its reader callback, or its task)."""
        if owner.error is not None:
            if self._failed is None:
                self._failed = owner
            self._wake()
            return
        try:
            self._harvest(self._lanes_of.get(id(owner)))  # (it may call the collector's on_full)
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
        got = False
        if lanes is None:
            got = bool(self._process_lanes) and self._harvest_block()
            lanes = self._other_lanes
        for lane in lanes:
            if lane.state is not READY and lane.worker.completed():
                self.take(lane)
                got = True
        return got

    def _harvest_block(self) -> bool:
        """Take in the completed commands of every process lane, read from the control
        block at once (two array reads, then integer compares): a lane in flight is done when
        its ``DONE`` word says the sequence number its ``CMD`` word holds (``Port.seen`` then
        records it as taken in, as ``Port.completed`` does). (Numpy over a few dozen lines
        costs more than these compares: a microsecond per operation.)"""
        block = self._block
        done = block[:, protocol.DONE].tolist()
        cmd = block[:, protocol.CMD].tolist()
        seen = self._seen
        hits = []
        for lane, line in self._process_lanes:
            if lane.state is not READY and done[line] == cmd[line] >> 2:
                seen[line] = done[line]
                hits.append(lane)
        if len(hits) > 1:
            self._take_all(hits)
        elif hits:
            self.take(hits[0])
        return bool(hits)

    def _take_all(self, lanes: list[Lane]) -> None:
        """``take`` each of ``lanes`` (in lane order), booking the steps of the lanes at one
        slot that each completed one ``STEP`` (whatever their columns) in one pass over all
        their rows (``_take_steps``: it hands out new trajectory ids in row order, as a call
        per lane would)."""
        group: list[Lane] = []
        for lane in lanes:
            if lane.state is STEPPING and not lane.run and not lane.carry:
                if group and lane.slot != group[0].slot:
                    self._take_steps(group)
                    group = []
                group.append(lane)
                continue
            if group:
                self._take_steps(group)
                group = []
            self.take(lane)
        if group:
            self._take_steps(group)

    def _take_steps(self, lanes: list[Lane]) -> None:
        """``take`` for lanes in row order at one slot, each done with one ``STEP`` (no run,
        nothing carried): their rows booked at once, as one block when they sit side by side
        at one column, else through index arrays (``Timelines.stepped_rows``)."""
        if len(lanes) == 1:
            self.take(lanes[0])
            return
        first = lanes[0]
        s, t, lo, hi = first.slot, first.t, first.lo, lanes[-1].hi
        tl, st = self.timelines, self.storage
        before = tl.completed_trajectories
        if all(lane.t == t for lane in lanes) and hi - lo == sum(lane.num_envs for lane in lanes):
            terminated, truncated, next_count = st.flags(s, t, lo, hi, cache=False)
            tl.stepped(lo, hi, terminated, truncated, next_count)
        else:
            rows, cols = rows_and_columns(lanes)
            terminated, truncated = st.terminated[s, cols, rows], st.truncated[s, cols, rows]
            counts = tl.stepped_rows(rows, terminated, truncated)
            if counts is not None and st.next_step_count is not None:
                st.next_step_count[s, cols, rows] = counts
        ended = None
        if tl.completed_trajectories != before:  # each lane's share of the episodes that ended
            starts, at = [], 0
            for lane in lanes:
                starts.append(at)
                at += lane.num_envs
            ended = np.add.reduceat(terminated | truncated, starts, dtype=np.int64).tolist()
        self.busy -= len(lanes)
        for i, lane in enumerate(lanes):  # (every lane booked before any on_full, which may raise)
            if ended is not None:
                lane.completed_trajectories += ended[i]
            lane.worker.env_steps += lane.num_envs
            lane.t += 1
            lane.state = READY
        on_full = self._on_full
        for lane in lanes:
            if lane.t >= lane.frames and on_full is not None:
                on_full(lane)
                self._delivered = True
            self._ready(lane)

    def post_steps(self, lanes: list[Lane]) -> None:
        """Post each of ``lanes`` a ``STEP`` at its slot and column (the actions are in the storage)."""
        self.busy += len(lanes)
        for lane in lanes:
            lane.state = STEPPING
            lane.worker.post(protocol.STEP_CODE, lane.slot, lane.t)

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

    def _spin_rounds(self, runner: Callable[[], Actor], until: Callable[[], bool]) -> None:
        clock, spin_s, yield_ = time.perf_counter, self.spin_s, os.sched_yield
        give_back = clock() + SLICE_S  # let the loop run its other callbacks now and then
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
                    return  # runs only: each lasts about its span_s, far longer than a spin
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

    def _rung_round(self, runner: Actor) -> None:
        """A round whose doorbells ring together when it ends (``Bell.hold``)."""
        bells = self._bells
        for bell in bells:
            bell.hold()
        try:
            self.rounds.round(runner)
        finally:
            for bell in bells:
                bell.release()

    def _engine_asleep(self, flag: int) -> None:
        for line in self._lines:
            line[protocol.E_ASLEEP] = flag

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
        return self.busy == 0

    async def pump(self, runner: Callable[[], Actor], until: Callable[[], bool],
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

    async def run_inline(self, runner: Callable[[], Actor], until: Callable[[], bool]) -> None:
        """``pump()``'s synchronous fast path, for one lane whose worker steps inside
        ``post`` (``_workers.inline_worker``; ``Collector``): see ``rounds.InlineRounds.run``.
        A command an exception cut short counts as undone: those envs are reset before
        their next step, with new trajectory ids."""
        await self.rounds.run(runner, until)

    def abandon(self, lanes: list[Lane]) -> None:
        """The commands under way on ``lanes`` were cut short (an exception, Ctrl-C, a
        cancelled task): they count as undone. Those envs are reset before their next step
        and start new trajectories, with new ids; the step before, if it is in the batch
        under way, is marked truncated (so that within a batch a trajectory id changes only
        after a done step)."""
        st = self.storage
        for lane in lanes:
            if lane.state is not READY:
                lane.state = READY
                lane.run = 0
                self.busy -= 1
                if lane.t > 0:
                    st.truncated[lane.slot, lane.t - 1, lane.lo : lane.hi] = True
                self.timelines.request_reset(None, lane.lo, lane.hi)
                self._ready(lane)

    async def _raise(self, owner: LaneOwner) -> None:
        error = owner.error
        assert error is not None  # (a failed owner)
        if error.remote_type is None and error.exitcode is None and owner.process is not None:
            with anyio.move_on_after(2):  # name the signal that killed it, if it was one
                await owner.process.wait()
            error = type(error).died(owner.index, owner.pid, owner.process.returncode)
            owner.error = error
        raise error

    # ------------------------------------------------------------------ completions and resets

    def take(self, lane: Lane) -> None:
        """Book ``lane``'s completed command: a step (or a run of steps) moves its column on,
        a reset clears the envs' pending resets. Its worker wrote the results already."""
        self.busy -= 1
        if lane.state is STEPPING:
            t, lo, hi = lane.t, lane.lo, lane.hi
            tl = self.timelines
            before = tl.completed_trajectories
            steps = 1
            if lane.run:
                steps = self.rounds.book_run(lane)
            else:
                tl.stepped(lo, hi, *self.storage.flags(lane.slot, t, lo, hi, cache=self._cache_flags))
                if lane.carry:
                    self.storage.carry(lane.slot, t, lo, hi, lane.carry, self.reset_when_done)
            lane.completed_trajectories += tl.completed_trajectories - before
            lane.worker.env_steps += lane.num_envs * steps
            lane.t = t + steps
            lane.state = READY
            if lane.t >= lane.frames and self._on_full is not None:
                self._on_full(lane)
                self._delivered = True
        else:
            self.timelines.resets_done(lane.lo, cast(np.ndarray, lane._resetting))
            lane.state = READY
        self._ready(lane)

    def post_reset(self, lane: Lane) -> bool:
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
        if lane.start_flags is not None and len(idx):  # (without reset_when_done)
            # the observations the reset writes at column t begin episodes: root flags false
            if lane.t == 0:
                lane.start_flags[:, idx] = False
            else:
                lane.fresh.append((lane.t, idx))
        st.reset_mask[lo:hi] = False
        st.reset_mask[idx + lo] = True
        if seeds is None:
            st.seed_set[lo:hi] = False
        else:
            st.seed_set[lo:hi] = [v is not None for v in seeds]
            st.seed[lo:hi] = [0 if v is None else v for v in seeds]
        lane._resetting = idx
        lane.state = RESETTING
        self.busy += 1
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
            await self.pump(_no_actor, self.idle)


def _bells(ports: Iterable[ProcessLane]) -> list[Bell]:
    """The futex doorbells of the workers of ``ports`` (one per pool; none without futexes)."""
    found: dict[int, Bell] = {}
    for port in ports:
        bell = getattr(port.worker, "bell", None)
        if bell is not None:
            found[id(bell)] = bell
    return list(found.values())


def _no_actor() -> Actor:
    """The actor of a pump whose rounds find no lane to act for (every lane held: ``settle``):
    ``None``, never called."""
    return cast("Actor", None)


def _truncate_flags(out: dict, valid: np.ndarray) -> dict:
    """TorchRL's ``set_truncated`` on the env's own done flags in a copied-out batch (``out``,
    ``[envs, frames]``, env ``i`` filled up to column ``valid[i]``): at each env's last step,
    every ``("next", ..., "truncated")`` entry (a TorchRL env's flags per agent group, say)
    is set, and the ``"done"`` beside it. The engine's own root flag is set in the storage
    already (``seal``: setting it again changes nothing); these are set here, in the copy,
    since in the storage they are also the next batch's first observations."""
    rows = np.flatnonzero(valid > 0)
    if not rows.size:
        return out
    at = (rows, valid[rows] - 1)
    for key in [k for k in out if k[0] == "next" and len(k) == 2]:
        path = key[1] if isinstance(key[1], tuple) else (key[1],)
        if path[-1] != "truncated":
            continue
        for name in ("truncated", "done"):
            flag = out.get(("next", (*path[:-1], name) if len(path) > 1 else name))
            if flag is not None:
                flag[at] = True
    return out

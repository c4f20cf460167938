"""Round strategies: which lanes a round acts on, and how it reads and writes their rows.

The scheduler (``_engine.scheduler``) runs a *round* whenever a completion arrived or the
collector released a slot: the ready lanes that need a reset are sent a ``RESET``, the
others get actions from **one** policy call and a ``STEP``. How a round finds its lanes and
lays out their observations depends on the lanes, so each schedule is a strategy of its
own, chosen once when the scheduler is built (``rounds_for``), each readable alone:

* ``WorkerRounds``: the lanes of worker processes (and coroutine workers), a few of them,
  scanned at each round. The policy reads a *view* of the storage when the ready lanes sit
  side by side at the same column, as in a lockstep round (``_act_block``); lanes at one
  slot but different columns are gathered, and their outputs written, through index arrays,
  one fancy index per field whatever the number of lanes (``_act_rows``); the rest (lanes in
  different slots, or a policy that reads aligned inputs in place) are concatenated and
  written lane by lane (``_act_apart``).
* ``RunRounds``: the same, but where the actor offers ``runs`` (``_policies.actor``: a
  random policy, whose actions do not depend on the observations, or the policy in the
  workers, each worker acting with its own copy), a round needs no policy call: each ready
  lane that ``takes_runs`` (a process's port) is given a *run* instead, a command for about
  ``runs.span_s`` worth of steps (``_workers.protocol``), whose actions are either written
  here at once (``Runs.fill``: random actions, every step's drawn from the lane's own stream)
  or computed by the worker's copy at each step (``Runs.local``, for lanes that
  ``acts_locally``). The worker steps on with no round trip, and the run is booked as a whole
  when it completes (``book_run``, ``Timelines.ran``): the main process does a few array
  operations per run, not per step. (The collector decides when runs are allowed: never
  where a batch must be cut after any step, an interruptor, or where finished envs wait for
  a reset, no ``reset_when_done``.)
* ``InlineRounds``: a ``Collector``'s in-process envs, one ``synchronous`` lane
  (``_workers.inline_worker``) that carries a command out inside ``post``: ``run`` (the
  scheduler's ``run_inline``) runs round after round with no callback at all, and gives the
  event loop a turn about every ``SLICE_S``. Where the actor offers runs (random actions)
  and the collector allows them, each round is a run of the steps of about ``SLICE_S``,
  as ``RunRounds`` posts a process, taken by the lane inside ``post`` and booked as a
  whole: per step, only the envs' own step and what ``_workers.rows`` writes besides.
* ``EnvQueueRounds``: a ``Collector``'s coroutine envs, one lane each, hundreds of them,
  each at its own column. A scan of every lane per round would cost more than the round:
  ready lanes wait in a queue in the order they became ready (the scheduler tells the
  strategy, ``ready(lane)``), a round takes them as ``Batching`` says (EnvPool's
  ``max_batch_size``/``min_batch_size``/``batch_timeout``), gathers their observations with
  one fancy index per field and writes their outputs the same way (each lane at its own
  column, and slot: an env that has its steps of a batch may step on into the next one,
  ``Collector``'s ``step_ahead``).

The interface (``Rounds``) is four calls: ``round(actor)`` posts the ready lanes their
commands, ``ready(lane)`` says a lane may want a step (its batch began, a command of it was
taken in or abandoned), ``book_run(lane)`` books a completed run (``RunRounds``' only), and
``run(actor, until)`` is the fast path, ``InlineRounds``' only. The scheduler asks the
strategy, never its type; what an actor does (calls here, runs, checked actions) it declares
(``_policies.actor.Actor``), and the strategies ask it, never its kind.
What the strategies share is there too: the policy call and its checks (``_infer``), and
posting the steps (``_post_steps``). The bookkeeping of completions, resets, batches and
the event loop stays with the scheduler (what a strategy uses of it: ``Engine``).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import anyio
import numpy as np

from .._envs.keyed import KeyedActionCheck
from .._envs.spaces import NonFiniteAction
from .._errors import PolicyError
from .._policies.output_writer import env_actions
from .._policies.outputs import check_outputs, host_array, note_policy_inputs
from .._workers import protocol
from .lanes import READY, STEPPING, Lane, rows_and_columns

if TYPE_CHECKING:
    from .._envs.spaces import ActionCheck
    from .._policies.actor import Actor, Runs
    from .profile import Profile
    from .storage import RolloutStorage
    from .timelines import Timelines

SLICE_S = 0.001
"""Longest stretch of rounds run without a break before the loop gets a turn."""
OVERSHOOT = 4
"""A run that takes more than this many ``SLICE_S`` sizes the next at its own pace (``InlineRounds``)."""


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


class Engine(Protocol):
    """What a round strategy uses of its scheduler (``Scheduler`` is one)."""

    storage: RolloutStorage
    timelines: Timelines
    lanes: list[Lane]
    check_action: ActionCheck
    """Checks (and converts) a policy's actions, and gives the envs theirs."""
    busy: int
    """Lanes stepping or resetting: a strategy adds those it posts."""
    runs: bool
    """Actions may go in runs of steps where the actor offers them (the collector decides)."""
    profile: Profile | None
    """Times and names the policy calls (``_engine.profile``; ``None``: off)."""

    def post_reset(self, lane: Lane) -> bool:
        """Send ``lane`` a ``RESET`` for the envs that need one; ``True``."""
        ...

    def take(self, lane: Lane) -> None:
        """Book ``lane``'s completed command."""
        ...

    def poke(self) -> None:
        """Run a round on the next loop pass."""
        ...

    def abandon(self, lanes: list[Lane]) -> None:
        """The commands under way on ``lanes`` were cut short: they count as undone."""
        ...

    def post_steps(self, lanes: list[Lane]) -> None:
        """Post each of ``lanes`` a ``STEP`` at its slot and column (they count as busy)."""
        ...


def rounds_for(sched: Engine, batching: Batching | None, runs: bool) -> Rounds:
    """The strategy for ``sched``'s lanes: see the module docstring."""
    if batching is not None:
        return EnvQueueRounds(sched, batching)
    lanes = sched.lanes
    if len(lanes) == 1 and lanes[0].worker.synchronous:
        return InlineRounds(sched)
    return RunRounds(sched) if runs else WorkerRounds(sched)


class Rounds:
    """The interface the scheduler drives, and what every strategy shares."""

    cache_flags = True
    """The scheduler may keep views of a lane's flags per column (``RolloutStorage.flags``);
    not for one-env lanes, which would make one per env and column."""

    def __init__(self, sched: Engine):
        self.sched = sched
        self.storage, self.timelines, self.lanes = sched.storage, sched.timelines, sched.lanes

    def round(self, runner: Actor) -> None:
        """Post the ready lanes their commands: resets, or steps with the actions of one
        call of ``runner`` (or runs of steps)."""
        raise NotImplementedError

    def book_run(self, lane: Lane) -> int:
        """Book ``lane``'s completed run of steps; returns the steps it took. Only a strategy
        that posts runs (``RunRounds``) has any to book."""
        raise NotImplementedError(f"{type(self).__name__} posts no runs")

    def ready(self, lane: Lane) -> None:
        """``lane`` may be ready for its next step: its batch began, a command of it was
        taken in, or one was abandoned. (Strategies that scan the lanes need not know.)"""

    async def run(self, runner: Callable[[], Actor], until: Callable[[], bool]) -> None:
        """Rounds until ``until()``, with no event-loop callback (``Scheduler.run_inline``)."""
        kinds = sorted({type(lane.worker).__name__ for lane in self.lanes})
        raise ValueError(f"run_inline drives one inline lane, not {len(self.lanes)} ({', '.join(kinds)})")

    def _infer(self, ready: list[Lane], runner: Actor, obs,
               n: int) -> tuple[dict, np.ndarray | None, np.ndarray]:
        """One policy call on the observations ``obs`` of the ``ready`` lanes (``n`` envs):
        the outputs (checked), the ``"action"`` the batch stores (``None``: the outputs hold
        what it stores, an env with several action keys), and the actions the envs get."""
        profile = self.sched.profile
        try:
            out = runner(obs, n) if profile is None else profile.policy(runner, obs, n)
        except Exception as exc:
            if ready[0].keys is None:  # (a lane's first call: say what the policy was given)
                note_policy_inputs(exc, obs, n)
            raise
        if ready[0].keys is None or any(not v.shape or v.shape[0] != n for v in out.values()):
            check_outputs(out, n)  # a lane's first call, or a row count that would broadcast
        check = self.sched.check_action
        if isinstance(check, KeyedActionCheck):  # several action keys: each checked, packed for the envs
            try:
                out, to_env = check.check(out, n, host_array)
            except NonFiniteAction as exc:
                raise self._not_finite(ready, exc) from None
            self._book_keys(ready, out)
            return out, None, to_env  # (each action stored as checked, under its key)
        action = out["action"]
        if not isinstance(action, np.ndarray):
            action = host_array(action)  # (bfloat16 as float32 for the check: the batch keeps the bfloat16)
        to_env = action  # what the envs are given; ``action``: what the batch stores
        if runner.checks_actions:
            try:
                checked, to_env = env_actions(check, action, n)
            except NonFiniteAction as exc:
                raise self._not_finite(ready, exc) from None
            if checked is not action:  # converted (booleans for a discrete space): store that
                out = {**out, "action": checked}
                action = checked
        self._book_keys(ready, out)
        return out, action, to_env

    def _book_keys(self, ready: list[Lane], out: dict) -> None:
        """The keys the policy wrote: each lane's first call books them, later calls must match."""
        keys = tuple(out)
        st = self.storage
        for lane in ready:
            if lane.keys is None:
                lane.keys = keys
                lane.carry = st.carried(keys)
            elif lane.keys != keys:
                st.check_outputs(out, lane.keys)

    def _not_finite(self, ready: list[Lane], exc: NonFiniteAction) -> PolicyError:
        """The ``PolicyError`` for the action ``exc`` found not finite, naming its env: row
        ``exc.row`` of the call over the ``ready`` lanes (their rows side by side, in order)."""
        row = exc.row
        for lane in ready:
            if row < lane.num_envs:
                break
            row -= lane.num_envs
        first = min(other.lo for other in self.lanes if other.index == lane.index)  # the worker's env 0
        return PolicyError.not_finite(exc.value, worker=lane.index, env=lane.lo + row - first, pid=os.getpid())

    def _post_steps(self, ready: list[Lane]) -> None:
        """Their actions are in the storage: post each of the ``ready`` lanes a ``STEP``
        (``Engine.post_steps``: the process lanes' control lines written at once)."""
        self.sched.post_steps(ready)


class WorkerRounds(Rounds):
    """Rounds over every ready lane, found by a scan (the parts of worker processes)."""

    def round(self, runner: Actor) -> None:
        ready = self._ready_lanes()
        if ready:
            self._act(ready, runner)

    def _ready_lanes(self) -> list[Lane]:
        """The lanes that want a step: the ready ones, less those just sent a reset."""
        ready = [lane for lane in self.lanes if lane.state is READY and not lane.held and lane.t < lane.frames]
        tl = self.timelines
        if ready and tl.any_reset:
            post_reset = self.sched.post_reset
            ready = [lane for lane in ready if not (tl.wants_reset(lane.lo, lane.hi) and post_reset(lane))]
        return ready

    def _act(self, ready: list[Lane], runner: Actor) -> None:
        s, t = ready[0].slot, ready[0].t
        if all(lane.slot == s and lane.t == t and (i == 0 or ready[i - 1].hi == lane.lo)
               for i, lane in enumerate(ready)):
            self._act_block(ready, runner)
        elif all(lane.slot == s for lane in ready) and not runner.aligned_inputs:
            self._act_rows(ready, runner)
        else:
            self._act_apart(ready, runner)

    def _act_block(self, ready: list[Lane], runner: Actor) -> None:
        """Lanes side by side at one slot and column: the policy reads a view of the storage,
        and its outputs are written as one block of rows."""
        st, tl = self.storage, self.timelines
        first = ready[0]
        s, t, lo, hi = first.slot, first.t, first.lo, ready[-1].hi
        out, action, to_env = self._infer(ready, runner, st.policy_input(s, t, lo, hi), hi - lo)
        st.write(s, t, lo, hi, out, 0, runner.version, tl.traj_ids, tl.step_count, action)
        st.action[t, lo:hi] = to_env
        self._post_steps(ready)

    def _act_rows(self, ready: list[Lane], runner: Actor) -> None:
        """Lanes at one slot, at different columns (or not adjacent): their rows gathered, and
        the outputs written, with one fancy index per field (``rows_and_columns``)."""
        st, tl = self.storage, self.timelines
        s = ready[0].slot
        rows, cols = rows_and_columns(ready)
        out, action, to_env = self._infer(ready, runner, st.gather(s, cols, rows), len(rows))
        st.write_rows(s, cols, rows, out, runner.version, tl.traj_ids, tl.step_count, action)
        st.action[cols, rows] = to_env
        self._post_steps(ready)

    def _act_apart(self, ready: list[Lane], runner: Actor) -> None:
        """Lanes at different columns (or slots, or not adjacent): their observations are
        concatenated, and the outputs written lane by lane."""
        st, tl = self.storage, self.timelines
        obs = st.policy_inputs([(lane.slot, lane.t, lane.lo, lane.hi) for lane in ready],
                               aligned=runner.aligned_inputs)  # (a JAX policy reads it in place)
        out, action, to_env = self._infer(ready, runner, obs, sum(lane.num_envs for lane in ready))
        version = runner.version
        start = 0
        for lane in ready:
            st.write(lane.slot, lane.t, lane.lo, lane.hi, out, start, version, tl.traj_ids, tl.step_count, action)
            st.action[lane.t, lane.lo : lane.hi] = to_env[start : start + lane.num_envs]
            start += lane.num_envs
        self._post_steps(ready)


class RunRounds(WorkerRounds):
    """``WorkerRounds`` where the actor's actions go in runs of steps; see the module docstring."""

    def round(self, runner: Actor) -> None:
        ready = self._ready_lanes()
        if ready and runner.runs is not None:
            ready = self._post_runs(ready, runner.runs)
        if ready:
            self._act(ready, runner)

    def _post_runs(self, ready: list[Lane], runs: Runs) -> list[Lane]:
        """Give each of the ``ready`` lanes that takes runs (and acts locally, for ``local``
        runs) a run of steps; returns the others, for a call here."""
        runs.begin()
        rest = []
        now, local, storage = time.perf_counter(), runs.local, self.storage
        for lane in ready:
            if not lane.runs or (local and not lane.worker.acts_locally):
                rest.append(lane)
                continue
            left = lane.frames - lane.t
            k = left if 2 * left <= 3 * lane.run_steps else lane.run_steps  # (no short run at the end)
            if lane.keys is None:
                lane.keys, lane.carry = runs.keys, []
            runs.fill(storage, lane, k)
            lane.run, lane.run_posted, lane.run_span, lane.state = k, now, runs.span_s, STEPPING
            self.sched.busy += 1
            lane.worker.post(protocol.RUN_CODE, lane.slot, lane.t, k, local)
        return rest

    def book_run(self, lane: Lane) -> int:
        """A completed run: the ids and step counts of all its steps at once, and the size
        of the lane's next run (its ``span_s`` at this one's pace, growing at most twofold).
        Returns the steps it took."""
        k = self._book(lane)
        per_step = (time.perf_counter() - lane.run_posted) / k
        lane.run_steps = max(1, min(int(lane.run_span / per_step) if per_step > 0 else k, 2 * max(k, lane.run_steps)))
        return k

    def _book(self, lane: Lane) -> int:
        """The ids and step counts of all the steps of ``lane``'s completed run, at once;
        returns the steps it took."""
        s, t, lo, hi = lane.slot, lane.t, lane.lo, lane.hi
        k = lane.worker.steps_done()  # all of the run, unless settle() cut it short
        st, cols = self.storage, slice(t, t + k)
        ids, counts = self.timelines.ran(lo, hi, st.terminated[s, cols, lo:hi], st.truncated[s, cols, lo:hi])
        st.ran(s, t, lo, hi, ids, counts)
        lane.run = 0
        return k


class InlineRounds(RunRounds):
    """One ``synchronous`` lane (a ``Collector``'s in-process envs): ``run`` is the fast path.

    Its runs differ from a process's in two ways. The actions of the whole rest of the batch
    are drawn at its first run (``_post_run``), and each run steps through the next of them:
    the draws do not depend on how the steps were grouped into runs. And a run lasts about
    ``SLICE_S`` at the fastest pace seen lately (``book_run``), not at the last run's: on a busy
    machine the clock runs on while the thread waits for a core, and runs sized by the last
    one's pace would shrink to a step or two, each booked on its own. A run that took more
    than ``OVERSHOOT`` times ``SLICE_S`` sizes the next at its own pace: the env slowed down,
    and a run sized at the old pace would hold the event loop for long (``sized``)."""

    def __init__(self, sched: Engine):
        super().__init__(sched)
        self._drawn_to = 0
        """The batch's actions are drawn (and in the storage) up to this column."""
        self._run_steps = 1
        """The steps of the next run: ``SLICE_S`` at ``_pace``."""
        self._pace = float("inf")
        """Seconds per step: the fastest of the last runs' paces, forgetting a quarter a run."""
        self._posted = 0.0
        """When the run under way was posted."""

    async def run(self, runner: Callable[[], Actor], until: Callable[[], bool]) -> None:
        """Round after round in this one loop, with no callback, no search for ready lanes
        and no harvest; the event loop gets a turn about every ``SLICE_S`` (so that
        collection stays cancellable). Random actions go in runs (``RunRounds``) where the
        scheduler allows them (``Scheduler.runs``), each of about ``SLICE_S`` (``book_run``:
        at the fastest recent pace, or at the last run's own where it overshot). A command an exception cut short counts
        as undone (``Scheduler.abandon``): those envs are reset before their next step, with
        new trajectory ids; the steps a run took before it stay in the batch, as steps
        posted one by one would."""
        sched, lanes, tl = self.sched, self.lanes, self.timelines
        lane = lanes[0]
        worker, act, take, post_reset = lane.worker, self._act_block, sched.take, sched.post_reset
        post_run = self._post_run if sched.runs and lane.runs else None
        clock = time.perf_counter
        last = clock()
        try:
            while not until():
                if tl.any_reset and tl.wants_reset(lane.lo, lane.hi):
                    post_reset(lane)
                else:
                    actor = runner()
                    runs = actor.runs
                    if post_run is not None and runs is not None and not runs.local:
                        post_run(lane, runs)
                    else:
                        act(lanes, actor)  # (no run: one step, with a call of the actor here)
                take(lane)
                worker.completed()  # (after take: a run's steps_done() is its own until then)
                if clock() - last > SLICE_S:
                    await anyio.lowlevel.checkpoint()
                    last = clock()
        except BaseException:
            if lane.run and worker.steps_done():  # (the run's steps before the failed one: booked)
                take(lane)
                lane.state = STEPPING  # (and the failed one undone, as alone)
                sched.busy += 1
            sched.abandon([lane])
            raise

    def _post_run(self, lane: Lane, runs: Runs) -> None:
        """Post ``lane`` its next run: the actions of the rest of the batch drawn first if
        they are not yet (at its first run: a new batch has no ``keys``)."""
        if lane.keys is None or self._drawn_to <= lane.t:
            runs.begin()
            lane.keys, lane.carry = runs.keys, []
            runs.fill(self.storage, lane, lane.frames - lane.t)
            self._drawn_to = lane.frames
        left, k = self._drawn_to - lane.t, self._run_steps
        if 2 * left <= 3 * k:  # (no short run at the end)
            k = left
        lane.run, lane.state = k, STEPPING
        self.sched.busy += 1
        self._posted = time.perf_counter()
        lane.worker.post(protocol.RUN_CODE, lane.slot, lane.t, k)

    def redraw(self) -> None:
        """The actions drawn ahead for the rest of the batch are forgotten: the next run
        draws them anew (``set_seed`` after a collection cut mid-batch: the new seed's)."""
        self._drawn_to = 0

    def book_run(self, lane: Lane) -> int:
        """``RunRounds.book_run``, the next run sized at the fastest pace seen lately (see the
        class docstring): a run slowed down by a wait for a core does not shrink the next."""
        k = self._book(lane)
        self._pace, self._run_steps = self.sized(self._pace, self._run_steps, k, time.perf_counter() - self._posted)
        return k

    @staticmethod
    def sized(pace: float, run_steps: int, k: int, took: float) -> tuple[float, int]:
        """The pace (seconds per step) and the steps of the next run, after a run of ``k``
        steps that took ``took`` seconds, the pace so far being ``pace`` and the last run's
        size ``run_steps``. The fastest pace seen lately, forgetting a quarter a run; but a
        run that overshot ``SLICE_S`` more than ``OVERSHOOT`` times over sets the pace at its
        own (the env slowed down: a run sized at the old pace would hold the loop for long)."""
        own = took / k
        pace = own if took > OVERSHOOT * SLICE_S else min(own, 1.25 * pace)
        return pace, max(1, min(int(SLICE_S / pace) if pace > 0 else 2 * k, 2 * max(k, run_steps)))


class EnvQueueRounds(Rounds):
    """Per-env rounds over one-env lanes, lane ``i`` on row ``i``; see the module docstring."""

    cache_flags = False

    def __init__(self, sched: Engine, batching: Batching):
        super().__init__(sched)
        if any(lane.num_envs != 1 or lane.lo != i for i, lane in enumerate(self.lanes)):
            raise ValueError("per-env rounds drive lanes of one env each, lane i on row i")
        self.batching = batching
        self.queue: list[Lane] = []
        """The ready lanes, in the order they became ready (``lane.queued``)."""
        self._first_ready: float | None = None
        self._timer: asyncio.TimerHandle | None = None

    def ready(self, lane: Lane) -> None:
        if not lane.queued and lane.state is READY and not lane.held and lane.t < lane.frames:
            lane.queued = True
            self.queue.append(lane)

    def round(self, runner: Actor) -> None:
        queue, tl = self.queue, self.timelines
        keep = []
        for lane in queue:  # drop what is no longer ready (held between batches, or full)
            if lane.state is READY and not lane.held and lane.t < lane.frames:
                if tl.any_reset and tl.needs_reset[lane.lo]:
                    lane.queued = False
                    self.sched.post_reset(lane)
                else:
                    keep.append(lane)
            else:
                lane.queued = False
        if not keep:
            queue.clear()
            return
        b, clock = self.batching, time.perf_counter
        if len(keep) < b.min_batch_size and self.sched.busy:  # wait for more, but not for long
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
        self._act(take, runner)
        if queue:
            self.sched.poke()  # the rest, capped out of this call, in the next

    def _on_timer(self) -> None:
        self._timer = None
        self.sched.poke()

    def _act(self, ready: list[Lane], runner: Actor) -> None:
        """One-env lanes, each at its own column (and slot, where lanes may be a batch apart:
        ``Collector``'s ``step_ahead``): one fancy index per field."""
        st, tl = self.storage, self.timelines
        n = len(ready)
        s: int | np.ndarray = ready[0].slot
        if st.slots > 1:
            s = np.fromiter([lane.slot for lane in ready], dtype=np.int64, count=n)
        rows = np.fromiter([lane.lo for lane in ready], dtype=np.int64, count=n)
        cols = np.fromiter([lane.t for lane in ready], dtype=np.int64, count=n)
        out, action, to_env = self._infer(ready, runner, st.gather(s, cols, rows), n)
        st.write_rows(s, cols, rows, out, runner.version, tl.traj_ids, tl.step_count, action)
        st.action[cols, rows] = to_env
        self._post_steps(ready)

"""One consumer at a time: who may collect the next batch, and abandoned iterations.

A collector yields one batch at a time. ``Consumers._guarded_collect`` wraps a variant's
``_collect()``: a second caller while a batch is collected gets ``CollectorBusyError``, and a
collection that raises marks the collector failed. One exception: an ``async for`` whose
event loop was stopped in the middle of a batch (Ctrl-C raised out of
``run_until_complete``, its task left pending) is no longer a consumer. The next caller
cancels it and resumes its batch (``_take_over``), and it never goes on by itself when its
loop runs again. ``_loop_run`` tells one run of a loop from the next: asyncio and uvloop
install fresh async-generator hooks each time ``run_forever`` starts.

Collections that run on the collector's loop thread for a caller on another loop take turns
there, and a batch collected for a caller cancelled too late to stop it is kept for the next
(``_across``, ``_collect_next``).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
import weakref
from collections.abc import Callable
from typing import Any

from tensordict import TensorDictBase

from .._errors import CollectorBusyError
from .background import BACKGROUND
from .loop_thread import LoopThread
from .parts import CollectorParts

logger = logging.getLogger("aiocollect")


def _loop_run() -> Any:
    """What tells this run of the thread's running event loop from its other runs.

    asyncio and uvloop install their async-generator hooks, fresh bound methods, each time
    ``run_forever`` starts, and put the previous ones back when it returns: the ``firstiter``
    hook in place is one object during a run and another once the loop was stopped and
    started again (a ``KeyboardInterrupt`` raised out of ``run_until_complete``, then the next
    ``run_until_complete``). ``None`` where no hook is installed (no run can be told apart)."""
    return sys.get_asyncgen_hooks().firstiter


class Consumer:
    """A task that collects (``DataCollectorBase._busy``) or iterates (``_AsyncBatches``), and
    the run of its event loop at that time (``_loop_run``), both held weakly: a consumer
    abandoned by its loop is neither kept alive nor mistaken for a new one."""

    __slots__ = ("run", "task")

    def __init__(self) -> None:
        try:
            task = asyncio.current_task()
        except RuntimeError:  # not on an asyncio loop (trio): never taken over
            task = None
        self.task: weakref.ref[asyncio.Task] | None = None if task is None else weakref.ref(task)
        self.run: weakref.ref | None
        try:
            self.run = weakref.ref(_loop_run())
        except TypeError:  # no hook, or one that cannot be referenced weakly
            self.run = None

    def in_this_run(self) -> bool:
        """Whether the loop has run without a stop since (called on that loop; true where it
        cannot be told). A stopped run's hook is freed once it is replaced, and the weak
        reference then reads ``None``."""
        return self.run is None or self.run() is _loop_run()

    def same_task(self, other: Consumer | None) -> bool:
        return other is not None and self.task is not None and other.task is not None and self.task() is other.task()


OVER = ("this `async for` was left in the middle of a batch when its event loop stopped (Ctrl-C?), and it "
         "does not go on when the loop runs again: the next `async for` resumes the batch")


_TAKEOVER_TIMEOUT_S = 20.0
"""How long a new iteration waits for an abandoned one, once cancelled, to let go of its batch
(its collection on the loop thread unwinds within ``loop_thread._UNWIND_TIMEOUT_S``)."""


class Consumers(CollectorParts):
    """``DataCollectorBase``'s guard around ``_collect()``. Uses the collector's ``_busy``
    (the ``Consumer`` collecting now), ``_kept``, ``_left_pending``, ``_failed``,
    ``_collect_seconds`` and ``_resources``."""

    _busy: Consumer | None

    async def _guarded_collect(self) -> tuple[TensorDictBase, int]:
        """``_collect()``, one at a time, marking the collector failed if it raises.

        A second caller while a batch is collected gets ``CollectorBusyError``, unless the
        consumer collecting it was abandoned (``_take_over``): its event loop was stopped in
        the middle of the batch and its task left pending (Ctrl-C raised out of
        ``run_until_complete``). That consumer's task is then cancelled and this caller
        resumes the batch. The abandoned task may run again before anyone takes over (the
        loop runs again): its collection then ends with ``CancelledError`` and keeps the
        batch for the next caller, so an interrupted ``async for`` never goes on.
        """
        self._check_usable()
        if self.is_running() and not BACKGROUND.get():
            raise CollectorBusyError(
                f"{type(self).__name__} is already collecting in the background (start()) into its "
                "replay buffer: sample from the buffer, or call async_shutdown() before iterating."
            )
        while self._busy is not None:
            await self._take_over(self._busy)
        self._busy = claim = Consumer()
        started = time.perf_counter()
        try:
            collected = await self._collect_next()
            if not claim.in_this_run():  # its loop was stopped meanwhile: an abandoned iteration
                self._kept = collected  # (not counted yet: the next collection delivers it)
                raise asyncio.CancelledError(OVER)
            return collected
        except asyncio.CancelledError:
            if self._closed and (self._cancelled_by_shutdown() or self._shutdown_cancelled_this_task()):
                raise self._closed_error() from None
            raise
        except Exception as exc:
            self._failed = exc
            raise
        finally:
            if self._busy is claim:  # (not if it was taken over meanwhile)
                self._busy = None
            self._collect_seconds += time.perf_counter() - started

    def _shutdown_cancelled_this_task(self) -> bool:
        """``shutdown()`` cancelled this task itself (``_stop_collecting_caller``): the
        cancellation is taken back, and the task raises ``CollectorClosedError``."""
        task = asyncio.current_task()
        if task is None or task not in self._cancelled_for_shutdown:
            return False
        uncancel = getattr(task, "uncancel", None)  # (Python 3.11+)
        if uncancel is not None:
            uncancel()
        return True

    @staticmethod
    def _cancelled_by_shutdown() -> bool:
        """A cancellation nobody asked this task for: ``shutdown()`` from another thread
        stopped the collection (a task of a loop that is gone, closed by the garbage
        collector, has nothing to say: ``False``)."""
        try:
            task = asyncio.current_task()
        except RuntimeError:
            return False
        return task is not None and not getattr(task, "cancelling", lambda: 1)()

    async def _take_over(self, holder: Consumer) -> None:
        """Raise ``CollectorBusyError`` if ``holder``, the consumer collecting a batch, is alive;
        otherwise end its part, so that the caller resumes the batch.

        ``holder`` was abandoned if its task is gone or done, or if its event loop is no longer
        running the run in which it started the batch: stopped by a ``KeyboardInterrupt``
        raised inside it (in a REPL or terminal IPython, where each cell is a
        ``run_until_complete``) and either started again (this caller's loop), stopped, or
        closed. A task of this loop is cancelled and waited for (it unwinds as a cancelled
        ``async for`` does: the batch under way stays to be resumed); one of a stopped loop
        is cancelled and ends when that loop runs again; one of a closed loop never runs
        again: its coroutine is closed here.
        """
        task = None if holder.task is None else holder.task()
        if holder.task is not None and (task is None or task.done()):
            self._busy = None  # (its coroutine let go of the batch, or is about to)
            return
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        loop = None if task is None else task.get_loop()
        if task is None or loop is None or here is None or (loop is here and holder.in_this_run()) or (
                loop is not here and loop.is_running()):
            raise CollectorBusyError(
                f"{type(self).__name__} is already collecting a batch: a collector yields one batch "
                "at a time; don't iterate it from two places (or while start() runs) at once."
            )
        logger.info("aiocollect: %s takes over the batch of an `async for` whose event loop stopped "
                    "in the middle of it (Ctrl-C?); that iteration is cancelled", type(self).__name__)
        if loop.is_closed():
            try:
                task.get_coro().close()  # GeneratorExit: it unwinds now, in this thread
            except Exception:  # its own cleanup failed: logged, the batch is resumed anyway
                logger.exception("aiocollect: error while closing an abandoned iteration")
        elif loop is not here:
            # it ends when its loop runs again; until then it is kept from the garbage
            # collector, which would unwind it at any moment, maybe in the middle of a step
            task.cancel(OVER)
            self._left_pending.add(task)
            task.add_done_callback(self._left_pending.discard)
        else:
            task.cancel(OVER)
            deadline = time.monotonic() + _TAKEOVER_TIMEOUT_S
            while self._busy is holder and not task.done():
                if time.monotonic() > deadline:
                    raise CollectorBusyError(
                        f"{type(self).__name__}: the `async for` interrupted in the middle of a batch did not "
                        f"let go of it within {_TAKEOVER_TIMEOUT_S:.0f} s of being cancelled."
                    )
                await asyncio.sleep(0.001)
        if self._busy is holder:
            self._busy = None

    async def _collect_next(self) -> tuple[TensorDictBase, int]:
        """The batch kept for a caller that was cancelled (see ``_across``) if there is one,
        else ``_collect()``. On the collector's own loop thread, collections take turns
        (``LoopThread.serial``): the one of a caller that could not wait for it to unwind
        (see ``LoopThread.acall``) ends first, and the batch it kept comes next."""
        loop = self._resources.loop
        if self._kept is None:
            if loop is None or not loop.in_this_thread():
                return await self._collect()
            async with loop.serial:
                if self._kept is None:
                    return await self._collect()
        kept, self._kept = self._kept, None
        return kept

    async def _across(self, loop: LoopThread, collect: Callable[[], Any]) -> tuple[TensorDictBase, int]:
        """``await collect()`` on the collector's loop thread, for a caller on another loop
        (the async face). The batch is kept as soon as it is collected, so a caller
        cancelled once it was (too late to stop the collection) does not lose it: the next
        collection returns it first. Collections take turns there (``LoopThread.serial``),
        and one that finds a batch kept by an earlier caller's returns that one."""
        claim = self._busy

        async def keep() -> None:
            async with loop.serial:
                if self._kept is None:
                    self._kept = await collect()

        await loop.acall(keep)
        if claim is not None and self._busy is not claim:  # taken over meanwhile: the batch is the new caller's
            raise asyncio.CancelledError(OVER)
        kept, self._kept = self._kept, None
        assert kept is not None  # (keep() set it)
        return kept

"""The private event-loop thread behind the sync face.

``for batch in collector`` and ``with collector:`` run the one async implementation on an
event loop in a thread of its own, through anyio's blocking portal. That works the same in
a script, in a worker thread, and where the calling thread already runs a loop (a Jupyter
cell), without ``nest_asyncio``. uvloop is used where it is installed.

The thread is a daemon, and neither starting nor stopping it waits unboundedly on the
caller's side of a Ctrl-C: a ``KeyboardInterrupt`` that lands while the loop starts stops
the loop once it is up, instead of joining a thread whose loop nobody will stop (which is
what anyio's ``start_blocking_portal`` context manager does when its ``__enter__`` is
interrupted: the program then hangs until a second Ctrl-C).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any, TypeVar

import anyio
from anyio.from_thread import BlockingPortal

T = TypeVar("T")

logger = logging.getLogger("aiocollect")

try:  # uvloop is a dependency on Linux and macOS only
    import uvloop  # noqa: F401

    _BACKEND_OPTIONS = {"use_uvloop": True}
except ImportError:  # pragma: no cover - Windows
    _BACKEND_OPTIONS = {}

_UNWIND_TIMEOUT_S = 10.0
"""How long an interrupted ``call`` waits for the cancelled coroutine to unwind."""

_JOIN_TIMEOUT_S = 10.0
"""How long ``stop()`` waits, by default, for the thread after its loop was told to stop
(a worker collector gives it its workers' whole stop sequence and a margin)."""


class LoopThread:
    """An event loop running in a daemon thread until ``stop()``."""

    def __init__(self) -> None:
        self._ready: Future[BlockingPortal] = Future()
        self._abandoned = False
        self._stopping = False
        """Set by ``stop()`` (or an abandoned start): the loop is not to be used any more."""
        self._ending = False
        """The loop is stopping (``_end_jobs``): jobs handed over from now on fail."""
        self._live: set[_Job] = set()
        """Jobs handed to the loop and not settled yet: failed when the loop ends first."""
        self._exited = threading.Event()
        """Set when the thread's loop has ended (not ``Thread.join``, which a Ctrl-C can
        leave believing a running thread is gone)."""
        self.at_exit: list[Callable[[], None]] = []
        """Called in this thread, last registered first, once its loop's jobs are over and
        before the thread ends: what must end in the thread it began in (torch's profiler:
        a trace whose thread ended crashes the process at exit)."""
        self.serial = asyncio.Lock()
        """Taken on this loop by work that must not overlap: a collector's collections, one
        of which may still be unwinding when the next comes (see ``acall``)."""
        self._thread = threading.Thread(target=self._main, name="aiocollect-loop", daemon=True)
        # Everything from start() on is in the try: a Ctrl-C can land inside start() (it
        # waits on an event, after the thread began), in result(), or in reading ``ident``
        # (a property), and each leaves a running loop that nobody else holds.
        try:
            self._thread.start()
            self.portal: BlockingPortal = self._ready.result()
            self.ident: int | None = self._thread.ident  # (set: the thread started)
        except BaseException:
            # Plain stores first: no interrupt lands between entering this handler and
            # them (no call), so the loop stops once up even if a second Ctrl-C then cuts
            # _abandon short.
            self._abandoned = True
            self._stopping = True
            self._abandon()
            raise

    # the thread ------------------------------------------------------------------

    def _main(self) -> None:
        try:
            anyio.run(self._serve, backend="asyncio", backend_options=_BACKEND_OPTIONS)
        except BaseException as exc:
            if not self._ready.done():
                self._ready.set_exception(exc)
            else:
                logger.exception("aiocollect: the loop thread ended with an error")
        finally:
            self._exited.set()
            for job in list(self._live):  # handed over too late: the loop is gone
                job.fail()

    async def _serve(self) -> None:
        async with BlockingPortal() as portal:
            self._aloop = asyncio.get_running_loop()
            self._ready.set_result(portal)
            try:
                if not self._abandoned:  # (interrupted while starting: see _abandon)
                    await portal.sleep_until_stopped()
            finally:
                await self._end_jobs()
                self._run_at_exit()

    def _run_at_exit(self) -> None:
        while self.at_exit:
            fn = self.at_exit.pop()
            try:
                fn()
            except Exception:  # the others still run
                logger.exception("aiocollect: error in %r as the loop thread ends", fn)

    async def _end_jobs(self) -> None:
        """The loop stops: cancel the jobs still running and wait until they have unwound
        (what a task group does for its tasks)."""
        self._ending = True
        tasks = [job.task for job in list(self._live) if job.task is not None]
        for job in list(self._live):
            if job.started:
                job.cancel()
            else:
                job.fail()  # its caller gets a cancellation; its task, if any, sees it abandoned
        if tasks:
            with anyio.CancelScope(shield=True):
                await asyncio.gather(*tasks, return_exceptions=True)

    def _abandon(self) -> None:
        """The starting thread was interrupted: make sure the loop stops once it is up.

        This thread sets ``_abandoned`` before it looks at ``_ready``; the loop sets
        ``_ready`` before it looks at ``_abandoned``: one of the two sees the other's.
        """
        self._abandoned = True
        self._stopping = True
        try:
            if self._ready.done() and self._ready.exception() is None:
                portal = self._ready.result()
                portal.call(portal.stop, True)
        except BaseException:  # noqa: BLE001 - stopped already, or a second Ctrl-C
            pass

    # use -------------------------------------------------------------------------

    def in_this_thread(self) -> bool:
        return threading.get_ident() == self.ident

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``await fn(*args)`` on the loop and wait for it.

        If the waiting thread is interrupted (Ctrl-C raises ``KeyboardInterrupt`` in the
        main thread), the coroutine is cancelled and the interruption propagates once it
        has unwound (for at most ``_UNWIND_TIMEOUT_S``): nothing keeps running behind the
        user's back, and a call made right after does not find the last one still there.
        That holds wherever the interruption lands, even before the coroutine started
        (the job exists before it is handed to the loop; see ``_Job``).
        """
        job = _Job(fn, args, live=self._live)
        try:
            self._hand_over(job)
            return job.future.result()
        except BaseException:
            job.abandon(self._aloop)
            raise

    def _hand_over(self, job: _Job) -> None:
        """Start ``job`` on the loop. A loop that is closed raises ``RuntimeError`` here;
        one that ends before the job starts fails it (``_main``), so no caller waits forever."""
        self._live.add(job)
        if self._exited.is_set():
            job.fail()
            return
        self._aloop.call_soon_threadsafe(self._start_job, job)

    def _start_job(self, job: _Job) -> None:
        # a plain asyncio task: anyio's task-group spawn (and its task handle and cancel
        # scope) cost more than the rest of a call; ``_end_jobs`` does the group's part
        if self._ending:  # the loop is ending: it takes no more jobs
            job.fail()
            return
        job.task = self._aloop.create_task(job.run())

    @property
    def usable(self) -> bool:
        """Running, and not asked to stop (a stop that Ctrl-C cut short included)."""
        return not self._stopping and not self._exited.is_set()

    async def acall(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``call`` for a caller on another event loop: ``await fn(*args)`` runs on this
        loop. If the awaiting task is cancelled, so is the coroutine, and the cancellation
        propagates once the coroutine has unwound (for at most ``_UNWIND_TIMEOUT_S``; more
        cancellations meanwhile are absorbed): a coroutine that had already finished has
        left its effects, and none runs on once the caller has moved on.

        Where the caller cannot wait (a ``KeyboardInterrupt`` raised in its own step, or its
        coroutine closed because its event loop stopped for good: ``GeneratorExit``), the
        coroutine is cancelled and the exception propagates at once: the coroutine may still
        be unwinding when the caller's next call comes, which is why a collector's
        collections take turns on ``serial``.
        """
        here = asyncio.get_running_loop()
        settled = here.create_future()
        job = _Job(fn, args, lambda: _set_soon(here, settled), live=self._live)
        try:
            self._hand_over(job)
            await asyncio.shield(settled)
        except asyncio.CancelledError:
            job.abandoned = True
            try:
                self._aloop.call_soon_threadsafe(job.cancel)
            except RuntimeError:  # the loop is closed: nothing runs any more
                raise asyncio.CancelledError from None
            deadline = here.time() + _UNWIND_TIMEOUT_S
            while not settled.done() and here.time() < deadline:
                try:
                    await asyncio.wait_for(asyncio.shield(settled), deadline - here.time())
                except (asyncio.CancelledError, asyncio.TimeoutError):
                    pass
            raise
        except BaseException:
            job.abandoned = True
            try:
                self._aloop.call_soon_threadsafe(job.cancel)
            except RuntimeError:  # the loop is closed: nothing runs any more
                pass
            raise
        if job.future.cancelled():  # the loop ended before the job could run
            raise asyncio.CancelledError
        return job.future.result()

    def start_soon(self, fn: Callable[..., Awaitable[T]], *args: Any) -> Future[T]:
        return self.portal.start_task_soon(fn, *args)

    def stop(self, timeout: float = _JOIN_TIMEOUT_S) -> None:
        """Cancel whatever still runs on the loop and join the thread (idempotent; a stop
        that Ctrl-C cut short is finished by the next call).

        Called from the loop's own thread (a callback shutting the collector down), the
        join is left to a short-lived helper thread: a thread cannot join itself.
        """
        first = not self._stopping
        self._stopping = True
        if self._exited.is_set():
            return
        if self.in_this_thread():
            if first:
                threading.Thread(target=self._stop_and_join, args=(timeout,), daemon=True).start()
        else:  # (again after an interrupted stop: the portal stops once, the join is retried)
            self._stop_and_join(timeout)

    def _stop_and_join(self, timeout: float) -> None:
        try:
            self.portal.call(self.portal.stop, True)
        except RuntimeError:  # already stopped
            pass
        if not self._exited.wait(timeout):
            logger.warning("aiocollect: the loop thread did not stop within %.0f s", timeout)


class _Job:
    """One ``LoopThread.call``: its coroutine, the future the caller waits on, and what
    an interrupted caller needs to stop it and know when it is gone.

    The caller creates the job before handing ``run`` to the loop, so whatever bytecode
    an interruption lands on, the caller holds the job: ``abandon`` then cancels the
    coroutine if it runs, keeps it from starting if it did not, and waits until either
    is settled.
    """

    def __init__(self, fn: Callable[..., Awaitable[Any]], args: tuple,
                 notify: Callable[[], None] | None = None, *, live: set | None = None) -> None:
        self.fn, self.args = fn, args
        self.live = live
        """The loop thread's unsettled jobs; this one leaves it once settled."""
        self.future: Future = Future()
        self.finished = threading.Event()
        self.notify = notify
        """Called (on the loop) once the job is settled: ``acall``'s caller waits on it."""
        self.started = False
        self.abandoned = False
        self.scope: anyio.CancelScope | None = None
        self.task: asyncio.Task | None = None
        """The loop's task running ``run`` (kept: the loop holds its tasks only weakly)."""

    async def run(self) -> None:
        """On the loop: run the coroutine, settle the future."""
        if self.abandoned:
            self._settled()
            return
        self.started = True
        try:
            with anyio.CancelScope() as self.scope:
                result = await self.fn(*self.args)
            if self.scope.cancelled_caught:
                self.future.cancel()
            else:
                self.future.set_result(result)
        except BaseException as exc:
            self.future.set_exception(exc)  # the caller raises it (SystemExit included)
            if isinstance(exc, asyncio.CancelledError):
                raise  # the loop's own cancellation: the task ends cancelled
        finally:
            self._settled()

    def _settled(self) -> None:
        if self.live is not None:
            self.live.discard(self)
        self.finished.set()
        if self.notify is not None:
            self.notify()

    def fail(self) -> None:
        """The loop ended before the job could run: its caller gets a cancellation."""
        if not self.future.done():
            self.future.cancel()
        self.abandoned = True
        self._settled()

    def abandon(self, loop: asyncio.AbstractEventLoop) -> None:
        """From the interrupted caller: stop the coroutine, wait until it is gone."""
        self.abandoned = True
        try:
            loop.call_soon_threadsafe(self.cancel)
        except RuntimeError:  # the loop is closed: nothing runs any more
            return
        self.finished.wait(_UNWIND_TIMEOUT_S)

    def cancel(self) -> None:
        """On the loop: cancel the coroutine, or settle a job that never started."""
        if self.scope is not None:
            self.scope.cancel()
        elif not self.started:
            self._settled()  # it never started; if it is about to, it sees abandoned


def _set_soon(loop: asyncio.AbstractEventLoop, future: asyncio.Future) -> None:
    """Resolve ``future`` of ``loop`` from another thread (nothing if that loop is gone)."""
    def resolve() -> None:
        if not future.done():
            future.set_result(None)

    try:
        loop.call_soon_threadsafe(resolve)
    except RuntimeError:  # that loop is closed
        pass

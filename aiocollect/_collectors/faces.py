"""The two faces of one collection: ``async for`` on your loop, ``for`` anywhere else.

There is one implementation, async. ``async for batch in collector`` awaits it on the
caller's loop; ``for batch in collector``, ``next()``, ``rollout()`` and the control calls
(``set_seed``, ``reset``, ``load_state_dict``: ``_on_engine``) run it on the collector's
private loop thread (``_collectors.loop_thread``), which exists while a sync call needs it,
so the sync face works in a script, a thread or a Jupyter cell whose thread already runs a
loop. Calling the sync face from that loop thread itself (a policy or ``postproc``
callback) would deadlock: it raises and points to the async face. A ``for`` written in an
``async def`` that runs on this thread's loop works, but blocks that loop while each batch is
collected (its other tasks wait): a ``RuntimeWarning`` names ``async for``, once per
collector (``_warn_if_in_a_coroutine``). A Jupyter cell is not an ``async def``, though the
kernel runs it inside a task of its loop: its ``for`` is the sync face's use, and is not warned.

A batch handed from the loop thread to the caller keeps the caller's CUDA stream in order
(``_after_caller_stream``, ``_on_caller_stream``): see ``_engine.staging`` and
``PolicySetup.follow_caller``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import sys
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from tensordict import TensorDictBase

from .._errors import CollectorBusyError, CollectorError
from .consumers import OVER, Consumer
from .delivery import DONE, NOTHING
from .loop_thread import LoopThread
from .parts import CollectorParts

ASYNC_CODE = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE
"""The flags of the code of an ``async def`` (a coroutine or an async generator)."""


class Faces(CollectorParts):
    """``DataCollectorBase``'s sync and async faces. Uses the collector's ``_resources``,
    ``_undelivered``, ``_staging``, ``_policy``, ``_closed`` and the other parts' methods
    (``_next_batch``, ``_guarded_collect``, ``_finish``, ``is_running``)."""

    def __aiter__(self) -> AsyncIterator[Any]:
        return AsyncBatches(self)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Shut the collector down from ``async`` code (what ``async with`` calls on exit).

        It calls [`shutdown()`][aiocollect.DataCollectorBase.shutdown], which blocks the
        event loop while it runs (for a multi-process collector, until its workers are gone).
        """
        self.shutdown()

    async def arollout(self) -> TensorDictBase:
        """Collect one batch and return it as collected: the async twin of ``rollout()``.

        See [`rollout`][aiocollect.DataCollectorBase.rollout].

        Returns:
            The batch, without ``split_trajs``, ``postproc`` or the replay buffer.
        """
        self._after_caller_stream()
        self._run_pre_collect_hook()  # (TorchRL's rollout() calls it; its post hook is the iterator's)
        batch, _ = await self._guarded_collect()
        return self._finish(batch)

    def _check_sync_allowed(self, what: str) -> None:
        loop = self._resources.loop
        if loop is not None and loop.in_this_thread():
            raise CollectorBusyError(
                f"{what} was called from the collector's own event loop (from a policy, postproc "
                "or replay-buffer callback?), where blocking would deadlock; use the async face "
                "there: `async for batch in collector` or `await collector.arollout()`."
            )

    @contextlib.contextmanager
    def _loop_thread(self, what: str) -> Iterator[LoopThread]:
        """The loop thread, started for the duration of the block if none runs."""
        self._check_sync_allowed(what)
        self._check_usable()
        res = self._resources
        with res.loop_lock:
            if res.loop is not None and not res.loop.usable:
                res.stop_loop()  # a stop that a second Ctrl-C cut short: finish it, start afresh
            if res.loop is None:
                res.loop = LoopThread()
            loop = res.loop
            res.loop_users += 1
        try:
            yield loop
        finally:
            with res.loop_lock:
                res.loop_users -= 1
                # (the last user stops it: an iteration dropped while another goes on, or two
                # threads, leave it to the other)
                if not res.loop_users and res.loop is loop and not self.is_running() and not self._persistent_loop:
                    res.stop_loop()

    def _run_sync(self, what: str, fn: Callable, *args: Any) -> Any:
        with self._loop_thread(what) as loop, self._closed_meanwhile():
            return loop.call(fn, *args)

    def _after_caller_stream(self) -> None:
        """Before a batch is asked for: the policy's next calls wait for what this thread
        queued on its current CUDA stream, where that matters (a ``Collector`` acting with
        the user's module on a GPU, changed on a stream of the user's own:
        ``PolicySetup.follow_caller``); the reverse of ``_on_caller_stream``."""
        policy = getattr(self, "_policy", None)
        if policy is not None:
            policy.follow_caller()

    def _on_caller_stream(self, batch: Any) -> Any:
        """A batch handed over by the loop thread, made ready on this thread's current CUDA
        stream (``DeviceStaging.hand_over``); as it is without a GPU storing device."""
        staging = self._staging
        return batch if staging is None else staging.hand_over(batch)

    @contextlib.contextmanager
    def _closed_meanwhile(self) -> Iterator[None]:
        """A call that ``shutdown()`` (from another thread) cut short raises
        [`CollectorClosedError`][aiocollect.CollectorClosedError], not a bare cancellation."""
        try:
            yield
        except (concurrent.futures.CancelledError, asyncio.CancelledError, RuntimeError) as exc:
            if self._closed and not isinstance(exc, CollectorError):
                raise self._closed_error() from None
            raise

    def __iter__(self) -> Iterator[Any]:
        self._warn_if_in_a_coroutine(sys._getframe(1))
        return self._sync_batches()

    def iterator(self) -> Iterator[Any]:
        """Return ``iter(collector)``: TorchRL's spelling of the sync iteration.

        Returns:
            An iterator over the batches (``None`` for each batch stored in a replay buffer).
        """
        self._warn_if_in_a_coroutine(sys._getframe(1))
        return self._sync_batches()

    def _warn_if_in_a_coroutine(self, caller: Any) -> None:
        """A sync iteration started by the code of an ``async def`` (``caller``, its frame) while
        an event loop runs in this thread blocks that loop for each batch: the other tasks on
        it (a server, a logger, a second collector) do not run meanwhile. Warn once per
        collector, naming ``async for``. The code's own flags tell an ``async def`` from a
        Jupyter cell, which the kernel runs inside a task of its loop too but whose code is
        not a coroutine: there a ``for`` is the sync face's intended use. (The collector's own
        loop thread is left to ``_check_sync_allowed``, which raises.)"""
        if self._warned_loop_blocked or caller is None or not caller.f_code.co_flags & ASYNC_CODE:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # (a coroutine stepped by hand, with no loop here: nothing waits on it)
            return
        own = self._resources.loop
        if own is not None and own.in_this_thread():
            return
        self._warned_loop_blocked = True
        warnings.warn(
            f"`for batch in collector` in the async function {caller.f_code.co_name}() blocks this thread's "
            "event loop while each batch is collected: its other tasks do not run meanwhile. Use "
            "`async for batch in collector` there (and `await collector.arollout()` for rollout()). "
            f"(Warned once per {type(self).__name__}.)",
            RuntimeWarning, stacklevel=3,
        )

    def _sync_batches(self) -> Iterator[Any]:
        """``for batch in collector``: each batch collected on the loop thread.

        The loop thread leaves each batch in ``_undelivered`` before it reports back, and
        this thread takes it from there. So a batch whose collection ended just as the
        waiting thread was interrupted (Ctrl-C), too late for the cancellation to stop it,
        is kept, already counted, and is the first one the next iteration yields: an
        interruption never loses a batch. ``shutdown()`` called from the loop's body ends
        the iteration (``shutdown()`` from another thread while a batch is collected
        raises [`CollectorClosedError`][aiocollect.CollectorClosedError] instead).
        """
        with self._loop_thread("for batch in collector") as loop:
            if self._finished():
                self._warn_finished("for batch in collector")
                return
            while True:
                if self._undelivered is NOTHING:
                    self._after_caller_stream()
                    with self._closed_meanwhile():
                        loop.call(self._next_batch_kept)
                batch, self._undelivered = self._undelivered, NOTHING
                if batch is DONE:
                    return
                yield self._on_caller_stream(batch)
                if self._closed:
                    return  # shut down by the loop's body: the iteration is over

    def _finished(self) -> bool:
        """Whether the collection is over: ``total_frames`` collected, and nothing left to
        deliver (a batch an interrupted iteration kept, trajectories already assembled)."""
        opts = self.options
        if opts.total_frames < 0 or self._frames < opts.total_frames or self._undelivered is not NOTHING:
            return False
        return not (opts.trajs_per_batch is not None and opts.replay_buffer is None
                    and self._assembler.ready >= opts.trajs_per_batch)

    def _warn_finished(self, face: str) -> None:
        """A new iteration over a finished collector yields nothing, as in TorchRL: say so
        (once per line of the caller's code, as Python shows a ``UserWarning``)."""
        opts = self.options
        warnings.warn(
            f"{face}: this {type(self).__name__} has already collected its total_frames={opts.total_frames} "
            f"(len(collector) == {len(self)} batches), so this iteration yields nothing. To collect more, "
            "create a new collector (with a larger total_frames, or total_frames=-1 for an endless one).",
            UserWarning, stacklevel=3,
        )

    async def _next_batch_kept(self) -> None:
        self._undelivered = await self._next_batch()

    def next(self) -> Any:
        """The next batch of the collection: TorchRL's ``collector.next()``.

        The batch ``for batch in collector`` would give next, counted towards
        ``total_frames`` (with ``postproc``, ``split_trajs``, ``trajs_per_batch`` and the
        replay buffer applied), so calls to ``next()`` and iterations share one collection.
        As in TorchRL, ``None`` once ``total_frames`` are collected (and, with a replay
        buffer, for every batch, which went to the buffer).

        Returns:
            The next batch, or ``None``.

        Raises:
            CollectorBusyError: called from the collector's own event loop; use
                ``async for`` or ``await collector.arollout()`` there.
        """
        with self._loop_thread("next()") as loop:
            if self._undelivered is NOTHING:  # (a batch an interrupted iteration kept comes first)
                self._after_caller_stream()
                with self._closed_meanwhile():
                    loop.call(self._next_batch_kept)
            batch, self._undelivered = self._undelivered, NOTHING
        return None if batch is DONE else self._on_caller_stream(batch)

    def rollout(self) -> TensorDictBase:
        """Collect one batch and return it as collected.

        Unlike iteration, it applies neither ``split_trajs`` nor ``postproc``, does not
        extend the replay buffer, and does not count towards ``total_frames`` or the
        ``frames`` and ``batches`` of [`statistics()`][aiocollect.DataCollectorBase.statistics].
        The envs go on from where they were, as for the next batch of an iteration.

        Returns:
            The batch, laid out as the collector's batches are.

        Raises:
            CollectorBusyError: called from the collector's own event loop (a policy, ``postproc``
                or replay-buffer callback); use ``await collector.arollout()`` there.
        """
        self._after_caller_stream()
        return self._on_caller_stream(self._run_sync("rollout()", self.arollout))

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.shutdown()

    def _on_engine(self, fn: Callable, *args: Any) -> Any:
        """Run ``fn`` where it cannot interleave with a step: on the loop thread if one runs.

        What goes through here changes the collection (seeds, resets, a loaded state), so
        a shut-down collector refuses it rather than accept it silently."""
        if self._closed:
            raise self._closed_error()
        loop = self._resources.loop
        if loop is not None and not loop.in_this_thread():
            return loop.portal.call(fn, *args)
        return fn(*args)



class AsyncBatches:
    """The async iterator ``async for`` uses: one awaited batch per ``__anext__``.

    An iteration does not outlive the run of its event loop in which its task left off: a
    task left pending when its loop stopped (Ctrl-C raised out of ``run_until_complete``)
    that asks for a batch once the loop runs again gets ``CancelledError`` instead, so an
    interrupted cell does not go on consuming batches behind the user's back. (Another
    task may go on with the same iterator: ``loop.run_until_complete(anext(batches))``
    in turns works.) The batch it was collecting is the next iteration's (``_guarded_collect``).
    """

    def __init__(self, collector: Any):
        self._collector = collector
        self._last: Consumer | None = None
        """The task of the last ``__anext__``, and the run of its loop then."""
        self._started = False
        """Whether ``__anext__`` was called: a first one on a finished collector warns."""

    def __aiter__(self):
        return self

    async def __anext__(self) -> Any:
        here = Consumer()
        last = self._last
        if last is not None and here.same_task(last) and not last.in_this_run():
            raise asyncio.CancelledError(OVER)
        self._last = here
        collector = self._collector
        if not self._started:
            self._started = True
            collector._check_usable()  # (a shut-down or failed collector says so first)
            if collector._finished():
                collector._warn_finished("async for batch in collector")
                raise StopAsyncIteration
        collector._after_caller_stream()
        batch = await collector._next_batch()
        if batch is DONE:
            raise StopAsyncIteration
        return batch

"""Background collection: ``start()`` collects into the replay buffer while you train.

The collection runs as one task on the collector's loop thread, batch after batch, until
``total_frames``, an error, ``async_shutdown()`` or ``shutdown()``; ``pause()`` parks it
between two batches. It is the one consumer allowed while it runs (``BACKGROUND``, a
context variable of its task): any other iteration is refused.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import logging
from collections.abc import Iterator

import anyio

from .._errors import CollectorBusyError, CollectorError
from .delivery import DONE
from .loop_thread import LoopThread
from .options import validate_timeout
from .parts import CollectorParts

logger = logging.getLogger("aiocollect")

BACKGROUND = contextvars.ContextVar("aiocollect_background", default=False)
"""True inside ``start()``'s collection task: the one caller allowed while it runs."""



class Background(CollectorParts):
    """``DataCollectorBase``'s background collection (``start``, ``pause``, ``is_running``,
    ``async_shutdown``). Uses the collector's ``_background`` future, ``_pause_requested`` and
    ``_parked`` events, ``_resources`` and ``_next_batch``."""

    _background: concurrent.futures.Future | None

    def start(self) -> None:
        """Collect in the background into ``replay_buffer`` until ``async_shutdown()``.

        Collection runs on the collector's loop thread; the training loop samples from the
        replay buffer meanwhile. It stops by itself after ``total_frames`` frames. An error
        in the background is logged at once and raised again by ``async_shutdown()`` and
        ``pause()``.

        Raises:
            CollectorError: the collector has no ``replay_buffer``, already runs in the
                background, is shut down or failed, or this is called from its own loop.

        Examples:
            >>> collector = MultiSyncCollector([make_env] * 4, policy, frames_per_batch=400,
            ...                                total_frames=-1, replay_buffer=buffer)
            >>> collector.start()
            >>> for step in range(10_000):
            ...     with collector.pause():     # only if a sample must not see new frames
            ...         sample = buffer.sample(256)
            ...     train(sample)
            ...     collector.update_policy_weights_()
            >>> collector.async_shutdown()
        """
        self._check_usable()
        if self.options.replay_buffer is None:
            raise CollectorError(
                "start() collects into a replay buffer: pass replay_buffer=... to the collector."
            )
        if self.is_running():
            raise CollectorBusyError(f"{type(self).__name__} is already running in the background.")
        self._check_sync_allowed("start()")
        res = self._resources
        if res.loop is None:
            res.loop = LoopThread()
        self._background = res.loop.start_soon(self._run_background)
        self._background.add_done_callback(self._background_done)

    async def _run_background(self) -> None:
        BACKGROUND.set(True)  # this task's context only
        while True:
            # Let the loop run other callbacks between two batches: a batch of in-process envs
            # may never suspend, and a cancellation (async_shutdown) is delivered only here.
            await anyio.lowlevel.checkpoint()
            while True:
                with self._pause_lock:  # (a few instructions: no pause() sees a stale _parked)
                    if not self._pause_requested.is_set():
                        self._parked.clear()
                        break
                    self._parked.set()
                await anyio.sleep(0.002)
            if await self._next_batch() is DONE:
                return

    def _background_done(self, future: concurrent.futures.Future) -> None:
        if not future.cancelled() and future.exception() is not None:
            logger.error("aiocollect: background collection failed", exc_info=future.exception())

    def _raise_background_error(self) -> None:
        bg = self._background
        if bg is not None and bg.done() and not bg.cancelled():
            error = bg.exception()
            if error is not None:
                raise error

    def is_running(self) -> bool:
        """Whether background collection ([`start()`][aiocollect.DataCollectorBase.start]) is going on.

        Returns:
            ``True`` from ``start()`` until the collection ends: ``total_frames`` reached, an
            error, ``async_shutdown()`` or ``shutdown()``.
        """
        return self._background is not None and not self._background.done()

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """``with collector.pause():`` background collection stops between two batches.

        The block starts once the batch in progress is stored, so the replay buffer does
        not change while it runs; collection resumes when it ends, or when the last of
        several ``pause()`` blocks open at once (nested, or in other threads) ends. Without
        background collection the block just runs.

        Raises:
            CollectorBusyError: called from the collector's own loop (a replay-buffer or
                postproc callback), where waiting for the collection to park would hang it.
            Exception: the error that ended the background collection, if one did.
        """
        if self.is_running():
            self._check_sync_allowed("pause()")
        with self._pause_lock:
            self._pauses += 1
            self._pause_requested.set()
        try:
            while self.is_running() and not self._parked.wait(0.01):
                pass
            self._raise_background_error()
            yield
        finally:
            with self._pause_lock:
                self._pauses -= 1
                if not self._pauses:
                    self._pause_requested.clear()

    def async_shutdown(self, timeout: float | None = None, close_env: bool = True) -> None:
        """Stop background collection, then shut the collector down.

        TorchRL's name for the end of ``start()``; it also works on a collector that never
        started.

        Args:
            timeout: seconds to wait for the background collection to stop once it is
                cancelled (``None``: as long as it takes).
            close_env: passed to [`shutdown()`][aiocollect.DataCollectorBase.shutdown].

        Raises:
            TypeError: ``timeout`` is not a number (checked before anything is stopped).
            ValueError: ``timeout`` is negative, ``nan`` or infinite (likewise).
            Exception: the error that ended the background collection, if one did.
        """
        timeout = validate_timeout(timeout)
        bg = self._background
        if bg is not None and not bg.done():
            bg.cancel()
            concurrent.futures.wait([bg], timeout=timeout)
        self.shutdown(close_env=close_env)
        self._raise_background_error()

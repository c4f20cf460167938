"""What a collector must release, kept apart from the collector itself.

``Resources`` lists the loop thread and the closers a collector registers as it builds its
parts (worker pools, envs, progress bars). The garbage-collection finalizer holds this
object, not the collector, so an abandoned collector can be collected and still cleaned up;
``close()`` releases everything, last registered first, and picks up where it stopped when
a Ctrl-C cut it short.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import anyio

from .loop_thread import LoopThread

logger = logging.getLogger("aiocollect")


class Resources:
    """What a collector must release, reachable without the collector itself.

    The garbage-collection finalizer holds this object, not the collector, so an
    abandoned collector can be collected and still cleaned up.
    """

    def __init__(self) -> None:
        self.loop: LoopThread | None = None
        self.loop_users = 0
        """The sync calls and iterations using ``loop`` now (``Faces._loop_thread``): a
        collector without a loop of its own stops it after the last, not the first."""
        self.loop_lock = threading.Lock()
        """Guards ``loop`` and ``loop_users`` while the sync face starts or stops the loop,
        from any thread."""
        self.join_timeout = 10.0
        """How long ``stop_loop`` waits for the loop thread (worker collectors: their
        workers' whole stop sequence, and a margin)."""
        self.closers: list[Callable[[], None]] = []
        self.env_closers: list[Callable[[], None]] = []
        """Close envs of this process; skipped by ``shutdown(close_env=False)``."""
        self.aclosers: list[Callable[[], Any]] = []
        """Coroutine functions run on the loop before it stops (closing coroutine envs)."""

    def stop_loop(self) -> None:
        loop = self.loop
        if loop is not None:
            loop.stop(self.join_timeout)
            self.loop = None  # (only once it stopped: an interrupted stop is retried)

    def close(self, close_env: bool = True) -> None:
        """Release everything, last registered first.

        Each step leaves its list only once it ran, so a ``close()`` interrupted by Ctrl-C
        goes on where it stopped when it is called again (a second ``shutdown()``, or the
        finalizer at exit); a step that raised an ``Exception`` is logged and not retried.
        """
        loop = self.loop
        if self.aclosers and loop is not None and loop.usable:
            if loop.in_this_thread():
                logger.warning("aiocollect: shut down from its own loop; coroutine envs are not closed")
                self.aclosers.clear()
            else:
                try:
                    loop.call(_run_aclosers, self.aclosers)
                except Exception:  # cleanup goes on
                    logger.exception("aiocollect: error while closing coroutine envs")
                    self.aclosers.clear()
        self.stop_loop()
        if not close_env:
            self.env_closers.clear()
        for pending in (self.closers, self.env_closers):
            while pending:
                close = pending[-1]
                try:
                    close()
                except Exception:  # cleanup goes on; the failure is logged
                    logger.exception("aiocollect: error while closing %r", close)
                pending.pop()


async def _run_aclosers(aclosers: list[Callable[[], Any]]) -> None:
    """Run ``aclosers``, last first, each leaving the list once it ran (or gave up)."""
    with anyio.move_on_after(_ACLOSE_TIMEOUT_S):
        while aclosers:
            aclose = aclosers[-1]
            try:
                await aclose()
            except Exception:  # the others still run
                logger.exception("aiocollect: error while closing %r", aclose)
            aclosers.pop()
    aclosers.clear()  # what the time limit cut short is not retried


_ACLOSE_TIMEOUT_S = 5.0

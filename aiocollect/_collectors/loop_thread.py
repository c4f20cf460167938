"""The private event-loop thread behind the sync face.

``for batch in collector`` and ``with collector:`` run the one async implementation on an
event loop in a thread of its own, through anyio's blocking portal. That works the same in
a script, in a worker thread, and where the calling thread already runs a loop (a Jupyter
cell), without ``nest_asyncio``. uvloop is used where it is installed.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from anyio.from_thread import BlockingPortal, start_blocking_portal

T = TypeVar("T")

try:  # uvloop is a dependency on Linux and macOS only
    import uvloop  # noqa: F401

    _BACKEND_OPTIONS = {"use_uvloop": True}
except ImportError:  # pragma: no cover - Windows
    _BACKEND_OPTIONS = {}


class LoopThread:
    """An event loop running in a daemon thread until ``stop()``."""

    def __init__(self) -> None:
        self._cm = start_blocking_portal("asyncio", backend_options=_BACKEND_OPTIONS, name="aiocollect-loop")
        self.portal: BlockingPortal = self._cm.__enter__()
        self.ident: int = self.portal.call(threading.get_ident)
        self._stopped = False

    def in_this_thread(self) -> bool:
        return threading.get_ident() == self.ident

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``await fn(*args)`` on the loop and wait for it.

        If the waiting thread is interrupted (Ctrl-C raises ``KeyboardInterrupt`` in the
        main thread), the coroutine is cancelled and given a moment to unwind before the
        interruption propagates: nothing keeps running behind the user's back.
        """
        future: Future[T] = self.portal.start_task_soon(fn, *args)
        try:
            return future.result()
        except BaseException:
            if not future.done():
                future.cancel()
                try:
                    self.portal.call(_noop)  # the cancellation has been delivered by now
                except BaseException:  # noqa: BLE001 - the first exception is the one to raise
                    pass
            raise

    def start_soon(self, fn: Callable[..., Awaitable[T]], *args: Any) -> Future[T]:
        return self.portal.start_task_soon(fn, *args)

    def stop(self) -> None:
        """Cancel whatever still runs on the loop and join the thread (idempotent).

        Called from the loop's own thread (a callback shutting the collector down), the
        join is left to a short-lived helper thread: a thread cannot join itself.
        """
        if self._stopped:
            return
        self._stopped = True
        if self.in_this_thread():
            threading.Thread(target=self._stop_and_join, daemon=True).start()
        else:
            self._stop_and_join()

    def _stop_and_join(self) -> None:
        try:
            self.portal.call(self.portal.stop, True)
        except RuntimeError:  # already stopped
            pass
        self._cm.__exit__(None, None, None)


async def _noop() -> None:
    return None

"""``WorkerError``: what the collector raises when an env worker fails."""

from __future__ import annotations


class WorkerError(RuntimeError):
    """An env worker process failed: an env raised, or the process died.

    Raised from the iterator of [`MultiSyncCollector`][aiocollect.MultiSyncCollector],
    [`MultiAsyncCollector`][aiocollect.MultiAsyncCollector] and
    [`AsyncCollector`][aiocollect.AsyncCollector], with the worker's traceback in its
    message; every worker is stopped at once and the collector is failed. For an entry of
    coroutine envs (which runs in the main process) the env's own exception is its
    ``__cause__``.

    Attributes:
        worker (int): the worker's index (its position in ``create_env_fn``).
        pid (int | None): its process id.
        env (int | None): the index of the env that raised, within the worker (``None`` if unknown).
        remote_type (str | None): the exception's class name in the worker (``None`` if it died).
        remote_traceback (str): the traceback text from the worker ("" if it died).
        exitcode (int | None): the process's exit code when it died (negative: killed by that signal).
    """

    def __init__(self, message: str, *, worker: int, pid: int | None, env: int | None = None,
                 remote_type: str | None = None, remote_traceback: str = "", exitcode: int | None = None):
        super().__init__(message)
        self.worker = worker
        self.pid = pid
        self.env = env
        self.remote_type = remote_type
        self.remote_traceback = remote_traceback
        self.exitcode = exitcode

    def __reduce__(self):
        return (_rebuild, (str(self), self.__dict__))

    @classmethod
    def from_remote(cls, worker: int, pid: int | None, info: dict) -> WorkerError:
        where = f"worker {worker} (pid {pid})"
        if info.get("env") is not None:
            where += f", env {info['env']}"
        message = (
            f"{where} raised {info['type']}: {info['message']}\n\n"
            f"Traceback in the worker:\n{info['traceback'].rstrip()}"
        )
        return cls(message, worker=worker, pid=pid, env=info.get("env"), remote_type=info["type"],
                   remote_traceback=info["traceback"])

    @classmethod
    def died(cls, worker: int, pid: int | None, exitcode: int | None) -> WorkerError:
        import signal

        if exitcode is None:
            how = "closed its control channel"
        elif exitcode < 0:
            try:
                how = f"was killed by {signal.Signals(-exitcode).name}"
            except ValueError:
                how = f"was killed by signal {-exitcode}"
        else:
            how = f"exited with code {exitcode}"
        message = (
            f"worker {worker} (pid {pid}) {how} while the collector was using it (out of memory? "
            "a crash in native env code?); the other workers were stopped."
        )
        return cls(message, worker=worker, pid=pid, exitcode=exitcode)


def _rebuild(message: str, state: dict) -> WorkerError:
    err = WorkerError.__new__(WorkerError)
    RuntimeError.__init__(err, message)
    err.__dict__.update(state)
    return err

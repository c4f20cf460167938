"""Every error aiocollect raises for a fault, in one hierarchy.

```
CollectorError                  a fault in collection; `except aiocollect.CollectorError` catches them all
├── WorkerError                 an env worker failed: its process died (or, as EnvError, an env raised)
│   └── EnvError                an env's reset() or step() raised: its exception is the __cause__
│       └── StepTimeoutError    an env (coroutine or in a worker), or a worker's copy of the policy, did not answer
│                               within step_timeout (a TimeoutError; ``stuck_in`` says which)
├── PolicyError                 the policy returned an action the envs cannot be stepped with (NaN or infinite)
├── StartTimeoutError           worker processes (or Ray actors) did not start within start_timeout (a TimeoutError)
├── RemoteCollectorError        a remote collector (Ray actor, RPC worker) failed: the remote error is the __cause__
├── CollectorClosedError        the collector was used after shutdown()
├── CollectorFailedError        the collector was used after a fault: the fault is the __cause__
└── CollectorBusyError          the collector is already collecting (iterated from two places, or while start() runs)
```

The same fault gives the same type in every collector: an env that raises is an
[`EnvError`][aiocollect.EnvError] whether it ran in this process
([`Collector`][aiocollect.Collector]), in a worker process or as a coroutine env, and names
the env and the worker in its message and attributes. Bad arguments are not faults: they
stay ``TypeError`` / ``ValueError``, raised before any env is built or process started. An
exception raised by the policy, which runs in your process, comes out as it is; an action
that is NaN or infinite is a [`PolicyError`][aiocollect.PolicyError], raised before any env
is stepped with it (an env given NaN returns NaN, which would blame the env).

Every class is a ``RuntimeError``, as aiocollect's errors were before the hierarchy
existed, so older ``except RuntimeError`` code still catches them.
"""

from __future__ import annotations

import pickle
import signal
import traceback
from typing import Any


class CollectorError(RuntimeError):
    """Base class of every error aiocollect raises for a fault in collection.

    Catch it to handle any fault of any collector in one place; the subclasses say which
    fault it was. Bad arguments are ``TypeError`` / ``ValueError`` instead.

    Examples:
        >>> try:
        ...     for batch in collector:
        ...         train(batch)
        ... except aiocollect.CollectorError as exc:
        ...     print(f"collection failed: {exc}")
    """


class WorkerError(CollectorError):
    """An env worker failed: its process died, or (as [`EnvError`][aiocollect.EnvError]) an env raised.

    Raised from the iterator of every collector; the worker collectors
    ([`MultiSyncCollector`][aiocollect.MultiSyncCollector],
    [`MultiAsyncCollector`][aiocollect.MultiAsyncCollector],
    [`AsyncCollector`][aiocollect.AsyncCollector]) stop every worker at once. The collector
    is then failed (later calls raise [`CollectorFailedError`][aiocollect.CollectorFailedError]).
    A [`Collector`][aiocollect.Collector]'s envs are worker 0, in this process.

    Attributes:
        worker (int): the worker's index (its position in ``create_env_fn``; 0 for a ``Collector``).
        pid (int | None): the process that ran the env.
        env (int | None): the index of the env that raised, within the worker (``None`` if unknown).
        remote_type (str | None): the class name of the exception the env raised (``None`` if the process died).
        remote_traceback (str): that exception's traceback ("" if the process died).
        exitcode (int | None): the process's exit code when it died (negative: killed by that signal).
    """

    def __init__(self, message: str, *, worker: int = 0, pid: int | None = None, env: int | None = None,
                 remote_type: str | None = None, remote_traceback: str = "", exitcode: int | None = None):
        super().__init__(message)
        self.worker = worker
        self.pid = pid
        self.env = env
        self.remote_type = remote_type
        self.remote_traceback = remote_traceback
        self.exitcode = exitcode

    def __reduce__(self):
        return (_rebuild, (type(self), str(self), self.__dict__, _portable(self.__cause__)))

    @classmethod
    def died(cls, worker: int, pid: int | None, exitcode: int | None) -> WorkerError:
        """The error for a worker process that died (``exitcode`` as ``Popen.returncode``)."""
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
        return WorkerError(message, worker=worker, pid=pid, exitcode=exitcode)


def policy_error_from_worker(worker: int, pid: int | None, info: dict) -> BaseException:
    """The error for the copy of the policy that raised in worker process ``worker`` (the
    policy runs in the workers: ``_policies.actor``): the policy's own exception, as
    central inference raises it, with a note naming the worker and its traceback there; a
    ``WorkerError`` saying the same if it does not unpickle here. Either carries the
    ``WorkerError`` attributes (``worker``, ``pid``, ``remote_type``...)."""
    where = (f"raised by the copy of the policy in worker {worker} (pid {pid}): the policy runs in the "
             "workers here (AIOCOLLECT_POLICY_IN_WORKERS=0 runs it in this process).")
    trace = f"Traceback in the worker:\n{info['traceback'].rstrip()}"
    error = unpickled_exception(info.get("pickled"))
    if error is None:
        return WorkerError(f"{where[0].upper()}{where[1:-1]}: {info['type']}: {info['message']}\n\n{trace}",
                           worker=worker, pid=pid, remote_type=info["type"], remote_traceback=info["traceback"])
    error.add_note(f"{where}\n\n{trace}")
    env = error.env if isinstance(error, PolicyError) else None  # (a PolicyError named its env in the worker)
    for name, value in (("worker", worker), ("pid", pid), ("env", env), ("remote_type", info["type"]),
                        ("remote_traceback", info["traceback"]), ("exitcode", None)):
        try:
            setattr(error, name, value)
        except AttributeError:  # (an exception type with fixed slots: the note says it all)
            pass
    return error


class EnvError(WorkerError):
    """An env's ``reset()`` or ``step()`` raised (or its factory did, in a worker).

    The same type from every collector, wherever the env ran: in this process, in a worker
    process or as a coroutine env. The message names the env and its worker and carries
    the env's traceback; ``__cause__`` is the env's own exception (for a worker process,
    rebuilt here from the worker's copy when it can be pickled). See
    [`WorkerError`][aiocollect.WorkerError] for the attributes.

    Examples:
        >>> try:
        ...     batch = collector.rollout()
        ... except aiocollect.EnvError as exc:
        ...     print(exc.worker, exc.env, type(exc.__cause__).__name__)
    """

    @classmethod
    def of(cls, exc: BaseException, *, worker: int, pid: int | None, in_process: bool = False) -> EnvError:
        """Wrap ``exc``, raised by an env (``exc.env_index`` names it), as an ``EnvError``."""
        env = getattr(exc, "env_index", None)
        trace = exception_traceback(exc)
        error = cls(
            f"{_where(worker, pid, env, in_process)} raised {type(exc).__name__}: {exception_text(exc)}\n\n"
            f"Traceback of the env:\n{trace.rstrip()}",
            worker=worker, pid=pid, env=env, remote_type=type(exc).__name__, remote_traceback=trace,
        )
        error.__cause__ = exc
        return error

    @classmethod
    def bad_value(cls, what: str, step: int, *, worker: int, pid: int | None, env: int | None,
                  in_process: bool) -> EnvError:
        """An env returned a value that cannot be stored faithfully (``what`` says which), at
        step ``step`` of the batch under way: found in the storage, so there is no traceback."""
        return cls(
            f"{_where(worker, pid, env, in_process)} {what} (step {step} of the batch; the types of an env's "
            "return values are checked at its first step, and the stored rewards and flags of every batch "
            "before it is delivered). The batch was not delivered.",
            worker=worker, pid=pid, env=env, remote_type="ValueError",
        )

    @classmethod
    def from_remote(cls, worker: int, pid: int | None, info: dict) -> EnvError:
        """The error for an env that raised in worker process ``worker``; ``info`` is what
        the worker sent (``_workers.child.describe_exception``)."""
        env = info.get("env")
        error = cls(
            f"{_where(worker, pid, env, False)} raised {info['type']}: {info['message']}\n\n"
            f"Traceback in the worker:\n{info['traceback'].rstrip()}",
            worker=worker, pid=pid, env=env, remote_type=info["type"], remote_traceback=info["traceback"],
        )
        error.__cause__ = unpickled_exception(info.get("pickled"))
        return error


class StepTimeoutError(EnvError, TimeoutError):
    """An env did not answer ``reset()`` or ``step()`` within ``step_timeout`` seconds.

    Raised by every collector that steps coroutine envs ([`AsyncEnv`][aiocollect.AsyncEnv])
    with a ``step_timeout``, in a [`Collector`][aiocollect.Collector] as in an entry of
    coroutine envs of the worker collectors; the collector is then failed and the pending
    steps of the other envs are cancelled. The message names the env, its class and the
    call, e.g. ``env 3 of worker 0 (GameEnv) did not answer step() within 2.0 s
    (step_timeout)``. It is also a built-in ``TimeoutError``; see
    [`WorkerError`][aiocollect.WorkerError] for the attributes.

    The worker collectors raise it too for a worker *process* whose envs' step or reset
    outlives ``step_timeout`` (an env that never returns, a process someone stopped): the
    worker is killed (``exitcode`` is ``-SIGKILL``), the others are stopped, and the message
    names the worker, its pid, its envs and ``step_timeout``, says how to fix it, and shows
    the worker's Python stack when it was killed (also in ``remote_traceback``).

    With the policy in the workers (``policy_in_workers``), a worker's step includes its copy
    of the policy computing the actions, so a policy that hangs there outlives
    ``step_timeout`` too. The worker says which it was running: then ``stuck_in`` is
    ``"policy"``, and the message names the policy, not the env, and says what to fix (the
    policy's ``forward``, or where it runs). It is the same type either way, as where the
    policy runs is the machine's choice (``AIOCOLLECT_POLICY_IN_WORKERS``), and what catches a
    hung worker (killed, the others stopped) should not depend on it.

    Attributes:
        stuck_in (str): what did not answer: ``"env"`` (an env's step or reset), or
            ``"policy"`` (a worker's copy of the policy, computing a step's actions).

    Examples:
        >>> collector = Collector([lambda: GameEnv(port)] * 64, policy, frames_per_batch=6400,
        ...                       step_timeout=2.0)
        >>> try:
        ...     batch = collector.rollout()
        ... except StepTimeoutError as exc:
        ...     print(exc.env, exc)
    """

    stuck_in = "env"

    @classmethod
    def late(cls, *, env: int, env_type: str, call: str, timeout: float) -> StepTimeoutError:
        """The error for env ``env`` (a ``env_type``) whose ``call`` took over ``timeout`` s;
        ``locate`` fills in its worker."""
        return cls(f"env {env} ({env_type}) did not answer {call}() within {timeout} s (step_timeout); "
                   "raise step_timeout if it is just slow.", env=env, remote_type="TimeoutError")

    @classmethod
    def hung(cls, *, worker: int, pid: int | None, envs: tuple[int, int], env: int | None, call: str,
             timeout: float, stopped: bool, stack: str, policy: bool = False) -> StepTimeoutError:
        """The error for worker process ``worker`` whose ``call`` (``"step"``, ``"reset"``) of
        envs ``envs`` (``(lo, hi)``, counted over all workers; ``env``: the one env within the
        worker, if it was one) took over ``timeout`` s. The pool kills it: ``exitcode`` is
        ``-SIGKILL``. ``stopped``: the process was stopped, not running; ``stack``: its
        threads' Python stacks ("" if they could not be read); ``policy``: the worker's copy
        of the policy was computing the step's actions, not the envs stepping."""
        lo, hi = envs
        which = f"env {lo}" if hi - lo == 1 else f"envs {lo}..{hi - 1}"
        place = f"worker {worker} (pid {pid}; {which} of the collector)"
        if env is not None:
            place = f"env {env} of {place}"
        killed = "it was killed and the other workers were stopped"
        if stopped:
            what = (f"{place} is stopped (SIGSTOP, Ctrl-Z or a debugger?) and did not answer {call}() "
                    f"within {timeout} s (step_timeout)")
            fix = "Let worker processes run while collecting (SIGCONT), or raise step_timeout."
        elif policy:
            what = f"the policy did not return the actions for {place} within {timeout} s (step_timeout)"
            killed = "the worker was killed and the other workers were stopped"
            fix = ("The policy runs in the workers here, and that worker's copy of it was computing the actions "
                   "when the time ran out, not the envs stepping. "
                   "If the policy is just slow there, raise step_timeout (None waits forever) or run it in this "
                   "process (AIOCOLLECT_POLICY_IN_WORKERS=0; step_timeout then bounds the envs' steps alone); "
                   "otherwise fix the policy's forward(): the stack below shows where it was stuck.")
        else:
            what = f"{place} did not answer {call}() within {timeout} s (step_timeout)"
            fix = ("If the env is just slow, raise step_timeout (None waits forever); otherwise fix the "
                   f"env's {call}(): the stack below shows where it was stuck.")
        trace = (f"\n\nPython stack of the worker when it was killed:\n{stack.rstrip()}" if stack
                 else "" if stopped else "\n\n(the worker did not send its Python stack)")
        error = cls(f"{what}: {killed}. {fix}{trace}",
                    worker=worker, pid=pid, env=env, remote_type="TimeoutError", remote_traceback=stack,
                    exitcode=-signal.SIGKILL)
        error.stuck_in = "policy" if policy else "env"
        return error

    def locate(self, worker: int, pid: int | None) -> StepTimeoutError:
        """Name the worker the env belongs to (in the message too); returns ``self``."""
        self.worker, self.pid = worker, pid
        message = str(self).replace(f"env {self.env} ", f"env {self.env} of worker {worker} ", 1)
        self.args = (message,)
        return self


class PolicyError(CollectorError):
    """The policy returned an action the envs cannot be stepped with: NaN or infinite values.

    Checked at every step (one vectorised test of the batch's float actions; integer actions
    need none), before any env is stepped with the action, whether the policy runs in this
    process or as its copy in each worker process (``policy_in_workers``): an env given NaN
    returns NaN (gymnasium's Pendulum, in its reward), which would be reported as the env's
    fault. The message names the env (the first one whose action is not finite) and its
    worker, and shows that env's action; raised from the iterator of every collector, which
    is then failed (later calls raise [`CollectorFailedError`][aiocollect.CollectorFailedError]).
    The policy's copy in a worker adds a note naming that worker and the traceback there.
    Finite actions outside a ``Box``'s bounds are given to the envs as they are, as before.

    A NaN action usually comes from the policy's weights (a training update that diverged: a
    NaN or infinite loss, exploding gradients), from NaN in its inputs, or from its own
    arithmetic (a log of 0, a division by 0).

    Attributes:
        worker (int): the worker of the env the action was for (0 for a ``Collector``).
        env (int): that env's index within its worker, as [`EnvError`][aiocollect.EnvError] counts.
        pid (int | None): the process the policy ran in: this one, or the worker's.

    Examples:
        >>> try:
        ...     batch = collector.rollout()
        ... except aiocollect.PolicyError as exc:
        ...     print(exc.worker, exc.env)   # restore the last good weights, lower the learning rate...
    """

    def __init__(self, message: str, *, worker: int = 0, env: int | None = None, pid: int | None = None):
        super().__init__(message)
        self.worker, self.env, self.pid = worker, env, pid

    def __reduce__(self):
        return (_rebuild, (type(self), str(self), self.__dict__, _portable(self.__cause__)))

    @classmethod
    def not_finite(cls, value: str, *, worker: int, env: int, pid: int | None) -> PolicyError:
        """The error for an action ``value`` (its text) with NaN or infinite values, computed
        for env ``env`` of worker ``worker`` by the policy running in process ``pid``."""
        return cls(
            f"the policy's action for env {env} of worker {worker} is not finite: {value}. No env was stepped "
            "with it (an env given NaN returns NaN, e.g. as its reward). A NaN or infinite action comes from "
            "the policy: from its weights (a training update that diverged: a NaN or infinite loss; clip the "
            "gradients, lower the learning rate), from its inputs, or from its own arithmetic (a log of 0, a "
            "division by 0).",
            worker=worker, env=env, pid=pid,
        )


class StartTimeoutError(CollectorError, TimeoutError):
    """Worker processes (or remote collectors) did not start within ``start_timeout`` seconds.

    Raised by the constructor of the worker collectors
    ([`MultiSyncCollector`][aiocollect.MultiSyncCollector],
    [`MultiAsyncCollector`][aiocollect.MultiAsyncCollector],
    [`AsyncCollector`][aiocollect.AsyncCollector], ``Collector(..., num_collectors=N)``) when a
    worker process has not imported what it needs and built its envs within ``start_timeout``
    (default 300 s), and by [`RayCollector`][aiocollect.RayCollector] when its actors are not
    placed and built within its own ``start_timeout`` (default 120 s). Nothing is left
    running: the workers that were not up are killed (their Python stack read first), the
    others stopped; Ray's actors are killed.

    The message names the workers that were up and those that were not (with their pids), how
    long it waited, and what to do: on a loaded machine (more processes than cores, each
    importing large libraries at once) raise ``start_timeout`` (``None`` waits forever) or start
    fewer workers; an env whose constructor is slow or stuck shows in the stack of its worker,
    which the message carries. It is also a built-in ``TimeoutError``.

    Attributes:
        timeout (float): the bound that was passed, in seconds.
        started (tuple[int, ...]): the workers (remote collectors, for Ray) that were up.
        pending (tuple[int, ...]): those that were not.

    Examples:
        >>> try:
        ...     collector = MultiSyncCollector([make_env] * 64, policy, frames_per_batch=6400)
        ... except StartTimeoutError as exc:
        ...     print(exc.pending)          # retry with start_timeout=600, or fewer workers
    """

    def __init__(self, message: str, *, timeout: float, started: tuple[int, ...] = (),
                 pending: tuple[int, ...] = ()):
        super().__init__(message)
        self.timeout, self.started, self.pending = timeout, tuple(started), tuple(pending)

    def __reduce__(self):
        return (_rebuild, (type(self), str(self), self.__dict__, _portable(self.__cause__)))

    @classmethod
    def workers(cls, *, timeout: float, started: list[int], pending: list[tuple[int, int | None, str]],
                processes: int, cores: int, load: float | None) -> StartTimeoutError:
        """The error for worker processes not up after ``timeout`` s: ``started``, the indices
        of those that were; ``pending``, ``(index, pid, stack)`` of the others (killed; ``stack``:
        their Python stack, "" if it could not be read); ``processes`` started at once on
        ``cores`` cores, with ``load`` the 1-minute load average (``None`` if unknown)."""
        late = ", ".join(f"{i} (pid {pid})" for i, pid, _ in pending)
        one = len(pending) == 1
        up = (f"; worker{'' if len(started) == 1 else 's'} {', '.join(map(str, started))} "
              f"{'was' if len(started) == 1 else 'were'} up (stopped too)") if started else "; no worker was up"
        busy = f"{processes} worker processes starting at once on {cores} core{'s' if cores != 1 else ''}"
        if load is not None:
            busy += f", load average {load:.1f}"
        traces = "".join(
            f"\n\nPython stack of worker {i} (pid {pid}) when it was killed:\n{stack.rstrip()}" if stack
            else f"\n\n(worker {i} (pid {pid}) sent no Python stack: it was still starting Python)"
            for i, pid, stack in pending)
        message = (
            f"worker{'' if one else 's'} {late} did not start within {timeout:g} s (start_timeout): "
            f"{'it' if one else 'they'} had not finished importing and building {'its' if one else 'their'} envs, "
            f"and {'was' if one else 'were'} killed{up}. The machine may be overloaded ({busy}), or an env's "
            "constructor is slow or stuck (the stack below shows where each worker was). If the workers are "
            f"just slow to start, raise start_timeout (e.g. start_timeout={2 * timeout:g}; None waits forever) "
            f"or start fewer workers.{traces}"
        )
        return cls(truncated(message), timeout=timeout, started=tuple(started), pending=tuple(i for i, _, _ in pending))

    @classmethod
    def remote(cls, *, timeout: float, started: list[int], pending: list[int], asked: list[dict],
               available: dict, total: dict) -> StartTimeoutError:
        """The error for Ray actors not up after ``timeout`` s: ``started``/``pending``, the
        indices of the remote collectors that were up / not; ``asked``, the ``remote_configs``
        of the pending ones; ``available``/``total``, the cluster's resources."""
        one = len(pending) == 1
        which = f"remote collector{'' if one else 's'} {', '.join(map(str, pending))}"
        up = (f"; {'remote collector' if len(started) == 1 else 'remote collectors'} "
              f"{', '.join(map(str, started))} {'was' if len(started) == 1 else 'were'} up") if started \
            else "; none was up"
        configs = [dict(c) for c in asked]
        each = repr(configs[0]) if all(c == configs[0] for c in configs) else repr(configs)
        message = (
            f"{which} of {len(started) + len(pending)} did not start within {timeout:g} s (start_timeout): Ray "
            f"could not place {'its actor' if one else 'their actors'}, or {'its' if one else 'their'} "
            f"collector{'' if one else 's'} took longer to build{up}; every actor was killed. "
            f"{'It asks' if one else 'They ask'} {each} (remote_configs); the cluster has {available} available "
            f"of {total}. Ask for less in remote_configs or add nodes; if the cluster is just loaded (or the "
            f"envs slow to build), raise start_timeout (e.g. start_timeout={2 * timeout:g}; None waits forever)."
        )
        return cls(message, timeout=timeout, started=tuple(started), pending=tuple(pending))


class RemoteCollectorError(CollectorError):
    """A remote collector failed: its collector raised, or its process (actor, RPC worker) died.

    Raised from the iterator, ``await update_policy_weights(...)`` and ``set_seed()`` of
    [`RayCollector`][aiocollect.RayCollector] and [`RPCCollector`][aiocollect.RPCCollector];
    the remote error is its ``__cause__`` (an [`EnvError`][aiocollect.EnvError] when a remote
    env raised), with the remote traceback.

    Attributes:
        index (int): the remote collector's index (0 .. num_collectors - 1).
        where (str): what ran it ("Ray actor 1f2e...", "RPC worker collector1").
        pid (int | None): its process id, when known.
    """

    def __init__(self, message: str, *, index: int, where: str, pid: int | None):
        super().__init__(message)
        self.index, self.where, self.pid = index, where, pid

    def __reduce__(self):
        return (_rebuild, (type(self), str(self), self.__dict__, _portable(self.__cause__)))

    @classmethod
    def wrap(cls, index: int, where: str, pid: int | None, exc: BaseException) -> RemoteCollectorError:
        error = cls(f"remote collector {index} ({where}, pid {pid}) failed: "
                    f"{type(exc).__name__}: {exception_text(exc)}", index=index, where=where, pid=pid)
        error.__cause__ = exc
        return error


class CollectorClosedError(CollectorError):
    """The collector was used after [`shutdown()`][aiocollect.DataCollectorBase.shutdown]: create a new one."""


class CollectorFailedError(CollectorError):
    """The collector was used after a fault: its envs are in an unknown state.

    The fault (an [`EnvError`][aiocollect.EnvError], a policy's exception...) came out of
    the call that met it and is this error's ``__cause__``; shut the collector down and
    create a new one.
    """


class CollectorBusyError(CollectorError):
    """The collector is already collecting: a collector yields one batch at a time.

    Raised when it is iterated from two places at once, iterated while
    [`start()`][aiocollect.DataCollectorBase.start] collects in the background, or started twice.
    """


class PolicyKeyError(KeyError, ValueError):
    """A policy whose keys do not fit the envs: ``in_keys`` the envs do not give, or no
    ``"action"`` among its ``out_keys``. A bad argument, so a ``ValueError``, raised before
    any process starts; also a ``KeyError``, which the same mistake raised before (from
    tensordict, or a bare ``KeyError: 'action'``). Its message prints as written (a
    ``KeyError`` would print it quoted)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def env_failure(exc: Exception, worker: int, pid: int | None) -> EnvError:
    """The error for ``exc``, raised in this process by an env of worker ``worker`` (a
    coroutine env or entry): a [`StepTimeoutError`][aiocollect.StepTimeoutError] now
    naming the worker, anything else wrapped in an [`EnvError`][aiocollect.EnvError]."""
    if isinstance(exc, StepTimeoutError):
        return exc.locate(worker, pid)
    return EnvError.of(exc, worker=worker, pid=pid, in_process=True)


def _where(worker: int, pid: int | None, env: int | None, in_process: bool) -> str:
    place = f"worker {worker} (this process, pid {pid})" if in_process else f"worker {worker} (pid {pid})"
    return place if env is None else f"env {env} of {place}"


MAX_TEXT = 64 * 1024
"""The most characters of an exception's message, and of its traceback, that an error
carries (a bigger one is cut in its middle): a 50 MB message would otherwise take seconds
to travel from a worker, and flood the terminal."""


def truncated(text: str, limit: int = MAX_TEXT) -> str:
    """``text``, cut in its middle to at most about ``limit`` characters, saying so."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters truncated ...]\n{text[-half:]}"


def exception_text(exc: BaseException) -> str:
    """``str(exc)``, truncated; ``<unprintable TYPE>`` when ``__str__`` itself raises."""
    try:
        return truncated(str(exc))
    except BaseException:  # noqa: BLE001 - a hostile __str__ must not hide the env's error
        return f"<unprintable {type(exc).__name__}>"


def exception_traceback(exc: BaseException) -> str:
    """``exc``'s formatted traceback, truncated (whatever its ``__str__`` or notes do)."""
    try:
        return truncated("".join(traceback.format_exception(exc)))
    except BaseException:  # noqa: BLE001 - as above
        return f"<the traceback of {type(exc).__name__} could not be formatted>\n"


def unpickled_exception(data: bytes | None) -> BaseException | None:
    """The exception ``pickled_exception`` made bytes of, if it unpickles here (else ``None``)."""
    if not data:
        return None
    try:
        exc = pickle.loads(data)
    except Exception:  # noqa: BLE001 - its class may not import here: the message has it all
        return None
    return exc if isinstance(exc, BaseException) else None


_MAX_PICKLED = 1024 * 1024
"""The biggest pickled exception sent along with its text (a bigger one is left out)."""


def pickled_exception(exc: BaseException) -> bytes | None:
    """``exc`` as bytes for another process (``None`` if it cannot be pickled, or is
    bigger than ``_MAX_PICKLED``)."""
    try:
        import cloudpickle

        data = cloudpickle.dumps(exc)
    except Exception:  # noqa: BLE001 - the text of the exception still travels
        return None
    return data if len(data) <= _MAX_PICKLED else None


def _portable(cause: BaseException | None) -> BaseException | None:
    """``cause`` if it survives pickling (it travels with the error, e.g. from a Ray actor)."""
    if cause is None:
        return None
    try:
        pickle.dumps(cause)
    except Exception:  # noqa: BLE001 - the message keeps its text and traceback
        return None
    return cause


def _rebuild(cls: type, message: str, state: dict, cause: BaseException | None = None) -> Any:
    err = cls.__new__(cls)
    RuntimeError.__init__(err, message)
    err.__dict__.update(state)
    err.__cause__ = cause
    return err

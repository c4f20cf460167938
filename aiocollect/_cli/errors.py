"""How the command reports a mistake: one line on stderr and exit code 2, never a traceback.

A bad env id, ``--env-kwargs`` or option, a ``--policy`` that cannot be loaded or cannot act
on the env, an env module (``--env module:EnvId``) that cannot be imported or raises on
import, an env whose first reset or step raises (one env, stepped in this process), an
``--out`` that cannot safely be written, or a size that cannot fit (``--frames`` on the disk,
``--frames-per-batch`` in memory) ends the command before any worker starts: each check raises
a ``UsageError``, which ``main`` prints as ``aiocollect: error: ...``. An env that raises
later, in a worker, ends it the same way (``env_error``: the env's exception and the line that
raised it).

Whatever the user's code raised (an env, a module, a policy) is put in that line by
``one_line``.
"""

from __future__ import annotations

import re


class UsageError(Exception):
    """A mistake of the user's: reported in one line, exit code 2."""


def one_line(exc: BaseException) -> str:
    """``TYPE: message`` of ``exc`` on one line (a ``SyntaxError`` with its file and line; an
    ``EnvError``: ``env_error``)."""
    from .._errors import EnvError

    if isinstance(exc, EnvError):
        return env_error(exc)
    if isinstance(exc, SyntaxError):
        text = f"{exc.msg} ({exc.filename}, line {exc.lineno})"
    else:
        text = str(exc)
        if "Traceback of TorchScript" in text:  # the TorchScript stack, then the error itself, on the last line
            last = text.strip().splitlines()[-1]
            return " ".join(last.split())[:300]
    text = " ".join(text.split())
    text = text if len(text) <= 300 else f"{text[:300]}..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


_FRAME = re.compile(r'^[ |+-]*File "(.*)", line (\d+), in (.*)$', re.M)
_TRACE = re.compile(r"\n\n(Traceback of the env|Traceback in the worker|Python stack of the worker)")


def env_error(exc: BaseException) -> str:
    """An ``EnvError`` (an env's ``reset()`` or ``step()`` raised) in one line: what its message
    says before the traceback it carries (the env, its worker, and the env's exception: type
    and message), and where the env's code raised it, the last frame of that traceback
    (``raised at FILE:LINE, in FUNCTION``), never the frames of aiocollect that led there. The
    env of a probe in this process is not named (it is the one env of the probe)."""
    text = _TRACE.split(str(exc), maxsplit=1)[0]
    place, raised, rest = text.partition(" raised ")
    if raised and "(this process, pid " in place:
        text = rest  # "RuntimeError: message"
    text = " ".join(text.split())
    text = text if len(text) <= 300 else f"{text[:300]}..."
    frames = _FRAME.findall(getattr(exc, "remote_traceback", "") or "")
    if frames:
        file, line, function = frames[-1]
        text += f" (raised at {file}:{line}, in {function})"
    return text

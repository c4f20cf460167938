"""``--out``: where ``aiocollect collect`` saves, checked so that writing there loses nothing.

The save is written beside ``--out`` and renamed to it once complete, so ``--out`` is never
half-written (see ``_dataset``). Before anything starts, ``--out`` must be a new or empty
directory, or, with ``--overwrite``, an earlier save that its ``aiocollect.json`` proves to be
one; never a symbolic link, the current directory or one that holds it, a file, or a mount
point (the rename could not replace it); and a directory must be makeable beside it
(``_check_writable``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
from pathlib import Path

from .errors import UsageError


def check_out(args: argparse.Namespace) -> Path:
    """``--out`` resolved, once it is sure that writing there loses nothing (see ``_dataset``)
    and that a directory can be made beside it (``_check_writable``)."""
    try:
        target = _look_at_out(args)
    except OSError as exc:  # a directory on the way that this user may not enter (EACCES), ...
        where = f"{exc.filename}: " if exc.filename else ""
        raise UsageError(f"--out {args.out}: not writable: {where}{exc.strerror or exc}; give an --out in a "
                         "directory you can write to") from None
    _check_writable(args, target)
    return target


def _look_at_out(args: argparse.Namespace) -> Path:
    """``--out`` resolved, refused where the save's rename would lose or hide something."""
    from .._dataset import NotASave, check_replaceable

    given = Path(args.out)
    if given.is_symlink():
        raise UsageError(f"--out {args.out}: is a symbolic link (to {os.readlink(given)}); aiocollect collect "
                         "replaces --out by renaming a new directory onto it, so give a real path: the "
                         "directory the link points to, or a new one")
    target = given.resolve()
    cwd = Path.cwd().resolve()
    if target == cwd or target in cwd.parents:
        which = "the current directory" if target == cwd else "a directory that holds the current directory"
        raise UsageError(f"--out {args.out}: is {which}; the save goes into a directory of its own, "
                         f"e.g. --out {Path(args.out) / 'frames'}")
    if target.exists() and not target.is_dir():
        raise UsageError(f"--out {args.out}: is a file; give a directory (new, empty, or saved by aiocollect collect)")
    if target.is_dir() and any(target.iterdir()):
        if not args.overwrite:
            raise UsageError(f"--out {args.out}: exists and is not an empty directory; pick another or pass "
                             "--overwrite (which replaces only an earlier save of aiocollect collect)")
        try:
            check_replaceable(target)
        except NotASave as exc:
            raise UsageError(f"--out {args.out}: --overwrite replaces only a directory that aiocollect collect "
                             f"saved, and {exc}; delete it yourself if you mean to, or pick another --out") from None
    if target.is_dir() and target.stat().st_dev != target.parent.stat().st_dev:
        raise UsageError(f"--out {args.out}: is a mount point, and the save is renamed into place from beside it; "
                         f"give a new directory inside it, e.g. --out {Path(args.out) / 'frames'}")
    return target


def _check_writable(args: argparse.Namespace, target: Path) -> None:
    """The save is made as a new directory beside ``target`` (its missing parents made first):
    one is made, and removed, in the nearest directory that exists, so that a place nobody may
    write to (``/proc``, ``/sys``, a read-only disk, another user's directory) is refused as
    such, and not later, or as a disk without room (``/proc`` has 0 bytes free). Permission
    bits do not say it: root passes every ``os.access`` check, and a read-only mount has them."""
    import tempfile

    base = target.parent
    while not os.path.exists(base) and base != base.parent:
        base = base.parent
    if not base.is_dir():
        raise UsageError(f"--out {args.out}: cannot write there: {base} is a file, not a directory")
    try:
        probe = tempfile.mkdtemp(prefix=f".{target.name}.writable-", dir=base)
    except OSError as exc:
        raise UsageError(f"--out {args.out}: not writable: making a directory in {base} failed "
                         f"({exc.strerror or exc}); give an --out in a directory you can write to") from None
    with contextlib.suppress(OSError):
        os.rmdir(probe)

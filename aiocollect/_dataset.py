"""Where ``aiocollect collect`` saves its frames, and why it never loses anything else.

A save is written into a fresh sibling of ``--out`` named ``.NAME.partial-XXXXXXXX`` and
renamed to ``--out`` only once its last frame is in. So ``--out`` is never half-written: it is
absent, or holds the previous complete save, or the new complete one. A run stopped by Ctrl-C
removes its partial directory; a run killed outright (``kill -9``, out of memory, a power cut)
leaves it, under a name that says so and with an ``aiocollect.json`` that says how many frames
it holds (``"complete": false, "frames_written": ...``).

Every save records what it wrote in ``aiocollect.json``: a format name and version, every file
and directory with its size (and the sha256 of each ``meta.json``, the small files that say what
the data is), and a sha256 of that record. ``--overwrite`` replaces a directory only when that
record proves the whole directory is a save: the record is intact, and the directory holds
nothing it does not list, at the size it lists. Anything else (a ``meta.json`` of someone else's,
a file added since, a symbolic link) is refused and left as it is. The data files are checked by
size, not hashed: a memory-mapped save is meant to be written into in place, and proving that a
directory is ours must not re-read gigabytes.

Replacing a save is two renames: the old save steps aside (``.NAME.replaced-XXXXXXXX``), the
new one takes its place, and then the old one's listed files are deleted one by one (never a
recursive delete of anything but our own partial directory). Ctrl-C waits for the two renames.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import signal
import threading
from pathlib import Path

from tensordict import TensorDict

MARKER = "aiocollect.json"
FORMAT = "aiocollect collect"
VERSION = 1


class NotASave(Exception):
    """Why a directory cannot be proven to be a save of ours: a phrase for an error message."""


class CommitError(Exception):
    """The finished save could not be put in place; the message says where its frames are."""


def leftovers(target: Path) -> list[Path]:
    """Partial or set-aside directories of ``target`` that an earlier run left behind."""
    if not target.parent.is_dir():
        return []
    names = (f".{target.name}.partial-", f".{target.name}.replaced-")
    return sorted(p for p in target.parent.iterdir() if p.name.startswith(names) and p.is_dir())


def _walk(directory: Path) -> tuple[dict[str, os.stat_result], list[str], list[str]]:
    """(files with their stat, directories, anything else) under ``directory``, as relative
    POSIX paths; symbolic links are never followed and count as "anything else"."""
    files: dict[str, os.stat_result] = {}
    dirs: list[str] = []
    other: list[str] = []
    pending = [""]
    while pending:
        rel = pending.pop()
        with os.scandir(directory / rel) as entries:
            for entry in entries:
                path = f"{rel}/{entry.name}" if rel else entry.name
                if entry.is_symlink():
                    other.append(path)
                elif entry.is_dir(follow_symlinks=False):
                    dirs.append(path)
                    pending.append(path)
                elif entry.is_file(follow_symlinks=False):
                    files[path] = entry.stat(follow_symlinks=False)
                else:
                    other.append(path)
    return files, dirs, other


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _seal(record: dict) -> dict:
    """``record`` with the sha256 of everything else in it under ``"sha256"``."""
    body = {k: v for k, v in record.items() if k != "sha256"}
    return {**body, "sha256": hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()}


def _write_json(path: Path, record: dict) -> None:
    """Write ``record`` to ``path`` whole or not at all (a reader never sees half of it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def check_replaceable(directory: Path) -> list[str]:
    """Prove that ``directory`` is a complete save of ours and nothing else; return what it
    holds (relative paths, files before the directories that hold them), or raise
    ``NotASave`` with the reason."""
    marker = directory / MARKER
    if marker.is_symlink() or not marker.is_file():
        raise NotASave(f"it has no {MARKER} (the record of the files aiocollect collect wrote)")
    try:
        record = json.loads(marker.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise NotASave(f"its {MARKER} cannot be read ({exc})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise NotASave(f"its {MARKER} is not one that aiocollect collect writes")
    if record.get("version") != VERSION:
        raise NotASave(f"its {MARKER} has format version {record.get('version')!r}; this aiocollect "
                       f"writes and replaces version {VERSION}")
    if record.get("sha256") != _seal(record)["sha256"]:
        raise NotASave(f"its {MARKER} was changed after aiocollect collect wrote it (its sha256 does not match)")
    if record.get("complete") is not True:
        raise NotASave("it is an unfinished save (an interrupted run's partial directory)")
    listed_files, listed_dirs = record.get("files"), record.get("dirs")
    if not isinstance(listed_files, dict) or not isinstance(listed_dirs, list):
        raise NotASave(f"its {MARKER} lists no files")
    files, dirs, other = _walk(directory)
    if other:
        raise NotASave(f"it holds {other[0]}, which is a symbolic link or a special file")
    for path in sorted(dirs):
        if path not in listed_dirs:
            raise NotASave(f"it holds {path}/, which aiocollect collect did not write")
    for path, stat in sorted(files.items()):
        if path == MARKER:
            continue
        listed = listed_files.get(path)
        if not isinstance(listed, dict):
            raise NotASave(f"it holds {path}, which aiocollect collect did not write")
        if stat.st_size != listed.get("size"):
            raise NotASave(f"{path} is {stat.st_size:,} bytes where aiocollect collect wrote {listed.get('size')!r}")
        if "sha256" in listed and _sha256(directory / path) != listed["sha256"]:
            raise NotASave(f"{path} was changed after aiocollect collect wrote it (its sha256 does not match)")
    depth_first = sorted(dirs, key=lambda p: p.count("/"), reverse=True)
    return [p for p in files if p != MARKER] + [MARKER] + depth_first


@contextlib.contextmanager
def _sigint_deferred():
    """Hold a Ctrl-C until the block is done (then raise it): a rename pair is never cut in two."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


def _fresh_sibling(target: Path, kind: str) -> Path:
    """A new, empty directory beside ``target`` whose name says what it is (``kind``)."""
    for _ in range(100):
        path = target.with_name(f".{target.name}.{kind}-{secrets.token_hex(4)}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free name for a {kind} directory beside {target}")


class PartialSave:
    """A save being written: a fresh directory beside ``target``, renamed onto it by
    ``commit()`` once every frame is in, or removed by ``discard()``.

    ``time_steps`` is the length of the saved time dim; ``about`` is recorded in
    ``aiocollect.json`` as it is (the env, the frame count...).
    """

    def __init__(self, target: Path, time_steps: int, about: dict):
        self.target = target
        self.time_steps = time_steps
        self.about = about
        target.parent.mkdir(parents=True, exist_ok=True)
        self.path = _fresh_sibling(target, "partial")
        self.frames_written = 0
        self._data: TensorDict | None = None
        self._mark()

    def _mark(self, written: dict | None = None) -> None:
        """Write ``aiocollect.json``: while collecting, how far it got (``"complete": false``);
        given what was ``written`` (its files, directories and shape), the record of a save."""
        record = {"format": FORMAT, "version": VERSION, "complete": written is not None, **self.about,
                  "frames_written": self.frames_written, **(written or {"pid": os.getpid()})}
        _write_json(self.path / MARKER, _seal(record))

    def write(self, batch: TensorDict, start: int) -> None:
        """Write ``batch`` at time steps ``start:start + batch.shape[-1]``; the first call lays
        the whole file out on disk, so memory use does not grow with the number of frames."""
        if self._data is None:
            first = batch[..., :1].expand(*batch.shape[:-1], self.time_steps)
            self._data = first.memmap_like(prefix=str(self.path))
        self._data[..., start:start + batch.shape[-1]] = batch
        self.frames_written += batch.numel()
        self._mark()

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._data.shape) if self._data is not None else ()

    def discard(self) -> None:
        """Remove the partial directory (ours alone: created by us under a fresh random name)."""
        import shutil

        self._data = None
        shutil.rmtree(self.path, ignore_errors=True)

    def commit(self) -> None:
        """Record every file written, then put the save at ``target``: renamed onto it when it is
        absent or an empty directory, swapped with it when it is a save of ours (proven again
        here, as it may have changed while collecting). Raises ``CommitError`` otherwise, and the
        frames stay in the partial directory."""
        shape, self._data = self.shape, None
        files, dirs, _ = _walk(self.path)
        listing: dict[str, dict[str, int | str]] = {path: {"size": stat.st_size} for path, stat in files.items()
                                                    if path != MARKER}
        for path, listed in listing.items():
            if path.rsplit("/", 1)[-1] == "meta.json":
                listed["sha256"] = _sha256(self.path / path)
        self._mark({"shape": list(shape), "files": listing, "dirs": sorted(dirs)})
        target, keep = self.target, f"; the frames are kept in {self.path}"
        with _sigint_deferred():
            if not os.path.lexists(target) or (target.is_dir() and not target.is_symlink()
                                               and not any(target.iterdir())):
                try:  # onto nothing, or onto an empty directory (which rename replaces)
                    os.rename(self.path, target)
                except OSError as exc:
                    raise CommitError(f"cannot rename the save to {target} ({exc.strerror or exc}){keep}") from None
                return
            aside = _fresh_sibling(target, "replaced")
            try:
                check_replaceable(target)
                os.rename(target, aside)  # onto the empty directory that reserved the name
                old = check_replaceable(aside)  # proven again where it cannot change under us
            except (NotASave, OSError) as exc:
                if not os.path.lexists(target):
                    os.rename(aside, target)  # put it back as it was
                else:
                    aside.rmdir()
                reason = exc if isinstance(exc, NotASave) else exc.strerror or exc
                raise CommitError(f"--overwrite cannot replace {target} any more: {reason}{keep}") from None
            try:
                os.rename(self.path, target)
            except OSError as exc:
                os.rename(aside, target)  # the old save goes back where it was
                raise CommitError(f"cannot rename the save to {target} ({exc.strerror or exc}){keep}") from None
        for path in old:  # the old save, file by file from its own list; never a recursive delete
            with contextlib.suppress(OSError):
                entry = aside / path
                if entry.is_dir() and not entry.is_symlink():
                    entry.rmdir()
                else:
                    entry.unlink()
        with contextlib.suppress(OSError):
            aside.rmdir()

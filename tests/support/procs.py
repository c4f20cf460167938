"""Process, thread and leak probes: what a collector leaves behind after it is gone."""

from __future__ import annotations

import os
import signal
import threading
import time


def children() -> set[int]:
    """Pids of this process's live (non-zombie) env workers: its children that run a worker,
    and every process its warm launcher forked (``aiocollect._workers.launcher``)."""
    from aiocollect._workers import launcher

    me, out = os.getpid(), set()
    warm = launcher.current()
    forked_by = warm.pid if warm is not None else None
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z":
            continue
        if (int(fields[1]) == me and _is_worker(entry)) or int(fields[1]) == forked_by:
            out.add(int(entry))
    return out


def _is_worker(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return False
    return b"aiocollect._workers.child" in cmdline or b"aiocollect._distributed.rpc_worker" in cmdline


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def open_fds() -> set[str]:
    return {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")}


def aiocollect_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("aiocollect")}


def segment_mappings() -> set[str]:
    """The address ranges where this process maps an aiocollect shared-memory segment (a
    memfd): the engine maps its segment with no descriptor of its own (``_workers.shm.Mapping``),
    so its fds alone would not show one left behind."""
    try:
        with open("/proc/self/maps") as f:
            return {line.split()[0] for line in f if "memfd:aiocollect" in line}
    except OSError:  # (no /proc)
        return set()


def snapshot() -> tuple[set[int], set[str], set[str], set[str]]:
    """What this process holds that a collector could leak: its worker processes, its
    aiocollect threads, its shared-memory fds (aiocollect's segments are memfds), sockets
    and pipes (the workers' doorbell pipe, their stack-dump pipes), and its mappings of
    shared-memory segments.

    Only this process and its children are looked at, so other programs on the machine
    (another test run, a TorchRL job making /dev/shm segments) cannot fail a test."""
    fds = {f for f in open_fds() if "memfd:aiocollect" in f or f.startswith(("socket:", "pipe:"))}
    return children(), aiocollect_threads(), fds, segment_mappings()


def leftovers(before: tuple[set[int], set[str], set[str], set[str]]) -> dict[str, set]:
    """What ``snapshot()`` finds now that it did not find in ``before``; empty if nothing leaked."""
    now = snapshot()
    names = ("worker processes", "threads", "shared-memory fds, sockets and pipes", "shared-memory mappings")
    return {name: new - old for name, new, old in zip(names, now, before) if new - old}


def wait_until(cond, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def interrupt_script(script: str, preamble: int = 0) -> tuple[str, str, int]:
    """Run ``script`` as ``python -c`` would, forked from the warm interpreter of
    ``support.zygote`` (the test takes the ``zygote`` fixture); once it prints "collecting"
    (after ``preamble`` lines, which come back at the start of stdout), wait 0.5 s and send
    SIGINT (Ctrl-C). Asserts it exits within 10 s (it takes well under one on a quiet machine;
    a loaded 2-core machine has taken over 5); returns ``(stdout, stderr, returncode)``."""
    from support import zygote

    proc = zygote.popen(script)
    first = "".join(proc.stdout.readline() for _ in range(preamble))
    assert proc.stdout.readline().strip() == "collecting"
    time.sleep(0.5)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert time.monotonic() - t0 < 10, "Ctrl-C took too long"
    return first + out, err, proc.returncode

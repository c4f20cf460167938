"""RPCCollector's guarantees about sockets and processes, checked on real processes and sockets.

* everything a launched world listens on is on ``master_addr`` (loopback by default): the
  rendezvous store, TensorPipe and Gloo, even where torch would pick the external interface;
* a ``master_port`` that is taken fails at once, naming the port;
* the workers die with a driver that is killed, and the port is free again;
* ``shutdown()`` is bounded when a worker stopped answering;
* no process of a launched world busy-polls (TensorPipe's shared-memory transport, whose
  reactor thread spins a core in every process, is left out: ``rpc_rendezvous.TRANSPORTS``).

Each driver runs in a process of its own (RPC can be initialised once per process), forked
from a warm interpreter that imported torch and aiocollect once (``support.zygote``).
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from support import zygote

TESTS = os.path.dirname(os.path.dirname(__file__))  # tests/, where support/ is

PRELUDE = f"""
import faulthandler, json, os, signal, socket, sys, time
faulthandler.dump_traceback_later(90, exit=True)  # a hang shows where, before the test's timeout
sys.path.insert(0, {TESTS!r})
from aiocollect import RPCCollector, RemoteCollectorError
from support.envs import IntObsEnv
"""


def driver(body: str, **kwargs) -> zygote.Driver:
    """``Popen([sys.executable, "-c", PRELUDE + body], stdout=PIPE, stderr=PIPE, text=True, **kwargs)``."""
    return zygote.popen(PRELUDE + textwrap.dedent(body), **kwargs)


def run(body: str, timeout: float = 60, env: dict | None = None) -> dict:
    proc = driver(body, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        out, err = proc.communicate()
        pytest.fail(f"the driver was still running after {timeout} s:\n{err[-4000:]}")
    assert proc.returncode == 0, err[-4000:]
    return json.loads(out.strip().splitlines()[-1])


# ---------------------------------------------------------------------- /proc probes (Linux)


def descendants(pid: int) -> set[int]:
    """The live processes below ``pid``."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                parents[int(entry)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def kill_tree(pid: int) -> None:
    for p in descendants(pid) | {pid}:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    except OSError:
        pass
    return inodes


def _address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)  # each 32-bit word in host (little-endian) order
    return str(ipaddress.ip_address(b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))))


def thread_names(pid: int) -> set[str]:
    names = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            names.add(Path(f"/proc/{pid}/task/{task}/comm").read_text().strip())
        except OSError:
            pass
    return names


def listening(pids: set[int] | None = None) -> list[tuple[str, int]]:
    """``(address, port)`` of every TCP socket in LISTEN state (state 0A), held by one of
    ``pids`` (``None``: by anyone)."""
    inodes = set().union(*(_socket_inodes(p) for p in pids)) if pids is not None else None
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and (inodes is None or fields[9] in inodes):
                address, port = fields[1].split(":")
                found.append((_address(address), int(port, 16)))
    return found


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


def external_interface() -> tuple[str, str] | None:
    """``(name, IPv4 address)`` of the interface of the default route, if the machine has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: the kernel only picks a route
            address = s.getsockname()[0]
        except OSError:
            return None
    try:
        routes = [line.split() for line in Path("/proc/net/route").read_text().splitlines()[1:]]
    except OSError:
        return None
    name = next((r[0] for r in routes if r[1] == "00000000"), None)  # the default route's interface
    return (name, address) if name and not ipaddress.ip_address(address).is_loopback else None


# ---------------------------------------------------------------------- the guarantees


def test_a_launched_world_listens_on_loopback_only():
    """The store listened on every interface (``*:port``), and TensorPipe and Gloo on the
    interface torch picks from the hostname; all of it is on 127.0.0.1 now. On a machine
    whose hostname resolves to an external address, torch picks that one: naming the
    external interface in ``TP_SOCKET_IFNAME`` / ``GLOO_SOCKET_IFNAME`` does the same here.
    While the world is up, no process of it runs TensorPipe's busy-polling shared-memory reactor."""
    external = external_interface()
    env = dict(os.environ)
    if external is not None:
        env.update(TP_SOCKET_IFNAME=external[0], GLOO_SOCKET_IFNAME=external[0])
    proc = driver("""
        c = RPCCollector(lambda: IntObsEnv(), None, frames_per_batch=20, total_frames=-1, num_collectors=2,
                         sync=True)
        c.rollout()
        pids = [os.getpid()] + [w.pid for w in c.statistics().workers]
        print(json.dumps({"pids": pids, "port": c.master_port}), flush=True)
        sys.stdin.readline()  # the test looks now
        c.shutdown()
    """, env=env, stdin=subprocess.PIPE)
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()[-4000:]
        started = json.loads(line)
        sockets = listening(set(started["pids"]))
        ports = {port for _, port in sockets}
        assert started["port"] in ports  # the store, held by worker 0
        assert len(sockets) >= 3 * 2  # and TensorPipe's listeners in every process
        assert [s for s in sockets if not is_loopback(s[0])] == []
        threads = set().union(*(thread_names(pid) for pid in started["pids"]))
        assert "TP_SHM_reactor" not in threads  # (it spun a core in each process, idle or not)
        if external is not None:  # what the issue did: connect to the store from outside
            with socket.socket() as s, pytest.raises(ConnectionRefusedError):
                s.settimeout(5)
                s.connect((external[1], started["port"]))
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(60) == 0, proc.stderr.read()[-4000:]
    finally:
        kill_tree(proc.pid)


def test_a_taken_master_port_fails_at_once_naming_it():
    """It hung past ``start_timeout`` (the workers met whatever held the port)."""
    with socket.socket(socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET) as squatter:
        squatter.bind(("::" if socket.has_ipv6 else "0.0.0.0", 0))  # on every interface, as a server would
        squatter.listen()
        port = squatter.getsockname()[1]
        out = run(f"""
            start = time.monotonic()
            try:
                RPCCollector(lambda: IntObsEnv(), None, frames_per_batch=20, num_collectors=2, master_port={port},
                             start_timeout=15)
                error = None
            except OSError as exc:
                error = [exc.errno, str(exc)]
            print(json.dumps({{"error": error, "seconds": time.monotonic() - start,
                               "children": len(__import__("multiprocessing").active_children())}}))
        """, timeout=40)
    assert out["error"] is not None and out["seconds"] < 5
    code, message = out["error"]
    assert code == 98 or "in use" in message
    assert f"master_port {port}" in message and "in use" in message


def test_the_workers_die_with_a_killed_driver_and_free_the_port():
    """Both workers (then children of init) and the port were still there after 601 s."""
    proc = driver("""
        c = RPCCollector(lambda: IntObsEnv(), None, frames_per_batch=20, total_frames=-1, num_collectors=2,
                         sync=True)
        c.rollout()
        print(json.dumps({"workers": [w.pid for w in c.statistics().workers], "port": c.master_port}), flush=True)
        time.sleep(120)
    """)
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()[-4000:]
        started = json.loads(line)
        below = descendants(proc.pid)  # the RPC workers and their env workers
        assert set(started["workers"]) <= below
        assert started["port"] in {port for _, port in listening()}
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (any(_alive(p) for p in below) or
                                               started["port"] in {port for _, port in listening()}):
            time.sleep(0.1)
        left = [p for p in below if _alive(p)]
        assert left == [], f"still running 5 s after the driver was killed: {left}"
        assert started["port"] not in {port for _, port in listening()}
    finally:
        kill_tree(proc.pid)


def test_shutdown_is_bounded_when_a_worker_stops_answering():
    """A worker whose call failed counts as dead, whatever ``poll()`` says: the driver leaves
    the world without waiting for it (a graceful shutdown waits for every member; the
    flaky hang was this, with a killed worker whose exit status was not yet reapable)."""
    out = run("""
        c = RPCCollector(lambda: IntObsEnv(), None, frames_per_batch=20, total_frames=-1, num_collectors=2,
                         sync=True, rpc_timeout=2)
        c.rollout()
        pids = [w.pid for w in c.statistics().workers]
        os.kill(pids[1], signal.SIGSTOP)  # alive to poll(), deaf to RPC
        try:
            c.rollout()
            error = None
        except RemoteCollectorError as exc:
            error = exc.index
        start = time.monotonic()
        c.shutdown()
        seconds = time.monotonic() - start
        deadline = time.monotonic() + 0.2
        while any(os.path.exists(f"/proc/{p}") for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        alive = [p for p in pids if os.path.exists(f"/proc/{p}")]  # this driver reaps its children
        print(json.dumps({"error": error, "seconds": seconds, "alive": alive}))
    """)
    assert out["error"] == 1
    assert out["seconds"] < 10 and out["alive"] == []


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

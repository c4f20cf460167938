"""Where a world launched by [`RPCCollector`][aiocollect.RPCCollector] meets, and what it listens on.

torch's own ``tcp://`` rendezvous opens the world's key-value store (a ``TCPStore``) on
*every* interface, whatever host the URL names, and its RPC transports (TensorPipe) and
process group (Gloo) listen on whichever address the machine's hostname resolves to. A
launched world is one machine's business, so this module keeps all of it on
``master_addr`` (loopback by default):

* ``listen(addr, port)`` opens the store's listening socket *here*, in the driver, bound to
  ``addr`` only. A port that is taken fails at once, naming the port, instead of the world
  waiting for a rendezvous that never comes. The socket is handed to worker 0 (the store's
  host, as the ``fd`` of its rendezvous URL), which serves the store on it: the port lives
  exactly as long as worker 0.
* ``url(...)`` is the ``aiocollect://`` rendezvous URL each process passes to
  ``rpc.init_rpc``; ``register()`` teaches torch that scheme. Rank 0 serves the store on
  the inherited socket; every other rank is a client that gives up after the start
  timeout (``tcp://`` waits half an hour).
* ``interface_env(addr)`` names the network interface that holds ``addr`` in
  ``TP_SOCKET_IFNAME`` and ``GLOO_SOCKET_IFNAME``, which torch reads to choose where
  TensorPipe and Gloo listen; ``interfaces(addr)`` sets them in this process while it joins.

```python
listener = listen("127.0.0.1", 0)            # OSError at once if the port is taken
port = listener.getsockname()[1]
register()
init = url("127.0.0.1", port, timeout=120.0, fd=listener.fileno())   # rank 0's URL
```
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import socket
import struct
from collections.abc import Iterator
from datetime import timedelta
from urllib.parse import parse_qsl, urlparse

SCHEME = "aiocollect"
INTERFACE_VARIABLES = ("TP_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
"""The environment variables torch reads to pick the interface TensorPipe and Gloo listen on."""
TRANSPORTS = ["uv"]
"""The TensorPipe transports of a launched world (``TensorPipeRpcBackendOptions(_transports=...)``):
TCP (libuv) only. TensorPipe's default list adds its shared-memory transport, whose reactor
thread busy-polls: every process of the world then burns a core for as long as it lives,
idle or not (three processes take the whole of a 2-core machine from the envs and the
trainer). Tensors still travel through TensorPipe's channels (cross-memory attach on one
machine), not through the transport."""


def listen(addr: str, port: int) -> socket.socket:
    """A TCP socket listening on ``addr:port`` only (``port=0``: a free one).

    Raises:
        OSError: the port is taken (``EADDRINUSE``), with a message naming it, or ``addr``
            is not an address of this machine.
    """
    family, _, _, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free
        sock.bind(sockaddr)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise OSError(errno.EADDRINUSE, f"RPCCollector: master_port {port} is already in use on {addr}; "
                          "pass another master_port, or leave it out to use a free one.") from exc
        raise OSError(exc.errno, f"RPCCollector: cannot listen on master_addr {addr}:{port}: {exc.strerror}") \
            from exc
    return sock


def url(addr: str, port: int, timeout: float, fd: int | None = None) -> str:
    """The rendezvous URL of a launched world: with ``fd``, that of the rank that serves
    the store on the listening socket ``fd``; without, that of a client."""
    host = f"[{addr}]" if ":" in addr else addr
    query = f"timeout={timeout}" + (f"&fd={fd}" if fd is not None else "")
    return f"{SCHEME}://{host}:{port}?{query}"


def register() -> None:
    """Make ``aiocollect://`` URLs known to ``torch.distributed.rendezvous`` (once per process)."""
    from torch.distributed import register_rendezvous_handler

    try:
        register_rendezvous_handler(SCHEME, _rendezvous)
    except RuntimeError:  # registered already
        pass


def _rendezvous(url: str, **kwargs):
    """torch's rendezvous handler protocol: yield ``(store, rank, world_size)`` once."""
    from torch.distributed import TCPStore

    parsed = urlparse(url)
    query = dict(parse_qsl(parsed.query))
    rank, world_size = int(query["rank"]), int(query["world_size"])
    fd = int(query["fd"]) if "fd" in query else None
    assert parsed.hostname is not None and parsed.port is not None  # (our own URL: host and port in it)
    store = TCPStore(parsed.hostname, parsed.port, world_size, is_master=fd is not None,
                     timeout=timedelta(seconds=float(query["timeout"])), master_listen_fd=fd)
    yield store, rank, world_size
    raise RuntimeError("a world launched by RPCCollector cannot rendezvous again")


def interface_env(addr: str) -> dict[str, str]:
    """``TP_SOCKET_IFNAME`` and ``GLOO_SOCKET_IFNAME`` naming the interface holding ``addr``
    (empty when none does, e.g. ``0.0.0.0``: torch then picks, as it always does)."""
    name = interface_of(addr)
    return dict.fromkeys(INTERFACE_VARIABLES, name) if name else {}


@contextlib.contextmanager
def interfaces(addr: str) -> Iterator[None]:
    """Within the block, this process's TensorPipe and Gloo listen on ``addr``'s interface."""
    wanted = interface_env(addr)
    saved = {name: os.environ.get(name) for name in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def interface_of(addr: str) -> str | None:
    """The name of the network interface that holds ``addr`` (``lo`` for loopback on Linux),
    or ``None``."""
    try:
        ip = ipaddress.ip_address(socket.getaddrinfo(addr, None)[0][4][0])
    except (OSError, ValueError):
        return None
    names = [name for _, name in socket.if_nameindex()]
    if ip.is_loopback:
        return next((name for name in names if name.startswith("lo")), None)
    if ip.version != 4 or ip.is_unspecified:
        return None
    try:
        import fcntl
    except ImportError:
        return None
    siocgifaddr = 0x8915  # Linux: an interface's IPv4 address
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for name in names:
            try:
                answer = fcntl.ioctl(probe.fileno(), siocgifaddr, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue
            if socket.inet_ntoa(answer[20:24]) == str(ip):
                return name
    return None

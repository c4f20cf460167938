"""The control channel between the engine and a worker: a Unix socket pair.

Per step only one byte travels each way, the data itself being in shared memory:

* engine -> worker: ``STEP`` (step every env with the actions in shared memory),
  ``RESET`` (reset the envs in ``reset_mask``, with ``seed`` where ``seed_set``),
  ``CLOSE`` (close the envs and exit);
* worker -> engine: ``OK``, or ``ERROR`` followed by a framed message describing the
  exception (type, message, traceback text, env index).

Setup uses framed messages both ways: a 4-byte little-endian length, then a pickle.
"""

from __future__ import annotations

import pickle
import socket
import struct
from typing import Any

STEP = b"s"
RESET = b"r"
CLOSE = b"c"
OK = b"k"
ERROR = b"e"

_LEN = struct.Struct("<I")


def frame(obj: Any) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _LEN.pack(len(data)) + data


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Read exactly ``n`` bytes from a blocking socket (``EOFError`` if it closes)."""
    chunks, left = [], n
    while left:
        chunk = sock.recv(left)
        if not chunk:
            raise EOFError("control socket closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def recv_frame(sock: socket.socket) -> Any:
    (size,) = _LEN.unpack(recv_exact(sock, _LEN.size))
    return pickle.loads(recv_exact(sock, size))


def parse_frame(buf: bytearray, start: int) -> tuple[Any, int] | None:
    """A frame starting at ``buf[start]``: ``(message, end)``, or ``None`` if incomplete."""
    if len(buf) < start + _LEN.size:
        return None
    (size,) = _LEN.unpack_from(buf, start)
    end = start + _LEN.size + size
    if len(buf) < end:
        return None
    return pickle.loads(bytes(buf[start + _LEN.size : end])), end

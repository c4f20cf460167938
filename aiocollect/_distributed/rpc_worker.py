"""An RPC worker process launched by [`RPCCollector`][aiocollect.RPCCollector].

``python -m aiocollect._distributed.rpc_worker NAME RANK WORLD_SIZE INIT_METHOD LIFELINE_FD DRIVER_PID``
joins the RPC world and serves until the driver shuts it down: the driver creates a
``RemoteCollector`` here with ``rpc.remote`` and calls it. ``INIT_METHOD`` is an
``aiocollect://`` URL (``_distributed.rpc_rendezvous``): rank 0's carries the listening
socket it serves the world's store on.

A worker never outlives its driver. The driver holds the write end of a pipe whose read end
is ``LIFELINE_FD`` here; it never writes, so the read returns end-of-file exactly when the
driver's end closes, however the driver went (``SIGKILL`` included). A watchdog thread
waits for that, and checks once a second that the driver is still its parent, then exits at
once (``os._exit``): its env workers follow by their own socket's end-of-file. (Linux's
``PR_SET_PDEATHSIG`` is not used: it fires when the *thread* that started the worker ends,
and a collector may be built from a short-lived thread.)

On a cluster started by torchrun, each worker rank runs the same two calls itself:

```python
rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world_size)
rpc.shutdown()          # serves the driver's calls until it shuts down too
```
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading

DRIVER_GONE = 3
"""The exit code of a worker whose driver died."""


def watch_driver(lifeline: int, driver: int, period: float = 1.0) -> threading.Thread:
    """Start the watchdog: ``os._exit(DRIVER_GONE)`` once ``lifeline`` reads end-of-file or
    this process's parent is no longer ``driver``."""

    def watch() -> None:
        poll = select.poll()  # (not select.select: the driver's fd number may be 1024 or more)
        poll.register(lifeline, select.POLLIN | select.POLLHUP)
        while os.getppid() == driver:
            if poll.poll(period * 1000) and not os.read(lifeline, 1):
                break
        os._exit(DRIVER_GONE)

    thread = threading.Thread(target=watch, name="aiocollect-driver-watchdog", daemon=True)
    thread.start()
    return thread


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    name, rank, world_size, init_method = argv[1], int(argv[2]), int(argv[3]), argv[4]
    watch_driver(int(argv[5]), int(argv[6]))
    import warnings

    from torch.distributed import rpc

    from .rpc_rendezvous import TRANSPORTS, register

    # torch's own deprecation notice about its internal process group, not the user's concern
    warnings.filterwarnings("ignore", message="You are using a Backend", category=UserWarning)

    register()
    options = rpc.TensorPipeRpcBackendOptions(init_method=init_method, rpc_timeout=300, _transports=TRANSPORTS)
    rpc.init_rpc(name, rank=rank, world_size=world_size, rpc_backend_options=options)
    rpc.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

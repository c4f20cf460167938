"""An RPC worker process launched by [`RPCCollector`][aiocollect.RPCCollector].

``python -m aiocollect._distributed.rpc_worker NAME RANK WORLD_SIZE INIT_METHOD`` joins the
RPC world and serves until the driver shuts it down: the driver creates a
``RemoteCollector`` here with ``rpc.remote`` and calls
it. On a cluster started by torchrun, each worker rank runs the same two calls itself:

```python
rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world_size)
rpc.shutdown()          # serves the driver's calls until it shuts down too
```
"""

from __future__ import annotations

import signal
import sys


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    name, rank, world_size, init_method = argv[1], int(argv[2]), int(argv[3]), argv[4]
    import warnings

    from torch.distributed import rpc

    # torch's own deprecation notice about its internal process group, not the user's concern
    warnings.filterwarnings("ignore", message="You are using a Backend", category=UserWarning)

    options = rpc.TensorPipeRpcBackendOptions(init_method=init_method, rpc_timeout=300)
    rpc.init_rpc(name, rank=rank, world_size=world_size, rpc_backend_options=options)
    rpc.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

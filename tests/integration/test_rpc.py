"""RPCCollector over a real torch.distributed.rpc world on loopback.

RPC can be initialised once per process, so each test runs its driver in a process of its
own (the collector's own workers are processes anyway) and checks what it prints. The driver
is forked from a warm interpreter that imported torch and aiocollect once (``support.zygote``):
a new process in which RPC was never initialised, without a fresh interpreter's 5 s of imports.
"""

from __future__ import annotations

import json
import os
import textwrap

from support import zygote

TESTS = os.path.dirname(os.path.dirname(__file__))  # tests/, where support/ is

PRELUDE = f"""
import faulthandler, json, os, signal, subprocess, sys, time
faulthandler.dump_traceback_later(90, exit=True)  # a hang shows where, before the test's timeout
sys.path.insert(0, {TESTS!r})
import torch, torch.nn as nn
from tensordict.nn import TensorDictModule
from aiocollect import RPCCollector, RemoteCollectorError, GymEnv
from support.checks import check_batch
from support.envs import IntObsEnv

def linear(value):
    m = nn.Linear(3, 1)
    with torch.no_grad():
        m.weight.fill_(value); m.bias.fill_(value)
    return TensorDictModule(m, in_keys=["observation"], out_keys=["action"])

def listening(port):
    out = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if f":{{port}} " in line]
"""


def run(body: str, timeout: float = 110) -> dict:
    proc = zygote.run(PRELUDE + textwrap.dedent(body), timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_launched_world_seed_example_weights_and_cleanup():
    out = run("""
        policy = linear(0.0)
        c = RPCCollector(create_env_fn=lambda: IntObsEnv(), policy=policy, frames_per_batch=40,
                         total_frames=400, num_collectors=2, sync=True)
        pids = [w.pid for w in c.statistics().workers]
        shapes, versions = [], []
        for i, data in enumerate(c):
            for row in data.unbind(0):
                check_batch(row)
            v = data["collector", "policy_version"].float()
            assert torch.equal(data["action"][..., 0], v * (data["observation"].sum(-1) + 1))
            shapes.append(list(data.shape)); versions.append(sorted(set(v.int().flatten().tolist())))
            with torch.no_grad():
                for p in policy.parameters():
                    p.fill_(i + 1)
            c.update_policy_weights_()
        port = c.master_port
        c.shutdown()
        deadline = time.monotonic() + 0.5  # (shutdown waited for the workers: at once, unless it did not)
        while (any(os.path.exists(f"/proc/{p}") for p in pids) or listening(port)) and time.monotonic() < deadline:
            time.sleep(0.05)
        alive = [p for p in pids if os.path.exists(f"/proc/{p}")]
        print(json.dumps({"shapes": shapes, "versions": versions, "alive": alive, "listening": listening(port)}))
    """)
    assert out["shapes"] == [[2, 20]] * 10
    assert out["versions"] == [[i] for i in range(10)]  # on-policy: each batch has the newest weights
    assert out["alive"] == [] and out["listening"] == []  # workers gone, nobody on the port


def test_async_mode_the_async_twin_and_a_dead_worker():
    out = run("""
        import asyncio
        c = RPCCollector([lambda: IntObsEnv()] * 2, linear(0.0), frames_per_batch=20, total_frames=-1, sync=False)
        async def main():
            first = await c.arollout()
            version = await c.update_policy_weights(linear(1.0), worker_ids=[0, 1])
            in_effect = c.statistics().policy_version
            later = []
            async for batch in c:
                later.append(sorted(set(batch["collector", "policy_version"].tolist())))
                if len(later) == 6:
                    break
            return first.shape[0], version, in_effect, later
        n, version, in_effect, later = asyncio.run(main())
        os.kill(c.statistics().workers[1].pid, signal.SIGKILL)
        start = time.monotonic()
        try:
            for _ in range(1000):
                c.rollout()
            error = None
        except RemoteCollectorError as exc:
            error = [exc.index, str(exc)[:200], time.monotonic() - start]
        c.shutdown()
        print(json.dumps({"n": n, "version": version, "in_effect": in_effect, "later": later, "error": error}))
    """)
    assert out["n"] == 20 and out["version"] == 1 and out["in_effect"] == 1
    assert out["later"][-1] == [1]  # collected ahead first, then only the new weights
    index, message, seconds = out["error"]
    assert index == 1 and "RPC worker aiocollect_collector1" in message and seconds < 5


def test_joins_a_world_started_elsewhere_as_torchrun_would():
    out = run("""
        import socket
        from torch.distributed import rpc
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
        init = f"tcp://127.0.0.1:{port}"
        # (TCP transport only, as RPCCollector's own worlds: TensorPipe's shared-memory one
        # busy-polls a core in every process of the world)
        worker = (
            "import sys; from torch.distributed import rpc\\n"
            "opts = rpc.TensorPipeRpcBackendOptions(init_method=sys.argv[3], _transports=['uv'])\\n"
            "rpc.init_rpc(sys.argv[1], rank=int(sys.argv[2]), world_size=3, rpc_backend_options=opts)\\n"
            "rpc.shutdown()\\n"
        )
        procs = [subprocess.Popen([sys.executable, "-c", worker, f"worker{r}", str(r), init]) for r in (1, 2)]
        options = rpc.TensorPipeRpcBackendOptions(init_method=init, _transports=["uv"])
        rpc.init_rpc("trainer", rank=0, world_size=3, rpc_backend_options=options)
        c = RPCCollector(lambda: IntObsEnv(), None, frames_per_batch=40, total_frames=120, sync=True,
                         worker_names=["worker1", "worker2"])
        shapes = [list(b.shape) for b in c]
        c.shutdown()
        still_up = rpc.api._is_current_rpc_agent_set()  # the world is the user's: still there
        rpc.shutdown()
        codes = [p.wait(30) for p in procs]
        print(json.dumps({"shapes": shapes, "still_up": still_up, "codes": codes}))
    """)
    assert out["shapes"] == [[2, 20]] * 3 and out["still_up"] and out["codes"] == [0, 0]


def test_bad_input():
    out = run("""
        errors = []
        for kwargs in ({"worker_names": ["a", "b"]}, {"num_collectors": 0}, {"sync": True, "num_collectors": 3},
                       {"collector_class": "parallel"}, {"start_timeout": None}, {"rpc_timeout": -1},
                       {"start_timeout": float("nan")}):
            try:
                RPCCollector(lambda: IntObsEnv(), None, frames_per_batch=10, **kwargs)
            except (ValueError, TypeError, RuntimeError) as exc:
                errors.append(str(exc)[:120])
        c = RPCCollector(lambda: IntObsEnv(), None, frames_per_batch=10, total_frames=10)
        list(c)
        c.shutdown()
        try:
            RPCCollector(lambda: IntObsEnv(), None, frames_per_batch=10)
        except RuntimeError as exc:
            errors.append(str(exc)[:120])
        print(json.dumps(errors))
    """)
    assert len(out) == 8
    assert "rpc.init_rpc" in out[0] and "num_collectors" in out[1] and "does not split over 3" in out[2]
    assert "collector_class" in out[3] and "cannot be initialised twice" in out[7]
    assert out[4].startswith("start_timeout=None: give a positive, finite number of seconds")
    assert out[5].startswith("rpc_timeout=-1: give") and out[6].startswith("start_timeout=nan: give")

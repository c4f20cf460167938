"""The Ray instance RayCollector starts listens on loopback only, and serves no dashboard."""

from __future__ import annotations

import ipaddress
import os

import pytest

from aiocollect import RayCollector
from support.envs import IntObsEnv

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")
pytestmark = pytest.mark.xdist_group("ray")  # one Ray instance at a time (scripts/test.sh runs pytest -n 2)


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


def test_a_local_instance_listens_on_loopback_only_without_a_dashboard(no_ray_instance):
    """GCS, raylet and workers listened on every interface (``::``) and the runtime-env
    agent on the external address; all of them are on 127.0.0.1 now. (Ray still runs its
    dashboard process headless, ``--minimal``: it serves no web UI and listens on nothing.)"""
    assert not ray.is_initialized()
    c = RayCollector(lambda: IntObsEnv(), None, frames_per_batch=20, total_frames=-1, num_collectors=1)
    try:
        c.rollout()
        node = ray._private.worker._global_node
        started = {info.process.pid for infos in node.all_processes.values() for info in infos}
        pids = {os.getpid(), *started}  # this process hosts Ray's driver, which listens too
        for pid in started:  # and the raylet's workers (the actors among them), the agents
            try:
                pids |= {p.pid for p in psutil.Process(pid).children(recursive=True)}
            except psutil.NoSuchProcess:
                pass
        sockets = [(c.laddr.ip, c.laddr.port, c.pid) for c in psutil.net_connections("inet")
                   if c.status == psutil.CONN_LISTEN and c.pid in pids]
        assert {"gcs_server", "raylet"} <= set(node.all_processes)
        dashboard = {info.process.pid for info in node.all_processes.get("dashboard", [])}
        assert [s for s in sockets if s[2] in dashboard] == []  # no web UI
        assert len(sockets) >= 3  # GCS, raylet, the actor's worker at least
        assert [s for s in sockets if not is_loopback(s[0])] == []
        assert node.node_ip_address == "127.0.0.1"
    finally:
        c.shutdown()
    assert not ray.is_initialized()

"""The local Ray instance the Ray tests share (``tests/conftest.py``'s ``ray_cluster``).

Starting a local instance costs about 7 s of CPU (GCS, raylet, dashboard and runtime-env
agents, monitors: six processes) and stopping it 1.5 s. The tests that take ``ray_cluster``
share one instance for as long as they run one after the other: it is started by the first of
them and stopped after the last of a run, before a test that takes ``no_ray_instance`` (one
about the instance ``RayCollector`` starts itself) or any test outside the ``ray`` xdist group.

Which test runs next: in a plain run, the next one collected; under ``--dist loadgroup``
(``scripts/test.sh``), the tests of one group run one after the other on one worker in the
order collected, so the next test of the group. A test that takes neither fixture, in a
module whose other tests take ``ray_cluster`` (bad input, the RPC contract), runs with the
instance idle, as it did when the instance was module-scoped; any other test (one of the
docs' pages, which start their own) has it stopped first. Under any other ``--dist`` mode
the next test is unknown: the instance is stopped after each test.
"""

from __future__ import annotations

import sys
import time

import pytest

INIT = dict(num_cpus=2, include_dashboard=False, _system_config={"worker_niceness": 0})
"""The shared instance: 2 CPUs (``test_ray.py``'s start-timeout test names them), no dashboard,
and its workers at the test process's priority, as in the instance a ``RayCollector`` starts
itself (at Ray's nice 15, the actors of the first Ray test waited 90-100 s for a core beside
the suite's other test processes; alone it takes 10 s)."""


def _groups(item: pytest.Item) -> set[str]:
    return {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}


def _wants(item: pytest.Item) -> str | None:
    """``"shared"``, ``"none"`` (``no_ray_instance``), or ``None``: the test does not care."""
    names = getattr(item, "fixturenames", ())
    if "ray_cluster" in names:
        return "shared"
    if "no_ray_instance" in names:
        return "none"
    return None


def _sharing_modules(items: list[pytest.Item]) -> set:
    """The modules with a test that takes ``ray_cluster``."""
    return {item.path for item in items if _wants(item) == "shared"}


def needed_after(item: pytest.Item) -> bool:
    """Whether the instance should stay up after ``item``: a test run next in this process
    takes ``ray_cluster``, and the tests run before it take neither fixture in a module that
    shares the instance."""
    config = item.config
    items = item.session.items
    try:
        index = items.index(item)
    except ValueError:
        return False
    in_worker = hasattr(config, "workerinput")
    if in_worker and not getattr(config.option, "loadgroup", False):
        return False  # (another --dist mode: what this worker runs next is not known)
    groups = _groups(item)
    if not groups:
        return False
    sharing = _sharing_modules(items)
    for following in items[index + 1:]:
        if _groups(following) != groups:
            if in_worker:
                continue  # run by another worker, or later: the group's tests run together
            return False
        wants = _wants(following)
        if wants is not None:
            return wants == "shared"
        if following.path not in sharing:
            return False
    return False


_started: str | None = None
"""The session directory of the instance ``ensure_up`` started, while it runs."""


def _session(ray) -> str | None:
    node = getattr(ray._private.worker, "_global_node", None)
    return getattr(node, "get_session_dir_path", lambda: None)()


def ensure_up(ray) -> None:
    """Start the shared instance, or reuse it once every CPU is free again (an actor a test
    left behind would hold its CPUs: then a new instance is started). An instance something
    else started (a ``RayCollector`` that was not shut down) is stopped first."""
    global _started
    if ray.is_initialized():
        if _started is not None and _session(ray) == _started:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                total = ray.cluster_resources().get("CPU", 0)
                if total and ray.available_resources().get("CPU", 0) >= total:
                    return
                time.sleep(0.05)
        ray.shutdown()
    ray.init(**INIT)
    _started = _session(ray)


def stop(only_shared: bool = False) -> None:
    """Stop the Ray instance of this process, if one runs: the shared one, or (unless
    ``only_shared``) any other."""
    global _started
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized() and (not only_shared or _session(ray) == _started):
        ray.shutdown()
    _started = None

"""The poison test's parts: a linear policy whose weights of version ``k`` are all ``k``, and a
trainer thread that publishes a new version as fast as it can, then poisons its own copy."""

from __future__ import annotations

import os
import threading
import time

import torch
import torch.nn as nn
from tensordict.nn import TensorDictModule

from support.checks import check_batch


def linear(value: float) -> TensorDictModule:
    """``action = value * (sum(obs) + 1)``: every weight of version ``k`` is ``k``."""
    module = nn.Linear(3, 1)
    with torch.no_grad():
        module.weight.fill_(value)
        module.bias.fill_(value)
    return TensorDictModule(module, in_keys=["observation"], out_keys=["action"])


def unpicklable_linear(value: float, driver_pid: int) -> TensorDictModule:
    """``linear(value)`` holding a lock, so it cannot be pickled: a ``policy_factory`` for
    remote collectors, which must call it there (it refuses to run in ``driver_pid``)."""
    if os.getpid() == driver_pid:
        raise RuntimeError("policy_factory was called in the driver")
    policy = linear(value)
    policy.module.lock = threading.Lock()
    return policy


def check_versions(batch) -> set[int]:
    """Each frame's action came from exactly the weights of the version it is tagged with."""
    for part in (batch.unbind(0) if batch.ndim == 3 else [batch]):  # MultiSync: [workers, envs, T]
        check_batch(part)
    version = batch["collector", "policy_version"].to(torch.float32)
    expected = version * (batch["observation"].sum(-1) + 1)
    assert torch.equal(batch["action"][..., 0], expected), "an action does not match its policy version"
    return set(batch["collector", "policy_version"].unique().tolist())


class Trainer(threading.Thread):
    """Sets its weights to ``k``, sends them as version ``k``, then poisons its own copy."""

    def __init__(self, collector):
        super().__init__(daemon=True)
        self.collector, self.policy = collector, linear(0.0)
        self.stop, self.sent, self.error = threading.Event(), 0, None

    def run(self):
        params = list(self.policy.parameters())
        try:
            while not self.stop.is_set():
                with torch.no_grad():
                    for p in params:
                        p.fill_(self.sent + 1)
                version = self.collector.update_policy_weights_(self.policy)
                assert version == self.sent + 1, (version, self.sent)
                self.sent = version
                with torch.no_grad():
                    for p in params:
                        p.fill_(-1e9)  # poison: any frame computed from it would show
                time.sleep(0.0005)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


async def versions_while_training(collector, trainer, face: str = "sync") -> set[int]:
    """Collect every batch of ``collector`` through ``face`` (``"sync"``: ``for``, ``"async"``:
    ``async for``) while ``trainer`` (a ``Trainer`` thread, started here) publishes; each batch
    passes ``check_versions``. Returns the versions seen; asserts the trainer raised nothing,
    enough versions were seen to test anything, and no batch carries an unsent version."""
    seen: set[int] = set()
    with collector:
        trainer.start()
        try:
            if face == "sync":
                for batch in collector:
                    seen |= check_versions(batch)
            else:
                async for batch in collector:
                    seen |= check_versions(batch)
        finally:
            trainer.stop.set()
            trainer.join()
    assert trainer.error is None, trainer.error
    assert len(seen) >= 3, f"too few versions collected to test anything: {seen}"
    assert max(seen) <= trainer.sent
    return seen


def jax_linear_apply(params, obs):
    """``linear``'s policy as a ``JaxPolicy`` function: ``action = params["v"] * (sum(obs) + 1)``."""
    return (params["v"] * (obs.sum(-1) + 1))[:, None]

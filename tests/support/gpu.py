"""Parts the GPU tests share (``tests/gpu``): a deterministic argmax policy and its CPU check, and
the ``torch.compile`` backend this machine can build."""

from __future__ import annotations

import shutil
import sysconfig
from pathlib import Path

import torch
import torch.nn as nn
from tensordict.nn import TensorDictModule

from support.checks import check_batch


class Argmax(nn.Module):
    """The same weights every time it is built: ``argmax(W obs / 1000 + b)`` over 3 actions."""

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(3, 3)
        with torch.no_grad():
            self.net.weight.copy_(torch.tensor([[1.0, 0.5, -1.0], [-1.0, 1.0, 0.5], [0.5, -1.0, 1.0]]))
            # biases with no round differences: the logits of CounterEnv's integer observations
            # then differ by at least 1e-4, so no rounding (CPU, GPU, any summation order) flips a pick
            self.net.bias.copy_(torch.tensor([0.1234, 0.0371, -0.0913]))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs / 1000).argmax(-1)


def argmax_policy() -> TensorDictModule:
    return TensorDictModule(Argmax(), in_keys=["observation"], out_keys=["action"])


def acts_as_the_cpu_policy(batch) -> None:
    """Every valid frame's action is what ``Argmax`` on the CPU picks for its observation."""
    host = batch.cpu()
    for part in host.unbind(0) if host.ndim == 3 else [host]:  # (MultiSync: [workers, envs, time])
        check_batch(part)
    valid = host["collector", "policy_version"] >= 0
    expected = Argmax()(host["observation"])
    assert torch.equal(host["action"][valid], expected[valid])


def compile_backend() -> str:
    """``inductor`` (the default) where it can build its GPU kernels' launchers, which needs a C
    compiler and Python's headers; else ``aot_eager``, which still traces and compiles the graph
    (a bare machine may lack both: this test is about aiocollect, not the toolchain)."""
    headers = Path(sysconfig.get_paths()["include"], "Python.h")
    if (shutil.which("cc") or shutil.which("gcc")) and headers.exists():
        return "inductor"
    print(f"no C compiler or no {headers}: torch.compile(backend='aot_eager')")
    return "aot_eager"

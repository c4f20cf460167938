"""``cudagraph_policy``: a policy's calls on the GPU captured in CUDA graphs, one per row count,
and replayed (``aiocollect/_policies/graphs.py``), in every local variant.

A replay must act as the eager policy does (the argmax policy, frame by frame), with the
newest weights (the poison test), drawing new random numbers each time (a sampling policy),
and a call that cannot be captured must fail the collection with an error that says why,
never act wrongly.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading

import pytest
import torch
import torch.nn as nn
from tensordict.nn import TensorDictModule, TensorDictSequential

from aiocollect import Collector, MultiAsyncCollector
from aiocollect._policies import graphs as graphs_module
from support.envs import CounterEnv, IntObsEnv
from support.gpu import Argmax, acts_as_the_cpu_policy, argmax_policy, compile_backend
from support.weights import Trainer, linear, versions_while_training


def graphs_of(collector):
    return collector._policy.runner.graphs


def test_replays_act_as_the_cpu_policy(variant):
    with variant(CounterEnv, argmax_policy(), frames_per_batch=variant.num_envs * 10, total_frames=-1,
                 policy_device="cuda", cudagraph_policy=True) as collector:
        batches = [collector.rollout() for _ in range(3)]
        graphs = graphs_of(collector)
        assert graphs.graphs, "nothing was captured"
    for batch in batches:
        acts_as_the_cpu_policy(batch)
    assert graphs.replays > 0


def test_a_tensordict_policy_and_a_plain_callable_are_captured_too():
    seq = TensorDictSequential(TensorDictModule(Argmax(), in_keys=["observation"], out_keys=["action"]))
    plain = Argmax()
    for policy in (seq, plain):
        with Collector([CounterEnv] * 4, policy, frames_per_batch=40, total_frames=-1, policy_device="cuda",
                       cudagraph_policy={"warmup": 1}) as collector:
            batches = [collector.rollout() for _ in range(2)]
            graphs = graphs_of(collector)
            assert list(graphs.graphs) == [4]
            # captured in the constructor: the 20 calls of the two rollouts are replays
            assert graphs.replays == 20, graphs.replays
        for batch in batches:
            acts_as_the_cpu_policy(batch)


async def test_weights_reach_the_replays_and_versions_stay_exact(variant):
    collector = variant(IntObsEnv, linear(0.0), frames_per_batch=40, total_frames=40 * 30, policy_device="cuda",
                        cudagraph_policy=True)
    await versions_while_training(collector, Trainer(collector))
    assert graphs_of(collector).graphs


async def test_weights_loaded_into_a_shared_cuda_module_reach_the_replays():
    """``Collector`` acts with the user's CUDA module itself: the graph reads its parameters,
    and each published version, loaded into them in place, reaches the next replay."""
    policy = linear(0.0).cuda()
    collector = Collector([IntObsEnv] * 4, policy, frames_per_batch=40, total_frames=40 * 30, cudagraph_policy=True)
    await versions_while_training(collector, Trainer(collector))
    assert graphs_of(collector).graphs


class GumbelPick(nn.Module):
    """Samples one of 3 actions uniformly, in kernels alone (the Gumbel-max trick)."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(obs.shape[0], 3, device=obs.device)
        u = torch.rand_like(logits).clamp_(1e-9, 1.0)
        return (logits - torch.log(-torch.log(u))).argmax(-1)


def test_a_sampling_policy_draws_anew_at_each_replay():
    with Collector([CounterEnv] * 8, GumbelPick(), frames_per_batch=8 * 250, total_frames=-1,
                   policy_device="cuda", cudagraph_policy=True) as collector:
        collector.set_seed(0)
        batch = collector.rollout()
        assert graphs_of(collector).graphs
    actions = batch["action"].cpu()
    later = actions[:, 10:]
    counts = torch.bincount(later.flatten(), minlength=3).float() / later.numel()
    assert ((counts > 0.28) & (counts < 0.39)).all(), counts
    # consecutive replays differ (a replay that drew the same numbers would repeat rows)
    assert (later[:, 1:] != later[:, :-1]).float().mean() > 0.5


FAILING_CAPTURE = """
import sys
import torch, torch.nn as nn
from tensordict.nn import TensorDictModule
from aiocollect import Collector, MultiSyncCollector
from support.envs import CounterEnv
from support.gpu import Argmax

class HostReading(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Argmax()

    def forward(self, obs):
        if obs.sum().item() < 0:  # a value read on the host: cannot be captured
            raise AssertionError("unreachable")
        return self.inner(obs)

cls = {"Collector": Collector, "MultiSyncCollector": MultiSyncCollector}[sys.argv[1]]
envs = [CounterEnv] * 4 if cls is Collector else [[CounterEnv] * 2] * 2
policy = TensorDictModule(HostReading(), in_keys=["observation"], out_keys=["action"])
try:  # (the row counts are captured in the constructor)
    with cls(envs, policy, frames_per_batch=40, total_frames=-1, policy_device="cuda", cudagraph_policy=True) as c:
        for _ in range(3):
            c.rollout()
except RuntimeError as exc:
    print("ERROR:", str(exc).replace(chr(10), " "))
    print("CAUSE:", type(exc.__cause__).__name__, flush=True)
"""


@pytest.mark.parametrize("name", ["Collector", "MultiSyncCollector"])
def test_a_call_that_cannot_be_captured_fails_the_collection_saying_why(name):
    """In a fresh interpreter: in torch releases without pytorch#180395 a failed capture leaves
    torch's allocator believing a capture is under way, which would leak into the tests that follow (and may
    make that interpreter's exit fail: its exit status is torch's, not checked here)."""
    proc = subprocess.run([sys.executable, "-c", FAILING_CAPTURE, name], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    print(f"exit status {proc.returncode}")
    assert re.search(r"ERROR: cudagraph_policy: the policy's call over \d+ envs cannot be captured in a CUDA "
                     r"graph \(.+\)\. A captured call may not read values on the host .* Make the policy "
                     r"capturable, or remove cudagraph_policy\.", proc.stdout), proc.stdout + proc.stderr[-3000:]
    assert "CAUSE: " in proc.stdout and "CAUSE: NoneType" not in proc.stdout


class CountingPolicy(nn.Module):
    """``Argmax``'s action, and the number of calls so far as a host tensor: a graph would give
    back the count of its capture at every replay, so its capture is refused."""

    def __init__(self):
        super().__init__()
        self.inner, self.calls = Argmax(), 0

    def forward(self, obs: torch.Tensor):
        self.calls += 1
        return self.inner(obs), torch.full((obs.shape[0],), self.calls)


def test_outputs_off_the_gpu_are_refused_for_capture():
    policy = TensorDictModule(CountingPolicy(), in_keys=["observation"], out_keys=["action", "calls"])
    with pytest.raises(RuntimeError, match=r"cannot be captured in a CUDA graph \(TypeError: outputs "
                                           r"\['calls'\] are not tensors on cuda:\d\b"):
        Collector([CounterEnv] * 4, policy, frames_per_batch=40, total_frames=-1, policy_device="cuda",
                  cudagraph_policy=True)  # (captured in the constructor: refused there)


def test_every_row_count_is_captured_in_the_constructor(variant):
    """The counts a round can have are captured before collection (a failure shows at once,
    and no capture runs while a trainer thread works): collecting only replays them."""
    with variant(CounterEnv, argmax_policy(), frames_per_batch=variant.num_envs * 10, total_frames=-1,
                 policy_device="cuda", cudagraph_policy=True) as collector:
        graphs = graphs_of(collector)
        captured = dict(graphs.graphs)
        assert captured and graphs.replays == 0
        batches = [collector.rollout() for _ in range(2)]
        assert set(captured) <= set(graphs.graphs) and graphs.replays > 0
    for batch in batches:
        acts_as_the_cpu_policy(batch)


class ReassigningBuffer(nn.Module):
    """``Argmax``, counting its calls in a buffer it replaces (not updates in place) each call."""

    def __init__(self):
        super().__init__()
        self.inner = Argmax()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        self.calls = self.calls + 1
        return self.inner(obs)


def test_a_call_that_replaces_the_modules_tensors_is_refused_for_capture():
    policy = TensorDictModule(ReassigningBuffer(), in_keys=["observation"], out_keys=["action"])
    with pytest.raises(RuntimeError, match=r"cannot be captured in a CUDA graph \(TypeError: the call replaced "
                                           r"parameters or buffers of the module"):
        Collector([CounterEnv] * 4, policy, frames_per_batch=40, total_frames=-1, policy_device="cuda",
                  cudagraph_policy=True)


def test_a_shared_module_whose_tensors_are_swapped_is_captured_again():
    """``Collector`` acting with the user's module: tensors replaced rather than written in
    place (here by assignment) are found before the next replay, and captured again."""
    policy = linear(1.0).cuda()
    with Collector([IntObsEnv] * 4, policy, frames_per_batch=40, total_frames=-1, cudagraph_policy=True) as c:
        c.rollout()
        assert graphs_of(c).graphs
        module = policy.module
        module.weight = nn.Parameter(torch.full_like(module.weight, 2.0))
        module.bias = nn.Parameter(torch.full_like(module.bias, 2.0))
        batch = c.rollout().cpu()
        assert graphs_of(c).graphs and graphs_of(c).replays > 0
    assert torch.equal(batch["action"][..., 0], 2.0 * (batch["observation"].sum(-1) + 1))


def test_rounds_of_several_sizes_get_a_graph_each_up_to_the_bound(monkeypatch):
    """MultiAsync's rounds cover the ready workers' envs: workers of 1, 2 and 4 envs give
    counts 1-7; with the bound at 2 graphs, the other counts run eagerly, still right."""
    monkeypatch.setattr(graphs_module, "MAX_GRAPHS", 2)
    with MultiAsyncCollector([[CounterEnv], [CounterEnv] * 2, [CounterEnv] * 4], argmax_policy(),
                             frames_per_batch=40, total_frames=-1, policy_device="cuda",
                             cudagraph_policy={"warmup": 1}) as collector:
        batches = [collector.rollout() for _ in range(12)]
        assert len(graphs_of(collector).graphs) == 2
    for batch in batches:
        acts_as_the_cpu_policy(batch)


def test_a_trainer_busy_on_the_gpu_during_captures_breaks_nothing(variant):
    """Captures run in ``thread_local`` mode: a trainer's allocations and synchronisations in
    another thread during a capture neither fail it nor fail themselves."""
    stop, errors = threading.Event(), []

    def train() -> None:
        # (a generator of its own: before pytorch#176752, a draw from the default CUDA generator
        # during another thread's capture fails, as docs/gpu.md says)
        generator = torch.Generator(device="cuda")
        try:
            while not stop.is_set():
                x = torch.randn(256, 256, device="cuda", generator=generator)
                (x @ x).sum().item()  # allocates, launches, synchronises
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    try:
        with variant(CounterEnv, argmax_policy(), frames_per_batch=variant.num_envs * 10, total_frames=-1,
                     policy_device="cuda", cudagraph_policy=True) as collector:
            batches = [collector.rollout() for _ in range(3)]
            assert graphs_of(collector).graphs
    finally:
        stop.set()
        thread.join()
    assert not errors, errors
    for batch in batches:
        acts_as_the_cpu_policy(batch)


def test_a_compiled_module_is_captured_after_its_warmup():
    module = torch.compile(Argmax(), backend=compile_backend())
    policy = TensorDictModule(module, in_keys=["observation"], out_keys=["action"])
    with Collector([CounterEnv] * 4, policy, frames_per_batch=40, total_frames=-1, device="cuda",
                   cudagraph_policy={"warmup": 3}) as collector:
        batches = [collector.rollout() for _ in range(3)]
        assert graphs_of(collector).graphs
    for batch in batches:
        acts_as_the_cpu_policy(batch)


def test_a_device_other_than_the_policys_is_refused():  # (a CPU policy is warned about before the check)
    with pytest.raises(ValueError, match=r"cudagraph_policy: device='cpu', but the policy runs on cuda"):
        Collector([CounterEnv] * 2, argmax_policy(), frames_per_batch=20, policy_device="cuda",
                  cudagraph_policy={"device": "cpu"})

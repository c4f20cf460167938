"""TorchRL 0.14's collector keywords (issue 18 items 2 and 6): every one is taken by the
aiocollect class of the same name at the value TorchRL gives it by default; the implemented
ones work (``num_collectors``/``sync``, ``num_workers``, ``policy_factory``, ``cudagraph_policy``,
``compile_policy``); any other value is an error that says what to do."""

from __future__ import annotations

import functools
import importlib.util
import inspect
import os

import pytest
import torch
from tensordict.nn import TensorDictModule

import aiocollect
from aiocollect._collectors.torchrl_compat import _KEYWORDS, DISTRIBUTED_KEYWORDS, check_torchrl_keywords
from support.envs import CounterEnv
from support.weights import unpicklable_linear

torchrl_collectors = pytest.importorskip("torchrl.collectors")

CLASSES = ["Collector", "MultiSyncCollector", "MultiAsyncCollector", "AsyncCollector"]


def torchrl_only_defaults(name: str) -> dict:
    """TorchRL's keywords of class ``name`` that aiocollect's signature does not name, at
    TorchRL's defaults."""
    theirs = inspect.signature(getattr(torchrl_collectors, name).__init__).parameters
    ours = inspect.signature(getattr(aiocollect, name).__init__).parameters
    return {k: p.default for k, p in theirs.items()
            if k not in ours and p.default is not p.empty and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}


@pytest.mark.parametrize("name", CLASSES)
def test_every_torchrl_keyword_is_taken_at_its_default(name):
    extra = torchrl_only_defaults(name)
    if name == "Collector":
        assert {"compile_policy", "num_collectors", "trajs_per_batch", "weight_sync_schemes"} <= (
            set(extra) | set(inspect.signature(aiocollect.Collector.__init__).parameters))
    env = CounterEnv if name in ("Collector", "AsyncCollector") else [CounterEnv, CounterEnv]
    with getattr(aiocollect, name)(env, None, frames_per_batch=20, total_frames=40, **extra) as collector:
        assert sum(b.numel() for b in collector) == 40


@pytest.mark.parametrize("keyword", sorted(_KEYWORDS))
def test_a_value_aiocollect_cannot_honour_is_an_error_saying_what_to_do(keyword):
    with pytest.raises(ValueError, match=rf"^{keyword}=.*\(TorchRL's keyword is taken at "):
        check_torchrl_keywords("Collector", {keyword: "something else"})


def test_a_keyword_torchrl_does_not_have_is_a_type_error_with_the_nearest_name():
    with pytest.raises(TypeError, match=r"Collector\(\) got an unexpected keyword argument 'total_frame'; "
                                        r"did you mean 'total_frames'\?"):
        aiocollect.Collector(CounterEnv, None, frames_per_batch=20, total_frame=40)


@pytest.mark.parametrize(("sync", "cls"), [(True, aiocollect.MultiSyncCollector),
                                           (False, aiocollect.MultiAsyncCollector),
                                           (None, aiocollect.MultiAsyncCollector)])
def test_num_collectors_builds_the_worker_collector_torchrl_does(sync, cls):
    with aiocollect.Collector(CounterEnv, None, num_collectors=2, sync=sync, frames_per_batch=20,
                              total_frames=40) as collector:
        assert type(collector) is cls and collector.num_workers == 2
        assert sum(b.numel() for b in collector) == 40
    with pytest.raises(ValueError, match="sync: it chooses between the worker collectors"):
        aiocollect.Collector(CounterEnv, None, sync=True, frames_per_batch=20)
    with pytest.raises(ValueError, match="num_collectors=3 but create_env_fn has 2 entries"):
        aiocollect.Collector([CounterEnv] * 2, None, num_collectors=3, frames_per_batch=20)


@pytest.mark.parametrize("sync", [True, False])
def test_num_collectors_takes_step_ahead_false_and_refuses_true(sync):
    """``step_ahead`` is a ``Collector``'s own (coroutine envs): ``False`` is left out of the
    worker collector built, ``True`` refused, naming the argument."""
    with aiocollect.Collector(CounterEnv, None, num_collectors=2, sync=sync, frames_per_batch=20,
                              total_frames=40, step_ahead=False) as collector:
        assert collector.num_workers == 2
        assert sum(b.numel() for b in collector) == 40
    with pytest.raises(ValueError, match=r"step_ahead=True with num_collectors=2.*coroutine envs"):
        aiocollect.Collector(CounterEnv, None, num_collectors=2, sync=sync, frames_per_batch=20, step_ahead=True)
    with pytest.raises(TypeError, match="step_ahead must be True or False"):
        aiocollect.Collector(CounterEnv, None, num_collectors=2, sync=sync, frames_per_batch=20, step_ahead=1)


def test_num_workers_repeats_a_single_factory():
    with aiocollect.MultiSyncCollector(CounterEnv, None, num_workers=2, frames_per_batch=20) as collector:
        assert collector.num_workers == 2 and collector.rollout().shape == (2, 10)


def test_policy_factory_builds_the_policy():
    built = []

    def factory():
        built.append(TensorDictModule(torch.nn.Linear(3, 3), in_keys=["observation"], out_keys=["logits"]))
        return TensorDictModule(lambda obs: obs[..., 0].long() % 3, in_keys=["observation"], out_keys=["action"])

    with aiocollect.Collector(CounterEnv, policy_factory=factory, frames_per_batch=20) as collector:
        batch = collector.rollout()
    assert len(built) == 1 and torch.equal(batch["action"], batch["observation"][..., 0].long() % 3)
    with pytest.raises(ValueError, match="policy and policy_factory: give one of them"):
        aiocollect.Collector(CounterEnv, lambda obs: obs, policy_factory=factory, frames_per_batch=20)


@pytest.mark.parametrize("name", ["Collector", "MultiSyncCollector"])
def test_compile_policy_compiles_the_network_and_the_weights_still_update(name):
    net = torch.nn.Linear(3, 3)
    policy = TensorDictModule(torch.nn.Sequential(net, _ArgMax()), in_keys=["observation"], out_keys=["action"])
    env = CounterEnv if name == "Collector" else [CounterEnv, CounterEnv]
    # (the "eager" backend: torch.compile's whole path, without minutes of code generation on CI)
    with getattr(aiocollect, name)(env, policy, frames_per_batch=20, compile_policy={"backend": "eager"}) as c:
        assert isinstance(c.policy.module, torch._dynamo.eval_frame.OptimizedModule)
        assert type(policy.module) is torch.nn.Sequential  # the user's object is left as it was
        c.rollout()
        with torch.no_grad():
            net.weight.zero_()
            net.bias.copy_(torch.tensor([0.0, 0.0, 1.0]))
        c.update_policy_weights_(policy)
        later = c.rollout()
    assert (later["action"][later["collector", "policy_version"] == 1] == 2).all()
    assert (later["collector", "policy_version"] == 1).any()


class _ArgMax(torch.nn.Module):
    def forward(self, x):
        return x.argmax(-1)


@pytest.mark.parametrize("name", ["RayCollector", "RPCCollector"])
def test_the_distributed_collectors_take_every_torchrl_keyword_at_its_default(name):
    distributed = pytest.importorskip("torchrl.collectors.distributed")
    theirs = inspect.signature(getattr(distributed, name).__init__).parameters
    ours = inspect.signature(getattr(aiocollect, name).__init__).parameters
    extra = {k: p.default for k, p in theirs.items() if k not in ours and p.default is not p.empty
             and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    # RPCCollector's default launcher is SLURM's there; here the workers are local processes
    assert extra.pop("launcher", "mp") == ("submitit" if name == "RPCCollector" else "mp")
    check_torchrl_keywords(name, extra, DISTRIBUTED_KEYWORDS)  # raises if one is not taken
    with pytest.raises(ValueError, match=r"^launcher='submitit': RPCCollector starts its workers as local"):
        check_torchrl_keywords(name, {"launcher": "submitit"}, DISTRIBUTED_KEYWORDS)


def test_the_distributed_collectors_check_torchrl_keywords_before_starting_anything():
    with pytest.raises(ValueError, match=r"^slurm_kwargs=.*SLURM submission is not supported"):
        aiocollect.RPCCollector(CounterEnv, None, frames_per_batch=20, slurm_kwargs={"timeout": 10})
    with pytest.raises(ValueError, match="tcp_port=1234 and master_port=1235: they name the same port"):
        aiocollect.RPCCollector(CounterEnv, None, frames_per_batch=20, tcp_port=1234, master_port=1235)
    with pytest.raises(ValueError, match=r"^max_weight_update_interval=5: "):
        aiocollect.RayCollector(CounterEnv, None, frames_per_batch=20, max_weight_update_interval=5)
    with pytest.raises(ValueError, match="policy and policy_factory: give one of them"):
        aiocollect.RayCollector(CounterEnv, lambda obs: obs, frames_per_batch=20, policy_factory=lambda: None)
    with pytest.raises(TypeError, match="argument 'trajs_per_batchh'; did you mean 'trajs_per_batch'"):
        aiocollect.RayCollector(CounterEnv, None, frames_per_batch=20, trajs_per_batchh=2)
    # policy_factory is called in each remote collector: never here, and there is no policy here to send
    factory = functools.partial(unpicklable_linear, 0.0, os.getpid())
    with pytest.raises(ValueError, match=r"update_after_each_batch=True sends this process's policy weights"):
        aiocollect.RayCollector(CounterEnv, frames_per_batch=20, policy_factory=factory, update_after_each_batch=True)
    with pytest.raises(ValueError, match=r"policy_factory: a list of 3 entries for 2 remote collectors"):
        aiocollect.RPCCollector(CounterEnv, frames_per_batch=20, num_collectors=2, policy_factory=[factory] * 3)
    with pytest.raises(TypeError, match=r"policy_factory must be a callable .* one per remote collector"):
        aiocollect.RayCollector(CounterEnv, frames_per_batch=20, policy_factory=[factory, "not callable"])


def test_a_list_of_policy_factories_is_one_policy_if_they_are_one_factory_and_refused_otherwise():
    """TorchRL's per-worker factories: here one policy runs for every worker's envs, so
    ``[factory] * num_workers`` (as TorchRL's scripts write it) builds it once, and different
    factories are refused (issue 51)."""
    for cls in (aiocollect.Collector, aiocollect.MultiSyncCollector, aiocollect.MultiAsyncCollector):
        with pytest.raises(TypeError, match=r"a list of 2 different factories .* the same one for every worker"):
            cls([CounterEnv] * 2, policy_factory=[lambda: None, lambda: None], frames_per_batch=20)
    calls = []

    def factory():
        calls.append(1)
        return None  # (random actions)

    with aiocollect.MultiSyncCollector([CounterEnv] * 2, policy_factory=[factory] * 2, frames_per_batch=20,
                                       total_frames=20) as collector:
        batch = next(iter(collector))
    assert len(calls) == 1 and batch.batch_size == (2, 10)


def test_torchrl_weight_sync_schemes_are_taken_and_other_values_refused():
    from torchrl.weight_update import MultiProcessWeightSyncScheme, SharedMemWeightSyncScheme

    check_torchrl_keywords("MultiSyncCollector", {"weight_sync_schemes": {"policy": SharedMemWeightSyncScheme()}})
    check_torchrl_keywords("Collector", {"weight_sync_schemes": MultiProcessWeightSyncScheme()})
    check_torchrl_keywords("Collector", {"weight_sync_schemes": {}})
    for bad in ({"policy": object()}, {"policy.transform": SharedMemWeightSyncScheme()}, "shared_mem"):
        with pytest.raises(ValueError, match=r"^weight_sync_schemes=.*a TorchRL weight-sync scheme for the policy"):
            check_torchrl_keywords("Collector", {"weight_sync_schemes": bad})


class _MarkedCounter(CounterEnv):
    """A ``CounterEnv`` that leaves a file behind when built: proof that an env was made."""

    def __init__(self, marker: str):
        super().__init__()
        with open(marker, "w"):
            pass


@pytest.mark.parametrize("name", CLASSES)
def test_cudagraph_policy_of_a_cpu_policy_warns_and_collects_as_without(name):
    """TorchRL's ``CudaGraphModule`` passes calls through where there is no CUDA device; so
    does this, saying so. (What it does on a GPU: ``tests/gpu/test_cuda_graphs.py``.)"""
    from support.gpu import acts_as_the_cpu_policy, argmax_policy

    env = CounterEnv if name in ("Collector", "AsyncCollector") else [CounterEnv, CounterEnv]
    with pytest.warns(UserWarning, match=r"^cudagraph_policy: the policy runs on the CPU, and CUDA graphs need "
                                         r"a CUDA device \(policy_device='cuda', or a module on the GPU\)"):
        collector = getattr(aiocollect, name)(env, argmax_policy(), frames_per_batch=20, total_frames=40,
                                              cudagraph_policy={"warmup": 3})
    with collector:
        assert collector._policy.runner.graphs is None
        batches = list(collector)
    assert sum(b.numel() for b in batches) == 40
    for batch in batches:
        acts_as_the_cpu_policy(batch)


@pytest.mark.parametrize("name", CLASSES)
def test_cudagraph_policy_refuses_what_it_cannot_capture_before_any_env_is_built(name, tmp_path):
    marker = str(tmp_path / "built")
    factory = functools.partial(_MarkedCounter, marker)
    env = factory if name in ("Collector", "AsyncCollector") else [factory, factory]
    cls = getattr(aiocollect, name)
    from support.gpu import argmax_policy

    cases = [
        (None, True, ValueError, r"^cudagraph_policy: the policy draws random actions .* remove cudagraph_policy"),
        (argmax_policy(), "yes", TypeError, r"^cudagraph_policy must be True, False, None or a dict"),
        (argmax_policy(), {"warmup": 0}, ValueError, r"^cudagraph_policy: warmup=0; give the number of eager calls"),
        (argmax_policy(), {"warmup": True}, ValueError, r"^cudagraph_policy: warmup=True"),
        (argmax_policy(), {"in_keys": ["observation"], "out_keys": ["action"]}, ValueError,
         r"^cudagraph_policy: \['in_keys', 'out_keys'\] are not taken here"),
    ]
    if importlib.util.find_spec("jax") is not None:
        from aiocollect.jax import JaxPolicy

        cases.append((JaxPolicy(lambda params, obs: obs.argmax(-1), {}), True, ValueError,
                      r"^cudagraph_policy: a JaxPolicy is compiled by its own framework"))
    for policy, value, error, message in cases:
        with pytest.raises(error, match=message):
            cls(env, policy, frames_per_batch=20, cudagraph_policy=value)
    # a torch.compile mode that captures CUDA graphs itself: a graph cannot be captured inside another
    for compile_policy in ({"mode": "reduce-overhead"}, {"options": {"triton.cudagraphs": True}}):
        with pytest.raises(ValueError, match=r"^cudagraph_policy and compile_policy=.*captures CUDA graphs itself"):
            cls(env, argmax_policy(), frames_per_batch=20, cudagraph_policy=True, compile_policy=compile_policy)
    assert not os.path.exists(marker), "an env was built before the error"


def test_cudagraph_policy_passes_to_the_remote_collectors_through_collector_kwargs():
    with pytest.raises(ValueError, match=r"^cudagraph_policy=True: the policies run in the remote collectors: pass "
                                         r"it to them, collector_kwargs=\{'cudagraph_policy': True\}"):
        aiocollect.RayCollector(CounterEnv, None, frames_per_batch=20, cudagraph_policy=True)
    check_torchrl_keywords("RPCCollector", {"cudagraph_policy": False}, DISTRIBUTED_KEYWORDS)

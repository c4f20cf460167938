"""``_policies.direct_calls``: a worker's private copy of the policy calls each submodule's
``forward`` directly, with the same results, and keeps the standard call wherever a hook,
an own ``__call__`` or an instance ``forward`` could make a difference."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from aiocollect._policies.direct_calls import _classes, direct_calls


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))

    def forward(self, obs):
        return self.net(obs).argmax(-1)


class Counting(torch.nn.Module):
    """Python state changed at every call, and a numpy draw: what tracing would bake in."""

    def __init__(self):
        super().__init__()
        self.calls = 0
        self.rng = np.random.default_rng(0)

    def forward(self, obs):
        self.calls += 1
        return obs * self.calls + float(self.rng.random())


def _is_direct(module: torch.nn.Module) -> bool:
    return type(module) in _classes.values()


def test_same_outputs_and_types_every_submodule_direct():
    policy = MLP()
    reference = copy.deepcopy(policy)
    changed = direct_calls(policy)
    assert changed == 5  # MLP, Sequential, Linear, Tanh, Linear
    assert all(_is_direct(m) for m in policy.modules())
    assert isinstance(policy.net[0], torch.nn.Linear) and type(policy.net[0]).__name__ == "Linear"
    for _ in range(3):
        obs = torch.randn(16, 4)
        assert torch.equal(policy(obs), reference(obs))
    # the weights are the module's own: loading a state dict in place reaches the calls
    new = MLP()
    with torch.no_grad():
        for dst, src in zip(policy.state_dict().values(), new.state_dict().values()):
            dst.copy_(src)
    obs = torch.randn(32, 4)
    assert torch.equal(policy(obs), new(obs))
    assert direct_calls(policy) == 0  # twice changes nothing more


def test_forward_runs_whole_at_every_call():
    policy, reference = Counting(), Counting()
    direct_calls(policy)
    obs = torch.ones(3)
    for _ in range(4):
        assert torch.equal(policy(obs), reference(obs))
    assert policy.calls == 4


def test_hooks_keep_the_standard_call():
    policy = MLP()
    seen = []
    policy.net[0].register_forward_hook(lambda mod, args, out: seen.append(out.shape[0]))
    policy.net[2].register_forward_pre_hook(lambda mod, args: (args[0] * 0,))
    direct_calls(policy)
    assert not _is_direct(policy.net[0]) and not _is_direct(policy.net[2])
    assert _is_direct(policy) and _is_direct(policy.net[1])
    out = policy.net(torch.randn(5, 4))
    assert seen == [5]
    assert torch.equal(out, policy.net[2].bias.expand(5, 2))  # the pre-hook zeroed its input


def test_global_hooks_change_nothing():
    handle = torch.nn.modules.module.register_module_forward_hook(lambda mod, args, out: None)
    try:
        policy = MLP()
        assert direct_calls(policy) == 0
        assert not any(_is_direct(m) for m in policy.modules())
    finally:
        handle.remove()


def test_own_call_instance_forward_and_compiled_are_kept():
    class OwnCall(torch.nn.Linear):
        def __call__(self, x):
            return super().__call__(x) + 1

    policy = torch.nn.Sequential(OwnCall(4, 4), torch.nn.Linear(4, 4), torch.nn.ReLU())
    policy[1].forward = lambda x: x * 2  # an instance forward: __call__ uses it, so must we
    policy[2].compile()
    direct_calls(policy)
    assert not _is_direct(policy[0]) and not _is_direct(policy[1]) and not _is_direct(policy[2])
    assert _is_direct(policy)
    x = torch.ones(1, 4)
    expected = torch.relu(2 * (torch.nn.functional.linear(x, policy[0].weight, policy[0].bias) + 1))
    assert torch.allclose(policy(x), expected)


@pytest.mark.parametrize("thing", [lambda x: x, "not a module", None])
def test_anything_else_is_left_alone(thing):
    assert direct_calls(thing) == 0


def test_tensordict_modules_keep_their_class_their_modules_do_not():
    from tensordict import TensorDict
    from tensordict.nn import TensorDictModule

    from aiocollect._policies.runner import PolicyRunner

    policy = TensorDictModule(MLP(), in_keys=["observation"], out_keys=["action"])
    reference = copy.deepcopy(policy)
    direct_calls(policy)
    assert type(policy) is TensorDictModule  # the runner's fast path still recognises it
    assert PolicyRunner(policy, ["observation"], device=None, exploration_type=None).kind == "module"
    assert all(_is_direct(m) for m in policy.module.modules())
    td = TensorDict({"observation": torch.randn(7, 4)}, [7])
    assert torch.equal(policy(td.clone())["action"], reference(td.clone())["action"])

"""TorchRL's weight-synchronisation example (examples/collectors/weight_sync_collectors.py), in
its shape: the example's CartPole policy (``TensorDictModule(nn.Linear(obs, actions),
out_keys=["action"])``, whose float outputs TorchRL's ``OneHot`` spec turns into an action with
``.long().argmax(-1)``); a single ``Collector`` whose weights are pushed with
``update_policy_weights_``; then ``Collector(num_collectors=1, sync=True)``, a worker process,
with a ``SharedMemWeightSyncScheme(strategy="tensordict")`` fed ``TensorDict.from_module(policy)``;
under ``if __name__ == "__main__"`` with the "spawn" start method, as the example runs.

Changes a user makes on TorchRL 0.14.1: the example's single collector takes a
``MultiProcessWeightSyncScheme(strategy="state_dict")`` and ``policy.state_dict()``, which 0.14.1
refuses ("Either params_map, model_id + context or model/weights + devices must be provided",
then "'collections.OrderedDict' object has no attribute 'data'"): it gets no scheme and
``TensorDict.from_module(policy)``. The example has 3 workers; 1 here, as TorchRL's spawned
workers take seconds each to start and to stop (the CI budget).

Where the example pushes the same weights back, here the policy is trained between batches
(imitation of the classic controller "push right when 3 * angle + angular velocity > 0") and
the trained weights are pushed: collection must then follow them. It learned when, in both
collectors, every batch after the push ends episodes at most half as often as the batch before
it. Calibrated on TorchRL's collectors over torch seeds 0-4: 60-107 episodes per 1000 frames
before the push, 5-25 after; the highest after/before ratio was 0.33.
"""

import json

import torch
import torch.nn as nn
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torchrl.collectors import Collector
from torchrl.envs import GymEnv
from torchrl.weight_update import SharedMemWeightSyncScheme


def make_policy(env):
    return TensorDictModule(
        nn.Linear(env.observation_spec["observation"].shape[-1], env.action_spec.shape[-1]),
        in_keys=["observation"],
        out_keys=["action"],
    )


def train(policy, data, steps=300):
    """Imitation: the policy's argmax learns the controller on the observations collected."""
    obs = data["observation"].reshape(-1, data["observation"].shape[-1])
    target = (3 * obs[:, 2] + obs[:, 3] > 0).long()  # push right when the pole falls right
    optim = torch.optim.Adam(policy.parameters(), lr=0.05)
    for _ in range(steps):
        loss = nn.functional.cross_entropy(policy.module(obs), target)
        optim.zero_grad()
        loss.backward()
        optim.step()
    return loss.item()


def episodes_per_1000_frames(data):
    return 1000 * data["next", "done"].sum().item() / data.numel()


def example_single_collector():
    """Example 1: Single collector, weights pushed as a TensorDict."""
    torch.manual_seed(0)
    env = GymEnv("CartPole-v1")
    policy = make_policy(env)
    env.close()

    collector = Collector(
        create_env_fn=lambda: GymEnv("CartPole-v1"),
        policy=policy,
        frames_per_batch=200,
        total_frames=800,
    )
    collector.set_seed(0)

    rates = []
    for i, data in enumerate(collector):
        rates.append(episodes_per_1000_frames(data))
        print(f"Iteration {i}: Collected {data.numel()} transitions, {rates[-1]:.1f} episodes per 1000 frames")
        if i == 0:
            loss = train(policy, data)
            collector.update_policy_weights_(TensorDict.from_module(policy))
            print(f"  -> Trained (imitation loss {loss:.3f}) and updated policy weights")
    collector.shutdown()
    return collector, rates


def example_multi_collector_shared_memory():
    """Example 2: Multiple collectors with shared memory."""
    torch.manual_seed(0)
    env = GymEnv("CartPole-v1")
    policy = make_policy(env)
    env.close()

    scheme = SharedMemWeightSyncScheme(strategy="tensordict")
    collector = Collector(
        create_env_fn=lambda: GymEnv("CartPole-v1"),
        num_collectors=1,
        sync=True,
        policy=policy,
        frames_per_batch=400,
        total_frames=1600,
        weight_sync_schemes={"policy": scheme},
    )
    collector.set_seed(0)

    rates = []
    for i, data in enumerate(collector):
        rates.append(episodes_per_1000_frames(data))
        print(f"Iteration {i}: Collected {data.numel()} transitions, {rates[-1]:.1f} episodes per 1000 frames")
        if i == 0:
            loss = train(policy, data)
            collector.update_policy_weights_(TensorDict.from_module(policy))
            print(f"  -> Trained (imitation loss {loss:.3f}) and updated policy weights via shared memory")
    collector.shutdown()
    return collector, rates


def main():
    import torch.multiprocessing as mp

    try:
        mp.set_start_method("spawn")
    except RuntimeError:
        pass  # Already set

    single, single_rates = example_single_collector()
    multi, multi_rates = example_multi_collector_shared_memory()

    def follows(rates):  # every batch after the push ends episodes at most half as often
        return len(rates) == 4 and all(r <= rates[0] / 2 for r in rates[1:])

    print("RESULT " + json.dumps({
        "collector": type(multi).__module__,
        "single_collector": type(single).__module__,
        "learned": follows(single_rates) and follows(multi_rates),
        "single_episodes_per_1000": [round(r, 1) for r in single_rates],
        "multi_episodes_per_1000": [round(r, 1) for r in multi_rates],
    }))


if __name__ == "__main__":
    main()

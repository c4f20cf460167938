"""The examples of TorchRL 0.14's collector reference (the docs of ``torchrl.collectors``:
"Single node collectors", ``DataCollectorBase``, the collector hierarchy tutorial, "Collectors
and replay buffers", ``SyncDataCollector``/``Collector``; and the class docstrings of
``Collector``, ``MultiSyncCollector``, ``MultiAsyncCollector``, ``split_trajectories``), run as
written with the 0.14 names (TorchRL 0.14 has dropped ``SyncDataCollector``,
``MultiSyncDataCollector`` and ``MultiaSyncDataCollector``). Each example checks what the docs
print or state: batch shapes, keys, dtypes and the ``"time"`` dim name; ``split_trajectories``'
padded output and mask; a replay buffer filled by iterating, by ``replay_buffer=`` (the collector
then yields no tensordicts) and by ``start()``/``async_shutdown()``; ``SliceSampler`` slices on
``("collector", "traj_ids")``; ``update_policy_weights_()`` (no argument, a module, a
TensorDict of weights) reaching the workers; ``reset()`` starting new trajectories;
``set_seed``, ``state_dict``/``load_state_dict``; ``shutdown()``.

Departures from the docs, for CI: ``SerialEnv`` for the ``set_seed`` example's
``ParallelEnv(6, ...)`` (six processes fewer); CartPole for the ``start()`` example's Pong; the
PPO, Ray and RPC examples are left out. Where the docs print something TorchRL 0.14 does not do,
the program checks what TorchRL does: ``SliceSampler`` takes ``traj_key`` (the docs write
``trajectory_key``), ``MultiSyncCollector(..., cat_results="stack")`` yields
``[2, 100]`` (the docstring prints ``[200]``), and ``set_seed`` returns the last env's seed, not
``6``. Nothing trains (``learned`` is null).
"""

import json
import time

import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.collectors import Collector, MultiAsyncCollector, MultiSyncCollector
from torchrl.collectors.utils import split_trajectories
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers import SliceSampler
from torchrl.envs import SerialEnv
from torchrl.envs.libs.gym import GymEnv
from torchrl.modules import RandomPolicy

PRINTED_KEYS = {  # the keys of the batch the Collector/MultiSync/MultiAsync docstrings print
    "action", ("collector", "traj_ids"), "done", ("next", "done"), ("next", "observation"),
    ("next", "reward"), ("next", "step_count"), ("next", "truncated"), "observation", "step_count",
    "truncated",
}


def check_printed_batch(data, batch_size):
    """What the docstrings print for Pendulum batches of 200 frames."""
    assert data.batch_size == torch.Size(batch_size), data.batch_size
    assert set(data.keys(True, True)) >= PRINTED_KEYS, set(data.keys(True, True)) ^ PRINTED_KEYS
    for key, tail, dtype in (("action", [1], torch.float32), (("collector", "traj_ids"), [], torch.int64),
                             ("done", [1], torch.bool), (("next", "done"), [1], torch.bool),
                             (("next", "observation"), [3], torch.float32),
                             (("next", "reward"), [1], torch.float32), (("next", "step_count"), [1], torch.int64),
                             (("next", "truncated"), [1], torch.bool), ("observation", [3], torch.float32),
                             ("step_count", [1], torch.int64), ("truncated", [1], torch.bool)):
        assert data[key].shape == torch.Size([*batch_size, *tail]), (key, data[key].shape)
        assert data[key].dtype == dtype, (key, data[key].dtype)
    assert data.device == torch.device("cpu"), data.device
    # max_frames_per_traj=50: no trajectory runs past 50 steps, and each one that reaches 50 is cut there
    assert int(data["next", "step_count"].max()) <= 50
    at_50 = data["next", "step_count"] == 50
    assert data["next", "truncated"][at_50].all() and data["next", "done"][at_50].all()


if __name__ == "__main__":
    torch.manual_seed(0)
    figures = {}

    # ---------------------------------------------------------------- Collector (class docstring)
    env_maker = lambda: GymEnv("Pendulum-v1", device="cpu")
    policy = TensorDictModule(nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
    collector = Collector(
        create_env_fn=env_maker,
        policy=policy,
        total_frames=2000,
        max_frames_per_traj=50,
        frames_per_batch=200,
        init_random_frames=-1,
        reset_at_each_iter=False,
        device="cpu",
        storing_device="cpu",
    )
    for i, data in enumerate(collector):
        if i == 2:
            print(data)
            break
    collector_module = type(collector).__module__
    modules = {collector_module}
    check_printed_batch(data, [200])
    # "The collector delivers batches of data that are marked with a "time" dimension."
    assert data.names[-1] == "time"
    # consecutive steps of one trajectory: the next observation is the following observation
    same = data["collector", "traj_ids"][1:] == data["collector", "traj_ids"][:-1]
    assert (data["next", "observation"][:-1][same] == data["observation"][1:][same]).all()
    assert (data["step_count"][1:][same] == data["step_count"][:-1][same] + 1).all()

    # split_trajectories on that batch (default prefix "collector"): one row per trajectory
    split = split_trajectories(data)
    mask = split["collector", "mask"]
    assert split.batch_size[0] == len(data["collector", "traj_ids"].unique()), split.batch_size
    assert int(mask.sum()) == 200
    ids = split["collector", "traj_ids"]
    assert (ids == ids[:, :1])[mask].all()  # each row holds one trajectory
    assert (split["observation"][mask] == data["observation"]).all()
    figures["split_shape"] = list(split.batch_size)

    # set_seed, state_dict / load_state_dict (SyncDataCollector reference)
    sd = collector.state_dict()
    assert "policy_state_dict" in sd and "env_state_dict" in sd, list(sd)
    collector.load_state_dict(sd)

    # reset(): the envs start new trajectories
    before = int(data["collector", "traj_ids"].max())
    collector.reset()
    data = next(iter(collector))
    assert int(data["collector", "traj_ids"][0]) > before, (data["collector", "traj_ids"][0], before)
    assert int(data["step_count"][0]) == 0
    del collector

    env_fn = lambda: GymEnv("Pendulum-v1")
    env_fn_parallel = SerialEnv(6, env_fn)
    policy = TensorDictModule(nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
    collector = Collector(env_fn_parallel, policy, total_frames=300, frames_per_batch=100)
    out_seed = collector.set_seed(1)
    assert isinstance(out_seed, int)
    shapes = [tuple(data.shape) for data in collector]
    assert all(s[0] == 6 and s[0] * s[1] >= 100 for s in shapes), shapes  # 100 frames over 6 envs
    figures["serial6_batches"] = shapes
    collector.shutdown()

    # ------------------------------------------ Collector (the collector hierarchy tutorial)
    collector = Collector(
        create_env_fn=lambda: GymEnv("Pendulum-v1", device="cpu"),
        policy=policy,
        frames_per_batch=200,
        total_frames=10_000,
        device="cpu",
        max_frames_per_traj=50,  # reset after 50 steps
    )
    for data in collector:
        # data is a TensorDict with shape (200,)
        print(data.shape, data.keys())
        break
    collector.shutdown()
    assert data.shape == torch.Size([200])

    # --------------------------------- Collectors and replay buffers (one env, flattened)
    env = GymEnv("Pendulum-v1")
    collector = Collector(create_env_fn=env, policy=policy, frames_per_batch=200, total_frames=2000)
    N = 1000
    memory = ReplayBuffer(
        storage=LazyTensorStorage(N),
        transform=lambda data: data.reshape(-1))
    for data in collector:
        memory.extend(data)
    collector.shutdown()
    assert len(memory) == N
    assert memory.sample(64).batch_size == torch.Size([64])

    # Single environment: trajectory slices with SliceSampler on ("collector", "traj_ids")
    N = 400
    memory = ReplayBuffer(
        storage=LazyTensorStorage(N),
        sampler=SliceSampler(num_slices=4, traj_key=("collector", "traj_ids")),
    )
    env = GymEnv("Pendulum-v1")
    collector = Collector(env, policy, frames_per_batch=N, total_frames=-1)
    for i, data in enumerate(collector):
        memory.extend(data)
        if i == 1:
            break
    collector.shutdown()
    sample = memory.sample(40).reshape(4, 10)
    assert (sample["collector", "traj_ids"] == sample["collector", "traj_ids"][:, :1]).all()
    assert (sample["next", "observation"][:, :-1] == sample["observation"][:, 1:]).all()

    # --------------------------------- replay_buffer=...: iterating yields no tensordicts
    rb = ReplayBuffer(storage=LazyTensorStorage(1000))
    collector = Collector(env, policy, replay_buffer=rb, frames_per_batch=100, total_frames=300)
    yielded = [data for data in collector]
    collector.shutdown()
    assert yielded == [None, None, None], yielded
    assert len(rb) == 300, len(rb)

    # ------------------- Running the collector asynchronously: start() and async_shutdown()
    env = GymEnv("CartPole-v1")
    policy_rnd = RandomPolicy(env.action_spec)
    rb = ReplayBuffer(storage=LazyTensorStorage(1000), shared=True)
    collector = Collector(
        env,
        policy=policy_rnd,
        replay_buffer=rb,
        frames_per_batch=256,
        total_frames=-1,
    )
    collector.start()
    t0 = time.time()
    while rb.write_count < 1000:
        time.sleep(0.1)
        assert time.time() - t0 < 30, rb.write_count
    collector.async_shutdown()
    sample = rb.sample(32)
    assert sample.batch_size == torch.Size([32])
    assert set(sample.keys(True, True)) >= {"observation", "action", ("next", "reward"), ("next", "done")}
    figures["start_write_count"] = rb.write_count

    # ------------------------------------------------------ split_trajectories (docstring)
    obs = torch.cat([torch.arange(10), torch.arange(5)])
    obs_ = torch.cat([torch.arange(1, 11), torch.arange(1, 6)])
    done = torch.zeros(15, dtype=torch.bool)
    done[9] = True
    trajectory_id = torch.cat([torch.zeros(10, dtype=torch.int32),
        torch.ones(5, dtype=torch.int32)])
    data = TensorDict({"obs": obs, ("next", "obs"): obs_, ("next", "done"): done, "trajectory": trajectory_id}, batch_size=[15])
    data_split = split_trajectories(data, done_key="done")
    print(data_split)
    assert data_split.batch_size == torch.Size([2, 10])
    assert set(data_split.keys(True, True)) == {"mask", ("next", "done"), ("next", "obs"), "obs", "traj_ids", "trajectory"}
    assert data_split["traj_ids"].dtype == torch.int64 and data_split["trajectory"].dtype == torch.int32
    # check that split_trajectories got the trajectories right with the done signal
    assert (data_split["traj_ids"] == data_split["trajectory"]).all()
    print(data_split["mask"])
    assert data_split["mask"].tolist() == [[True] * 10, [True] * 5 + [False] * 5]
    data_split = split_trajectories(data, trajectory_key="trajectory")
    print(data_split)
    assert data_split.batch_size == torch.Size([2, 10])
    assert set(data_split.keys(True, True)) == {"mask", ("next", "done"), ("next", "obs"), "obs", "trajectory"}
    assert (data_split["obs"][0] == torch.arange(10)).all() and (data_split["obs"][1, :5] == torch.arange(5)).all()

    # --------------------------------------------------- MultiSyncCollector (docstring, tutorial)
    env_maker = lambda: GymEnv("Pendulum-v1", device="cpu")
    policy = TensorDictModule(nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
    collector = MultiSyncCollector(
        create_env_fn=[env_maker, env_maker],
        policy=policy,
        total_frames=2000,
        max_frames_per_traj=50,
        frames_per_batch=200,
        init_random_frames=-1,
        reset_at_each_iter=False,
        device="cpu",
        storing_device="cpu",
        cat_results="stack",
    )
    # MultiSyncDataCollector + regular env: behaves like a ParallelEnv if cat_results="stack"
    memory = ReplayBuffer(
        storage=LazyTensorStorage(1000, ndim=2),
        sampler=SliceSampler(num_slices=4, traj_key=("collector", "traj_ids"))
    )
    sync_actions = []
    for i, data in enumerate(collector):
        memory.extend(data)
        sync_actions.append(sorted(data["action"].unique().tolist()))
        if i == 0:
            # a new policy: a constant action of 0.5, pushed to the workers
            with torch.no_grad():
                policy.module.weight.zero_()
                policy.module.bias.fill_(0.5)
            collector.update_policy_weights_()
        elif i == 1:
            # then 0.25, to the workers named
            with torch.no_grad():
                policy.module.bias.fill_(0.25)
            collector.update_policy_weights_(policy, worker_ids=[0, 1])
        if i == 2:
            print(data)
            break
    modules.add(type(collector).__module__)
    collector.shutdown()
    del collector
    check_printed_batch(data, [2, 100])
    assert data.names[-1] == "time"
    # each worker's row: its own trajectories, none shared with the other worker
    assert not set(data["collector", "traj_ids"][0].tolist()) & set(data["collector", "traj_ids"][1].tolist())
    # "no environment step is computed in between the reception of a batch of trajectory and
    # the start of the next collection": each batch runs the weights pushed before it was asked for
    assert sync_actions[1:] == [[0.5], [0.25]], sync_actions
    figures["sync_actions"] = sync_actions[1:]
    sample = memory.sample(40).reshape(4, 10)
    assert (sample["collector", "traj_ids"] == sample["collector", "traj_ids"][:, :1]).all()
    assert (sample["next", "observation"][:, :-1] == sample["observation"][:, 1:]).all()

    # -------------------------------------------------- MultiAsyncCollector (docstring, tutorial)
    collector = MultiAsyncCollector(
        create_env_fn=[env_maker, env_maker],
        policy=policy,
        total_frames=2000,
        max_frames_per_traj=50,
        frames_per_batch=200,
        init_random_frames=-1,
        reset_at_each_iter=False,
        device="cpu",
        storing_device="cpu",
        cat_results="stack",
    )
    seen = []
    for i, data in enumerate(collector):
        check_printed_batch(data, [200])
        seen.append(sorted(data["action"].unique().tolist()))
        if i == 0:
            # new weights as a TensorDict (a constant action of -0.5), to all workers
            weights = TensorDict.from_module(policy).clone()
            weights["module", "bias"].fill_(-0.5)
            collector.update_policy_weights_(weights)
        elif i == 2:
            # and as a module (a constant action of 1.0)
            with torch.no_grad():
                policy.module.bias.fill_(1.0)
            collector.update_policy_weights_(policy)
        if i == 2:
            print(data)
        if seen[-1] == [1.0] or i == 8:
            break
    modules.add(type(collector).__module__)
    collector.shutdown()
    del collector
    assert data.names[-1] == "time"
    assert any(-0.5 in actions for actions in seen), seen  # the TensorDict of weights reached the workers
    assert seen[-1] == [1.0], seen  # and so did the module's
    figures["async_actions"] = seen

    print("RESULT " + json.dumps({"collector": collector_module, "learned": None,
                                  "collectors": sorted(modules), **figures}))

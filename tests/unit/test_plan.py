"""``plan_workers`` (``_workers.plan``): validating a multi-process collector's
``create_env_fn`` and laying out its workers before any process starts.

Each distinct entry is built once in this process to learn its spaces (and closed again);
nothing here starts a worker.
"""

from __future__ import annotations

import threading

import cloudpickle
import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import SyncVectorEnv

from aiocollect import AsyncEnv
from aiocollect._workers import plan as plan_module
from aiocollect._workers.plan import WorkerSpec, plan_workers
from support.procs import children


class BoxEnv(gym.Env):
    """Box(size,) observations, Discrete(3) actions; records ``close()``."""

    def __init__(self, size: int = 2):
        self.observation_space = spaces.Box(-1, 1, (size,), np.float32)
        self.action_space = spaces.Discrete(3)
        self.size = size
        self.closed = False

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(self.size, np.float32), {}

    def step(self, action):
        return np.zeros(self.size, np.float32), 0.0, False, False, {}

    def close(self):
        self.closed = True


class CoroEnv(AsyncEnv):
    def __init__(self):
        self.observation_space = spaces.Box(-1, 1, (2,), np.float32)
        self.action_space = spaces.Discrete(3)

    async def step(self, action):  # never awaited here
        return np.zeros(2, np.float32), 0.0, False, False, {}


class Recorder:
    """A picklable factory that counts the envs it built in this process."""

    def __init__(self, size: int = 2):
        self.size = size
        self.built: list[BoxEnv] = []

    def __call__(self) -> BoxEnv:
        self.built.append(BoxEnv(self.size))
        return self.built[-1]


def test_one_env_per_factory_entry_with_consecutive_rows():
    make = Recorder()
    plan = plan_workers([make] * 3, None)
    assert [(w.index, w.num_envs, w.lo, w.hi, w.batched, w.coroutine) for w in plan.workers] == [
        (0, 1, 0, 1, False, False),
        (1, 1, 1, 2, False, False),
        (2, 1, 2, 3, False, False),
    ]
    assert plan.num_envs == 3
    assert plan.observation_space == spaces.Box(-1, 1, (2,), np.float32)
    assert plan.action_space == spaces.Discrete(3)
    assert all(w.kwargs == {} for w in plan.workers)
    assert all(isinstance(w, WorkerSpec) for w in plan.workers)


def test_a_repeated_entry_is_built_once_and_closed():
    make = Recorder()
    plan_workers([make] * 4, None)
    assert len(make.built) == 1 and make.built[0].closed


def test_distinct_entries_are_each_built_once():
    a, b = Recorder(), Recorder()
    plan_workers([a, b, a, b, b], None)
    assert len(a.built) == 1 and len(b.built) == 1
    assert a.built[0].closed and b.built[0].closed


def test_lists_and_vector_envs_give_batched_workers_with_their_env_counts():
    make = Recorder()
    plan = plan_workers([[make, make], make, lambda: SyncVectorEnv([BoxEnv] * 3), (make, make, make)], None)
    assert [(w.num_envs, w.lo, w.hi, w.batched) for w in plan.workers] == [
        (2, 0, 2, True),
        (1, 2, 3, False),
        (3, 3, 6, True),
        (3, 6, 9, True),
    ]
    assert plan.num_envs == 9
    # the VectorEnv's single spaces are the workers' spaces
    assert plan.observation_space == spaces.Box(-1, 1, (2,), np.float32)


def test_with_pipelining_a_list_of_envs_steps_in_two_parts_the_rest_in_one(monkeypatch):
    """Parts (``WorkerSpec.parts``) need envs this process steps one by one: not a single env,
    not a ``VectorEnv`` (stepped all at once), not coroutine envs (no process)."""
    monkeypatch.setenv("AIOCOLLECT_PIPELINE", "1")
    make = Recorder()
    plan = plan_workers([[make] * 5, make, lambda: SyncVectorEnv([BoxEnv] * 3), [make, make], [CoroEnv] * 2],
                        None)
    assert [w.parts for w in plan.workers] == [((0, 3), (3, 5)), (), (), ((9, 10), (10, 11)), ()]
    assert [w.lanes for w in plan.workers] == [((0, 3), (3, 5)), ((5, 6),), ((6, 9),), ((9, 10), (10, 11)),
                                               ((11, 13),)]
    assert plan.num_lanes == 7


@pytest.mark.parametrize(("value", "on"), [("0", False), ("off", False), ("", False), ("1", True), ("yes", True)])
def test_aiocollect_pipeline_forces_parts_on_or_off(value, on, monkeypatch):
    monkeypatch.setenv("AIOCOLLECT_PIPELINE", value)
    plan = plan_workers([[Recorder()] * 4] * 8, None)
    assert all(w.parts == (((w.lo, w.lo + 2), (w.lo + 2, w.hi)) if on else ()) for w in plan.workers)
    assert plan.num_lanes == (16 if on else 8)


@pytest.mark.parametrize(("parts", "env"), [(True, "0"), (False, "1"), (True, None), (False, None)])
def test_the_pipeline_keyword_overrides_the_variable_and_the_machine(parts, env, monkeypatch):
    if env is None:
        monkeypatch.delenv("AIOCOLLECT_PIPELINE", raising=False)
    else:
        monkeypatch.setenv("AIOCOLLECT_PIPELINE", env)
    monkeypatch.setattr(plan_module, "usable_cores", lambda: 1 if parts else 64)  # (the machine says otherwise)
    plan = plan_workers([[Recorder()] * 4] * 3, None, parts=parts)
    assert all(w.parts == (((w.lo, w.lo + 2), (w.lo + 2, w.hi)) if parts else ()) for w in plan.workers)
    assert plan_workers([[Recorder()] * 4] * 3, None, parts=True, policy_between_steps=False).num_lanes == 3


@pytest.mark.parametrize(("cores", "processes", "on"), [(2, 1, True), (2, 2, False), (16, 8, True), (16, 9, False)])
def test_by_default_workers_pipeline_when_the_engine_has_cores_to_spare(cores, processes, on, monkeypatch):
    monkeypatch.delenv("AIOCOLLECT_PIPELINE", raising=False)
    monkeypatch.setattr(plan_module, "usable_cores", lambda: cores)
    assert plan_module.pipeline(processes) is on
    least = 2 * plan_module.MIN_PART
    plan = plan_workers([[Recorder()] * least] * processes + [[CoroEnv] * least] * 3, None)  # coroutine: no process
    assert all(bool(w.parts) is on for w in plan.workers if not w.coroutine)
    assert not any(w.parts for w in plan.workers if w.coroutine)


@pytest.mark.parametrize(("cores", "processes", "cpu", "gpu"),
                         [(2, 1, True, True), (2, 2, False, False), (16, 8, True, True), (16, 12, False, True),
                          (16, 15, False, True), (16, 16, False, False)])
def test_a_gpu_policy_pipelines_whenever_the_engine_has_a_core(cores, processes, cpu, gpu, monkeypatch):
    """A GPU policy's call is a wait, not the engine's CPU: parts hide it whenever the engine
    has a core of its own; a CPU policy's doubled calls need twice the cores."""
    monkeypatch.delenv("AIOCOLLECT_PIPELINE", raising=False)
    assert plan_module.pipeline(processes, gpu_policy=False, cores=cores) is cpu
    assert plan_module.pipeline(processes, gpu_policy=True, cores=cores) is gpu
    monkeypatch.setenv("AIOCOLLECT_PIPELINE", "0")
    assert plan_module.pipeline(processes, gpu_policy=True, cores=cores) is False


def test_whether_a_policy_runs_on_a_gpu_is_read_off_its_device():
    import torch
    from tensordict.nn import TensorDictModule

    from aiocollect import RandomPolicy
    from aiocollect._policies.setup import runs_on_gpu

    module = TensorDictModule(torch.nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
    assert not runs_on_gpu(module, None) and not runs_on_gpu(None, None)
    assert not runs_on_gpu(module, torch.device("cpu"))
    assert runs_on_gpu(module, torch.device("cuda", 0))  # policy_device decides (the copy goes there)
    assert not runs_on_gpu(RandomPolicy(gym.spaces.Discrete(2)), None)
    meta = TensorDictModule(torch.nn.Linear(3, 1, device="meta"), in_keys=["observation"], out_keys=["action"])
    assert not runs_on_gpu(meta, None)


def test_by_default_a_worker_needs_two_parts_worth_of_envs(monkeypatch):
    monkeypatch.delenv("AIOCOLLECT_PIPELINE", raising=False)
    monkeypatch.setattr(plan_module, "usable_cores", lambda: 64)
    least = 2 * plan_module.MIN_PART
    plan = plan_workers([[Recorder()] * (least - 1), [Recorder()] * least, [Recorder()] * (least + 1)], None)
    assert [len(w.lanes) for w in plan.workers] == [1, 2, 2]
    assert least == 8 and plan.workers[2].parts == ((15, 20), (20, 24))  # rows 0:7, 7:15, 15:24


def test_an_env_id_is_an_entry():
    plan = plan_workers(["CartPole-v1", "CartPole-v1"], None)
    assert [(w.num_envs, w.batched) for w in plan.workers] == [(1, False), (1, False)]
    assert plan.observation_space.shape == (4,) and plan.action_space == spaces.Discrete(2)


def test_create_env_kwargs_reach_the_factories_and_are_kept():
    def factory(size):
        return BoxEnv(size)

    kwargs = {"size": 5}
    plan = plan_workers([factory, factory], kwargs)
    assert plan.observation_space.shape == (5,)
    assert all(w.kwargs == {"size": 5} and w.kwargs is not kwargs for w in plan.workers)


def test_create_env_kwargs_may_be_one_dict_per_worker():
    def factory(size):
        return BoxEnv(size)

    plan = plan_workers([factory, factory], [{"size": 5}, {"size": 5}])
    assert [w.kwargs for w in plan.workers] == [{"size": 5}, {"size": 5}]
    with pytest.raises(ValueError, match="a list of 1 dicts for create_env_fn's 2 workers"):
        plan_workers([factory, factory], [{"size": 5}])


def test_each_entry_is_shipped_cloudpickled():
    size = 4
    plan = plan_workers([lambda: BoxEnv(size), (Recorder(4), Recorder(4))], None)
    env = cloudpickle.loads(plan.workers[0].entry)()
    assert isinstance(env, BoxEnv) and env.size == 4
    entry = cloudpickle.loads(plan.workers[1].entry)
    assert isinstance(entry, tuple) and len(entry) == 2
    assert isinstance(entry[0], Recorder) and entry[0].size == 4 and entry[0].built == []


def test_coroutine_entries_are_marked():
    plan = plan_workers([CoroEnv, [CoroEnv, CoroEnv], Recorder()], None)
    assert [(w.num_envs, w.batched, w.coroutine) for w in plan.workers] == [
        (1, False, True),
        (2, True, True),
        (1, False, False),
    ]


@pytest.mark.parametrize("create_env_fn", ["CartPole-v1", BoxEnv, BoxEnv(), {"a": BoxEnv}, None],
                         ids=["env-id", "factory", "env", "dict", "none"])
def test_create_env_fn_must_be_a_list_of_worker_entries(create_env_fn):
    with pytest.raises(TypeError) as info:
        plan_workers(create_env_fn, None)
    message = str(info.value)
    assert message.startswith("create_env_fn: a multi-process collector takes a list with one entry per worker")
    assert "`[make_env] * 4`" in message


def test_an_empty_list_of_workers_is_rejected():
    with pytest.raises(ValueError, match=r"^create_env_fn: the list of workers is empty; give at least one env"):
        plan_workers([], None)


BAD_ENTRIES = [
    ([BoxEnv, BoxEnv()], TypeError,
     "create_env_fn[1] is an env instance (test_plan.BoxEnv); a worker builds its own envs: pass a factory"),
    ([BoxEnv, lambda: None, SyncVectorEnv([BoxEnv])], TypeError,
     "create_env_fn[2] is an env instance (gymnasium.vector.sync_vector_env.SyncVectorEnv)"),
    ([[]], ValueError, "create_env_fn[0] is an empty list; give each worker at least one env factory."),
    ([BoxEnv, [BoxEnv, 3]], TypeError,
     "create_env_fn[1][1]: expected an env factory or an env id, got builtins.int."),
    ([[BoxEnv(), BoxEnv]], TypeError,
     "create_env_fn[0][0]: expected an env factory or an env id, got test_plan.BoxEnv."),
    ([BoxEnv, 3.5], TypeError, "create_env_fn[1]: expected an env factory (a callable returning a gymnasium env"),
]


@pytest.mark.parametrize(("create_env_fn", "error", "message"), BAD_ENTRIES,
                         ids=["env", "vector-env", "empty-list", "int-in-list", "env-in-list", "float"])
def test_bad_entries_are_rejected_naming_the_entry(create_env_fn, error, message):
    with pytest.raises(error) as info:
        plan_workers(create_env_fn, None)
    assert type(info.value) is error
    assert message in str(info.value), str(info.value)


def test_bad_entries_are_found_before_anything_is_built():
    make = Recorder()
    with pytest.raises(TypeError, match=r"create_env_fn\[1\]"):
        plan_workers([make, BoxEnv()], None)
    assert make.built == []


def test_an_unpicklable_entry_is_rejected_naming_it_and_the_fix():
    lock = threading.Lock()

    def make_locked_env():
        with lock:
            return BoxEnv()

    with pytest.raises(TypeError) as info:
        plan_workers([BoxEnv, make_locked_env], None)
    message = str(info.value)
    assert message.startswith(
        "create_env_fn[1] (test_an_unpicklable_entry_is_rejected_naming_it_and_the_fix.<locals>.make_locked_env) "
        "cannot be pickled with cloudpickle"
    )
    assert "TypeError: cannot pickle '_thread.lock' object" in message
    assert "no open files, locks, sockets or live envs" in message
    assert isinstance(info.value.__cause__, TypeError)


def test_entries_with_different_spaces_are_rejected_naming_both():
    with pytest.raises(ValueError) as info:
        plan_workers([Recorder(2), Recorder(2), Recorder(3)], None)
    message = str(info.value)
    assert message.startswith("create_env_fn[2] builds envs with spaces Box(-1.0, 1.0, (3,), float32) / Discrete(3)")
    assert "but create_env_fn[0] has Box(-1.0, 1.0, (2,), float32) / Discrete(3)" in message
    assert message.endswith("all workers of a collector must share their observation and action spaces.")


def test_envs_of_one_list_entry_with_different_spaces_are_rejected_naming_the_entry_and_closed():
    small, large = Recorder(2), Recorder(3)
    with pytest.raises(ValueError, match=r"^create_env_fn\[1\]: env 1 has spaces .* env 0 has"):
        plan_workers([[Recorder(2)], [small, large]], None)
    assert len(small.built) == len(large.built) == 1
    assert small.built[0].closed and large.built[0].closed  # (the envs built to read the spaces)


def test_a_factory_that_gives_no_env_is_rejected_naming_the_entry():
    with pytest.raises(TypeError) as info:
        plan_workers([BoxEnv, lambda: 3], None)
    message = str(info.value)
    assert "gave builtins.int, not a gymnasium env" in message
    assert "create_env_fn[1]" in message, message


def test_a_bad_factory_inside_a_list_entry_is_named_by_both_indices():
    with pytest.raises(TypeError) as info:
        plan_workers([[BoxEnv, lambda: 3], BoxEnv], None)
    message = str(info.value)
    assert "gave builtins.int, not a gymnasium env" in message
    # the culprit is the second factory of worker 0, not worker 1 (a good entry)
    assert "create_env_fn[0][1]" in message, message


def test_a_vector_env_inside_a_list_entry_is_named_by_both_indices():
    with pytest.raises(TypeError) as info:
        plan_workers([[BoxEnv, lambda: SyncVectorEnv([BoxEnv])]], None)
    message = str(info.value)
    assert "gave a VectorEnv" in message
    assert "create_env_fn[0][1]" in message, message


def test_an_unpicklable_factory_in_a_list_entry_is_named_by_both_indices():
    lock = threading.Lock()

    def make_locked_env():
        with lock:
            return BoxEnv()

    with pytest.raises(TypeError, match=r"^create_env_fn\[0\]\[1\] \(.*make_locked_env\) cannot be pickled"):
        plan_workers([[BoxEnv, make_locked_env]], None)


def test_one_worker_s_entry_is_named_as_the_user_wrote_it():
    """``AsyncCollector([f, g])``: ``create_env_fn`` is the one worker's list, so ``g`` is
    ``create_env_fn[1]``, not ``create_env_fn[0][1]``."""
    lock = threading.Lock()

    def make_locked_env():
        with lock:
            return BoxEnv()

    cases = [([BoxEnv, 5], TypeError, r"^create_env_fn\[1\]: expected an env factory or an env id"),
             ([BoxEnv, make_locked_env], TypeError, r"^create_env_fn\[1\] \(.*make_locked_env\) cannot be pickled"),
             (make_locked_env, TypeError, r"^create_env_fn \(.*make_locked_env\) cannot be pickled"),
             ([BoxEnv, lambda: 3], TypeError, r"^create_env_fn\[1\] gave builtins.int, not a gymnasium env")]
    for entry, error, message in cases:
        with pytest.raises(error, match=message):
            plan_workers([entry], None, single=True)


def test_an_async_collector_names_its_factories_as_given_before_any_process_starts():
    from aiocollect import AsyncCollector

    before = children()
    with pytest.raises(TypeError, match=r"^create_env_fn\[1\]: expected an env factory or an env id"):
        AsyncCollector([BoxEnv, 5], None, frames_per_batch=10)
    assert children() == before

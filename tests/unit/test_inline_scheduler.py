"""``Scheduler.run_inline`` over an ``InlineWorker``: what ``Collector`` runs, by hand.

Real envs in this process (``StepEnv``), a scripted policy, the real storage, timelines and
scheduler: ids, observations, rewards and flags; trajectories across batches;
``max_frames_per_traj``; seeds; ``state_dict``; ``reset_when_done=False``; a cut batch;
``set_truncated``; a step cut short by an exception.
"""

from __future__ import annotations

import asyncio
import functools

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import InteractionType

from aiocollect._engine.scheduler import Scheduler
from aiocollect._engine.storage import RolloutStorage
from aiocollect._engine.timelines import Timelines
from aiocollect._envs.group import InProcessGroup
from aiocollect._envs.spaces import nest
from aiocollect._policies.random import RandomPolicy
from aiocollect._policies.runner import PolicyRunner
from aiocollect._workers.inline_worker import InlineWorker
from aiocollect._workers.protocol import RUN_CODE
from aiocollect._workers.shm import Layout, SharedArrays
from support.envs import StepEnv

COLUMNS = 8


class Scripted:
    """An actor (``_policies.actor.Actor``) that plays ``actions[k]`` at its ``k``-th call, with
    version ``k``, here (no runs), its actions checked as a policy's."""

    runs = None
    checks_actions = True
    aligned_inputs = False

    def __init__(self, actions):
        self.actions, self.calls = actions, 0

    @property
    def version(self) -> int:
        return self.calls - 1

    def __call__(self, obs, n):
        action = np.asarray(self.actions[self.calls], dtype=np.int64)
        self.calls += 1
        assert obs["observation"].shape == (n, 3)
        return {"action": action}


def make(*envs_or_lengths, max_frames_per_traj=None, reset_when_done=True, runs=False) -> Scheduler:
    envs = [e if isinstance(e, gym.Env) else StepEnv(e, tag=i) for i, e in enumerate(envs_or_lengths)]
    group = InProcessGroup(envs)
    check = group.check_action
    layout = Layout.plan([(leaf.dtype, leaf.shape) for leaf in group.obs_leaves], (check.dtype, check.shape),
                         group.num_envs, 1, columns=COLUMNS, slots=1)
    shared = SharedArrays(layout, -1)
    worker = InlineWorker(group, shared, max_frames_per_traj=max_frames_per_traj, reset_when_done=reset_when_done)
    step_count = max_frames_per_traj is not None
    storage = RolloutStorage(shared, group.obs_leaves, step_count=step_count)
    timelines = Timelines(storage.num_envs, reset_when_done=reset_when_done, count_steps=step_count)
    return Scheduler(storage, timelines, [worker], check, runs=runs)


def envs(sched: Scheduler) -> list[StepEnv]:
    return sched.lanes[0].worker.group.envs


def run(sched: Scheduler, frames: int, actions=None, *, mask=False, valid=None, set_truncated=False,
        runner=None) -> TensorDict:
    """One batch of ``frames`` steps, ``valid`` of them taken (all by default), as a TensorDict
    (``runner``: the actor, by default one that plays ``actions``)."""
    lane = sched.lanes[0]
    n = lane.num_envs
    valid = frames if valid is None else valid
    if runner is None:
        runner = Scripted(actions if actions is not None else [[0] * n] * valid)
    sched.begin(lane, frames, mask)
    asyncio.run(sched.run_inline(lambda: runner, lambda: lane.t >= valid))
    sealed = sched.seal(lane, set_truncated)
    tensors = sched.batch(sealed)
    sched.release(sealed)
    return TensorDict(nest(tensors), [n, frames])


def test_steps_record_ids_observations_rewards_and_flags():
    sched = make(2, 3)
    tl = sched.timelines
    assert tl.any_reset and tl.traj_ids.tolist() == [0, 1]
    td = run(sched, 5, [[0, 1], [1, 2], [2, 3], [3, 0], [0, 1]])
    assert td["collector", "traj_ids"].tolist() == [[0, 0, 2, 2, 4], [1, 1, 1, 3, 3]]
    assert td["observation"][..., 0].tolist() == [[0, 1, 0, 1, 0], [0, 1, 2, 0, 1]]
    assert td["next", "observation"][..., 0].tolist() == [[1, 2, 1, 2, 1], [1, 2, 3, 1, 2]]
    assert td["observation"][..., 1].tolist() == [[0] * 5, [1] * 5]  # each env's tag: rows stay with their env
    assert td["action"].tolist() == [[0, 1, 2, 3, 0], [1, 2, 3, 0, 1]]
    assert td["next", "reward"][..., 0].tolist() == [[1, 12, 21, 32, 1], [11, 22, 33, 1, 12]]
    assert td["next", "terminated"][..., 0].tolist() == [[False, True, False, True, False],
                                                         [False, False, True, False, False]]
    assert torch.equal(td["next", "done"], td["next", "terminated"])
    assert not td["next", "truncated"].any()
    assert not td["done"].any() and not td["terminated"].any() and not td["truncated"].any()
    assert td["collector", "policy_version"].tolist() == [[0, 1, 2, 3, 4]] * 2
    assert tl.completed_trajectories == 3 and tl.env_steps == 10
    assert tl.traj_ids.tolist() == [4, 3] and tl.ids.next == 5
    assert tl.needs_reset.tolist() == [False, False] and not tl.any_reset
    assert [env.resets for env in envs(sched)] == [3, 2]  # the first reset, then one per finished episode


def test_trajectories_continue_into_the_next_batch():
    sched = make(4, 4)
    a, b = run(sched, 3), run(sched, 3)
    assert a["collector", "traj_ids"].tolist() == [[0, 0, 0], [1, 1, 1]]
    assert b["collector", "traj_ids"].tolist() == [[0, 2, 2], [1, 3, 3]]
    assert torch.equal(b["observation"][:, 0], a["next", "observation"][:, -1])
    assert b["observation"][..., 0].tolist() == [[3, 0, 1], [3, 0, 1]]


def test_max_frames_per_traj_truncates_and_counts_steps():
    sched = make(100, max_frames_per_traj=2)
    td = run(sched, 5)[0]
    assert td["step_count"][..., 0].tolist() == [0, 1, 0, 1, 0]
    assert td["next", "step_count"][..., 0].tolist() == [1, 2, 1, 2, 1]
    assert td["next", "truncated"][..., 0].tolist() == [False, True, False, True, False]
    assert not td["next", "terminated"].any()
    assert torch.equal(td["next", "done"], td["next", "truncated"])
    assert td["collector", "traj_ids"].tolist() == [0, 0, 1, 1, 2]
    assert envs(sched)[0].resets == 3 and sched.timelines.step_count.tolist() == [1]


def test_without_max_frames_per_traj_no_step_count_is_kept():
    assert "step_count" not in run(make(3), 2)


def test_request_reset_with_seeds_resets_every_env_with_its_seed():
    sched = make(10, 10)
    tl = sched.timelines
    run(sched, 2)
    assert not tl.seed_set.any() and not tl.any_reset
    tl.request_reset([5, 6])
    assert tl.seed_set.all() and tl.any_reset
    assert tl.traj_ids.tolist() == [0, 1] and tl.completed_trajectories == 0  # new ids at the reset
    td = run(sched, 2)
    assert td["observation"][:, 0].tolist() == [[0, 0, 5], [0, 1, 6]]
    assert td["collector", "traj_ids"].tolist() == [[2, 2], [3, 3]]
    assert not tl.seed_set.any()  # seeds are used once
    tl.request_reset()
    assert run(sched, 1)["observation"][:, 0, 2].tolist() == [-1, -1]


def test_state_dict_round_trip_never_reuses_ids():
    a = make(2, 3)
    run(a, 5)
    state = a.timelines.state_dict()
    assert state == {"next_traj_id": 5, "completed_trajectories": 3}
    b = make(2, 3)
    b.timelines.load_state_dict(state)
    assert b.timelines.completed_trajectories == 3
    ids = run(b, 3)["collector", "traj_ids"]
    assert ids.tolist() == [[5, 5, 7], [6, 6, 6]]


def test_reset_when_done_false_keeps_stepping_and_carries_the_root_flags():
    sched = make(2, reset_when_done=False)
    td = run(sched, 4)[0]
    assert td["collector", "traj_ids"].tolist() == [0, 0, 0, 0]
    assert td["next", "terminated"][..., 0].tolist() == [False, True, True, True]
    # the root flags of step t are the "next" flags of step t - 1
    assert td["done"][..., 0].tolist() == [False, False, True, True]
    assert td["terminated"][..., 0].tolist() == [False, False, True, True]
    assert not td["truncated"].any()
    assert sched.timelines.completed_trajectories == 0
    td2 = run(sched, 2)[0]
    assert td2["done"][..., 0].tolist() == [True, True]  # carried over from the previous batch
    assert td2["observation"][..., 0].tolist() == [4, 5]
    assert envs(sched)[0].resets == 1


def test_a_cut_batch_blanks_and_masks_its_tail():
    td = run(make(10, 10), 4, mask=True, valid=2)
    assert td["collector", "mask"].tolist() == [[True, True, False, False]] * 2
    assert td["collector", "traj_ids"].tolist() == [[0, 0, -1, -1], [1, 1, -1, -1]]
    assert td["collector", "policy_version"].tolist() == [[0, 1, -1, -1]] * 2
    assert td["observation"][..., 0].tolist() == [[0, 1, 0, 0]] * 2
    assert not td["next", "done"][:, 2:].any()


def test_set_truncated_flags_the_last_valid_step_and_the_trajectories_go_on():
    """TorchRL's ``set_truncated``: the flags of the batch's last step, nothing else (value
    targets bootstrap there); the envs are not reset and keep their trajectory ids."""
    sched = make(3, 100)
    tl = sched.timelines
    td = run(sched, 3, set_truncated=True)
    assert td["next", "truncated"][..., 0].tolist() == [[False, False, True], [False, False, True]]
    assert td["next", "terminated"][..., 0].tolist() == [[False, False, True], [False, False, False]]
    assert td["next", "done"][:, -1, 0].tolist() == [True, True]
    # env 0 ended (terminated) and got a new id; env 1 goes on with its own
    assert tl.traj_ids.tolist() == [2, 1] and tl.completed_trajectories == 1
    assert not tl.needs_reset.any()
    td = run(sched, 2)
    assert td["collector", "traj_ids"].tolist() == [[2, 2], [1, 1]]
    assert td["observation"][..., 0].tolist() == [[0, 1], [3, 4]]  # env 1 steps on from step 3
    assert [env.resets for env in envs(sched)] == [2, 1]


def test_set_truncated_on_a_cut_batch_truncates_its_last_valid_step():
    sched = make(100)
    td = run(sched, 4, mask=True, valid=2, set_truncated=True)[0]
    assert td["next", "truncated"][..., 0].tolist() == [False, True, False, False]
    assert td["next", "done"][..., 0].tolist() == [False, True, False, False]
    assert sched.timelines.traj_ids.tolist() == [0]


def test_set_truncated_without_reset_when_done_leaves_the_next_batch_alone():
    sched = make(100, reset_when_done=False)
    assert run(sched, 2, set_truncated=True)[0]["next", "truncated"][..., 0].tolist() == [False, True]
    assert not sched.timelines.root_flags.any()
    td = run(sched, 2)[0]
    assert not td["done"].any() and not td["truncated"].any()
    assert td["observation"][..., 0].tolist() == [2, 3]
    assert sched.timelines.traj_ids.tolist() == [0]


def test_a_step_cut_short_resets_its_envs_and_the_batch_goes_on_with_new_trajectories():
    sched = make(StepEnv(100, tag=0), StepEnv(100, tag=1, interrupt_at=3))
    lane = sched.lanes[0]
    runner = Scripted([[1, 1]] * 10)
    sched.begin(lane, 5, False)
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(sched.run_inline(lambda: runner, lambda: lane.full))
    assert lane.t == 2 and sched.timelines.needs_reset.all()  # step 2 never happened, for anyone
    asyncio.run(sched.run_inline(lambda: runner, lambda: lane.full))  # the same batch, resumed
    sealed = sched.seal(lane, False)
    td = TensorDict(nest(sched.batch(sealed)), [2, 5])
    assert td["collector", "traj_ids"].tolist() == [[0, 0, 2, 2, 2], [1, 1, 3, 3, 3]]
    assert td["observation"][..., 0].tolist() == [[0, 1, 0, 1, 2]] * 2  # new episodes from the cut
    # the last step before the cut ends its trajectory as truncated: an id changes only after a done
    assert td["next", "truncated"][..., 0].tolist() == [[False, True, False, False, False]] * 2
    assert td["next", "done"][..., 0].tolist() == [[False, True, False, False, False]] * 2
    assert torch.equal(td["observation"][:, 1:2], td["next", "observation"][:, 0:1])


def next_action(actions, num_envs: int) -> dict:
    return {"action": next(actions)}


def random_runner(space, seed=0) -> PolicyRunner:
    """The runner of ``policy=None``: random actions, which go in runs where the scheduler allows them."""
    return PolicyRunner(RandomPolicy(space, seed=seed), ["observation"], device=None,
                        exploration_type=InteractionType.RANDOM)


def record_runs(worker: InlineWorker, lengths: list[int]) -> None:
    """Append the length of each run posted to ``worker`` to ``lengths``."""
    post = worker.post

    def spy(code: int, *args: int) -> None:
        if code == RUN_CODE:
            lengths.append(args[2])  # (slot, column, steps)
        post(code, *args)

    worker.post = spy  # type: ignore[method-assign]


def test_random_actions_go_in_runs_that_book_what_steps_one_by_one_would():
    # the same envs and the same actions, in runs and one step at a time: the same batches
    lengths, batches, run_lengths = (3, 5, 2), {}, []
    for runs in (True, False):
        sched = make(*lengths, max_frames_per_traj=4, runs=runs)
        runner = random_runner(envs(sched)[0].action_space, seed=3)
        if runs:  # (every run's length: the last one's is 1 when a busy machine preempted that run)
            record_runs(sched.lanes[0].worker, run_lengths)
        else:
            runner.runs = None  # (one call per step, drawn from the run's stream all the same)
            drawn = runner.policy.sample_steps(0, 4 * COLUMNS, 3)
            runner.policy.sample_outputs = functools.partial(next_action, iter(drawn))
        batches[runs] = [run(sched, COLUMNS, runner=runner) for _ in range(4)]
    assert max(run_lengths) > 1  # runs of several steps: fewer rounds than steps
    for a, b in zip(batches[True], batches[False]):
        assert (a == b).all(), "a run left the batch otherwise than steps one by one"
        assert a["next", "truncated"].any() and a["next", "terminated"].any()


def test_a_run_cut_short_keeps_the_steps_it_took_and_resets_its_envs():
    sched = make(StepEnv(100, tag=0), StepEnv(100, tag=1, interrupt_at=3), runs=True)
    lane = sched.lanes[0]
    runner = random_runner(envs(sched)[0].action_space)
    sched.begin(lane, 5, False)
    with pytest.raises(KeyboardInterrupt):  # (runs of 1, then 2 steps: the second step of that run fails)
        asyncio.run(sched.run_inline(lambda: runner, lambda: lane.full))
    assert lane.t == 2 and sched.timelines.needs_reset.all()  # step 1 is the batch's, step 2 never happened
    assert lane.state == "ready" and lane.run == 0 and sched.idle()
    asyncio.run(sched.run_inline(lambda: runner, lambda: lane.full))  # the same batch, resumed
    sealed = sched.seal(lane, False)
    td = TensorDict(nest(sched.batch(sealed)), [2, 5])
    assert td["collector", "traj_ids"].tolist() == [[0, 0, 2, 2, 2], [1, 1, 3, 3, 3]]
    assert td["observation"][..., 0].tolist() == [[0, 1, 0, 1, 2]] * 2
    assert td["next", "truncated"][..., 0].tolist() == [[False, True, False, False, False]] * 2
    reward = td["next", "reward"][..., 0] - td["next", "observation"][..., 0]  # 10 * the action taken
    assert torch.equal(reward, 10 * td["action"].float())


def test_a_run_that_overshot_sizes_the_next_at_its_own_pace():
    """``InlineRounds.sized``: runs of about ``SLICE_S`` at the fastest recent pace; after an
    env slowed down (a run far past ``SLICE_S``), the next run at the last run's own pace,
    not at a pace that may only slow 1.25x a run (which held the loop for up to ~0.9 s)."""
    from aiocollect._engine.rounds import OVERSHOOT, SLICE_S, InlineRounds
    from aiocollect._workers.inline_worker import RUN_LIMIT_S

    assert abs(RUN_LIMIT_S - OVERSHOOT * SLICE_S) < 1e-12  # a run the worker cut sizes the next at its pace

    pace, steps = InlineRounds.sized(float("inf"), 1, 1, 1e-6)  # first run: 1 us a step
    for _ in range(20):
        pace, steps = InlineRounds.sized(pace, steps, steps, steps * 1e-6)
    assert steps == int(SLICE_S / 1e-6) == 1000
    # a short stall (a wait for a core, under OVERSHOOT x SLICE_S): the next run does not shrink much
    _, s2 = InlineRounds.sized(pace, steps, steps, 0.9 * OVERSHOOT * SLICE_S)
    assert s2 >= steps // 2
    # the env now sleeps 5 ms a step: a 1000-step run took 5 s; the next is one step, not ~800
    p3, s3 = InlineRounds.sized(pace, steps, steps, steps * 0.005)
    assert p3 == pytest.approx(0.005) and s3 == 1
    # and it stays at a step while the env is slow
    _, s4 = InlineRounds.sized(p3, s3, s3, 0.005)
    assert s4 == 1

"""``Timelines`` (``_engine.timelines``): the main process's per-env bookkeeping, driven by hand.

Trajectory ids (unique, increasing, never reused, not even after a checkpoint), step
counts, completed trajectories, pending resets and their seeds, and the root done flags of
``reset_when_done=False``. Rows are given as a worker's block ``lo:hi``, as the scheduler does.
"""

from __future__ import annotations

import numpy as np

from aiocollect._engine.timelines import IdPool, Timelines


def flags(*values: int) -> np.ndarray:
    return np.array(values, dtype=bool)


def started(num_envs: int = 4, *, reset_when_done: bool = True, ids: IdPool | None = None) -> Timelines:
    """Timelines whose envs were all reset (as the first ``RESET`` of every worker does)."""
    tl = Timelines(num_envs, reset_when_done=reset_when_done, ids=ids)
    idx, _ = tl.take_resets(0, num_envs)
    tl.resets_done(0, idx)
    return tl


# --------------------------------------------------------------------------- ids and steps


def test_a_new_timeline_gives_each_env_its_own_id_and_needs_every_reset():
    tl = Timelines(4, reset_when_done=True)
    assert tl.traj_ids.tolist() == [0, 1, 2, 3]
    assert tl.step_count.tolist() == [0, 0, 0, 0]
    assert tl.needs_reset.tolist() == [True] * 4 and tl.any_reset
    assert tl.wants_reset(0, 2) and tl.wants_reset(2, 4)
    assert (tl.completed_trajectories, tl.env_steps) == (0, 0)


def test_timelines_sharing_an_id_pool_never_hand_out_the_same_id():
    pool = IdPool(start=100)
    a, b = Timelines(3, reset_when_done=True, ids=pool), Timelines(2, reset_when_done=True, ids=pool)
    assert a.traj_ids.tolist() == [100, 101, 102] and b.traj_ids.tolist() == [103, 104]
    a.stepped(0, 3, flags(1, 0, 0), flags(0, 0, 0))
    b.stepped(0, 2, flags(0, 1), flags(0, 0))
    assert a.traj_ids.tolist() == [105, 101, 102] and b.traj_ids.tolist() == [103, 106]


def test_stepped_counts_steps_of_the_block_only_and_reports_the_next_step_counts():
    tl = started(4)
    out = np.full(2, -1, dtype=np.int64)
    tl.stepped(2, 4, flags(0, 0), flags(0, 0), out)
    assert out.tolist() == [1, 1]
    tl.stepped(2, 4, flags(0, 0), flags(0, 0), out)
    tl.stepped(0, 2, flags(0, 0), flags(0, 0))  # no output array: fine
    assert out.tolist() == [2, 2]
    assert tl.step_count.tolist() == [1, 1, 2, 2]
    assert tl.env_steps == 6
    assert tl.traj_ids.tolist() == [0, 1, 2, 3] and tl.completed_trajectories == 0


def test_without_counting_steps_the_counts_stay_zero_and_the_rest_is_kept():
    tl = Timelines(2, reset_when_done=True, count_steps=False)
    tl.resets_done(0, np.arange(2))
    tl.stepped(0, 2, flags(0, 0), flags(0, 0))
    tl.stepped(0, 2, flags(1, 0), flags(0, 0))
    assert tl.step_count.tolist() == [0, 0]
    assert tl.env_steps == 4 and tl.completed_trajectories == 1 and tl.traj_ids.tolist() == [2, 1]


def test_finished_envs_get_new_increasing_ids_and_count_as_completed():
    tl = started(5)
    tl.stepped(0, 5, flags(0, 0, 0, 0, 0), flags(0, 0, 0, 0, 0))
    out = np.zeros(3, dtype=np.int64)
    tl.stepped(1, 4, flags(1, 0, 0), flags(0, 0, 1), out)  # env 1 terminated, env 3 truncated
    assert tl.traj_ids.tolist() == [0, 5, 2, 6, 4]
    assert out.tolist() == [2, 2, 2]  # the finishing step is counted in the step that ends it
    assert tl.step_count.tolist() == [1, 0, 2, 0, 1]  # the finished ones start over
    assert tl.completed_trajectories == 2
    assert not tl.any_reset and not tl.needs_reset.any()  # their worker already reset them
    tl.stepped(0, 5, flags(1, 0, 0, 0, 1), flags(0, 0, 0, 0, 0))
    tl.stepped(0, 5, flags(0, 1, 0, 0, 0), flags(0, 0, 0, 0, 0))
    assert tl.traj_ids.tolist() == [7, 9, 2, 6, 8]
    assert tl.completed_trajectories == 5
    assert len(set(tl.traj_ids.tolist()) | {0, 1, 3, 4, 5}) == 10  # no id ever given twice
    assert tl.env_steps == 5 + 3 + 5 + 5


def test_without_reset_when_done_ids_stay_and_the_root_flags_follow_the_last_step():
    tl = started(4, reset_when_done=False)
    out = np.zeros(2, dtype=np.int64)
    tl.stepped(0, 2, flags(1, 0), flags(0, 1), out)
    assert tl.traj_ids.tolist() == [0, 1, 2, 3]
    assert out.tolist() == [1, 1] and tl.step_count.tolist() == [1, 1, 0, 0]
    assert tl.root_flags.tolist() == [  # done, terminated, truncated
        [True, True, False, False],
        [True, False, False, False],
        [False, True, False, False],
    ]
    tl.stepped(0, 2, flags(1, 0), flags(0, 1))
    assert tl.traj_ids.tolist() == [0, 1, 2, 3] and tl.step_count.tolist() == [2, 2, 0, 0]
    tl.stepped(0, 2, flags(0, 0), flags(0, 0))
    assert not tl.root_flags.any()


# --------------------------------------------------------------------------- resets


def done_resets(tl: Timelines, lo: int = 0, hi: int | None = None) -> None:
    """The resets of rows ``lo:hi`` that were asked for, done (as a ``RESET`` command's reply)."""
    hi = tl.num_envs if hi is None else hi
    idx, _ = tl.take_resets(lo, hi)
    tl.resets_done(lo, idx)


def test_request_reset_midway_gives_new_ids_once_the_reset_is_done():
    tl = started(4)
    tl.keep_cut = True
    tl.stepped(0, 4, flags(0, 0, 0, 0), flags(0, 0, 0, 0))
    assert tl.request_reset().tolist() == [0, 1, 2, 3]  # the trajectories the reset cuts
    assert tl.traj_ids.tolist() == [0, 1, 2, 3]  # not before the reset is done
    assert tl.needs_reset.all() and tl.any_reset
    assert tl.request_reset().tolist() == []  # still waiting for their reset: nothing more cut
    done_resets(tl)
    assert tl.traj_ids.tolist() == [4, 5, 6, 7]
    assert tl.step_count.tolist() == [0, 0, 0, 0]
    assert tl.completed_trajectories == 0  # cut, not completed
    assert tl.take_cut().tolist() == [0, 1, 2, 3] and tl.take_cut().tolist() == []


def test_steps_in_flight_when_a_reset_is_asked_for_keep_their_trajectory():
    """A worker in the middle of a run of steps when ``reset()`` comes (MultiAsyncCollector):
    the run's steps belong to the episode they were taken in, counted on from it; the ids
    change when the reset is done, and the trajectory it cuts is the one under way then."""
    tl = started(2)
    tl.keep_cut = True
    tl.stepped(0, 2, flags(0, 0), flags(0, 0))
    tl.request_reset()
    # the run lands: env 0 ends its episode at its 2nd step and begins another
    ids, counts = tl.ran(0, 2, flags(0, 0, 1, 0, 0, 0).reshape(3, 2), np.zeros((3, 2), bool))
    assert ids.tolist() == [[0, 1], [0, 1], [2, 1], [2, 1]]
    assert counts.tolist() == [[1, 1], [2, 2], [0, 3], [1, 4]]
    assert tl.completed_trajectories == 1
    done_resets(tl)
    assert tl.traj_ids.tolist() == [3, 4] and tl.step_count.tolist() == [0, 0]
    assert tl.take_cut().tolist() == [2, 1]  # env 0's new episode and env 1's, cut; not env 0's first


def test_cut_trajectories_are_recorded_only_when_asked_for():
    tl = started(2)
    tl.stepped(0, 2, flags(0, 0), flags(0, 0))
    tl.request_reset()
    done_resets(tl)
    assert tl.traj_ids.tolist() == [2, 3] and tl.take_cut().tolist() == []


def test_request_reset_of_some_rows_leaves_the_others_alone():
    tl = started(4)
    tl.stepped(0, 4, flags(0, 0, 0, 0), flags(0, 0, 0, 0))
    tl.request_reset(lo=1, hi=3)
    assert tl.needs_reset.tolist() == [False, True, True, False]
    assert not tl.wants_reset(0, 1) and tl.wants_reset(0, 2) and not tl.wants_reset(3, 4)
    done_resets(tl, 1, 3)
    assert tl.traj_ids.tolist() == [0, 4, 5, 3]
    assert tl.step_count.tolist() == [1, 0, 0, 1]


def test_a_fresh_timeline_keeps_its_ids_when_asked_to_reset():
    tl = Timelines(3, reset_when_done=True)
    tl.request_reset([7, 8, 9])
    assert tl.traj_ids.tolist() == [0, 1, 2] and tl.ids.next == 3


def test_take_resets_hands_out_rows_from_lo_and_each_seed_once():
    tl = started(6)
    tl.request_reset([40, 41, 42], lo=3, hi=6)
    tl.request_reset(lo=1, hi=2)  # no seed
    idx, seeds = tl.take_resets(0, 3)
    assert idx.tolist() == [1] and seeds is None
    idx, seeds = tl.take_resets(3, 6)
    assert idx.tolist() == [0, 1, 2]  # relative to lo
    assert seeds == [40, 41, 42]
    idx, seeds = tl.take_resets(3, 6)  # not reset yet: asked again, but the seeds are used up
    assert idx.tolist() == [0, 1, 2] and seeds is None


def test_take_resets_gives_none_for_rows_without_a_seed():
    tl = started(4)
    tl.request_reset([5, 6], lo=2, hi=4)
    tl.request_reset(lo=0, hi=2)
    idx, seeds = tl.take_resets(1, 4)
    assert idx.tolist() == [0, 1, 2]
    assert seeds == [None, 5, 6]
    assert tl.take_resets(1, 4)[1] is None


def test_resets_done_clears_the_pending_resets_and_any_reset_once_none_is_left():
    tl = Timelines(4, reset_when_done=False)
    tl.stepped(0, 4, flags(1, 0, 0, 0), flags(0, 0, 0, 1))
    tl.resets_done(0, np.array([0, 1]))
    assert tl.needs_reset.tolist() == [False, False, True, True]
    assert tl.any_reset and not tl.wants_reset(0, 2) and tl.wants_reset(2, 4)
    assert tl.step_count.tolist() == [0, 0, 1, 1]
    assert tl.root_flags[:, 0].tolist() == [False, False, False]  # a reset env is not done
    assert tl.root_flags[:, 3].tolist() == [True, False, True]
    tl.resets_done(2, np.array([1, 0]))
    assert not tl.needs_reset.any() and not tl.any_reset
    assert not tl.wants_reset(0, 4)
    assert not tl.root_flags.any()


# --------------------------------------------------------------------------- checkpoints


def test_state_dict_round_trip_never_reuses_an_id():
    tl = started(3)
    tl.stepped(0, 3, flags(1, 1, 0), flags(0, 0, 0))
    state = tl.state_dict()
    assert state == {"next_traj_id": 5, "completed_trajectories": 2}
    fresh = Timelines(3, reset_when_done=True)  # ids 0, 1, 2 taken
    fresh.load_state_dict(state)
    assert fresh.needs_reset.all() and fresh.any_reset
    done_resets(fresh)
    assert fresh.traj_ids.tolist() == [5, 6, 7]
    assert fresh.completed_trajectories == 2  # the new ids were not completions


def test_loading_an_older_state_still_continues_after_every_id_handed_out():
    tl = started(2)
    old = tl.state_dict()
    for _ in range(4):
        tl.stepped(0, 2, flags(1, 1), flags(0, 0))
    assert tl.traj_ids.tolist() == [8, 9] and tl.completed_trajectories == 8
    tl.load_state_dict(old)
    assert tl.completed_trajectories == 0 and tl.needs_reset.all()
    done_resets(tl)
    assert tl.traj_ids.tolist() == [10, 11]
    assert tl.step_count.tolist() == [0, 0]

"""Resets, seeds and checkpoints asked for while a collector collects: no trajectory id ever
spans two episodes, a trajectory cut by a reset is never delivered as whole, and a checkpoint
holds exactly what was not delivered yet."""

from __future__ import annotations

import functools
import time
import traceback

import pytest
import torch
from tensordict.nn import TensorDictModule

from support.checks import check_batch, check_whole_episode, rows
from support.envs import IntObsEnv
from support.episode_envs import EpisodeEnv
from support.plain_modules import ArgmaxMLP
from support.variants import VARIANTS
from support.weights import linear

FPB = 20


def envs(variant, **kwargs) -> list:
    """One ``EpisodeEnv`` per env of ``variant``, each with its own tag."""
    return [functools.partial(EpisodeEnv, tag=k, **kwargs) for k in range(variant.num_envs)]


class EpisodeBook:
    """Every frame seen, by trajectory id: what episode of which env it belongs to."""

    def __init__(self):
        self.episode_of: dict[int, tuple[int, int]] = {}

    def add(self, ids: torch.Tensor, obs: torch.Tensor) -> None:
        for tid, o in zip(ids.reshape(-1).tolist(), obs.reshape(-1, 3).tolist()):
            if tid < 0:
                continue
            episode = (int(o[2]), int(o[1]))  # (env tag, episode number)
            assert self.episode_of.setdefault(tid, episode) == episode, (
                f"trajectory {tid} spans two episodes: {self.episode_of[tid]} and {episode}")


def check_no_glue(batch, book: EpisodeBook, step_count=None) -> None:
    """Within a row, frames of one id follow each other; an id changes only after a done step."""
    check_batch(batch, step_count=step_count)
    b = rows(batch)
    valid = b.get(("collector", "mask"), torch.ones(b.shape, dtype=torch.bool))
    book.add(b["collector", "traj_ids"][valid], b["observation"][valid])


def make_policy(kind: str):
    """Random actions (the runs of steps workers take alone), or a policy that reads the
    observation: central, or in the workers of the ``MultiAsync-process`` variant."""
    if kind == "random":
        return None
    return TensorDictModule(ArgmaxMLP(3, 2), in_keys=["observation"], out_keys=["action"])


POLICIES = ["random", "reads the observation"]


def trajectories(batch, traj_format: str) -> list:
    if traj_format == "cat":
        ends = torch.nonzero(batch["next", "done"][:, 0]).flatten().tolist()
        return [batch[a + 1 if i else 0: b + 1] for i, (a, b) in enumerate(zip([-1, *ends], ends))]
    return [batch[i][batch["collector", "mask"][i]] for i in range(batch.shape[0])]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("action", ["reset", "set_seed", "load_state_dict"])
def test_a_reset_mid_collection_never_glues_two_episodes_under_one_id(variant, action, policy):
    """MultiAsyncCollector's random steps used to go in runs that a reset() landed in the
    middle of: the run's steps were booked under the new id, and the next episode too. (A
    policy that reads the observation goes in runs too where the workers run it.)"""
    book = EpisodeBook()
    with variant(envs(variant), make_policy(policy), frames_per_batch=FPB, total_frames=40 * FPB,
                 max_frames_per_traj=7) as collector:
        if variant.processes:
            assert collector.policy_in_workers is (variant.in_workers and policy != "random")
        for i, batch in enumerate(collector):
            check_no_glue(batch, book, step_count=7)
            if i % 2:
                if action == "reset":
                    collector.reset()
                elif action == "set_seed":
                    collector.set_seed(i)
                else:
                    collector.load_state_dict(collector.state_dict())
    assert len(book.episode_of) > 40


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("traj_format", ["padded", "cat"])
def test_trajs_per_batch_never_delivers_a_trajectory_a_reset_cut(variant, traj_format, policy):
    seen = set()
    with variant(envs(variant, length=6), make_policy(policy), frames_per_batch=FPB, total_frames=60 * FPB,
                 trajs_per_batch=2, traj_format=traj_format) as collector:
        if variant.processes:
            assert collector.policy_in_workers is (variant.in_workers and policy != "random")
        for i, batch in enumerate(collector):
            for traj in trajectories(batch, traj_format):
                check_whole_episode(traj)
                tid = int(traj["collector", "traj_ids"][0])
                assert tid not in seen, "a trajectory delivered twice"
                seen.add(tid)
            if i % 2:
                collector.reset()
    assert len(seen) > 20


def test_trajs_per_batch_never_delivers_a_trajectory_whose_beginning_a_checkpoint_load_dropped(variant):
    """``load_state_dict`` restarts the envs and drops the trajectories under way. A collector
    that collects ahead still holds batches with their ends: those must be dropped too, not
    delivered as whole trajectories that begin mid-episode (they were)."""
    seen = set()
    with variant(envs(variant, length=6), None, frames_per_batch=FPB, total_frames=36 * FPB,
                 trajs_per_batch=2, traj_format="cat") as collector:
        for i, batch in enumerate(collector):
            for traj in trajectories(batch, "cat"):
                check_whole_episode(traj)
                tid = int(traj["collector", "traj_ids"][0])
                assert tid not in seen, "a trajectory delivered twice"
                seen.add(tid)
            if i % 2:
                time.sleep(0.05)  # (a collector that collects ahead fills its next batches meanwhile)
                collector.load_state_dict(collector.state_dict())
    assert len(seen) > 20


@pytest.mark.parametrize("policy", POLICIES)
def test_a_checkpoint_with_trajs_per_batch_holds_exactly_what_was_not_delivered(variant, tmp_path, policy):
    """Complete trajectories waiting in the collector are in the checkpoint, delivered first
    by the collector restored from it; frames of trajectories under way are not counted."""
    kwargs = dict(frames_per_batch=FPB * 5, total_frames=FPB * 20, trajs_per_batch=1)
    with variant(envs(variant, length=4, step_s=0), make_policy(policy), **kwargs) as first:
        it = iter(first)
        delivered = [next(it) for _ in range(2)]
        state = first.state_dict()
        held = first._assembler.ready
        pending = first._assembler.pending_frames
        collected = first.statistics().frames
    assert held > 0, "nothing waited: the case tests nothing"
    assert state["frames"] == collected - pending
    assert sum(state["trajectories"]["lengths"]) == state["frames"] - sum(b.numel() for b in delivered)
    torch.save(state, tmp_path / "ckpt.pt")
    state = torch.load(tmp_path / "ckpt.pt", weights_only=True)  # plain tensors: the safe loader reads it
    with variant(envs(variant, length=4, step_s=0), make_policy(policy), **kwargs) as second:
        second.load_state_dict(state)
        assert second.statistics().frames == state["frames"]
        it = iter(second)
        restored = [next(it) for _ in range(held)]
        lengths = state["trajectories"]["lengths"]
        assert [b.numel() for b in restored] == lengths, "the held trajectories, in their order, come first"
        for traj in restored:
            check_whole_episode(traj[0] if traj.ndim > 1 else traj)
        assert second.statistics().frames == state["frames"]  # delivering them collected nothing new
        rest = list(it)
        end = second.statistics().frames
    assert rest, "the restored collector collects on"
    assert kwargs["total_frames"] <= end < kwargs["total_frames"] + kwargs["frames_per_batch"]
    # every frame delivered here was counted here (the held ones by the first collector)
    assert sum(b.numel() for b in [*restored, *rest]) <= end - sum(b.numel() for b in delivered)


def test_a_checkpoint_whose_policy_does_not_fit_is_an_error_of_load_state_dict(variant):
    """The weights of another policy in a checkpoint: the error names ``load_state_dict``, the
    call the user made (not ``update_policy_weights_``, which loads them underneath), says
    what does not fit, and nothing is loaded."""
    with variant(IntObsEnv, linear(0.0), frames_per_batch=FPB, total_frames=-1) as collector:
        good = collector.state_dict()
        weights = good["policy_state_dict"]
        cases = [
            ({**weights, "module.weight": torch.zeros(2, 3)}, ValueError,
             r"'module.weight' has shape \(2, 3\), the collector's policy has \(1, 3\)"),
            ({"module.weight": weights["module.weight"], "net.bias": torch.zeros(1)}, KeyError,
             r"missing \['module.bias'\]; unexpected \['net.bias'\]"),
            (3, TypeError, "expected a module, a TensorDict of parameters, a state dict or None; got int"),
        ]
        for policy_state, error, what in cases:
            with pytest.raises(error, match=f"{variant.cls.__name__}.load_state_dict: the checkpoint's "
                                            f"'policy_state_dict' does not fit this collector's policy: {what}"
                                            r"\. Nothing was loaded") as info:
                collector.load_state_dict({**good, "policy_state_dict": policy_state})
            shown = "".join(traceback.format_exception(info.value))
            assert "update_policy_weights_" not in shown, shown
        stats = collector.statistics()
        assert stats.latest_policy_version == 0 and stats.frames == 0  # nothing was loaded
        collector.load_state_dict(good)
        assert collector.statistics().latest_policy_version == 1


def test_a_checkpoint_loaded_without_trajs_per_batch_does_not_count_the_trajectories_it_held(variant):
    with variant(envs(variant, length=4, step_s=0), None, frames_per_batch=FPB * 5, total_frames=FPB * 20,
                 trajs_per_batch=1) as first:
        next(iter(first))
        state = first.state_dict()
    held = sum(state["trajectories"]["lengths"])
    with variant(envs(variant, length=4, step_s=0), None, frames_per_batch=FPB * 5,
                 total_frames=FPB * 20) as second:
        second.load_state_dict(state)
        assert second.statistics().frames == state["frames"] - held


def test_trajs_per_batch_warns_once_when_episodes_never_end(variant, monkeypatch):
    from aiocollect._engine.trajectories import TrajectoryAssembler

    monkeypatch.setattr(TrajectoryAssembler, "WARN_BYTES", 2000)
    never_ends = envs(variant, length=10**9, step_s=0)
    with pytest.warns(RuntimeWarning, match="max_frames_per_traj") as warned, \
            variant(never_ends, None, frames_per_batch=FPB, total_frames=8 * FPB, trajs_per_batch=1) as collector:
        assert list(collector) == []  # no episode ever ends: nothing to deliver
    assert len([w for w in warned if "trajs_per_batch" in str(w.message)]) == 1


@pytest.mark.parametrize("variant", [v for v in VARIANTS if not v.coroutine], ids=lambda v: v.name)
def test_without_reset_when_done_the_first_frame_after_a_reset_is_not_done(variant):
    """With ``reset_when_done=False`` an env that finished stays done, and the root flags
    say so until a reset. The frame a reset begins is not done: between batches its root
    flags were copied before the reset landed, and mid-batch (a collector that collects
    ahead) they were read off the step before, which the reset marks truncated."""
    after_reset = 0
    with variant(envs(variant, length=3, step_s=0.0005), None, frames_per_batch=FPB, total_frames=12 * FPB,
                 reset_when_done=False) as collector:
        for i, batch in enumerate(collector):
            for env in rows(batch):
                ids, obs = env["collector", "traj_ids"], env["observation"]
                for t in range(env.shape[0]):
                    if ids[t] < 0:
                        continue
                    root = [bool(env[flag][t, 0]) for flag in ("done", "terminated", "truncated")]
                    if obs[t, 0] == 0:  # (a reset's observation: step 0 of an episode)
                        assert root == [False] * 3, f"the first frame of episode {int(obs[t, 1])} says done"
                        after_reset += i > 0 or t > 0
                    elif t > 0:
                        assert root[0] == bool(env["next", "done"][t - 1, 0])
            if i % 2 == 0:
                collector.reset()
    assert after_reset > 0, "no reset landed: the case tests nothing"

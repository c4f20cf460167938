"""A recurrent TorchRL policy keeps its state from step to step, in every local collector.

TorchRL's ``LSTMModule`` reads its state from ``recurrent_state_h``/``_c`` (observation keys
the env's ``TensorDictPrimer`` adds) and writes the new one under ``("next", ...)``;
TorchRL's collectors carry it to the next step (``step_mdp``), and a reset starts from the
primer's zeros (``is_init``). The check that matters: running the LSTM over each collected
row in recurrent mode, from the row's first state, gives the embeddings the collector's policy
computed step by step (with a state that is not carried, each step starts from zeros and they
differ by about 0.2).
"""

from __future__ import annotations

import functools
import warnings

import pytest
import torch

import aiocollect
from support.checks import check_batch, layout
from support.recurrent import lstm_actor, recurrent_cartpole
from support.torchrl_marks import QUIET_TORCHRL

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    pytest.importorskip("torchrl")
    from torchrl.modules import set_recurrent_mode

pytestmark = QUIET_TORCHRL
STATE = ("recurrent_state_h", "recurrent_state_c")


def layouts():
    return {
        "Collector": lambda: aiocollect.Collector([recurrent_cartpole] * 2, ACTOR, **KW),
        "MultiSyncCollector": lambda: aiocollect.MultiSyncCollector([recurrent_cartpole] * 2, ACTOR, **KW),
        "MultiAsyncCollector": lambda: aiocollect.MultiAsyncCollector([recurrent_cartpole] * 2, ACTOR, **KW),
    }


torch.manual_seed(0)
LSTM, ACTOR = lstm_actor()
KW = dict(frames_per_batch=64, total_frames=192)


async def collect(name: str, face: str) -> list:
    if face == "sync":
        with layouts()[name]() as collector:
            return list(collector)
    async with layouts()[name]() as collector:
        return [batch async for batch in collector]


@pytest.mark.parametrize("name", list(layouts()))
@pytest.mark.parametrize("face", ["sync", "async"])
async def test_a_recurrent_policy_gets_its_state_back_at_every_step(name, face):
    batches = await collect(name, face)
    assert len(batches) == 3
    for batch in batches:
        for part in batch.unbind(0) if batch.ndim == 3 else [batch]:  # MultiSync: [workers, envs, T]
            check_batch(part, policy_keys=("action", "embed", "logits", "action_log_prob"))
        rows = batch.reshape(-1, batch.shape[-1])  # one row per env: [envs, T]
        for row in rows.unbind(0):
            ids = row["collector", "traj_ids"]
            same = ids[1:] == ids[:-1]
            for key in STATE:  # carried within a trajectory, zeros where one starts
                assert torch.equal(row[key][1:][same], row["next", key][:-1][same]), key
                assert not row[key][row["is_init"][:, 0]].any(), key
            assert row["is_init"][1:, 0][same].logical_not().all()
        with torch.no_grad(), set_recurrent_mode(True):
            again = LSTM(rows.select("observation", "is_init", *STATE).clone())
        torch.testing.assert_close(again["embed"], rows["embed"], rtol=0, atol=1e-5)
        # the state did change: a policy that starts every step from zeros would pass the checks above
        assert rows["recurrent_state_h"][~rows["is_init"][..., 0]].abs().sum() > 0


@pytest.mark.parametrize("name", ["MultiSyncCollector", "MultiAsyncCollector"])
def test_auto_register_policy_transforms_in_the_workers_gives_torchrl_s_keys(name):
    """TorchRL's ``auto_register_policy_transforms=True`` in the worker collectors: each worker's
    TorchRL env gets the LSTM's ``InitTracker`` and ``TensorDictPrimer`` where it is built, and
    the batches have TorchRL's keys, shapes and dtypes (``test_torchrl_keywords_round2``: in
    ``Collector``)."""
    from torchrl import collectors as torchrl_collectors
    from torchrl.envs import GymEnv

    _, actor = lstm_actor()
    kwargs = dict(frames_per_batch=20, total_frames=20, auto_register_policy_transforms=True)
    if name == "MultiSyncCollector":
        kwargs["cat_results"] = "stack"
    cartpole = functools.partial(GymEnv, "CartPole-v1", categorical_action_encoding=True)
    layouts = []
    for make in (getattr(torchrl_collectors, name), getattr(aiocollect, name)):
        collector = make([cartpole] * 2, actor, **kwargs)
        try:
            layouts.append(layout(next(iter(collector))))
        finally:
            collector.shutdown()
    assert layouts[1] == layouts[0] and "is_init" in layouts[1] and "recurrent_state_c" in layouts[1]

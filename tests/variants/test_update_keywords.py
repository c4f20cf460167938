"""TorchRL's keyword spellings of ``update_policy_weights_`` (``weights=``, ``policy=``,
``model_id="policy"``, ``weights_dict={"policy": ...}``) send the weights as the positional
form does; another model id, or the weights given twice, is a ``ValueError`` naming them."""

from __future__ import annotations

import pytest
from tensordict import TensorDict

from aiocollect import Collector, MultiSyncCollector
from support.envs import IntObsEnv
from support.weights import check_versions, linear

SPELLINGS = [
    lambda c, w: c.update_policy_weights_(weights=TensorDict.from_module(w), model_id="policy"),
    lambda c, w: c.update_policy_weights_(policy=w),
    lambda c, w: c.update_policy_weights_(weights_dict={"policy": w.state_dict()}),
]


@pytest.mark.parametrize("make", [
    lambda: Collector([IntObsEnv] * 2, linear(0.0), frames_per_batch=20, total_frames=-1),
    lambda: MultiSyncCollector([[IntObsEnv] * 2] * 2, linear(0.0), frames_per_batch=40, total_frames=-1),
], ids=["Collector", "MultiSync"])
def test_torchrl_keyword_spellings_send_the_weights(make):
    with make() as collector:
        for version, send in enumerate(SPELLINGS, start=1):
            assert send(collector, linear(float(version))) == version
            batch = collector.rollout()
            while (batch["collector", "policy_version"] < version).any():
                batch = collector.rollout()
            assert check_versions(batch) == {version}  # each action computed with weights all equal to it


async def test_the_async_twin_takes_them_too():
    async with Collector([IntObsEnv] * 2, linear(0.0), frames_per_batch=20, total_frames=-1) as collector:
        assert await collector.update_policy_weights(weights=TensorDict.from_module(linear(1.0))) == 1


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(weights=linear(1.0), model_id="critic"), "model_id='critic'"),
    (dict(weights=linear(1.0), policy=linear(1.0)), "weights and policy were both given"),
    (dict(weights_dict={"critic": linear(1.0)}), r"weights_dict has \['critic'\]"),
    (dict(weights_dict={"policy": linear(1.0)}, model_id="policy"), "model_id or weights_dict"),
])
def test_conflicting_or_foreign_spellings_are_refused(kwargs, match):
    with Collector([IntObsEnv] * 2, linear(0.0), frames_per_batch=20, total_frames=-1) as collector:
        with pytest.raises(ValueError, match=match):
            collector.update_policy_weights_(**kwargs)
        assert (collector.rollout()["action"] == 0).all()  # the weights are still version 0's
        assert collector.update_policy_weights_() == 1  # the refused call made no version

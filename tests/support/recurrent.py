"""A recurrent TorchRL policy (an LSTM) and the env it needs: CartPole with an ``InitTracker``
and the LSTM's ``TensorDictPrimer``, as TorchRL's recurrent-policy tutorials set them up.
Module-level, so that worker processes unpickle the env factory without importing tests."""

from __future__ import annotations

HIDDEN = 8


def lstm_actor():
    """``(lstm, actor)``: an ``LSTMModule`` (``observation`` -> ``embed``) under a linear head
    and a categorical ``ProbabilisticActor``."""
    import torch
    from tensordict.nn import TensorDictModule, TensorDictSequential
    from torchrl.modules import LSTMModule, ProbabilisticActor

    lstm = LSTMModule(input_size=4, hidden_size=HIDDEN, in_key="observation", out_key="embed")
    head = TensorDictModule(torch.nn.Linear(HIDDEN, 2), in_keys=["embed"], out_keys=["logits"])
    actor = ProbabilisticActor(TensorDictSequential(lstm, head), in_keys=["logits"],
                               distribution_class=torch.distributions.Categorical, return_log_prob=True)
    return lstm, actor


def recurrent_cartpole():
    from torchrl.envs import GymEnv, InitTracker, TransformedEnv

    env = TransformedEnv(GymEnv("CartPole-v1", categorical_action_encoding=True), InitTracker())
    env.append_transform(lstm_actor()[0].make_tensordict_primer())
    return env

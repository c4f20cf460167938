"""The policy a loaded module becomes: what the collector calls with the observations, and
what travels to the workers.

A trained module often returns more than the action (an actor-critic's ``action, log_prob,
value``, or a dict); ``action_of`` wraps it so that the collector gets the action alone. A
module loaded from a TorchScript or ``torch.export`` file cannot be pickled by cloudpickle, so
its wrapper pickles as the file's bytes and its current weights, and is loaded again on the
other side (``rebuild_policy``).
"""

from __future__ import annotations

from typing import Any


def action_of(module: Any, source: tuple[str, bytes] | None = None) -> Any:
    """``module``, called by the collector with the observation tensor(s): its output is the
    action, or the first element of a tuple it returns (an actor-critic's ``action, log_prob,
    value``), or the ``"action"`` entry of a dict. A ``TensorDictModuleBase``, or a module
    whose ``forward`` takes a TensorDict, is returned as it is (aiocollect calls it so).

    ``source``: ``(format, the file's bytes)`` of a module loaded from a TorchScript or
    ``torch.export`` file, which cloudpickle cannot pickle; the wrapper pickles (and copies)
    as those bytes, loaded again (``rebuild_policy``), so that a collector may send the
    policy to its workers."""
    import inspect

    import torch
    from tensordict.nn import TensorDictModuleBase

    if not isinstance(module, torch.nn.Module) or isinstance(module, TensorDictModuleBase):
        return module
    try:
        params = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):  # a TorchScript method has none
        params = []
    if params in (["tensordict"], ["td"]):
        return module

    class ActionOf(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module):
            super().__init__()
            self.inner = inner

        def forward(self, *observations):
            out = self.inner(*observations)
            if isinstance(out, (tuple, list)) and out:
                return out[0]
            if isinstance(out, dict) and "action" in out:
                return out["action"]
            return out

        def __reduce__(self):
            if source is None:
                return rebuild_policy, ("module", self.inner)
            kind, data = source
            return rebuild_policy, (kind, data, self.inner.state_dict())

    return ActionOf(module)


def rebuild_policy(kind: str, data: Any, state: Any = None) -> Any:
    """A policy of ``action_of`` again, from what its ``__reduce__`` gave (in a copy, or a worker)."""
    import io

    import torch

    if kind == "module":
        return action_of(data)
    if kind == "torchscript":
        module = torch.jit.load(io.BytesIO(data), map_location="cpu")
    else:
        module = torch.export.load(io.BytesIO(data)).module()
    module.load_state_dict(state)
    return action_of(module, (kind, data))

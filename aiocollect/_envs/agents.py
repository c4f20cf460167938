"""Heterogeneous agents: a TorchRL group whose agents have entries of different shapes, lazily
stacked (``HeterogeneousCountingEnv``'s ``"lazy"`` group: agent 0 sees a ``vector`` of 3,
the others of 2, and acts with 3 and 2 numbers).

Each agent alone has entries of a fixed shape, so the engine keeps every agent's entries
apart, under a key of its own: ``("lazy", "_agent_0", "vector")`` holds agent 0's ``vector``
(``agent_key``). Those keys are the engine's only: shared memory, the rollout storage and the
action rows hold them like any other entry; an env's adapter reads and writes them agent by
agent (``agent_td``); and ``stack_agents`` turns them back into the lazily stacked group
TorchRL gives (``td["lazy"]``: a ``LazyStackedTensorDict`` of one TensorDict per agent,
stacked after the batch dims, with the group's entries of the same shape for every agent,
its done flags and rewards, split among them), in a policy's input and in every batch.
``agent_outputs`` does the reverse for what a policy wrote into such a group.
"""

from __future__ import annotations

from typing import Any

from tensordict import LazyStackedTensorDict, TensorDictBase

AGENT = "_agent_"
"""The key part before an agent's index, in the engine's own keys of a heterogeneous group."""


def agent_key(group: tuple, i: int, leaf: tuple) -> tuple:
    """The engine's key of agent ``i``'s ``leaf`` in ``group``."""
    return (*group, f"{AGENT}{i}", *leaf)


def _agent_part(key: Any) -> int | None:
    """Where in ``key`` an agent part is, or ``None``."""
    if isinstance(key, str):
        return None
    for j, part in enumerate(key):
        if part.startswith(AGENT) and part[len(AGENT):].isdigit():
            return j
    return None


def has_agents(keys: Any) -> bool:
    """Whether any of ``keys`` is an agent's own (a heterogeneous group's entry)."""
    return any(_agent_part(k) is not None for k in keys)


def agent_td(group: TensorDictBase, i: int, batch_dims: int) -> TensorDictBase:
    """Agent ``i``'s TensorDict in ``group`` (stacked over agents after ``batch_dims`` dims)."""
    if isinstance(group, LazyStackedTensorDict) and group.stack_dim == batch_dims:
        return group.tensordicts[i]
    return group[(slice(None),) * batch_dims + (i,)]


def stack_agents(td: TensorDictBase) -> TensorDictBase:
    """``td`` with each heterogeneous group lazily stacked as TorchRL lays it out (see the
    module docstring); ``td`` itself when it has none. Works in place on ``td``."""
    groups: dict[tuple, int] = {}
    for key in td.keys(include_nested=True, leaves_only=True):
        j = _agent_part(key)
        if j is not None:
            group = tuple(key[:j])
            groups[group] = max(groups.get(group, 0), int(key[j][len(AGENT):]) + 1)
    dims = td.batch_dims
    for group, n in sorted(groups.items(), key=lambda g: -len(g[0])):  # (a group's inner ones first)
        sub = td.get(group)
        names = [f"{AGENT}{i}" for i in range(n)]
        agents = [sub.get(name) for name in names]
        shared = sub.exclude(*names)
        if len(list(shared.keys())):  # (entries of one shape for all: the agent dim after the batch's)
            shared.batch_size = [*sub.batch_size, n]
            for agent, part in zip(agents, shared.unbind(dims)):
                agent.update(part)
        td.set(group, LazyStackedTensorDict.lazy_stack(agents, dim=dims))
    return td


def agent_outputs(td: TensorDictBase, groups: set) -> dict:
    """Every leaf of ``td`` under its key, the leaves of each heterogeneous group of ``groups``
    under each agent's own key (what a policy wrote there: ``agent_key``)."""
    out: dict = {}
    dims = td.batch_dims
    for group in groups:
        sub = td.get(group, None)
        if not isinstance(sub, LazyStackedTensorDict) or sub.stack_dim != dims:
            continue
        for i, agent in enumerate(sub.tensordicts):
            for leaf in agent.keys(include_nested=True, leaves_only=True):
                path = (leaf,) if isinstance(leaf, str) else tuple(leaf)
                out[agent_key(group, i, path)] = agent.get(leaf)
    for key in td.keys(include_nested=True, leaves_only=True):
        path = (key,) if isinstance(key, str) else tuple(key)
        if not any(path[: len(g)] == g for g in groups):
            out[key] = td.get(key)
    return out


def agent_groups(keys: Any) -> set:
    """The heterogeneous groups that ``keys`` (an env's observation keys) hold agents of."""
    out = set()
    for key in keys:
        j = _agent_part(key)
        if j is not None:
            out.add(tuple(key[:j]))
    return out

"""The batch invariants every collector keeps: TorchRL's layout, trajectory ids, continuity."""

from __future__ import annotations

import torch


def leaf_keys(td, prefix=()):
    return sorted(
        (k if isinstance(k, tuple) else (k,))
        for k in td.keys(include_nested=True, leaves_only=True)
    )


def layout(batch) -> dict:
    """Each leaf's ``(shape, dtype)``, by key, less aiocollect's one extra key
    (``("collector", "policy_version")``): what a batch must share with TorchRL's."""
    return {k: (tuple(v.shape), v.dtype) for k, v in batch.items(True, True) if k != ("collector", "policy_version")}


def obs_keys_of(td, policy_keys=("action",)):
    skip = {"done", "terminated", "truncated", "step_count", "collector", "next", *policy_keys}
    return [k for k in td.keys(include_nested=True, leaves_only=True)
            if (k if isinstance(k, str) else k[0]) not in skip]


def rows(td):
    """Any batch (``[T]``, ``[N, T]``, ``[W, E, T]``) as ``[rows, T]``: one row per env."""
    if td.ndim == 1:
        return td.unsqueeze(0)
    if td.ndim == 2:
        return td
    flat = td.clone(recurse=False)
    flat.names = [None] * flat.ndim
    return flat.reshape(-1, td.shape[-1])


def check_batch(td, *, reset_when_done=True, step_count=None, policy_keys=("action",)):
    """Assert TorchRL's layout and aiocollect's invariants on one batch ``[T]`` or ``[N, T]``."""
    assert td.names[-1] == "time"
    b = rows(td)
    n, T = b.shape
    done = b["next", "done"][..., 0]
    term = b["next", "terminated"][..., 0]
    # (a TorchRL env without "truncated" has none in its batches, as in TorchRL's)
    trunc = b.get(("next", "truncated"), torch.zeros_like(b["next", "done"]))[..., 0]
    assert b["next", "done"].dtype == torch.bool and b["next", "done"].shape == (n, T, 1)
    assert b["next", "reward"].dtype == torch.float32 and b["next", "reward"].shape == (n, T, 1)
    assert torch.equal(done, term | trunc)
    for flag in ("done", "terminated", *(["truncated"] if ("next", "truncated") in b.keys(True) else [])):
        assert b[flag].shape == (n, T, 1)
        if reset_when_done:
            assert not b[flag].any(), f"root {flag} set although envs reset when done"
    ids = b["collector", "traj_ids"]
    assert ids.dtype == torch.int64 and ids.shape == (n, T)
    for key in policy_keys:
        assert key in b.keys(True)
    obs = obs_keys_of(b, policy_keys)
    assert obs, "no observation keys"
    valid = b.get(("collector", "mask"), torch.ones(n, T, dtype=torch.bool))
    versions = b["collector", "policy_version"]
    assert versions.dtype == torch.int64 and versions.shape == (n, T)
    assert (versions[valid] >= 0).all() and (versions[~valid] == -1).all()
    # a policy version never goes back in time within an env's row
    for i in range(n):
        row = versions[i][valid[i]]
        assert (row[1:] >= row[:-1]).all(), row
    for i in range(n):
        for t in range(T - 1):
            if not (valid[i, t] and valid[i, t + 1]):
                continue
            if not done[i, t]:
                assert ids[i, t] == ids[i, t + 1], (i, t)
                for k in obs:
                    nk = ("next", *(k if isinstance(k, tuple) else (k,)))
                    assert torch.equal(b[nk][i, t], b[k][i, t + 1]), (k, i, t)
                if step_count:
                    assert b["next", "step_count"][i, t] == b["step_count"][i, t + 1]
            elif reset_when_done:
                assert ids[i, t + 1] != ids[i, t], (i, t)
                assert not (ids[:, : t + 1] == ids[i, t + 1]).any(), "trajectory id reused"
                if step_count:
                    assert b["step_count"][i, t + 1] == 0
    # rows never share a trajectory
    row_ids = [set(ids[i][valid[i]].tolist()) for i in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            assert not row_ids[i] & row_ids[j], "two envs share a trajectory id"
    if step_count:
        sc, nsc = b["step_count"][..., 0], b["next", "step_count"][..., 0]
        assert torch.equal((nsc - sc)[valid], torch.ones_like(sc)[valid])
        assert (nsc[valid] <= step_count).all()
        assert torch.equal(trunc[valid] | term[valid], done[valid])
        hit = (nsc == step_count) & valid
        assert trunc[hit].all() or (term | trunc)[hit].all()


def check_continuity(prev, cur):
    """The first frame of ``cur`` continues the last one of ``prev`` unless it was done."""
    p, c = rows(prev), rows(cur)
    obs = obs_keys_of(c)
    for i in range(p.shape[0]):
        last_id, first_id = p["collector", "traj_ids"][i, -1], c["collector", "traj_ids"][i, 0]
        if p["next", "done"][i, -1, 0]:
            assert first_id != last_id
            assert first_id > p["collector", "traj_ids"].max() or first_id not in p["collector", "traj_ids"]
        else:
            assert first_id == last_id
            for k in obs:
                nk = ("next", *(k if isinstance(k, tuple) else (k,)))
                assert torch.equal(p[nk][i, -1], c[k][i, 0])


def check_whole_episode(traj) -> None:
    """A trajectory ``trajs_per_batch`` delivered from ``support.episode_envs.EpisodeEnv``: one
    episode, its steps from 0 up to the env's own end (never one a reset cut)."""
    obs = traj["observation"]
    assert obs[:, 1].unique().numel() == 1 and obs[:, 2].unique().numel() == 1, "two episodes in one trajectory"
    assert torch.equal(obs[:, 0], torch.arange(len(traj), dtype=obs.dtype)), f"not whole: steps {obs[:, 0].tolist()}"
    assert traj["next", "terminated"][-1, 0], "a trajectory cut by a reset was delivered as whole"
    assert torch.equal(traj["next", "observation"][:-1], obs[1:])

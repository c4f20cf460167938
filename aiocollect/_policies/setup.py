"""The collector's side of a policy: the module it acts with, runners, versioned weights, state.

Every collector calls its policy in the main process (envs may live elsewhere), so the
same ``PolicySetup`` serves the in-process collector and the multi-worker ones. What the
policy object is depends on when the collector collects:

* ``Collector`` (``share=True``) collects only while the user waits for a batch, so it
  acts with **the user's module itself**, as TorchRL's ``Collector`` does: an optimiser
  step reaches the next batch with no ``update_policy_weights_``, and the step is a new
  policy version (``FollowChannel`` sees it before the next policy call). With a
  ``policy_device`` the module's tensors are not all on, the collector runs a copy there
  that follows the module the same way.
* the worker collectors collect *while* the user trains, so they run **their own copy**
  (on ``policy_device``): a trainer that goes on optimising the object it passed never
  changes the weights under a running collection; new weights reach the copy only
  through ``update_policy_weights_``, whole and versioned (``CopyChannel`` warns once if
  that never happens while the user's module changes).

Without a ``policy_device``, a module whose tensors all sit on one GPU runs there (as in
TorchRL): its inputs are moved to it and its outputs back.

**CUDA streams.** The collector's own copy of a module on a GPU gets a stream of its own:
its calls, the moves of its inputs and outputs, and the loads of new weights are queued
there, so the one wait per policy call waits for the policy's work only, never for a
trainer's kernels queued on the default stream, and training overlaps collection (whichever
thread loads, the load is ordered with the calls). A policy that *is* the user's module (a
``Collector`` sharing it) stays on the current stream, ordered after the user's in-place
changes to its weights.

Then ``runner`` calls the policy batched; ``random_runner`` draws random actions for
``init_random_frames``; ``publish()`` snapshots whatever ``update_policy_weights_`` was
given and returns the new version, which the engine loads before its next policy call.
"""

from __future__ import annotations

import copy
import logging
import warnings
from typing import Any

import anyio
import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import InteractionType, TensorDictModule, TensorDictModuleBase, set_interaction_type
from tensordict.utils import unravel_key
from torch.nn.parameter import is_lazy

from .._envs.keyed import KeyedActions
from .._envs.spaces import nest
from .._errors import PolicyKeyError
from .array import ArrayPolicy
from .board_channel import ArrayBoardChannel, BoardChannel
from .graphs import CudaGraphs, cudagraph_warmup
from .random import RandomPolicy, SpecRandomPolicy, is_torchrl_random
from .runner import PolicyRunner, RandomActions
from .weights import CopyChannel, FollowChannel, TorchWeights, WeightsChannel, tensor_state
from .weights_board import WeightsBoard

logger = logging.getLogger("aiocollect")


def cuda_graphs_for(value: Any, policy: Any, device: Any, compile_policy: Any = None,
                    stacklevel: int = 3) -> int | None:
    """``cudagraph_policy`` checked against the policy, before anything starts: the number of
    eager calls per row count before its capture, or ``None`` (off). A policy that has no
    torch calls to capture (random actions, a JAX policy, which XLA compiles) is a
    ``ValueError``; a torch policy that runs on the CPU is warned about and runs as it is,
    as TorchRL's ``CudaGraphModule`` does there. A ``compile_policy`` whose mode captures CUDA
    graphs itself (``"reduce-overhead"``, ``"max-autotune"``) is a ``ValueError`` too.
    ``stacklevel``: the warning's (3: the caller of this function's caller)."""
    warmup = cudagraph_warmup(value)
    if warmup is None:
        return None
    if isinstance(compile_policy, dict) and (compile_policy.get("mode") in ("reduce-overhead", "max-autotune")
                                             or (compile_policy.get("options") or {}).get("triton.cudagraphs")):
        raise ValueError(f"cudagraph_policy and compile_policy={compile_policy!r}: that torch.compile mode "
                         "captures CUDA graphs itself, and a graph cannot be captured inside another; "
                         "use one of them (compile_policy={'mode': 'default'} works with cudagraph_policy).")
    if policy is None or isinstance(policy, RandomPolicy) or is_torchrl_random(policy):
        raise ValueError("cudagraph_policy: the policy draws random actions (policy=None or a random "
                         "policy): there are no policy calls to capture; remove cudagraph_policy.")
    if isinstance(policy, ArrayPolicy):
        raise ValueError(f"cudagraph_policy: a {type(policy).__name__} is compiled by its own framework "
                         "(XLA launches a JAX program's kernels together already); remove cudagraph_policy.")
    device = policy_device_of(policy, device)
    if device is None or device.type != "cuda":
        warnings.warn(f"cudagraph_policy: the policy runs on {device or 'the CPU'}, and CUDA graphs need a "
                      "CUDA device (policy_device='cuda', or a module on the GPU); it runs without them.",
                      UserWarning, stacklevel=stacklevel)
        return None
    named = value.get("device") if isinstance(value, dict) else None
    if named is not None:
        named = torch.device(named)
        if named.type != device.type or (None not in (named.index, device.index) and named.index != device.index):
            raise ValueError(f"cudagraph_policy: device={str(named)!r}, but the policy runs on {device}; "
                             "remove 'device' (graphs are captured where the policy runs).")
    return warmup


def check_policy(policy: Any) -> None:
    if policy is not None and not callable(policy):
        raise TypeError(
            f"policy must be a TensorDictModuleBase, an nn.Module, a callable taking the "
            f"observation tensor, or None (random actions); got {type(policy).__name__}."
        )


# --------------------------------------------------------------------------- the policy's keys


def _keys(keys: Any) -> list | None:
    """A policy's declared ``in_keys`` / ``out_keys``, unravelled as observation keys are
    (``("observation",)`` is ``"observation"``); ``None`` where it declares none."""
    if keys is None or isinstance(keys, (str, tuple)):
        return None if keys is None else [unravel_key(keys)]
    try:
        return [unravel_key(k) for k in keys]
    except Exception:  # noqa: BLE001 - keys that are not keys: the call will say what is wrong
        return None


def _writes_its_out_keys(policy: Any) -> bool:
    """Whether ``policy`` writes exactly its ``out_keys``, so they say without a call whether
    it writes an ``"action"``: a ``JaxPolicy`` (``ArrayPolicy``), or a plain ``TensorDictModule``
    (tensordict's own ``forward``, no hooks that could write more)."""
    if isinstance(policy, ArrayPolicy):
        return True
    return type(policy) is TensorDictModule and not policy._forward_hooks and not policy._forward_pre_hooks


def in_keys_error(in_keys: list, missing: list, obs_keys: list, *, called: bool) -> PolicyKeyError:
    """``policy``'s ``in_keys`` name ``missing``, which no env gives: say which keys the batch
    has, and what to write instead."""
    it = "it" if len(missing) == 1 else "them"
    fails = f", and the policy fails without {it}" if called else ""
    example = ""
    if len(missing) == 1 and len(obs_keys) == 1 and obs_keys[0] not in in_keys:
        example = f" (in_keys={[obs_keys[0] if k == missing[0] else k for k in in_keys]!r})"
    return PolicyKeyError(
        f"policy: in_keys {in_keys!r}: the envs give no {', '.join(repr(k) for k in missing)} (the batch's "
        f"observation keys are {obs_keys!r}){fails}. Set the policy's in_keys to the observation keys it "
        f"reads{example}."
    )


def out_keys_error(out_keys: list, written: list | None = None,
                   action_keys: tuple = ("action",)) -> PolicyKeyError:
    """``policy`` writes no ``"action"`` (or not every action key of an env with several):
    say what it writes and how to name its action."""
    what = f"its out_keys are {out_keys!r}" if written is None else \
        f"it wrote {written!r} (its out_keys are {out_keys!r})"
    if tuple(action_keys) != ("action",):
        missing = [k for k in action_keys if k not in (written if written is not None else out_keys)]
        return PolicyKeyError(
            f"policy: {what}, with no {', '.join(repr(k) for k in missing)}: the env takes its actions under "
            f"{list(action_keys)!r}, and the collector steps it with the policy's outputs under those keys. "
            "Write each of them (a TensorDictModule's out_keys)."
        )
    example = " (out_keys=['action'])" if len(out_keys) == 1 else ""
    return PolicyKeyError(
        f"policy: {what}, with no 'action': the collector steps the envs with the policy's 'action' "
        f"output. Name the output that is the action 'action' in out_keys{example}."
    )


def _probe(policy: TensorDictModuleBase, obs_leaves: list, device: torch.device | None,
           exploration_type: InteractionType) -> Any:
    """``policy`` called as the collector calls it, on a TensorDict of zeros shaped as one
    env's observations: what it returns."""
    obs = {leaf.key: torch.from_numpy(np.zeros((1, *leaf.shape), dtype=leaf.dtype)) for leaf in obs_leaves}
    td = TensorDict(nest(obs), batch_size=[1], device=device)
    with torch.no_grad(), set_interaction_type(exploration_type):
        result = policy(td)
    return td if result is None else result


def check_policy_keys(policy: Any, obs_keys: list, obs_leaves: list | None, device: torch.device | None,
                      exploration_type: InteractionType, action_keys: tuple = ("action",)) -> None:
    """Before collecting (for a worker collector, before any process starts): a policy that
    declares its keys reads observations the envs give and writes an ``"action"``.

    What its keys alone settle is checked without a call: a ``JaxPolicy`` or a plain
    ``TensorDictModule`` without ``"action"`` in ``out_keys``, a ``JaxPolicy`` reading a key
    the envs do not give (it is called with exactly its ``in_keys``). Any other
    ``TensorDictModuleBase`` whose keys say it may fail (an ``in_keys`` entry the envs do not
    give, which a module with ``strict=False`` gets as ``None``, or no ``"action"`` among
    its ``out_keys``, which a module of its own may still write) is called **once**, on
    zeros shaped as one env's observations, and the error raised if that call fails
    without its inputs or writes no ``"action"``. A policy whose keys fit is never called
    here.

    Raises:
        PolicyKeyError: naming the policy's keys, the observation keys and the fix.
    """
    if isinstance(policy, RandomPolicy) or not isinstance(policy, (TensorDictModuleBase, ArrayPolicy)):
        return
    in_keys, out_keys = _keys(getattr(policy, "in_keys", None)), _keys(getattr(policy, "out_keys", None))
    obs_keys = [unravel_key(k) for k in obs_keys]
    if out_keys is not None and _writes_its_out_keys(policy) and any(k not in out_keys for k in action_keys):
        raise out_keys_error(out_keys, action_keys=action_keys)
    missing = [k for k in in_keys or () if k not in obs_keys]
    if missing and isinstance(policy, ArrayPolicy):
        raise in_keys_error(in_keys or [], missing, obs_keys, called=False)
    if isinstance(policy, ArrayPolicy) or obs_leaves is None \
            or not (missing or (out_keys is not None and any(k not in out_keys for k in action_keys))):
        return
    try:
        result = _probe(policy, obs_leaves, device, exploration_type)
    except Exception as exc:
        if missing:
            raise in_keys_error(in_keys or [], missing, obs_keys, called=True) from exc
        return  # (a call on zeros failed: the first call on real observations will say what is wrong)
    if out_keys is not None and isinstance(result, TensorDictBase) \
            and any(k not in result.keys(True, True) for k in action_keys):
        written = [k for k in result.keys(True, True) if k not in obs_keys]
        raise out_keys_error(out_keys, written, action_keys)


def _own_copy(policy: Any, device: torch.device | None) -> Any:
    """The policy the collector runs: a copy of ``policy`` wherever it has weights."""
    if isinstance(policy, RandomPolicy):
        return policy
    if isinstance(policy, ArrayPolicy):
        return policy.copy()
    if not isinstance(policy, torch.nn.Module):
        return policy  # a plain callable: no weights to version
    try:
        own = copy.deepcopy(policy)
    except Exception as exc:  # noqa: BLE001 - a module that cannot be copied still works
        logger.warning(
            "aiocollect: the policy cannot be deep-copied (%s: %s); the collector runs the object "
            "you passed, so changes you make to it reach collection at once, unversioned.",
            type(exc).__name__, exc,
        )
        own = policy
    return own.to(device) if device is not None else own


def _device_of(module: torch.nn.Module) -> torch.device | None:
    """The one device other than the CPU that holds every tensor of ``module``, if any."""
    devices = {t.device for t in tensor_state(module).values() if not is_lazy(t)}
    if len(devices) == 1:
        (device,) = devices
        if device.type not in ("cpu", "meta"):
            return device
    return None


def policy_device_of(policy: Any, device: Any) -> torch.device | None:
    """Where the collector's calls of ``policy`` run: ``policy_device`` if given, else (as in
    TorchRL) the one GPU that holds every tensor of a module, else ``None`` (the CPU)."""
    if device is not None:
        return torch.device(device)
    if isinstance(policy, torch.nn.Module) and not isinstance(policy, RandomPolicy):
        return _device_of(policy)
    return None


def runs_on_gpu(policy: Any, device: torch.device | None) -> bool:
    """Whether the collector's calls of ``policy`` will run on a GPU: ``policy_device`` says
    so, or (none given) a module's tensors all live on one, or a JAX policy's backend is one."""
    placed = policy_device_of(policy, device)
    if placed is not None:
        return placed.type != "cpu"
    return isinstance(policy, ArrayPolicy) and policy.accelerated


ROUND_SIZES_MAX = 64
"""Most row counts a policy is compiled for ahead of its calls (``PolicySetup.prepare``)."""


def round_sizes(lane_sizes: list[int], most: int = ROUND_SIZES_MAX) -> list[int] | None:
    """Every row count a round over some of these lanes can have (the sums of their subsets),
    sorted; ``None`` if there are more than ``most``."""
    sums = {0}
    for size in lane_sizes:
        sums |= {s + size for s in sums}
        if len(sums) > most + 1:
            return None
    return sorted(sums - {0})


def _on(module: torch.nn.Module, device: torch.device | None) -> bool:
    """Whether every tensor of ``module`` already is on ``device`` (so it can be shared)."""
    if device is None:
        return True
    device = torch.device(device)
    for t in tensor_state(module).values():
        here = t.device
        if here.type != device.type or (device.index is not None and here.index != device.index):
            return False
    return True


def _seed_from_torch() -> int:
    """The seed of a collector's random actions (``policy=None``, ``init_random_frames``) until
    ``set_seed``: drawn from torch's global generator, so that ``torch.manual_seed(0)`` at the
    top of a program makes its random frames repeat, as TorchRL's collectors do (they draw
    them with ``action_spec.rand()``). Drawn only by a collector that draws random frames
    (``policy=None``, ``init_random_frames``): another leaves the generator as it was."""
    return int(torch.randint(0, 2**62, ()).item())


class PolicySetup:
    """A collector's policy, the runners that call it and its weights channel; see the module docstring."""

    def __init__(self, policy: Any, action_space: gym.Space, obs_keys: list, *,
                 device: torch.device | None, exploration_type: InteractionType, share: bool = False,
                 cuda_graphs: int | None = None, obs_leaves: list | None = None, env_batch: tuple = (),
                 random_frames: bool = False, weights_from: Any = None):
        # (``weights_from``: the module whose weights ``publish(None)`` takes, and that the
        # stale-weights warning watches, where that is not ``policy``: TorchRL's ``policy``
        # given with a ``policy_factory`` that built ``policy``)
        self.user_policy = policy if weights_from is None else weights_from
        # (the random actions' seed, where there are any: drawn from torch's generator only then)
        seed = _seed_from_torch() if policy is None or random_frames else None
        if policy is None:
            policy = RandomPolicy(action_space, seed=seed)
        elif is_torchrl_random(policy):
            policy = SpecRandomPolicy.wrap(policy, action_space)
        module = isinstance(policy, torch.nn.Module) and not isinstance(policy, RandomPolicy)
        device = policy_device_of(policy, device)  # (as TorchRL: a module on a GPU runs there)
        if share and module and _on(policy, device):
            self.policy = policy  # the user's module itself: nothing to copy, nothing to move
        else:
            self.policy = _own_copy(policy, device)
        # (``obs_leaves``: the observations' shapes, for the one call that settles a policy
        # whose keys say it may not fit; without them, only what its keys alone settle)
        action_keys = action_space.keys if isinstance(action_space, KeyedActions) else ("action",)
        check_policy_keys(self.policy, obs_keys, obs_leaves, device, exploration_type, action_keys)
        self.weights: WeightsChannel | None = None
        stream = None
        if isinstance(self.policy, ArrayPolicy):
            self.weights = WeightsChannel(self.policy.snapshot, self.policy.load)
        elif isinstance(self.policy, torch.nn.Module) and not isinstance(self.policy, RandomPolicy):
            weights = TorchWeights(self.policy)
            if device is not None and device.type == "cuda" and self.policy is not policy:
                # a high-priority stream: a policy call goes before a trainer's kernels; it
                # first waits for the copy of the module, queued on this thread's stream
                stream = weights.stream = torch.cuda.Stream(device, priority=-1)
                stream.wait_stream(torch.cuda.current_stream(device))
            if share:
                self.weights = FollowChannel(weights, policy)
            else:
                watched = weights_from if weights_from is not None else policy if self.policy is not policy else None
                self.weights = CopyChannel(weights, watched)
            self._torch_weights = weights
        graphs = None
        if cuda_graphs is not None and device is not None and device.type == "cuda":
            # (the user's own module may have its tensors swapped: watched; the collector's copy is not)
            captured = self.policy if isinstance(self.policy, torch.nn.Module) else None
            graphs = CudaGraphs(device, cuda_graphs, module=captured,
                                watch=captured is not None and captured is policy)
        self.runner = PolicyRunner(self.policy, obs_keys, device=device, exploration_type=exploration_type,
                                   weights=self.weights, stream=stream, graphs=graphs,
                                   action_shape=None if len(action_keys) > 1 or action_keys != ("action",)
                                   else getattr(action_space, "shape", None), action_keys=action_keys,
                                   env_batch=env_batch)
        self.random = (self.policy if isinstance(self.policy, RandomPolicy)
                       else RandomPolicy(action_space, seed=seed))
        # (with a real policy, random steps write every key it writes, zero-filled, as in
        # TorchRL, so that every batch of a replay buffer has one layout)
        self.random_runner = (
            PolicyRunner(self.random, obs_keys, device=None, exploration_type=exploration_type, weights=self.weights)
            if self.random is self.policy else RandomActions(self.runner, self.random)
        )

    def publish_through(self, board: WeightsBoard) -> WeightsChannel:
        """The workers act with copies of the policy (``_policies.actor``): from now on its
        weights are published into ``board``, copied once, and the policy here acts with the
        board's views (``BoardChannel``; ``ArrayBoardChannel`` for a JAX policy). Before
        collecting, with nothing published yet."""
        old = self.weights
        assert old is not None  # (a torch module or a JAX policy: has_weights)
        if old.latest:
            raise RuntimeError("publish_through: weights were published already")
        channel: WeightsChannel
        if isinstance(self.policy, ArrayPolicy):
            channel = ArrayBoardChannel(self.policy, board)
        else:
            source = self.user_policy if self.user_policy is not self.policy else None
            channel = BoardChannel(self._torch_weights, source, board)
        self.weights = self.runner.weights = channel
        return channel

    @property
    def has_weights(self) -> bool:
        """A torch module or a JAX policy: weights to update, version and save."""
        return self.weights is not None

    def prepare(self, lane_sizes: list[int], obs_leaves: list) -> None:
        """Before collecting: an ``accelerated`` ``ArrayPolicy`` (JAX on a GPU) compiles for
        every row count a round over the lanes of ``lane_sizes`` envs can have (at most
        ``ROUND_SIZES_MAX``), instead of at each one's first call, inside the collection;
        with ``cudagraph_policy``, a torch policy is warmed up and captured for each of them
        (``_prepare_graphs``; past ``ROUND_SIZES_MAX`` counts, for a full round's and each
        lane's)."""
        if self.runner.graphs is not None:
            # (past ROUND_SIZES_MAX counts: a full round's and each lane's, the likeliest)
            self._prepare_graphs(round_sizes(lane_sizes) or sorted({sum(lane_sizes), *lane_sizes}), obs_leaves)
            return
        policy = self.policy
        if not (isinstance(policy, ArrayPolicy) and policy.accelerated):
            return
        rows = round_sizes(lane_sizes)
        specs = {leaf.key: (leaf.dtype, leaf.shape) for leaf in obs_leaves}
        if rows is None or any(k not in specs for k in policy.in_keys):
            return
        policy.prepare(rows, [specs[k] for k in policy.in_keys])

    def _prepare_graphs(self, rows: list[int], obs_leaves: list) -> None:
        """Call the policy on zeros ``warmup + 1`` times for each of ``rows`` envs, so each count
        is captured now, in the collector's constructor, rather than in the collection: a capture
        that fails says so before anything is collected, ``torch.compile`` compiles here, and no
        capture runs while the user trains in another thread (before torch's per-capture RNG
        state, pytorch#176752, a trainer's CUDA random draw during a capture raised)."""
        runner, graphs = self.runner, self.runner.graphs
        assert graphs is not None  # (cudagraph_policy)
        for count in rows:
            if graphs.full:
                return
            obs = {leaf.key: torch.from_numpy(np.zeros((count, *leaf.shape), dtype=leaf.dtype))
                   for leaf in obs_leaves}
            for _ in range(graphs.warmup + 1):
                runner(obs, count)

    def follow_caller(self) -> None:
        """Before a batch is asked for: a shared module's next policy call waits for what the
        asking thread queued on its own CUDA stream (``FollowChannel.follow_caller``)."""
        if isinstance(self.weights, FollowChannel):
            self.weights.follow_caller()

    def close(self) -> None:
        """Wait for what is queued on the policy's own CUDA stream (a weight load, a last
        call): the policy's tensors may be freed with the collector, and their memory must
        not go to a new tensor while that stream still writes it."""
        stream = self.runner.stream
        if stream is not None:
            stream.synchronize()

    @property
    def version(self) -> int:
        """The policy version in effect."""
        return 0 if self.weights is None else self.weights.version

    @property
    def latest(self) -> int:
        """The newest policy version published."""
        return 0 if self.weights is None else self.weights.latest

    def publish(self, policy_or_weights: Any) -> int:
        """Snapshot new weights; returns their version (they apply before the next policy call).

        ``policy_or_weights``: a module (its parameters and buffers are copied), a
        TensorDict of parameters, a state dict, a JAX params pytree (for a JAX policy), or
        ``None``: take them from the policy given at construction. A ``Collector`` that
        follows the user's module loads them at once unless a policy call is under way
        (into the user's module, when shared: TorchRL's ``Collector`` does the same).
        """
        channel = self.weights
        if channel is None:
            if policy_or_weights is None:
                return self.version  # a random or weightless policy: nothing to send
            raise TypeError(
                "update_policy_weights_: the collector's policy has no weights (it is not an "
                "nn.Module or a JaxPolicy); nothing can be updated."
            )
        src = self.user_policy if policy_or_weights is None else policy_or_weights
        if isinstance(self.policy, ArrayPolicy) and isinstance(src, ArrayPolicy):
            src = src.weights
        version = channel.publish(src)
        if isinstance(channel, FollowChannel):
            channel.try_apply()
        return version

    async def wait_applied(self, version: int) -> None:
        """Return once ``version`` (or a newer one) is in effect."""
        channel = self.weights
        if channel is None:
            return
        while channel.version < version:
            if channel.try_apply():
                return
            await anyio.sleep(0.0005)  # a policy call is under way: it applies them first

    def state_dict(self) -> dict | None:
        weights = self.weights
        if weights is None:
            return None
        with weights.lock:
            weights.apply_pending()
            if isinstance(self.policy, ArrayPolicy):
                return self.policy.snapshot(self.policy.weights)
            stream = self.runner.stream
            if stream is not None:  # the load above was queued on the policy's stream
                torch.cuda.current_stream(stream.device).wait_stream(stream)
            fence = weights.fence
            if fence is not None:  # a load queued on another thread's stream (left for the next call too)
                torch.cuda.current_stream(fence[0]).wait_event(fence[1])
            return {k: v.detach().clone() for k, v in tensor_state(self.policy).items()}

    def load_state_dict(self, state_dict: dict, strict: bool, version: int | None = None) -> None:
        """Load ``policy_state_dict`` as a new weights version: ``version`` (the checkpoint's
        ``policy_version``, checked) where that is newer than every version so far, as
        TorchRL's collectors restore it."""
        if "policy_state_dict" in state_dict:
            if version is not None and self.weights is not None:
                self.weights.skip_to(version)
            self.publish(state_dict["policy_state_dict"])
        elif strict and self.has_weights:
            raise KeyError("load_state_dict: 'policy_state_dict' missing (pass strict=False to skip it).")

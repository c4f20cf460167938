"""Running a user policy on a batch of observations.

Whatever the user passed as ``policy``, the engine sees one thing: a
``PolicyRunner``, called with the batched observations (tensors, one per observation
key) and returning the batched outputs (``{"action": ..., other keys the policy wrote}``,
on the CPU). How it calls the policy depends on what the policy is:

* [`RandomPolicy`][aiocollect.RandomPolicy]: one batched numpy draw, no TensorDict at all;
* a plain ``TensorDictModule`` around an ``nn.Module``: the module is called on the
  observation tensors directly and its outputs mapped to ``out_keys`` exactly as
  ``TensorDictModule.forward`` would (this saves ~60 us per step, most of the cost of a
  small policy);
* any other ``TensorDictModuleBase`` (``ProbabilisticActor``, ``TensorDictSequential``...):
  called on a fresh ``TensorDict`` of the observations; every new leaf it writes is kept;
* for the ``init_random_frames``, ``RandomActions``: the policy's layout (found by one
  call), zeros but for a random ``"action"``, as TorchRL's collectors give;
* an ``ArrayPolicy`` (a JAX policy): called with numpy
  views of the observations, its numpy outputs kept as they are;
* any other callable, wrapped as TorchRL wraps it (``plain_inputs``): arguments named after
  observation keys get those observations (``forward(observation)``); a callable whose
  arguments name no observation key gets the observation tensor(s) positionally, in the
  order of the observation keys (aiocollect's own form: ``lambda obs: ...``); one whose
  arguments name some observation keys but also require others is a ``TypeError`` at
  construction, as in TorchRL. Its return value is the ``"action"``; a tuple is the
  ``"action"`` and ``"output1"``, ``"output2"``... (TorchRL's out keys). A callable whose
  single argument is named ``tensordict``/``td`` or annotated as a ``TensorDictBase`` gets a
  TensorDict instead, as in TorchRL.

A policy whose call over several envs' observations does not give one row per env (it
ignores the batch dimension: ``CountingEnvCountPolicy`` writes its spec's zero plus one, a
module returns ``output.sum()``) is called once per env instead, on that env's own
observations without a batch dimension, as TorchRL calls it for an env of its own, and the
outputs are stacked (``PolicyRunner.per_env``); this is found at its first call.

On a GPU ``policy_device`` the observations cross in pinned buffers and the outputs come
back the same way, with one wait per call (``_policies.transfer``). With
``cudagraph_policy``, the calls of each row count are captured in a CUDA graph after a few
eager ones, and replayed (``_policies.graphs``).

With a weights channel (``_policies.weights``), each call holds the channel's lock and first
loads any pending weights: the call and the version it reports (``PolicyRunner.version``)
always agree. Every call happens under ``torch.no_grad()`` and tensordict's ``set_interaction_type``
(the collector's ``exploration_type``), so stochastic modules sample or take their mode as
asked.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import InteractionType, TensorDictModule, TensorDictModuleBase, set_interaction_type

from .._envs.agents import agent_groups, agent_outputs, stack_agents
from .._envs.object_batches import with_objects
from .._envs.objects import OBJECTS, decode_all
from .._envs.spaces import NestedKey, nest
from .array import ArrayPolicy
from .graphs import CudaGraphs
from .outputs import check_outputs, module_outputs
from .random import RandomPolicy
from .transfer import inputs_to, outputs_from
from .weights import WeightsChannel

_set_grad_enabled = torch._C._set_grad_enabled


def _takes_tensordict(fn: Callable) -> bool:
    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    try:
        params = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        return False
    if len(params) != 1:
        return False
    (param,) = params
    if param.name in ("tensordict", "td"):
        return True
    ann = param.annotation
    if isinstance(ann, str):
        return "TensorDict" in ann
    return isinstance(ann, type) and issubclass(ann, TensorDictBase)


def _signature_target(fn: Callable) -> Any:
    """What a policy's arguments are read from: ``forward`` of a module (of the module a
    ``torch.compile`` wrapper holds), else the callable itself."""
    fn = getattr(fn, "_orig_mod", fn)
    return fn.forward if isinstance(fn, torch.nn.Module) else fn


def plain_inputs(fn: Callable, obs_keys: list[NestedKey]) -> list[NestedKey] | None:
    """The observation keys a plain callable policy is called with, by name, as TorchRL's
    collectors wrap one (``_make_compatible_policy``): its arguments that name observation
    keys, in its own order, when every argument without a default names one; ``None``
    (positional, every observation in order: aiocollect's own form) when no argument names
    an observation key, or the callable has no signature to read.

    Raises:
        TypeError: its arguments name some observation keys and require others (TorchRL's
            ``TypeError``), or it cannot take the observations positionally.
    """
    try:
        params = list(inspect.signature(_signature_target(fn)).parameters.values())
    except (TypeError, ValueError):
        return None
    names = {k for k in obs_keys if isinstance(k, str)}
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY, p.POSITIONAL_ONLY)]
    required = [p.name for p in named if p.default is p.empty]
    matched = [p.name for p in named if p.name in names]
    if matched:
        if all(name in names for name in required) \
                and not any(p.kind is p.KEYWORD_ONLY for p in named if p.name in matched):
            return matched
        what = f"'{type(fn).__name__}.forward'" if isinstance(fn, torch.nn.Module) else "the policy"
        raise TypeError(
            f"policy: the arguments of {what} are {[p.name for p in params]}, and the observation keys "
            f"{sorted(names)}: {[n for n in required if n not in names]} name no observation. Arguments to "
            "policy.forward are incompatible with entries in env.observation_spec (TorchRL's rule: a policy "
            "that is not a TensorDictModule is called with the observations its arguments name, and every "
            "argument without a default must name one). Rename its arguments after observation keys, or "
            "wrap it in a TensorDictModule with in_keys and out_keys."
        )
    positional = [p for p in named if p.kind is not p.KEYWORD_ONLY]
    takes_more = any(p.kind is p.VAR_POSITIONAL for p in params)
    keyword_required = [p.name for p in named if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    least = sum(p.default is p.empty for p in positional)
    if keyword_required or not least <= len(obs_keys) <= (math.inf if takes_more else len(positional)):
        raise TypeError(
            f"policy: it takes the arguments {[p.name for p in params]}, none of them named after an observation "
            f"key ({sorted(names) or obs_keys}), and cannot be called with the {len(obs_keys)} observation "
            "tensor(s) in order. Name its arguments after the observation keys it reads (TorchRL's rule), or "
            "wrap it in a TensorDictModule with in_keys and out_keys."
        )
    return None


def _fast_module(policy: Any) -> bool:
    """Whether ``policy`` is a TensorDictModule whose forward we may reproduce exactly."""
    return (
        type(policy) is TensorDictModule
        and policy._kwargs is None
        and policy.method is None
        and not policy.method_kwargs
        and not policy._get_kwargs
        and not isinstance(policy.module, TensorDictModuleBase)
        and not policy._forward_hooks
        and not policy._forward_pre_hooks
    )


class PolicyRunner:
    """Calls ``policy`` on batched observations; see the module docstring."""

    def __init__(
        self,
        policy: Any,
        obs_keys: list[NestedKey],
        *,
        device: torch.device | None,
        exploration_type: InteractionType,
        weights: WeightsChannel | None = None,
        stream: Any = None,
        graphs: CudaGraphs | None = None,
        action_shape: tuple[int, ...] | None = None,
        action_keys: tuple = ("action",),
        env_batch: tuple[int, ...] = (),
    ):
        self.policy = policy
        self.env_batch = tuple(env_batch)
        """An env's batch dims when it has several (``[5, 2]``): a TensorDict policy is called
        with its rows as those dims, as TorchRL calls it."""
        self.action_keys = tuple(action_keys)
        """Where the policy writes the env's action(s): ``"action"``, or each action key of a
        TorchRL env with several (``_envs.keyed``)."""
        self.weights = weights
        self.version = 0 if weights is None else weights.version
        """The policy version that computed the last outputs."""
        self.obs_keys = obs_keys
        self.device = device
        self._mode = set_interaction_type(exploration_type)
        """Entered around each call (one object, made once: a runner's calls never nest)."""
        self._out_keys: list[NestedKey] | None = None
        self.stream = stream
        """A CUDA policy's own stream: its calls and the moves of its inputs and outputs are
        queued there (``PolicySetup``'s module docstring says why)."""
        self.graphs = graphs
        """The policy's CUDA graphs (``cudagraph_policy``), or ``None``."""
        if isinstance(policy, RandomPolicy):
            self.kind = "random"
        elif isinstance(policy, ArrayPolicy):
            missing = [k for k in policy.in_keys if k not in obs_keys]
            if missing:
                raise KeyError(f"policy: in_keys {missing} are not observations of the envs, which are {obs_keys}.")
            self.kind = "array"
        elif _fast_module(policy) and all(k in obs_keys for k in policy.in_keys):
            self.kind = "module"
        elif isinstance(policy, TensorDictModuleBase) or _takes_tensordict(policy):
            self.kind = "tensordict"
        else:
            self.kind = "callable"
            self._inputs = plain_inputs(policy, obs_keys)
            """The observation keys it is called with by name, or ``None``: all, in order."""
        self.runs: DrawnRuns | None = DrawnRuns(self) if self.kind == "random" else None
        """Random actions go in runs of steps, drawn here in advance (``DrawnRuns``; the
        ``Runs`` of ``_policies.actor``); ``None``: one call per step."""
        self.checks_actions = self.kind != "random" or policy.one_hot
        """Its actions are checked before the envs get them: a random policy's draws are valid
        by construction, but for one-hot rows (turned into the envs' indices by the check)."""
        self.aligned_inputs = self.kind == "array"
        """It reads its inputs in place from 64-byte aligned memory (XLA: a JAX policy)."""
        self.action_shape = action_shape
        """One env's action shape (the action space's), if known: an action of that shape from
        a call over one env is one env's action without the batch dimension (``per_env``)."""
        self._agent_groups: set | None = None
        """The heterogeneous agent groups of the policy's input (``_envs.agents``), once known."""
        self._inputs_seen: set = set()
        """The input's keys as a policy's outputs would be read (an agent's own), on the first call."""
        self.per_env: bool | None = None
        """Whether the policy is called once per env, on unbatched observations (the module
        docstring says when); ``None`` until its first call says."""

    @property
    def exploration_type(self) -> InteractionType:
        """The interaction type set around each policy call (fixed at construction)."""
        return self._mode.type

    @property
    def plain_module(self) -> bool:
        """It calls a plain ``TensorDictModule``'s module directly (a worker's copy may be
        sent that module alone: ``_policies.actor.payload``)."""
        return self.kind == "module"

    @property
    def out_keys(self) -> list[NestedKey] | None:
        """The keys the policy writes (known after its first call)."""
        return self._out_keys

    def __call__(self, obs: dict[NestedKey, torch.Tensor], num_envs: int) -> dict[NestedKey, Any]:
        """The policy's outputs for ``obs``: tensors (or numpy arrays), batch dim first."""
        weights = self.weights
        if self.kind == "random":
            if weights is not None:
                self.version = weights.version
            return self.policy.sample_outputs(num_envs)
        if self.stream is not None:  # the policy's own CUDA stream (``PolicySetup`` says when)
            with torch.cuda.stream(self.stream):
                return self._versioned(weights, obs, num_envs)
        return self._versioned(weights, obs, num_envs)

    def _versioned(self, weights: WeightsChannel | None, obs: dict[NestedKey, torch.Tensor],
                   num_envs: int) -> dict[NestedKey, Any]:
        """The call, after loading pending weights, with the version that computed it."""
        if weights is None:
            return self._call(obs, num_envs)
        with weights.lock:
            if weights.has_pending:
                weights.apply_pending()
            if weights.fence is not None:  # weights written on another stream (``WeightsChannel.fence``)
                (gpu, event), weights.fence = weights.fence, None
                torch.cuda.current_stream(gpu).wait_event(event)
            self.version = weights.version
            return self._call(obs, num_envs)

    def _call(self, obs: dict[NestedKey, torch.Tensor], num_envs: int) -> dict[NestedKey, Any]:
        if self.kind == "array":
            return self._call_array(obs)
        device = self.device
        remote = device is not None and device.type != "cpu"
        graphs = self.graphs
        capture = False
        if graphs is not None:  # ``cudagraph_policy`` (``_policies.graphs``)
            out = graphs.replay(obs, num_envs)
            if out is not None:
                return outputs_from(device, out)
            capture = graphs.due(num_envs)
        if remote:
            obs = inputs_to(device, obs)
        # ``no_grad`` and ``set_interaction_type`` as plain calls: built and entered as
        # context managers on every step they cost more than a small policy's forward
        grad = torch.is_grad_enabled()
        if grad:
            _set_grad_enabled(False)
        mode = self._mode
        mode.__enter__()
        try:
            out = graphs.capture(self._dispatch, obs, num_envs) if capture else self._dispatch(obs)
        finally:
            mode.__exit__(None, None, None)
            _set_grad_enabled(grad)  # (also if the policy switched grad mode itself)
        return outputs_from(device, out) if remote else out

    def call_bare(self, obs: dict[NestedKey, torch.Tensor]) -> dict[NestedKey, Any]:
        """The policy's outputs for ``obs`` with none of a call's setup (grad mode,
        interaction type, weights, devices): for a caller that set those once for good, a
        worker's own copy of the policy (``_policies.worker_actor``)."""
        return self._dispatch(obs)

    def _dispatch(self, obs: dict[NestedKey, torch.Tensor]) -> dict[NestedKey, Any]:
        """The policy's outputs for ``obs`` (on its device), called as its kind says."""
        if self.per_env is not False:
            return self._each_env(obs) if self.per_env else self._first(obs)
        if self.kind == "module":
            return self._call_module(obs)
        if self.kind == "tensordict":
            return self._call_tensordict(obs)
        return self._call_plain(obs)

    def _batched(self, obs: dict[NestedKey, torch.Tensor], batch: bool = True) -> dict[NestedKey, Any]:
        if self.kind == "module":
            return self._call_module(obs)
        if self.kind == "tensordict":
            return self._call_tensordict(obs, batch)
        return self._call_plain(obs)

    def _first(self, obs: dict[NestedKey, torch.Tensor]) -> dict[NestedKey, Any]:
        """The first call: batched, unless its outputs (or its failure) say the policy does not
        take a batch dimension and a call per env works (``per_env``)."""
        n = len(next(iter(obs.values())))
        try:
            out = self._batched(obs)
        except Exception:
            each = self._try_each(obs)
            if each is None:
                raise
            return each
        if self._one_row_per_env(out, n):
            self.per_env = False
            return out
        each = self._try_each(obs)
        return out if each is None else each  # (None: the checks name what is wrong with ``out``)

    def _one_row_per_env(self, out: dict[NestedKey, Any], n: int) -> bool:
        for value in out.values():
            shape = getattr(value, "shape", None)
            if shape is None or len(shape) == 0 or shape[0] != n:
                return False
        action = out.get("action")
        return not (n == 1 and self.action_shape is not None and action is not None
                    and tuple(action.shape) == tuple(self.action_shape))

    def _try_each(self, obs: dict[NestedKey, torch.Tensor]) -> dict[NestedKey, Any] | None:
        """The outputs of one call per env, if that works and gives tensors (then the policy is
        called so for good); else ``None``."""
        try:
            out = self._each_env(obs)
        except Exception:  # noqa: BLE001 - then the batched call's outcome stands
            self._out_keys = None
            return None
        self.per_env = True
        return out

    def _each_env(self, obs: dict[NestedKey, torch.Tensor]) -> dict[NestedKey, Any]:
        """One call per env on its unbatched observations, the outputs stacked (``per_env``)."""
        n = len(next(iter(obs.values())))
        outs = [self._batched({k: v[i] for k, v in obs.items()}, batch=False) for i in range(n)]
        first = outs[0]
        if any(not isinstance(v, torch.Tensor) for out in outs for v in out.values()) \
                or any(tuple(out) != tuple(first) for out in outs):
            raise TypeError("policy: its per-env outputs are not tensors with the same keys")
        return {k: torch.stack([out[k] for out in outs]) for k in first}

    # the four ways of calling -------------------------------------------------------

    def _call_module(self, obs: dict[NestedKey, torch.Tensor]) -> dict[NestedKey, Any]:
        policy = self.policy
        out = module_outputs(policy.module(*[obs[k] for k in policy.in_keys]), policy.out_keys)
        if self._out_keys is None:
            self._out_keys = list(out)
        return out

    def _call_array(self, obs: dict[NestedKey, torch.Tensor]) -> dict[NestedKey, Any]:
        policy = self.policy
        result = policy(*[obs[k].numpy() for k in policy.in_keys])
        if len(result) != len(policy.out_keys):
            raise RuntimeError(f"policy: returned {len(result)} output(s) for out_keys {policy.out_keys}.")
        out = dict(zip(policy.out_keys, result))
        for key, value in out.items():
            if isinstance(value, np.ndarray) and is_ml_dtype(value.dtype):
                out[key] = ml_dtype_tensor(value, key)
        if self._out_keys is None:
            self._out_keys = list(out)
        return out

    def _call_tensordict(self, obs: dict[NestedKey, torch.Tensor], batch: bool = True) -> dict[NestedKey, Any]:
        size = [next(iter(obs.values())).shape[0]] if batch else []
        dims = self.env_batch
        block = math.prod(dims)
        if batch and len(dims) > 1 and size[0] % block == 0:
            # an env of batch [5, 2]: called as TorchRL calls it, once per env (its 10 rows as
            # [5, 2]; a round over several workers' envs makes one call per env)
            outs = []
            for lo in range(0, size[0], block):
                part = {k: v[lo : lo + block].reshape(*dims, *v.shape[1:]) for k, v in obs.items()}
                rows = self._call_td(self._input_td(part, list(dims)), part)
                outs.append({k: v.reshape(block, *v.shape[len(dims):]) for k, v in rows.items()})
            return outs[0] if len(outs) == 1 else {k: torch.cat([o[k] for o in outs]) for k in outs[0]}
        return self._call_td(self._input_td(obs, size), obs)

    def _input_td(self, obs: dict[NestedKey, torch.Tensor], size: list) -> TensorDictBase:
        """A TensorDict policy's input: ``obs`` as a TensorDict of batch ``size``, with an env's
        entries of no fixed shape and its heterogeneous agents as TorchRL gives them."""
        td = TensorDict(nest(obs), batch_size=size, device=self.device)
        if OBJECTS in obs:  # (an env's entries with no fixed shape: under their own keys)
            td = with_objects(td)
        if self._agent_groups is None:
            self._agent_groups = agent_groups(obs)
        if self._agent_groups:  # (heterogeneous agents: their group lazily stacked)
            td = stack_agents(td)
            if self._out_keys is None:
                self._inputs_seen = set(agent_outputs(td, self._agent_groups))
        return td

    def _call_td(self, td: TensorDictBase, obs: dict[NestedKey, torch.Tensor]) -> dict[NestedKey, Any]:
        result = self.policy(td)
        if result is None:
            result = td
        if not isinstance(result, TensorDictBase):
            raise TypeError(
                f"policy: a TensorDict policy must return a TensorDict, got {type(result).__name__}."
            )
        flat = agent_outputs(result, self._agent_groups) if self._agent_groups else None
        if self._out_keys is None:
            seen = self._object_inputs(obs) | self._inputs_seen
            new = [k for k in (result.keys(True, True) if flat is None else flat) if k not in obs and k not in seen]
            missing = [k for k in self.action_keys if k not in new]
            if missing and self.action_keys != ("action",):
                raise KeyError(
                    f"action: the policy wrote {new or 'nothing'} but no {', '.join(repr(k) for k in missing)}: "
                    f"the env takes its actions under {list(self.action_keys)!r}; write each of them "
                    "(the out_keys of the modules that produce them)."
                )
            if missing:
                raise KeyError(
                    f"action: the policy wrote {new or 'nothing'} but no 'action' entry; set "
                    "out_keys=['action'] on the module that produces the action."
                )
            self._out_keys = new
        if flat is not None:
            return {k: flat[k] for k in self._out_keys}
        return {k: result.get(k) for k in self._out_keys}

    def _object_inputs(self, obs: dict[NestedKey, torch.Tensor]) -> set:
        """The keys of the entries with no fixed shape in the policy's input (not its outputs)."""
        if OBJECTS not in obs:
            return set()
        return {k for row in decode_all(obs[OBJECTS].cpu().numpy()).flat for k in row}

    def _call_plain(self, obs: dict[NestedKey, torch.Tensor]) -> dict[NestedKey, Any]:
        keys = self.obs_keys if self._inputs is None else self._inputs
        result = self.policy(*[obs[k] for k in keys])
        if isinstance(result, tuple):  # TorchRL's out keys for a tuple: "action", "output1", ...
            out = {("action" if i == 0 else f"output{i}"): _tensor(v) for i, v in enumerate(result)}
            if not out:
                raise TypeError("policy: a plain callable policy returned an empty tuple; return the action tensor.")
        else:
            out = {"action": _tensor(result)}
        if self._out_keys is None:
            self._out_keys = list(out)
        return out


def _tensor(value: Any) -> Any:
    """A plain callable's output as a tensor (numpy arrays and numbers converted)."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray) or np.isscalar(value):
        return torch.as_tensor(value)
    raise TypeError(
        f"policy: a plain callable policy must return the action tensor (or a tuple of tensors: the "
        f"action, then TorchRL's 'output1', 'output2'...), got {type(value).__name__}; to name its outputs "
        "wrap it in a TensorDictModule with out_keys=['action', ...]."
    )


RUN_S = 0.016
"""About how long a run of random steps lasts (sized from the lane's last runs): long enough
that booking it costs little per frame, short enough that what the collector asks next (a
new batch, a reset, ``CLOSE``) waits little."""


class DrawnRuns:
    """A random policy's runs of steps (the ``Runs`` of ``_policies.actor``): every step's
    actions drawn here at once from the lane's own stream (``RandomPolicy.sample_steps``) and
    written before the run is posted; the worker steps on with no round trip."""

    local = False
    span_s = RUN_S
    keys = ("action",)

    def __init__(self, runner: PolicyRunner):
        self.runner = runner

    def begin(self) -> None:
        """The version in effect (a random policy's weights, if any, are a version's all the same)."""
        runner = self.runner
        if runner.weights is not None:
            runner.version = runner.weights.version

    def fill(self, storage: Any, lane: Any, steps: int) -> None:
        """Draw ``lane``'s next ``steps`` steps and write them into ``storage``
        (``RolloutStorage.write_run``: the envs' actions, and the stored ones in the
        policy's encoding)."""
        random = self.runner.policy
        drawn = random.sample_steps(lane.lo, steps, lane.num_envs)  # (the envs' indices)
        storage.write_run(lane.slot, lane.t, lane.lo, lane.hi, drawn, self.runner.version, random.encode(drawn))


class RandomActions:
    """The ``init_random_frames`` runner: random actions, in the layout of the policy's batches.

    TorchRL's collectors act at random for the first ``init_random_frames`` frames
    without running the policy, yet those batches have every key the policy writes, as
    zeros (the policy ran once, when the collector was built, to find them), so a replay
    buffer holds one layout. This does the same: the policy runs **once**, on the first
    random step, to find what it writes; every random step then gives zeros of those
    shapes and dtypes, and an ``"action"`` drawn by ``random`` in the policy's encoding
    (its dtype; one-hot rows where the policy writes one-hot, see
    [`RandomPolicy.sample_like`][aiocollect.RandomPolicy.sample_like]). So
    ``action_value`` or ``sample_log_prob`` of a random frame are zeros, as in TorchRL:
    placeholders, not values of the random action.

    Args:
        runner: the policy's own runner.
        random: where the actions come from.
    """

    def __init__(self, runner: PolicyRunner, random: RandomPolicy):
        self.runner = runner
        self.random = random
        self.runs = None
        self.checks_actions = True
        """The random action is checked (and a one-hot one turned into indices for the envs)
        as the policy's would be."""
        self.aligned_inputs = runner.aligned_inputs
        self._probe: dict[NestedKey, Any] | None = None
        """The policy's outputs at its one call."""
        self._zeros: dict[int, dict[NestedKey, Any]] = {}
        """Per number of envs: zeros laid out as the policy's outputs (read, never written)."""

    @property
    def version(self) -> int:
        """The policy version in effect."""
        weights = self.runner.weights
        return self.runner.version if weights is None else weights.version

    def __call__(self, obs: dict[NestedKey, torch.Tensor], num_envs: int) -> dict[NestedKey, Any]:
        """Zeros for every output of the policy but ``"action"``, a random ``"action"``."""
        zeros = self._zeros.get(num_envs)
        if zeros is None:
            if self._probe is None:
                self._probe = self.runner(obs, num_envs)
                check_outputs(self._probe, num_envs)
            zeros = self._zeros[num_envs] = {key: _zeros(value, num_envs) for key, value in self._probe.items()}
        return self.random.sample_outputs(num_envs, zeros)


def _zeros(like: Any, num_envs: int) -> Any:
    """Zeros shaped as ``like`` (a policy output, one row per env) for ``num_envs`` envs."""
    shape = (num_envs, *like.shape[1:])
    if isinstance(like, torch.Tensor):
        return torch.zeros(shape, dtype=like.dtype)
    return np.zeros(shape, dtype=np.dtype(like.dtype))


def is_ml_dtype(dtype: np.dtype) -> bool:
    """One of the ``ml_dtypes`` types that JAX's bf16 and float8 arrays have in numpy."""
    return dtype.type.__module__.startswith("ml_dtypes")


def ml_dtype_tensor(value: np.ndarray, key: NestedKey) -> torch.Tensor:
    """An array of an ``ml_dtypes`` type (a JAX policy's bf16 output), which torch cannot
    take from numpy, as the torch tensor of the same bits: stored as it is, like a torch
    policy's bf16 outputs. Raises ``TypeError`` for a type torch has no float of the same
    name and size for (int4, float4...)."""
    dtype = getattr(torch, value.dtype.name, None)
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point and dtype.itemsize == value.dtype.itemsize):
        raise TypeError(
            f"policy: output {key!r} has dtype {value.dtype.name}, which torch has no type for; "
            "cast it in the policy (to float32, or bfloat16)."
        )
    bits = np.ascontiguousarray(value).view(np.uint16 if value.dtype.itemsize == 2 else np.uint8)
    return torch.from_numpy(bits.copy()).view(dtype)

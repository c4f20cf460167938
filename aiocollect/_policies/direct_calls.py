"""Calling a worker's copy of the policy without ``nn.Module.__call__``'s overhead.

Each ``module(x)`` goes through ``nn.Module.__call__``, which checks for hooks (the
module's and the global ones), for a compiled call and for JIT tracing before it calls
``forward``. With none of those, it ends in ``forward(x)``: the same result, but the
checks cost a few microseconds per submodule on a small machine (4-8 us here), and a small
MLP is four or five submodules. A worker's copy of the policy (``_policies.actor``)
acts on 16 CartPole envs in about the time those envs take to step, so that overhead was
about half of its call.

``direct_calls`` gives each submodule of a worker's private copy a class of its own whose
``__call__`` *is* its ``forward``: the user's ``forward`` code still runs, whole, at every
call (no tracing: nothing is baked in, a counter still counts, a numpy draw is still
drawn); only the checks that would have found nothing are skipped. A submodule keeps the
standard call where skipping it could change anything:

* it has a hook of its own (forward, forward pre-, backward or backward pre-hook), or any
  global module hook is registered in this process (then no submodule is changed);
* it is one of tensordict's modules (``TensorDictModuleBase``: tensordict and the engine's
  ``PolicyRunner`` look at their exact types; the modules they wrap are changed);
* its class defines its own ``__call__`` (TorchScript...) or a ``forward`` that is not a
  plain function, the instance has its own ``forward`` attribute, or it was
  ``compile()``d.

The new class subclasses the old one (``isinstance`` holds) and keeps its name. Only ever
applied to a copy that nothing else sees: the worker's unpickled policy.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import torch
from torch.nn.modules import module as _module

_classes: dict[type, type] = {}
"""One direct-call subclass per module class (per process)."""


def _global_hooks() -> bool:
    return any(getattr(_module, name, None) for name in (
        "_global_forward_hooks", "_global_forward_pre_hooks",
        "_global_backward_hooks", "_global_backward_pre_hooks"))


def _may_skip(sub: torch.nn.Module, tensordict_base: type | None) -> bool:
    cls = type(sub)
    return (
        not (tensordict_base is not None and isinstance(sub, tensordict_base))
        and cls.__call__ is torch.nn.Module.__call__
        and inspect.isfunction(inspect.getattr_static(cls, "forward", None))
        and "forward" not in sub.__dict__
        and getattr(sub, "_compiled_call_impl", None) is None
        and not (sub._forward_hooks or sub._forward_pre_hooks
                 or sub._backward_hooks or sub._backward_pre_hooks)
    )


def _direct(cls: type) -> type:
    direct = _classes.get(cls)
    if direct is None:
        direct = _classes[cls] = type(cls.__name__, (cls,), {
            "__call__": cls.forward,
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "__doc__": cls.__doc__,
        })
    return direct


def direct_calls(module: Any) -> int:
    """Make every submodule of ``module`` (itself included) that may skip
    ``nn.Module.__call__``'s checks call its ``forward`` directly (see the module
    docstring); returns how many were changed. Anything but an ``nn.Module`` is left as
    it is."""
    if not isinstance(module, torch.nn.Module) or _global_hooks():
        return 0
    # (with tensordict not imported, no module is one of its own; nothing imports it here)
    tensordict_base = getattr(sys.modules.get("tensordict.nn"), "TensorDictModuleBase", None)
    changed = 0
    for sub in module.modules():
        if type(sub) in _classes.values():
            continue
        if _may_skip(sub, tensordict_base):
            sub.__class__ = _direct(type(sub))
            changed += 1
    return changed

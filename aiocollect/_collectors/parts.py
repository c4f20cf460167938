"""``CollectorParts``: what the parts of ``DataCollectorBase`` use of each other, declared once.

``DataCollectorBase`` (``_collectors.base``) is assembled from parts, one module each:
``Faces`` (the sync and async faces), ``Consumers`` (one batch at a time), ``Delivery`` (from
``_collect()`` to the user), ``Background`` (``start()``) and ``TorchRLAccessors`` (TorchRL's
names). A part's methods read state that the base's ``__init__`` sets (``options``,
``_resources``, the counters...), class attributes that the variants set
(``_hook_after_postproc``...) and methods that other parts define (``_check_usable``,
``_next_batch``...). Every part derives from ``CollectorParts``, which declares all of them
with their types, so that a type checker checks each part's use against the definition, and
each definition against what the parts expect of it.

It holds annotations only: nothing here exists at run time (the methods are declared under
``TYPE_CHECKING``), so the parts keep their order of resolution and their definitions.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDictBase

    from .._engine.profile import Profile
    from .._engine.scheduler import Scheduler
    from .._engine.staging import DeviceStaging
    from .._engine.trajectories import TrajectoryAssembler
    from .._errors import CollectorClosedError
    from .._policies.setup import PolicySetup
    from .options import CollectorOptions
    from .progress import EpisodeReturns, ProgressBar
    from .resources import Resources
    from .statistics import CollectorStatistics


class CollectorParts:
    """The state and methods the parts of ``DataCollectorBase`` share; see the module docstring."""

    # set by DataCollectorBase.__init__ (described there)
    options: CollectorOptions
    _resources: Resources
    _frames: int
    _batches: int
    _collect_seconds: float
    _closed: bool
    _failed: BaseException | None
    _warned_loop_blocked: bool
    _cancelled_for_shutdown: weakref.WeakSet[asyncio.Task]
    _left_pending: set[asyncio.Task]
    _pause_requested: threading.Event
    _parked: threading.Event
    _pauses: int
    _pause_lock: threading.Lock
    _policy: PolicySetup | None
    _max_lag: int
    _stale_dropped: int
    _progress: ProgressBar | None
    _returns: EpisodeReturns
    _staging: DeviceStaging | None
    _reuse_td: bool
    _same_td: TensorDictBase | None
    _scheduler: Scheduler | None
    _profile: Profile | None
    _assembler: TrajectoryAssembler
    storing_device: torch.device | None  # (set by the variants)
    _kept: tuple[TensorDictBase, int] | None
    _undelivered: Any

    # class attributes: DataCollectorBase's and TorchRLAccessors' defaults, which variants override
    _persistent_loop: bool
    post_collect_hook: Callable[[Any], Any] | None
    extend_buffer: bool
    _hook_after_postproc: bool
    _object_entries: bool
    _left_out: tuple
    _agent_groups: bool

    if TYPE_CHECKING:
        # DataCollectorBase's (a variant may override them)
        def shutdown(self, timeout: float | None = None, close_env: bool = True) -> None: ...
        def _check_usable(self) -> None: ...
        def _closed_error(self) -> CollectorClosedError: ...
        def _take_cut(self) -> Any: ...
        async def _collect(self) -> tuple[TensorDictBase, int]: ...
        def __len__(self) -> int: ...
        def statistics(self) -> CollectorStatistics: ...
        def update_policy_weights_(self, policy_or_weights: Any = None, *, worker_ids: Any = None,
                                   weights: Any = None, policy: Any = None, model_id: str | None = None,
                                   weights_dict: dict | None = None) -> int: ...

        # Faces'
        def _check_sync_allowed(self, what: str) -> None: ...
        def _on_engine(self, fn: Callable, *args: Any) -> Any: ...

        # Consumers'
        async def _guarded_collect(self) -> tuple[TensorDictBase, int]: ...

        # Delivery's
        async def _next_batch(self) -> Any: ...
        def _finish(self, batch: TensorDictBase) -> TensorDictBase: ...
        def _versions(self) -> tuple[int, int] | None: ...

        # Background's
        def is_running(self) -> bool: ...

        # TorchRLAccessors'
        def _worker_parts(self, batch: Any) -> list: ...
        def _run_pre_collect_hook(self) -> None: ...
        def _trace_step(self) -> None: ...
        def _end_trace(self) -> None: ...

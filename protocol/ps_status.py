"""Typed records of the PS AM's job status (`GET /status`, `status.json`) that the CLI reads back.

The AM builds these Structs (appmaster.ps: directives, cruise_driver, plan_executor, metrics,
heldout_monitor) and `/status` serves them as JSON under the keys they always had; the CLI
(`elastane ps status`, `ps scale`, `ps submit --wait`'s progress bar) decodes a whole answer once
with `decode_status` into a `PsStatus` and reads its fields:

- `directives`: `DirectiveRecord`, one RM shape directive acted on (appmaster.ps.directives).
- `cruise`: `CruiseStatus`, the Cruise optimizer's section, its `plan_history` of `CruisePlanRecord`
  (appmaster.ps.cruise_driver), each with its `PlanRunRecord` (appmaster.ps.plan_executor).
- `objective_history`: `EpochResult`, one finished epoch (appmaster.ps.metrics).
- `heldout`: `HeldoutStatus` with its `HeldoutPointRecord`s (appmaster.ps.heldout_monitor);
  `final_metrics`: the final model's held-out metrics.
- `shape_history`: protocol.shape_history's records, decoded by the CLI with `decode_history`.

A JSON number that is not finite (NaN objective, a failed score) arrives as null, so those fields
are Optional. The sections the CLI reads only loosely (`spec`, `shape`, `eps`, `suspension`,
`spill`) stay JSON objects here; unknown keys are ignored so an older or newer AM still decodes.
"""
from __future__ import annotations

from typing import Any, Optional

import msgspec

from .shape_history import ExecutorCounts


class DirectiveRecord(msgspec.Struct, kw_only=True):
    """One RM shape directive acted on: its target shape (`workers`, `servers`, `nodes`), the
    shape before, the steps taken (`[op, n]`), when it started and how long it took, how it ended."""

    version: int
    workers: int
    servers: int
    nodes: list[str] = []
    before: ExecutorCounts
    steps: list[tuple[str, int]] = []
    started: float
    seconds: float = 0.0
    error: str = ""
    reason: str = ""
    group: Optional[str] = None
    run_state: str = "run"

    @property
    def ended(self) -> bool:
        """It failed, had nothing to do, or its change finished."""
        return bool(self.error) or not self.steps or self.seconds > 0


class OpTimingRecord(msgspec.Struct, kw_only=True):
    """When one op of a Cruise plan ran, relative to the plan's start (seconds), and what it did."""

    id: str
    op: str
    start_s: float
    end_s: Optional[float] = None
    seconds: Optional[float] = None
    bytes: int = 0
    error: str = ""


class PlanRunRecord(msgspec.Struct, kw_only=True):
    """One execution of a Cruise plan: per-op timings, total time, bytes moved, the first error;
    `plan` is the plan itself as appmaster.cruise writes it."""

    ok: bool
    seconds: float
    bytes_moved: int
    max_concurrency: int
    error: str
    ops: list[OpTimingRecord] = []
    plan: dict[str, Any] = {}


class CruisePlanRecord(msgspec.Struct, kw_only=True):
    """One plan Cruise executed: why, the shape before / after, predicted and measured epoch times."""

    time: float
    trigger: str
    epoch: int
    shape_before: list[int]
    shape_after: Optional[list[int]] = None
    chosen_shape: Optional[list[int]] = None
    predicted_epoch_before_s: Optional[float] = None
    predicted_epoch_after_s: Optional[float] = None
    predicted_gain: Optional[float] = None
    measured_epoch_before_s: Optional[float] = None
    measured_epoch_after_s: Optional[float] = None
    plan_s: Optional[float] = None
    bytes_moved: int = 0
    ops: int = 0
    finished: Optional[float] = None
    error: str = ""
    run: Optional[PlanRunRecord] = None


class CruiseStatus(msgspec.Struct, kw_only=True):
    """The job status's "cruise" section (optimizer "cruise"); `decisions` and `metrics` are the
    optimizer's own JSON (appmaster.cruise)."""

    optimizer: str = "cruise"
    shape: list[int] = []
    running: bool = False
    current_plan: Optional[PlanRunRecord] = None
    last_error: str = ""
    plan_history: list[CruisePlanRecord] = []
    decisions: list[dict[str, Any]] = []
    why_not_ready: Optional[str] = None
    metrics: dict[str, Any] = {}


class EpochResult(msgspec.Struct, kw_only=True):
    """One finished epoch: its objective (None: not finite), training time, when it ended (unix time)."""

    epoch: int
    objective: Optional[float]
    epoch_time_s: float = 0.0
    time: float = 0.0


class HeldoutPointRecord(msgspec.Struct, kw_only=True):
    """The held-out metrics of the model after `epoch`, and the training objective then."""

    epoch: int
    value: Optional[float]
    objective: Optional[float]
    metrics: dict[str, Optional[float]] = {}


class HeldoutStatus(msgspec.Struct, kw_only=True):
    """The held-out section: the metric, the latest score (`value`, `epoch`; None before the
    first), the true model's, the best point, early stopping's patience, a divergence warning."""

    metric: Optional[str] = None
    maximize: bool = False
    true_model_metric: Optional[str] = None
    value: Optional[float] = None
    true_model_value: Optional[float] = None
    epoch: Optional[int] = None
    best: Optional[HeldoutPointRecord] = None
    early_stopping: Optional[int] = None
    warning: Optional[str] = None
    history: list[HeldoutPointRecord] = []
    disabled: Optional[str] = None


class PsStatus(msgspec.Struct, kw_only=True):
    """The AM's `/status` answer as the CLI reads it (every field has a default: an AM still
    starting, or an older one, may leave sections out)."""

    app: Optional[str] = None
    state: Optional[str] = None
    diagnostics: str = ""
    spec: Optional[dict[str, Any]] = None
    shape: dict[str, Any] = {}
    num_blocks: Optional[int] = None
    epoch: Optional[int] = None
    converged: bool = False
    initial_objective: Optional[float] = None
    objective_history: list[EpochResult] = []
    heldout: HeldoutStatus = msgspec.field(default_factory=HeldoutStatus)
    stop_criterion: Optional[str] = None
    final_metrics: Optional[dict[str, Optional[float]]] = None
    model_mb: Optional[float] = None
    data_mb: Optional[float] = None
    shape_history: list[Any] = []          # protocol.shape_history records, decoded by decode_history
    directives: list[DirectiveRecord] = []
    eps: Optional[dict[str, Any]] = None
    optimizer: Optional[str] = None
    cruise: Optional[CruiseStatus] = None
    suspension: dict[str, Any] = {}
    spill: dict[str, Any] = {}


def decode_status(obj: Any) -> PsStatus:
    """A `/status` answer (JSON builtins) as a `PsStatus`; `msgspec.ValidationError` names a bad field."""
    status: PsStatus = msgspec.convert(obj, PsStatus, strict=True)
    return status


__all__ = ["CruisePlanRecord", "CruiseStatus", "DirectiveRecord", "EpochResult", "HeldoutPointRecord", "HeldoutStatus",
           "OpTimingRecord", "PlanRunRecord", "PsStatus", "decode_status"]

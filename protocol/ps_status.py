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
- `shape`: `ShapeStatus`, the executors the job was given, each an `ExecutorStatus`
  (appmaster.ps.executor_pool: ExecutorRecord.status, ExecutorPool.shape_status).
- `spec`: the job's protocol.ps_job_spec.PSJobSpec as the AM runs it (it round-trips strictly; the
  spec refuses unknown fields, so the CLI reads the spec of an AM of its own version).
- `suspension`: `SuspensionStatus`, Harmony's pause / resume (appmaster.ps.suspension), with its
  `SuspensionCut`; `spill`: `SpillStatus`, the job's input spill (appmaster.ps.executor_status;
  null when no worker spills).

A JSON number that is not finite (NaN objective, a failed score) arrives as null, so those fields
are Optional. `eps` (appmaster.ps.elastic_ops: the running change, its op history, the input
splits, each its own JSON) stays a JSON object here; the CLI reads its `running` and `limits`.
Unknown keys are ignored so an older or newer AM still decodes (the spec aside).
"""
from __future__ import annotations

from typing import Any, Optional

import msgspec

from .ps_job_spec import PSJobSpec
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


class ExecutorStatus(msgspec.Struct, kw_only=True):
    """One executor of the job: its role, container, node, state (LAUNCHING, READY, RETIRING,
    EXITED), data-plane address, pid, memory (MB), blocks (model blocks of a server, input blocks
    of a worker), a worker's input partition and its spill (alpha, MB on disk, load stall)."""

    id: str
    role: str
    container_id: str = ""
    node: str = ""
    state: str
    address: str = ""
    pid: Optional[int] = None
    rss_mb: float = 0.0
    data_mb: float = 0.0
    model_mb: float = 0.0
    blocks: list[int] = []
    partition: Optional[int] = None
    spill_alpha: Optional[float] = None
    spilled_mb: float = 0.0
    spill_stall_s: float = 0.0


class ShapeStatus(msgspec.Struct, kw_only=True):
    """The executors the job was given (each one's `state` tells whether it still runs) and how
    many workers and servers that is."""

    workers: int = 0
    servers: int = 0
    executors: list[ExecutorStatus] = []

    def serving(self) -> list[ExecutorStatus]:
        """The executors that announced themselves and serve now (READY)."""
        return [e for e in self.executors if e.state == "READY"]


class SuspensionCut(msgspec.Struct, kw_only=True):
    """Where a paused job stopped: epoch, clock into it, the checkpoint's dir."""

    epoch: int
    clock: int
    checkpoint: str


class SuspensionStatus(msgspec.Struct, kw_only=True):
    """Harmony's pause / resume of the job: its state (RUNNING, PAUSING, PAUSED, RESUMING), how often
    and how long it was paused, where it stopped, and its pauses and resumes
    (protocol.shape_history.SuspendChange records, as JSON)."""

    state: str = "RUNNING"
    pauses: int = 0
    paused_s: float = 0.0
    cut: Optional[SuspensionCut] = None
    history: list[Any] = []


class SpillStatus(msgspec.Struct, kw_only=True):
    """The job's input spill: the mean alpha of its spilling workers and the MB of all its spill files."""

    alpha: float
    spilled_mb: float


class PsStatus(msgspec.Struct, kw_only=True):
    """The AM's `/status` answer as the CLI reads it (every field has a default: an AM still
    starting, or an older one, may leave sections out)."""

    app: Optional[str] = None
    state: Optional[str] = None
    diagnostics: str = ""
    spec: Optional[PSJobSpec] = None
    shape: Optional[ShapeStatus] = None
    num_blocks: Optional[int] = None
    epoch: Optional[int] = None
    # The epoch limit the job's app trains to (its hyper-parameters' max_epochs, the job's own over
    # the class's preset): the CLI's progress needs it for a user's app, whose class it may not have.
    max_epochs: Optional[int] = None
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
    suspension: SuspensionStatus = msgspec.field(default_factory=SuspensionStatus)
    spill: Optional[SpillStatus] = None


def decode_status(obj: Any) -> PsStatus:
    """A `/status` answer (JSON builtins) as a `PsStatus`; `msgspec.ValidationError` names a bad field."""
    status: PsStatus = msgspec.convert(obj, PsStatus, strict=True)
    return status


__all__ = ["CruisePlanRecord", "CruiseStatus", "DirectiveRecord", "EpochResult", "ExecutorStatus", "HeldoutPointRecord",
           "HeldoutStatus", "OpTimingRecord", "PlanRunRecord", "PsStatus", "ShapeStatus", "SpillStatus",
           "SuspensionCut", "SuspensionStatus", "decode_status"]

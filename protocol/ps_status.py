"""The PS AM's job status, one record: `PsStatus` is what `GET /status` serves and what the AM
leaves as `status.json` (FINAL_STATUS_FILE) in its durable dir when it exits.

appmaster.ps.runtime.status_view builds it from the AM's parts, `encode_status` writes it, and every
reader decodes it once with this type -- `decode_status` (JSON builtins, e.g. an HTTP client's
answer) or `read_status` (the bytes): the CLI (`elastane ps status`, `ps scale`, `ps submit
--wait`'s progress bar), the benchmarks, the testbed (`TestbedCluster.final_status`) and the
tests. Its sections:

- `directives`: `DirectiveRecord`, one RM shape directive acted on (appmaster.ps.runtime.master records it).
- `cruise`: `CruiseStatus`, the Cruise optimizer's section, its `plan_history` of `CruisePlanRecord`
  (appmaster.ps.cruise_driver), each with its `PlanRunRecord` (the controller's run of the plan); the
  optimizer's decisions, metrics and plans stay its own JSON (`JsonObject`).
- `objective_history`: `EpochResult`, one finished epoch (appmaster.ps.metrics); `metrics`:
  `MetricsStatus`, the workers' and servers' timing averages.
- `heldout`: `HeldoutStatus` with its `HeldoutPointRecord`s (appmaster.ps.heldout_monitor);
  `final_metrics`: the final model's held-out metrics.
- `shape_history`: protocol.shape_history's records (the tagged union `ShapeChange`), the newest
  100 (appmaster.ps.runtime.bounded_history); `shape_changes` counts every one the job made, so
  a reader finds what came since by the count, not the list's length.
- `shape`: `ShapeStatus`, the executors the job was given, each an `ExecutorStatus`
  (appmaster.ps.runtime.executor_pool: ExecutorRecord.status, ExecutorPool.shape_status).
- `spec`: the job's protocol.ps_job_spec.PSJobSpec as the AM runs it (it round-trips strictly; the
  spec refuses unknown fields, so a reader reads the spec of an AM of its own version).
- `eps`: `EpsStatus`, EPS's section (appmaster.ps.runtime.master.eps_status): the running change, its ops
  (`EpsOpStatus` with their `EpsTransfer`s), the limits, the input splits by worker, the audit.
  POST /scale's body is a `ScaleRequest`; it answers the `EpsOpStatus` of each EPS function called.
- `checkpoints`: `CheckpointInfo`, each checkpoint written; `resumed_from`: `ResumedFrom`, the
  earlier attempt's checkpoint this attempt continued from (appmaster.ps.job_resume).
- `recovery`: `RecoveryStatus` (appmaster.ps.runtime.master.recovery_status); `stragglers`: `StragglerStatus`
  (appmaster.ps.stragglers).
- `suspension`: `SuspensionStatus`, Harmony's pause / resume (appmaster.ps.runtime.master.suspension_status), with its
  `SuspensionCut` and its `SuspendChange` history; `spill`: `SpillStatus`, the job's input spill
  (appmaster.ps.executor_status; null when no worker spills).

A JSON number that is not finite (NaN objective, a failed score) arrives as null, so those fields
are Optional. Unknown keys are ignored and every field has a default, so an AM still starting, or
an older or newer one, still decodes (the spec aside).
"""
from __future__ import annotations

from typing import Optional

import msgspec

from .json_types import JsonObject
from .ps_job_spec import PSJobSpec
from .shape_history import ExecutorCounts, ShapeChange, SuspendChange


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
    plan: JsonObject = {}                   # appmaster.cruise.plan.Plan.to_json


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
    decisions: list[JsonObject] = []        # appmaster.cruise.optimizer's decisions, its own JSON
    why_not_ready: Optional[str] = None
    metrics: JsonObject = {}                # appmaster.cruise.metrics, its own JSON


class EpochResult(msgspec.Struct, kw_only=True):
    """One finished epoch: its objective (None: not finite), training time, when it ended (unix time),
    and the part of that time its mid-epoch objective samples took (`evaluation_s`)."""

    epoch: int
    objective: Optional[float]
    epoch_time_s: float = 0.0
    time: float = 0.0
    evaluation_s: float = 0.0


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
    and how long it was paused, where it stopped, and its pauses and resumes."""

    state: str = "RUNNING"
    pauses: int = 0
    paused_s: float = 0.0
    cut: Optional[SuspensionCut] = None
    history: list[SuspendChange] = []


class SpillStatus(msgspec.Struct, kw_only=True):
    """The job's input spill: the mean alpha of its spilling workers and the MB of all its spill files."""

    alpha: float
    spilled_mb: float


class WorkerTimesStatus(msgspec.Struct, kw_only=True):
    """One worker's per-mini-batch times (seconds; None before the first measurement): compute,
    communication, the parts of each waited for an arbiter's grant, bytes moved per mini-batch."""

    compute_s: Optional[float] = None
    comm_s: Optional[float] = None
    batches: int = 0
    compute_wait_s: Optional[float] = None
    comm_wait_s: Optional[float] = None
    bytes_per_batch: Optional[float] = None


class ServerTimesStatus(msgspec.Struct, kw_only=True):
    """One server's mean service time per data-plane request (None before the first poll)."""

    service_s: Optional[float] = None
    requests: int = 0


class MetricsStatus(msgspec.Struct, kw_only=True):
    """The AM's timing measurements (appmaster.ps.metrics.JobMetrics), by executor id."""

    workers: dict[str, WorkerTimesStatus] = {}
    servers: dict[str, ServerTimesStatus] = {}


class CheckpointInfo(msgspec.Struct, kw_only=True):
    """One checkpoint the AM wrote (appmaster.ps.checkpoints.Checkpointer.write's answer): the
    epoch and clock of its cut, its local `dir` and durable `url`, blocks, seconds, bytes, when."""

    epoch: int
    clock: int = 0
    dir: str
    url: str = ""
    blocks: int = 0
    seconds: float = 0.0
    bytes: int = 0
    time: float = 0.0


class ResumedFrom(msgspec.Struct, kw_only=True):
    """The checkpoint of an earlier attempt this attempt continued from (appmaster.ps.job_resume):
    where it is, its cut, the attempt that wrote it, its objective and the one restored here.
    `adopted`: this attempt took the earlier one's executors over instead (appmaster.ps.
    attempt_takeover; `executors_adopted` of them): nothing was restored, `epoch` is where training
    went on and the checkpoint fields name the latest checkpoint, what a recovery goes back to."""

    dir: str
    url: str = ""
    epoch: int
    clock: int = 0
    attempt_id: Optional[str] = None
    objective: Optional[float] = None
    objective_restored: Optional[float] = None
    checkpoint_time: float = 0.0
    time: float = 0.0
    adopted: bool = False
    executors_adopted: int = 0
    takeover_s: float = 0.0      # how long the take-over took (the executors checked, the last clock waited out)


class RecoveryStatus(msgspec.Struct, kw_only=True):
    """Executor-loss recovery (the controller's planners/recovery.py): whether it is on, the spec's limit, loss
    events counted against it, every loss (described), recoveries and worker replacements done."""

    enabled: bool = False
    max_executor_failures: int = 0
    failures: int = 0
    losses: list[str] = []
    recoveries: int = 0
    replacements: int = 0


class StragglerReplaced(msgspec.Struct, kw_only=True):
    """A slow worker replaced (appmaster.ps.stragglers): its mini-batch time and its peers' median."""

    worker: str
    replacement: str
    seconds: Optional[float] = None
    peers_median: Optional[float] = None


class StragglerStatus(msgspec.Struct, kw_only=True):
    """Straggler replacement: how many times slower than its peers a worker must be, and those replaced."""

    factor: Optional[float] = None
    replaced: list[StragglerReplaced] = []


class EpsTransfer(msgspec.Struct, kw_only=True):
    """One move an EPS operation made: a model block (`kind` "block") or an input split ("split")
    from `src` to `dst` (`reactivate`: an inactive copy taken back instead of sent)."""

    kind: str
    item: int
    src: str
    dst: str
    reactivate: bool = False


class OpShape(msgspec.Struct, kw_only=True):
    """Workers and servers before or after an EPS operation (None: not known, it failed first)."""

    workers: Optional[int] = None
    servers: Optional[int] = None


class EpsOpStatus(msgspec.Struct, kw_only=True):
    """One EPS operation as `eps` shows it (appmaster.ps.eps_records.ElasticOpRecord): the shape
    before and after, what it added, released and moved, how long each step took, how it ended."""

    op: str
    requested: int
    started: float
    epoch_started: int = 0
    epoch_switched: Optional[int] = None
    before: Optional[OpShape] = None
    after: Optional[OpShape] = None
    duration_s: float = 0.0
    containers_added: list[str] = []
    containers_released: list[str] = []
    executors_added: list[str] = []
    executors_removed: list[str] = []
    blocks_moved: int = 0
    splits_moved: int = 0
    splits_reactivated: int = 0
    bytes_sent: int = 0
    transfers: list[EpsTransfer] = []
    training_time_lost_s: float = 0.0
    phases: dict[str, float] = {}
    ok: bool = True
    error: str = ""


class EpsLimits(msgspec.Struct, kw_only=True):
    """The shapes an EPS change may reach (appmaster.ps.controller.planners.eps.limits)."""

    workers: int
    servers: int
    min_workers: int = 1
    min_servers: int = 1


class AuditMismatch(msgspec.Struct, kw_only=True):
    """An epoch after which the servers applied another number of mini-batches than the workers ran."""

    epoch: int
    applied: int
    run: int


class SplitHoldings(msgspec.Struct, kw_only=True):
    """The input splits one worker trains on (`active`) and keeps inactive copies of."""

    active: list[int] = []
    inactive: list[int] = []


class ScaleRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Body of the AM's POST /scale (appmaster.ps.runtime.status_server): signed changes of each role
    (+N adds, -N removes). Its answer, {"changes": [...]}, holds one `EpsOpStatus` per EPS function
    called, or under elastic_mode "kill" the shape history's records of the restart (protocol.shape_history)."""

    workers: int = 0
    servers: int = 0


class EpsStatus(msgspec.Struct, kw_only=True):
    """EPS's section (appmaster.ps.runtime.master.eps_status): whether a change runs and
    which, the members, the exactly-once audit, the op history, the limits and the input splits
    by worker (`limits` and `datasets` None before training is set up)."""

    running: bool = False
    current: Optional[EpsOpStatus] = None
    workers: list[str] = []
    servers: list[str] = []
    minibatches_applied: Optional[int] = None     # None: the job does not audit its updates
    minibatches_run: int = 0
    audit_mismatches: list[AuditMismatch] = []
    history: list[EpsOpStatus] = []
    limits: Optional[EpsLimits] = None
    datasets: Optional[dict[str, SplitHoldings]] = None


class PsStatus(msgspec.Struct, kw_only=True):
    """The PS AM's job status: what `GET /status` serves and `status.json` keeps, built by
    appmaster.ps.runtime.status_view and decoded with `decode_status` by every reader (the CLI, benches,
    tests). Every field has a default: an AM still starting, or an older one, may leave sections out."""

    app: Optional[str] = None
    attempt_id: Optional[str] = None
    application_id: Optional[str] = None
    state: Optional[str] = None
    diagnostics: str = ""
    spec: Optional[PSJobSpec] = None
    started: Optional[float] = None          # unix time the AM started
    shape: Optional[ShapeStatus] = None
    num_blocks: Optional[int] = None
    table_version: Optional[int] = None      # the ownership table's version
    epoch: Optional[int] = None
    # The epoch limit the job's app trains to (its hyper-parameters' max_epochs, the job's own over
    # the class's preset): the CLI's progress needs it for a user's app, whose class it may not have.
    max_epochs: Optional[int] = None
    converged: bool = False
    clocks: Optional[int] = None             # clocks done
    clock_batches: Optional[int] = None      # mini-batches per worker in the next clock
    initial_objective: Optional[float] = None
    objective_history: list[EpochResult] = []
    metrics: MetricsStatus = msgspec.field(default_factory=MetricsStatus)
    checkpoints: list[CheckpointInfo] = []
    heldout: HeldoutStatus = msgspec.field(default_factory=HeldoutStatus)
    stop_criterion: Optional[str] = None
    final_metrics: Optional[dict[str, Optional[float]]] = None
    model_mb: Optional[float] = None
    data_mb: Optional[float] = None
    elastic_mode: Optional[str] = None
    shape_history: list[ShapeChange] = []
    shape_changes: int = 0      # every shape change the job made (shape_history keeps the newest)
    directives: list[DirectiveRecord] = []
    eps: Optional[EpsStatus] = None
    optimizer: Optional[str] = None
    cruise: Optional[CruiseStatus] = None
    resumed_from: Optional[ResumedFrom] = None
    recovery: Optional[RecoveryStatus] = None
    suspension: SuspensionStatus = msgspec.field(default_factory=SuspensionStatus)
    spill: Optional[SpillStatus] = None
    stragglers: Optional[StragglerStatus] = None


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(PsStatus)


def decode_status(obj: object) -> PsStatus:
    """A `/status` answer (JSON builtins) as a `PsStatus`; `msgspec.ValidationError` names a bad field."""
    status: PsStatus = msgspec.convert(obj, PsStatus, strict=True)
    return status


def encode_status(status: PsStatus) -> bytes:
    """The status as JSON: the `/status` body and the bytes of `status.json` (FINAL_STATUS_FILE)."""
    return _ENCODER.encode(status)


def read_status(raw: bytes) -> PsStatus:
    """A `status.json` (or `/status` body) as it was written; `msgspec.DecodeError` when it is not one."""
    status: PsStatus = _DECODER.decode(raw)
    return status


FINAL_STATUS_FILE = "status.json"   # in the AM's durable dir: the job's last status, written as the AM exits


__all__ = ["FINAL_STATUS_FILE", "AuditMismatch", "CheckpointInfo", "EpsLimits", "EpsOpStatus", "EpsStatus", "EpsTransfer",
           "MetricsStatus", "OpShape", "RecoveryStatus", "ResumedFrom", "ScaleRequest", "ServerTimesStatus", "SplitHoldings",
           "StragglerReplaced",
           "StragglerStatus", "WorkerTimesStatus", "encode_status", "read_status", "CruisePlanRecord", "CruiseStatus", "DirectiveRecord", "EpochResult", "ExecutorStatus", "HeldoutPointRecord",
           "HeldoutStatus", "OpTimingRecord", "PlanRunRecord", "PsStatus", "ShapeStatus", "SpillStatus",
           "SuspensionCut", "SuspensionStatus", "decode_status"]

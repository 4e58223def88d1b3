"""The PS job's state as the controller keeps it: typed, no I/O, nothing but data.

`JobState` holds the spec, the phase, the executors by role and state, who holds which model
block and input split, the change in progress (the one change slot) with the directive or request
it applies, what waits for the slot, pending losses, epoch and clock progress and the checkpoints.
`check.check_state` is its invariant checker.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from protocol.internal_api import ShapeDirective
from protocol.ps_job_spec import PSJobSpec

from .instructions import StepInstruction
from .phases import Phase
from .records import ExecutorInfo, Holdings, PlanOp, Role, Target

if TYPE_CHECKING:
    from .planners.cruise_plan import OpRun
    from .planners.eps import Part


class ExecutorState(str, enum.Enum):
    """An executor as the controller knows it."""

    STARTING = "STARTING"      # its container is granted, its process not yet announced
    READY = "READY"            # announced: it can be given work
    RETIRING = "RETIRING"      # stopped on purpose: its container's end is no loss
    LOST = "LOST"              # ended while the job needed it


@dataclass
class Executor:
    info: ExecutorInfo
    state: ExecutorState = ExecutorState.STARTING

    @property
    def executor_id(self) -> str:
        return self.info.executor_id

    @property
    def role(self) -> Role:
        return self.info.role


class ChangeKind(str, enum.Enum):
    """What the change in the job's one change slot is (each has its planner)."""

    START = "start"                # the first executors (and, for a new attempt, the restore)
    EPS = "eps"                    # EPS add / remove / place / relocate, live
    RESTART = "restart"            # the kill-based baseline
    PLAN = "plan"                  # a Cruise plan
    CHECKPOINT = "checkpoint"
    MIGRATE = "migrate"            # the whole job moved through a checkpoint (placement, size)
    RECOVER = "recover"            # executor losses
    STRAGGLER = "straggler"        # Optimus §5.2's replacement of a slow worker
    PAUSE = "pause"
    RESUME = "resume"
    FINISH = "finish"              # the final checkpoint and evaluation


class Origin(str, enum.Enum):
    """Who asked for a change: the reply and the record depend on it."""

    DIRECTIVE = "directive"        # an RM policy's shape directive
    SCALE = "scale"                # POST /scale
    CHECKPOINT = "checkpoint"      # POST /checkpoint or the spec's checkpoint_every_epochs
    OPTIMIZER = "optimizer"        # Cruise
    JOB = "job"                    # the job itself (its start, a loss, a straggler, its end)


@dataclass
class Change:
    """The change in progress: what it is, why, where its planner is, which steps still run."""

    kind: ChangeKind
    origin: Origin
    at: float
    stage: str = "begin"
    target: Optional[Target] = None
    directive_version: int = 0
    requests: list[int] = field(default_factory=list)    # endpoint requests answered when it ends
    outstanding: set[int] = field(default_factory=set)
    steps: dict[int, StepInstruction] = field(default_factory=dict)   # every step it issued
    error: str = ""                # the first step failure: the change rolls back and fails
    aborted: bool = False          # cancelled by a loss (rules.py ABORT): no further steps
    rolling_back: bool = False
    # The planner's working set (filled as steps report back).
    new: list[str] = field(default_factory=list)        # executors this change started
    leaving: list[str] = field(default_factory=list)    # executors this change takes out
    lost: list[str] = field(default_factory=list)       # the losses a recovery handles
    descriptions: list[str] = field(default_factory=list)
    delta: tuple[int, int] = (0, 0)        # a /scale's relative change (workers, servers)
    reason: str = ""
    ops: list[PlanOp] = field(default_factory=list)     # a Cruise plan's ops
    ops_done: set[str] = field(default_factory=set)
    ops_running: dict[int, str] = field(default_factory=dict)     # step -> op id
    bindings: dict[str, str] = field(default_factory=dict)        # plan placeholder -> executor
    op_runs: dict[str, OpRun] = field(default_factory=dict)       # a plan's ops as they run (planners/cruise_plan.py)
    checkpoint: str = ""           # the checkpoint a restart / pause / recovery goes back to
    keep_workers: bool = False     # a recovery from lost servers: the workers stay, with their input
    epoch: int = 0
    parts: list[Part] = field(default_factory=list)   # EPS's parts (planners/eps.py)
    before: Optional[Target] = None    # the shape and size a restart / migration / resume started from
    short: list[str] = field(default_factory=list)   # a restart's starts that came back short (planners/relaunch.py)
    attempt: int = 0               # a paused job's resume tried again (planners/suspension.py)


@dataclass
class JobState:
    """One PS job's state (module doc)."""

    spec: PSJobSpec
    keeps_worker_state: bool = False      # the app keeps training state on its workers (NMF, LDA)
    phase: Phase = Phase.STARTING
    diagnostics: str = ""
    executors: dict[str, Executor] = field(default_factory=dict)
    containers: dict[str, str] = field(default_factory=dict)       # container id -> executor id
    holdings: Holdings = field(default_factory=Holdings)
    change: Optional[Change] = None
    # Waiting for the change slot: the newest directive (older ones are superseded), endpoint
    # requests (replied to when served), a straggler replacement; losses never wait (rules.py).
    kept_directive: Optional[ShapeDirective] = None
    seen_directive: int = 0
    applied_directive: int = 0
    # Why `applied_directive` was acted on as no change although the job lacks its shape: a change
    # the job cannot make (its planner's `invalid`), or a /scale of the job's own that superseded it
    # since. The report carries it, so the RM does not send the same directive again
    # (rm/directive_retry.py); "" when the job made the change or had the shape.
    refused_directive: str = ""
    checkpoint_requests: list[int] = field(default_factory=list)
    # A due checkpoint (checkpoint_every_epochs) whose epoch end found the change slot busy: taken
    # at the next epoch end that finds it free, not skipped to the next due one.
    checkpoint_owed: bool = False
    pending_losses: list[tuple[str, str]] = field(default_factory=list)   # (executor, description)
    lost: dict[str, Executor] = field(default_factory=dict)      # every executor lost, by id
    failures: int = 0                      # executor losses so far (max_executor_failures)
    policy_places: bool = False            # wait for the first directive before starting executors
    first_directive: Optional[ShapeDirective] = None
    resume_from: str = ""                  # a new attempt: the checkpoint an earlier one left
    adopt: bool = False                    # a new attempt: take the failed one's executors over first
    memory_mb: Optional[int] = None       # the executors' size now (a directive may change it)
    vcores: Optional[int] = None
    epoch: int = 0
    clock: int = 0
    iterations: int = 0
    last_objective: Optional[float] = None
    objectives: list[float] = field(default_factory=list)
    checkpoints: list[tuple[int, str]] = field(default_factory=list)    # (epoch, directory)
    # len(checkpoints) when the workers' push logs last stopped holding every push since the latest
    # checkpoint: a worker left (retired, lost, switched to server: its pushes left with it), or a
    # new attempt took the executors over (its clock count restarts from the failed attempt's
    # record, behind the logs' own). Lost servers are not rebuilt from the logs until a checkpoint
    # after that (planners/recovery.py).
    push_logs_incomplete_at: int = -1
    training_criterion: str = ""
    # A PauseTraining was issued and no ResumeTraining since: the AM's training has stopped. A
    # change that a loss aborted after its pause leaves it so, and the recovery that follows
    # resumes it once it has replaced or rebuilt what was lost (planners/recovery.py).
    training_stopped: bool = False
    next_step: int = 1
    # A paused job's resume whose executors did not come: begun again when its timer fires
    # (planners/suspension.py), unless a newer directive had its say meanwhile.
    resume_retry: Optional[Change] = None
    history: list[tuple[Phase, str, Phase]] = field(default_factory=list)     # (from, trigger, to)

    # -- reads ---------------------------------------------------------------------------------
    def members(self, role: Role, *states: ExecutorState) -> list[Executor]:
        want = states or (ExecutorState.READY,)
        return [e for e in self.executors.values() if e.role is role and e.state in want]

    def ids(self, role: Role) -> list[str]:
        """The ready executors of `role`, in the order they joined."""
        return [e.executor_id for e in self.members(role)]

    @property
    def shape(self) -> tuple[int, int]:
        """(workers, servers) serving now."""
        return len(self.members(Role.WORKER)), len(self.members(Role.SERVER))

    @property
    def size(self) -> tuple[int, int]:
        """The executors' container size now, (memory MB, vcores): the spec's until a directive
        sizes them."""
        return (self.memory_mb if self.memory_mb is not None else self.spec.executor_memory_mb,
                self.vcores if self.vcores is not None else self.spec.executor_vcores)

    def node_of(self, executor_id: str) -> str:
        return self.executors[executor_id].info.node

    def new_step(self) -> int:
        step = self.next_step
        self.next_step += 1
        return step

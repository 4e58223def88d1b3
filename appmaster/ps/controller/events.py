"""What happens to a PS job, as typed events: the controller's only input.

Every event carries `at`, the time it happened (seconds, the AM's wall clock or the simulator's):
the controller never reads a clock. The AM's interpreter (appmaster.ps.runtime) makes them from
RM, NM and executor messages and from the steps it carried out; the simulator makes them from its
event loop. `StepDone` / `StepFailed` close an instruction that had a `step` id.
"""
from __future__ import annotations

from typing import Optional, Union

import msgspec

from protocol.internal_api import ShapeDirective

from .records import ExecutorInfo, Holdings, PlanOp


class _Event(msgspec.Struct, kw_only=True, tag_field="event"):
    at: float


class Registered(_Event, tag="registered"):
    """The AM registered with the RM; `policy_places_new_jobs`: wait for the first directive's
    shape and placement before starting executors (Harmony)."""

    policy_places_new_jobs: bool = False
    resume_from: str = ""        # a new attempt: the checkpoint an earlier attempt left ("" none)
    # A new attempt that was handed the failed attempt's running executors and found the record it
    # left (appmaster.ps.attempt_takeover): it tries to take them over before starting any.
    adopt: bool = False


class DirectiveArrived(_Event, tag="directive"):
    """An RM policy's shape directive (with the allocate reply)."""

    directive: ShapeDirective


class ContainersAllocated(_Event, tag="allocated"):
    """Containers the RM granted: each is launched with an executor of its ask's role (the
    interpreter names the executor); `unknown`: containers whose tag names no role."""

    containers: list[ExecutorInfo]
    unknown: list[str] = []


class ContainersCompleted(_Event, tag="completed"):
    """Containers that ended: (container id, what ended it)."""

    containers: list[tuple[str, str]]


class ExecutorReady(_Event, tag="executor_ready"):
    """An executor announced itself (its process runs and answers)."""

    executor: ExecutorInfo


class ExecutorLost(_Event, tag="executor_lost"):
    """An executor the job needed ended without being retired (died, killed, node lost, or
    stopped for not answering): `description` names it, its container and exit status."""

    executor_id: str
    description: str


class ClockDone(_Event, tag="clock_done"):
    """One BSP clock ended: every worker flushed (a clock boundary)."""

    clock: int
    epoch: int
    iterations: int


class EpochDone(_Event, tag="epoch_done"):
    """An epoch ended (at a clock boundary) with its objective."""

    epoch: int
    objective: float
    epoch_time_s: float


class ObjectiveMeasured(_Event, tag="objective"):
    """The model's objective measured outside an epoch end (a restored model, a pause's cut)."""

    objective: float


class TrainingEnded(_Event, tag="training_ended"):
    """The clock loop returned because training is over: converged, epoch limit or early stop."""

    criterion: str


class ScaleRequested(_Event, tag="scale"):
    """POST /scale on the AM (`elastane ps scale`): a relative change; `request` is the id the
    reply instruction answers."""

    request: int
    workers: int
    servers: int


class CheckpointRequested(_Event, tag="checkpoint_requested"):
    """POST /checkpoint on the AM: a checkpoint at the next epoch boundary."""

    request: int


class PlanProposed(_Event, tag="plan"):
    """Cruise's optimizer proposed a plan (at an epoch end or on a capacity change)."""

    ops: list[PlanOp]
    reason: str = ""


class StragglerFound(_Event, tag="straggler"):
    """Optimus §5.2: a worker confirmed much slower than its peers (at an epoch end)."""

    executor_id: str
    why: str


class CheckpointWritten(_Event, tag="checkpoint_written"):
    """A checkpoint of the job is durable (the step that wrote it is done too)."""

    epoch: int
    directory: str


class TimerFired(_Event, tag="timer"):
    """A timer the controller set (`SetTimer`) is due."""

    timer: str


class UserCodeError(_Event, tag="user_error"):
    """The user's app raised: the job fails at once, naming it (no recovery retries user code)."""

    message: str


class StopRequested(_Event, tag="stop"):
    """SIGTERM or the RM's shutdown: stop executors, no unregister (the RM decided already)."""

    reason: str


class StepDone(_Event, tag="step_done"):
    """A step instruction was carried out. `executors`: executors it started (StartExecutors);
    `holdings`: who holds what after it (steps that move blocks or splits, setup, restore)."""

    step: int
    executors: list[ExecutorInfo] = []
    holdings: Optional[Holdings] = None
    directory: str = ""
    objective: Optional[float] = None
    ops: list[PlanOp] = []       # a plan computed for the change (Cruise)
    # Executors taken over (AdoptExecutors): the epochs the job has done, and the epoch of the
    # checkpoint in `directory` (the failed attempt's latest, what a recovery goes back to).
    epochs_done: Optional[int] = None
    checkpoint_epoch: int = 0


class StepFailed(_Event, tag="step_failed"):
    """A step instruction failed (or was cancelled); what it did is in `holdings` /
    `executors` as for StepDone, so a rollback knows what to undo."""

    step: int
    error: str
    cancelled: bool = False
    executors: list[ExecutorInfo] = []
    holdings: Optional[Holdings] = None


Event = Union[Registered, DirectiveArrived, ContainersAllocated, ContainersCompleted, ExecutorReady, ExecutorLost,
              ClockDone, EpochDone, ObjectiveMeasured, TrainingEnded, ScaleRequested, CheckpointRequested,
              PlanProposed, StragglerFound, CheckpointWritten, TimerFired, UserCodeError, StopRequested, StepDone,
              StepFailed]

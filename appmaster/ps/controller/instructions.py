"""What the controller tells the AM's interpreter (or the simulator) to do, as typed records.

Instructions are steps, never whole mechanisms: an EPS add, a kill-based restart, a Cruise plan, a
recovery and a Harmony pause are *sequences* of these (planners/), issued one stage at a time. A
step instruction has a `step` id; the interpreter answers it with `StepDone` or `StepFailed`
(events.py) and the controller issues what follows. The others (`LaunchExecutor`, `Reply`,
`ReportProgress`, `SetTimer`, `Finish`, ...) are fire-and-forget.

Contract of each step (what the interpreter does; the simulator charges its calibrated cost):

    StartExecutors     ask the RM for containers (strict on `nodes` / per node when given) and wait
                       until the executors launched in them announce themselves; all or nothing.
    JoinExecutors      bind new executors to the app and register their addresses with every
                       executor (EPS barrier 1); workers also get EpsJoin.
    RetireExecutors    stop executors that left the job and release their containers (barrier 3).
    MoveModelBlocks    server-to-server migration (the store's two-step protocol) alongside the
                       running epoch, whose end waits for it; `drop` leave the server lists.
    StageSplits        worker-to-worker input data, alongside the running epoch.
    CommitSplits       at the next clock boundary: the splits' state follows, holders change.
    DiscardStaged      staged copies of splits that will not move after all are dropped.
    SwitchRole         worker <-> server in place.
    WaitClockBoundary  the next clock boundary (every worker flushed).
    PauseTraining      training stops at the next clock boundary (a consistent cut).
    ResumeTraining     training runs again.
    SetupTraining      place blocks on the servers, partitions on the workers, the initial model.
    WriteCheckpoint    every server block (and workers' block state where the app keeps it).
    RestoreCheckpoint  a checkpoint onto (new) executors: place, regenerate, restore, positions;
                       with `workers_kept` only the servers are new, and the workers keep their
                       input (they let go of the old servers and go back to the checkpoint's
                       positions and worker state).
    RebuildServers     lost servers' blocks on `new` servers (started and joined, owning nothing)
                       without going back: the latest checkpoint's blocks plus every worker's
                       pushes since it (psruntime.push_log); the clock they were lost in runs
                       again from where it began. A failure leaves the new servers to retire.
    AdoptExecutors     a new AM attempt takes over the executors the failed one left running (the
                       RM hands their containers over): check them against the record that
                       attempt left, cut and wait out the clock it started, read every input
                       block's place; StepDone names them (`executors`, `holdings`, the epochs
                       done and the checkpoint a recovery goes back to). A failure stops every
                       container handed over (the start goes on with new executors).
    ScoreModel         the final held-out evaluation and the model output.
    ComputePlan        Cruise's optimizer plans the job onto `workers + servers` containers (it
                       picks the split itself) with new executors on `nodes` (empty: anywhere);
                       answered by StepDone with the plan's `ops` (none: keep the configuration).
    TakeOverSplits     `new` (a joined worker holding no split) generates `old`'s active `splits`
                       at the positions they had when the clock began and takes `old`'s place in
                       the clock list and the BSP barrier: at once for a lost `old` (the clock it
                       was lost in waits and runs again on `new`), at the next clock boundary for
                       a live one (a straggler, which then holds nothing).
"""
from __future__ import annotations

from typing import Optional, Union

import msgspec

from protocol import executor_ops as ops

from .records import Move, Role


class _Instruction(msgspec.Struct, kw_only=True, tag_field="op"):
    pass


class _Step(_Instruction, kw_only=True):
    step: int


# ---- steps -------------------------------------------------------------------------------------
class StartExecutors(_Step, tag="start_executors"):
    role: Role
    count: int
    nodes: list[str] = []
    per_node: dict[str, int] = {}
    # What started of a start that came short is kept and named in its StepFailed (a restart's:
    # planners/relaunch.py `keeps_short_start`); otherwise it is all or nothing.
    keep_short: bool = False


class JoinExecutors(_Step, tag="join_executors"):
    role: Role
    executors: list[str]


class RetireExecutors(_Step, tag="retire_executors"):
    executors: list[str]
    released: bool = True        # the change gives them back (counted as removed in its record)


class MoveModelBlocks(_Step, tag="move_model_blocks"):
    moves: list[Move]
    drop: list[str] = []


class StageSplits(_Step, tag="stage_splits"):
    moves: list[Move]


class CommitSplits(_Step, tag="commit_splits"):
    moves: list[Move]
    keep_inactive: bool
    joining: list[str] = []      # new workers: into the clock list once they hold splits
    leaving: list[str] = []      # workers that leave the clock list once their splits moved


class DiscardStaged(_Step, tag="discard_staged"):
    moves: list[Move]


class SwitchRole(_Step, tag="switch_role"):
    executor: str
    role: Role


class SendExecutorRequest(_Step, tag="send_request"):
    """One of protocol.executor_ops' requests to `executors` (e.g. EpsJoin)."""

    executors: list[str]
    request: ops.ExecutorRequest


class WaitClockBoundary(_Step, tag="wait_boundary"):
    pass


class PauseTraining(_Step, tag="pause_training"):
    pass


class ResumeTraining(_Step, tag="resume_training"):
    pass


class SetupTraining(_Step, tag="setup_training"):
    pass


class WriteCheckpoint(_Step, tag="write_checkpoint"):
    epoch: int
    reason: str


class RestoreCheckpoint(_Step, tag="restore_checkpoint"):
    directory: str
    servers: list[str]
    workers: list[str]
    workers_kept: bool = False      # the workers stayed through a server loss: none regenerates its input


class RebuildServers(_Step, tag="rebuild_servers"):
    lost: list[str]                 # lost servers, each rebuilt on the new server at the same index
    new: list[str]
    directory: str                  # the latest checkpoint


class AdoptExecutors(_Step, tag="adopt_executors"):
    pass


class ScoreModel(_Step, tag="score_model"):
    pass


class ComputePlan(_Step, tag="compute_plan"):
    workers: int
    servers: int
    nodes: list[str] = []


class TakeOverSplits(_Step, tag="take_over_splits"):
    old: str
    new: str
    splits: list[int]


# ---- fire and forget ----------------------------------------------------------------------------
class LaunchExecutor(_Instruction, tag="launch_executor"):
    """Start an executor of `role` in a granted container."""

    container_id: str
    role: Role


class ReleaseContainer(_Instruction, tag="release_container"):
    """Give back a container the job has no use for (an unknown tag, a surplus grant)."""

    container_id: str


class WithdrawAsks(_Instruction, tag="withdraw_asks"):
    """Ask the RM for nothing more for `step` (its executors came, or it was given up)."""

    step: int


class CancelSteps(_Instruction, tag="cancel_steps"):
    """Stop running steps (a loss ends the change they belong to); each answers StepFailed."""

    steps: list[int]


class ReportProgress(_Instruction, tag="report"):
    """Send the RM the job report now (shape, changing, directive version acted on; why that
    version was refused is the job state's `refused_directive`)."""

    changing: bool
    directive_version: int


class Reply(_Instruction, tag="reply"):
    """Answer a request made at the AM's endpoint (/scale, /checkpoint): `status` is HTTP's."""

    request: int
    status: int
    message: str = ""
    directory: str = ""


class SetTimer(_Instruction, tag="set_timer"):
    timer: str
    at: float


class Finish(_Instruction, tag="finish"):
    """Stop every executor; unregister with `final_status` (None: stopped, no unregister)."""

    final_status: Optional[str]
    diagnostics: str


StepInstruction = Union[StartExecutors, JoinExecutors, RetireExecutors, MoveModelBlocks, StageSplits, CommitSplits,
                        DiscardStaged, SwitchRole, SendExecutorRequest, WaitClockBoundary, PauseTraining,
                        ResumeTraining, SetupTraining, WriteCheckpoint, RestoreCheckpoint, AdoptExecutors, ScoreModel,
                        ComputePlan, TakeOverSplits, RebuildServers]
Instruction = Union[StepInstruction, LaunchExecutor, ReleaseContainer, WithdrawAsks, CancelSteps, ReportProgress,
                    Reply, SetTimer, Finish]
STEP_TYPES: tuple[type, ...] = StepInstruction.__args__     # type: ignore[attr-defined]

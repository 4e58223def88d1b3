"""Recovery from executor losses as a planner (the AM's executor-loss recovery, docs/internals.md).

`admit` decides whether the job survives a loss (max_executor_failures, a checkpoint to go back
to); `needs_recovery` whether the loss needs one (a new worker that held no split trained
nothing); losses reported together are one event (`merge`). The checkpoint path: training stops,
every executor is retired, the job's shape starts afresh and continues from the latest checkpoint
(its epoch count, objective and every input block's place come back with it).
"""
from __future__ import annotations

from typing import Optional

from ..events import StepDone, StepFailed
from ..instructions import Instruction, PauseTraining, RestoreCheckpoint, RetireExecutors, StartExecutors
from ..records import Role, Target
from ..state import Change, ChangeKind, Executor, JobState
from .base import BasePlanner, end_job_failed, issue


def admit(job: JobState, lost: Executor, description: str, merging: bool = False) -> Optional[str]:
    """None when the job survives losing `lost`, else the diagnostics to fail it with."""
    if merging:
        return None               # the same event as the recovery running (a lost node's executors)
    spec = job.spec
    why = ("max_executor_failures is 0" if spec.max_executor_failures == 0 else
           f"the job is {job.phase.value}, not training" if not (job.phase.trains or job.change is not None) else
           "no checkpoint to go back to yet" if not job.checkpoints else
           (f"gave up after {job.failures + 1} executor failures "
            f"(max_executor_failures {spec.max_executor_failures})")
           if job.failures >= spec.max_executor_failures else None)
    if why is not None:
        return f"{why}; the last: {description}" if job.failures else description
    job.failures += 1
    return None


def needs_recovery(job: JobState, lost: Executor) -> bool:
    """A worker that held no input split (an EPS addition before its commit) trained nothing:
    there is nothing to recover (the change adding it fails on its own)."""
    return lost.role is Role.SERVER or lost.executor_id in job.holdings.splits


def merge(job: JobState, change: Change, lost: Executor, description: str, out: list[Instruction]) -> None:
    """A further loss while a recovery runs: the same recovery handles it."""
    change.lost.append(lost.executor_id)
    change.descriptions.append(description)


class RecoveryPlanner(BasePlanner):
    """The checkpoint path (module doc): pause -> retire all -> start the shape -> restore."""

    kind = ChangeKind.RECOVER

    def begin(self, job: JobState, change: Change, out: list[Instruction]) -> None:
        change.stage = "pause"
        w, s = _shape_before(job, change)
        change.target = Target(workers=w, servers=s)
        issue(change, out, PauseTraining(step=job.new_step()))

    def done(self, job: JobState, change: Change, ev: StepDone, out: list[Instruction]) -> None:
        if change.stage == "pause":
            change.stage = "retire"
            alive = [e.executor_id for e in job.executors.values()]
            if alive:
                issue(change, out, RetireExecutors(step=job.new_step(), executors=alive, released=False))
                return
        if change.stage == "retire" and not change.outstanding:
            change.stage = "start"
            assert change.target is not None
            issue(change, out, StartExecutors(step=job.new_step(), role=Role.SERVER, count=change.target.servers))
            issue(change, out, StartExecutors(step=job.new_step(), role=Role.WORKER, count=change.target.workers))
            return
        if change.stage == "start" and not change.outstanding:
            change.stage = "restore"
            change.checkpoint = job.checkpoints[-1][1]
            issue(change, out, RestoreCheckpoint(step=job.new_step(), directory=change.checkpoint,
                                                 servers=job.ids(Role.SERVER), workers=job.ids(Role.WORKER)))
            return
        if change.stage == "restore":
            job.epoch = job.checkpoints[-1][0]
            change.stage = "done"

    def failed(self, job: JobState, change: Change, ev: StepFailed, out: list[Instruction]) -> None:
        end_job_failed(job, change, f"recovery from {'; '.join(change.descriptions)} failed: {ev.error}", out)


def _shape_before(job: JobState, change: Change) -> tuple[int, int]:
    """The shape the job had before its losses: what the recovery starts again."""
    w, s = job.shape
    for eid in change.lost:
        x = job.lost.get(eid)
        if x is not None and x.role is Role.WORKER:
            w += 1
        elif x is not None:
            s += 1
    return w, s

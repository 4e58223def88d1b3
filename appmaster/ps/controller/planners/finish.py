"""The end of training as a planner: the final checkpoint (unless the latest one is of this very
epoch), the held-out evaluation and the model output, then SUCCEEDED."""
from __future__ import annotations

from ..events import StepDone, StepFailed
from ..instructions import Finish, Instruction, ScoreModel, WriteCheckpoint
from ..phases import Trigger
from ..state import Change, ChangeKind, JobState
from .base import BasePlanner, fire, issue


class FinishPlanner(BasePlanner):
    """TRAINING -TRAINED-> FINISHING -FINISHED-> SUCCEEDED."""

    kind = ChangeKind.FINISH

    def begin(self, job: JobState, change: Change, out: list[Instruction]) -> None:
        fire(job, Trigger.TRAINED)
        if job.checkpoints and job.checkpoints[-1][0] == job.epoch:
            self._score(job, change, out)
        else:
            change.stage = "checkpoint"
            issue(change, out, WriteCheckpoint(step=job.new_step(), epoch=job.epoch, reason="final"))

    def _score(self, job: JobState, change: Change, out: list[Instruction]) -> None:
        change.stage = "score"
        issue(change, out, ScoreModel(step=job.new_step()))

    def done(self, job: JobState, change: Change, ev: StepDone, out: list[Instruction]) -> None:
        if change.stage == "checkpoint":
            job.checkpoints.append((job.epoch, ev.directory))
            self._score(job, change, out)
            return
        change.stage = "done"
        fire(job, Trigger.FINISHED)
        out.append(Finish(final_status="SUCCEEDED", diagnostics=job.training_criterion))

    def failed(self, job: JobState, change: Change, ev: StepFailed, out: list[Instruction]) -> None:
        change.stage = "done"
        fire(job, Trigger.FAIL, ev.error)
        out.append(Finish(final_status="FAILED", diagnostics=ev.error))

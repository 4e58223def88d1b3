"""A checkpoint at an epoch boundary as a planner: due every `checkpoint_every_epochs`, or asked
for at the AM's endpoint (every request waiting is answered with the same checkpoint)."""
from __future__ import annotations

from ..events import StepDone
from ..instructions import Instruction, WriteCheckpoint
from ..state import Change, ChangeKind, JobState
from .base import BasePlanner, issue


class CheckpointPlanner(BasePlanner):
    """One WriteCheckpoint; the change ends with the checkpoint's directory."""

    kind = ChangeKind.CHECKPOINT

    def begin(self, job: JobState, change: Change, out: list[Instruction]) -> None:
        change.stage = "write"
        issue(change, out, WriteCheckpoint(step=job.new_step(), epoch=change.epoch, reason=change.reason or "due"))

    def done(self, job: JobState, change: Change, ev: StepDone, out: list[Instruction]) -> None:
        job.checkpoints.append((change.epoch, ev.directory))
        change.checkpoint = ev.directory
        change.stage = "done"

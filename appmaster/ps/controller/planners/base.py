"""What every planner is: a pure function object that turns the job's state and the change in
its slot into step instructions, one stage at a time (no I/O, no clock)."""
from __future__ import annotations

from typing import Protocol

from ..events import StepDone, StepFailed, TimerFired
from ..instructions import CancelSteps, Finish, Instruction, PauseTraining, ResumeTraining, StepInstruction
from ..phases import LIFECYCLE, Trigger
from ..state import Change, ChangeKind, JobState


class Planner(Protocol):
    """One mechanism (EPS, the kill-based restart, a Cruise plan, recovery, suspension, ...).

    `begin` issues the change's first steps; `done` / `failed` are called for each of its steps
    that ends and issue what follows. A planner marks the change finished by setting its stage to
    "done" once nothing it issued is outstanding; it records a failure in `change.error` (the
    first one wins) and issues its rollback steps before finishing.
    """

    kind: ChangeKind

    def needed(self, job: JobState, change: Change) -> bool:
        """Whether the change would change anything (a directive for the shape the job has: no)."""
        ...

    def invalid(self, job: JobState, change: Change) -> str:
        """Why the change cannot be made ("" if it can): answered 400, nothing changes."""
        ...

    def begin(self, job: JobState, change: Change, out: list[Instruction]) -> None: ...

    def done(self, job: JobState, change: Change, ev: StepDone, out: list[Instruction]) -> None: ...

    def failed(self, job: JobState, change: Change, ev: StepFailed, out: list[Instruction]) -> None: ...

    def timer(self, job: JobState, change: Change, ev: TimerFired, out: list[Instruction]) -> None: ...


class BasePlanner:
    """Defaults: always needed, always valid, a failed step fails the change (nothing to roll
    back), timers ignored. Planners override what their mechanism needs."""

    kind: ChangeKind

    def needed(self, job: JobState, change: Change) -> bool:
        return True

    def invalid(self, job: JobState, change: Change) -> str:
        return ""

    def failed(self, job: JobState, change: Change, ev: StepFailed, out: list[Instruction]) -> None:
        fail_change(change, ev.error)
        if not change.outstanding:
            change.stage = "done"

    def timer(self, job: JobState, change: Change, ev: TimerFired, out: list[Instruction]) -> None:
        return None


def issue(change: Change, out: list[Instruction], step: StepInstruction) -> int:
    """Emit a step of `change`: it is outstanding until its StepDone / StepFailed."""
    change.outstanding.add(step.step)
    change.steps[step.step] = step
    out.append(step)
    return step.step


def pause_training(job: JobState, change: Change, out: list[Instruction]) -> None:
    """Issue PauseTraining for `change`; the job's training is stopped until a resume
    (`JobState.training_stopped`, which a recovery reads: planners/recovery.py)."""
    job.training_stopped = True
    issue(change, out, PauseTraining(step=job.new_step()))


def resume_training(job: JobState, change: Change, out: list[Instruction]) -> None:
    """Issue ResumeTraining for `change`: the job trains again."""
    job.training_stopped = False
    issue(change, out, ResumeTraining(step=job.new_step()))


def fail_change(change: Change, error: str) -> None:
    """Record the change's first failure (later ones are consequences)."""
    if not change.error:
        change.error = error


def end_job_failed(job: JobState, change: Change, diagnostics: str, out: list[Instruction]) -> None:
    """A change whose failure the job cannot survive (its start, a recovery): the job fails."""
    fail_change(change, diagnostics)
    change.stage = "done"
    if change.outstanding:
        out.append(CancelSteps(steps=sorted(change.outstanding)))
        change.outstanding.clear()
    fire(job, Trigger.FAIL, diagnostics)
    out.append(Finish(final_status="FAILED", diagnostics=diagnostics))


def fire(job: JobState, trigger: Trigger, why: str = "") -> None:
    """Take the job's lifecycle through `trigger` (JobTransitionError when out of place)."""
    nxt = LIFECYCLE.next(job.phase, trigger)
    job.history.append((job.phase, trigger.value, nxt))
    job.phase = nxt
    if why:
        job.diagnostics = why

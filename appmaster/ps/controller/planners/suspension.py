"""Harmony's suspension (§4.3.2) and the migration through a checkpoint, as planners over
relaunch.py's sequence.

PAUSE (a directive with run state PAUSE, the job training): pause at a clock boundary, checkpoint
the cut, retire every executor; then the job sits in PAUSED holding nothing but its AM, and the
change slot is free (a scale or checkpoint request is refused while paused, a directive acted on
at once: rules.PAUSED_RULES). A pause that fails before its retire -- training ended before the
boundary, the checkpoint failed, a loss aborted it -- ends back in TRAINING (the loss's recovery
follows).

RESUME (a RESUME or RUN directive, the job paused): start the directive's shape where its placement
says, at its executor size, restore the pause's checkpoint with every input block's place, resume
training. When the executors do not come the job is paused again, on the same cut, and the resume
is tried again after RESUME_RETRY_S, up to RESUME_TRIES in all, unless a newer directive has its
say first (a job that cannot get its placement yet keeps its progress rather than failing).

MIGRATE (a directive with another executor size: every executor is a new container): the whole
job moves through a checkpoint -- pause, checkpoint, retire all, start at the new size and
placement, restore, resume -- so it never waits for room its own old executors hold (Harmony
pauses to move, §4.3.2). The new size is the job's (`JobState.memory_mb` / `vcores`) from its
start on; a migration that fails goes back to the old size and shape.
"""
from __future__ import annotations

from typing import Optional

from ..events import TimerFired
from ..instructions import Instruction, SetTimer
from ..phases import Phase, Trigger
from ..records import Target
from ..state import Change, ChangeKind, JobState
from .base import fail_change, fire
from .relaunch import Relaunch, placed

RESUME_TRIES = 5           # a resume that got no executors is tried this often in all
RESUME_RETRY_S = 5.0       # a backoff before asking the RM again


class PausePlanner(Relaunch):
    """TRAINING -PAUSE-> PAUSING -PAUSED-> PAUSED (module doc)."""

    kind = ChangeKind.PAUSE
    stages = ("pause", "checkpoint", "retire")
    reason = "pause"

    def finished(self, job: JobState, change: Change, out: list[Instruction]) -> None:
        fire(job, Trigger.PAUSED)


class ResumePlanner(Relaunch):
    """PAUSED -RESUME-> RESUMING -CHANGE_DONE-> TRAINING, or -PAUSED-> PAUSED (module doc)."""

    kind = ChangeKind.RESUME
    stages = ("start", "restore", "resume")

    def prepare(self, job: JobState, change: Change, out: list[Instruction]) -> bool:
        job.resume_retry = None              # this resume (a newer directive's, or the retry) runs now
        if not change.checkpoint:
            fail_change(change, "resume failed: the job has no checkpoint to resume from")
            fire(job, Trigger.PAUSED)
            return False
        return True

    def finished(self, job: JobState, change: Change, out: list[Instruction]) -> None:
        job.resume_retry = None

    def back_where_it_was(self, job: JobState, change: Change, at: float, out: list[Instruction]) -> None:
        """The new executors are retired: paused again, on the same cut, the resume tried later."""
        assert change.before is not None
        job.memory_mb, job.vcores = change.before.memory_mb, change.before.vcores
        fire(job, Trigger.PAUSED)
        change.stage = "done"
        if change.attempt + 1 < RESUME_TRIES:
            job.resume_retry = change
            out.append(SetTimer(timer=retry_timer(change), at=at + RESUME_RETRY_S))


def retry_timer(failed: Change) -> str:
    """The timer that tries a failed resume again."""
    return f"resume:v{failed.directive_version}:{failed.attempt + 1}"


def retry(job: JobState, e: TimerFired) -> Optional[Change]:
    """A paused job's timer: the resume to begin again, if this is its timer and no newer directive
    has been acted on since (a PAUSE repeated, or a newer resume)."""
    failed = job.resume_retry
    if failed is None or job.change is not None or job.phase is not Phase.PAUSED or e.timer != retry_timer(failed):
        return None
    job.resume_retry = None
    if job.applied_directive != failed.directive_version:
        return None
    return Change(ChangeKind.RESUME, failed.origin, e.at, target=failed.target,
                  directive_version=failed.directive_version, attempt=failed.attempt + 1)


class MigratePlanner(Relaunch):
    """TRAINING -MIGRATE-> MIGRATING -CHANGE_DONE-> TRAINING (module doc)."""

    kind = ChangeKind.MIGRATE
    reason = "migrate"

    def needed(self, job: JobState, change: Change) -> bool:
        t = change.target
        assert t is not None
        return resized(job, t) or (t.workers, t.servers) != job.shape or not placed(job, t)


def resized(job: JobState, t: Target) -> bool:
    """Whether `t` asks for executors of another size than the job's now (the spec's until a
    directive sized them): a directive that repeats the size moves nothing."""
    return t.memory_mb is not None and (t.memory_mb, t.vcores if t.vcores is not None else job.size[1]) != job.size

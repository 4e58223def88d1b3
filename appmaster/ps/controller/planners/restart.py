"""The kill-based baseline of elastic scaling as a planner (Optimus §5.4, Dorm §III-C; "kill-based"
in EPS §6), for jobs with `elastic_mode = "kill"`: a /scale or a shape directive changes the job's
shape the way those systems do, through relaunch.py's whole sequence -- pause at a clock
boundary, checkpoint the cut, retire every executor, start the new shape (per node as a
directive's placement says, else on its nodes, else anywhere), restore the checkpoint with every
input block's place, and training resumes. No progress is lost: the epoch count, objective history
and learning-rate schedule carry on from the cut; nothing trains from the pause to the resume.

Optimus and Dorm checkpoint only the servers' model; apps that keep training state on their
workers (NMF, LDA) would lose it, so the interpreter's checkpoint holds every worker's block
state too, taken at the same boundary, and the restore puts it back (JobState.keeps_worker_state).

A /scale is checked first (`invalid`: answered 400, nothing changes); a directive for the shape and
placement the job has already is no change (`needed`).
"""
from __future__ import annotations

from typing import Optional

from ..state import Change, ChangeKind, JobState, Origin
from .eps import shape_problem
from .relaunch import Relaunch, placed


def check_target(workers: int, servers: int, max_workers: Optional[int], max_servers: Optional[int]) -> str:
    """Why a shape is impossible for a job with these bounds ("" if it is possible), naming the field."""
    for name, v, most in (("workers", workers, max_workers), ("servers", servers, max_servers)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            return f"{name} must be an integer >= 1, got {v!r}"
        if most is not None and v > most:
            return f"{name}: {v} is above the job's max_{name} ({most})"
    return ""


class RestartPlanner(Relaunch):
    """The kill-based restart (module doc): TRAINING -RESTART-> RESTARTING -CHANGE_DONE-> TRAINING."""

    kind = ChangeKind.RESTART
    reason = "reshape"
    keeps_short_start = True        # a busy cluster's short start trains on (relaunch.py)

    def invalid(self, job: JobState, change: Change) -> str:
        if change.origin is Origin.SCALE:
            for name, d in zip(("workers", "servers"), change.delta):
                if not isinstance(d, int) or isinstance(d, bool):
                    return f"{name} must be a signed integer change, got {d!r}"
            if change.delta == (0, 0):
                return "nothing to change: give workers and/or servers as +N or -N"
        t = change.target
        assert t is not None
        # The spec's bounds first, then what every elastic mode is bound by: no more workers than
        # input splits, no more servers than model blocks (a restart to more would start executors
        # that have nothing to hold).
        return (check_target(t.workers, t.servers, job.spec.max_workers, job.spec.max_servers)
                or shape_problem(job, t.workers, t.servers))

    def needed(self, job: JobState, change: Change) -> bool:
        t = change.target
        assert t is not None
        return (t.workers, t.servers) != job.shape or not placed(job, t)

"""Optimus §5.2's straggler replacement as a planner: a worker confirmed much slower than its
peers is replaced the way a lost worker is (recovery.Replacement: StartExecutors ->
JoinExecutors -> TakeOverSplits, the new worker taking the slow one's splits and clock-list place
at a clock boundary), then the slow one is retired and its container given back. Training runs
throughout: the new worker starts and joins beside it.

Refused, with nothing changed, where a lost worker would not be replaced either (SSP, an app
keeping state on its workers) or a loss is pending; while another change runs the core ignores
the finding (rules.RULES). A replacement that fails retires the new worker and leaves the
straggler in place: a straggler is slow, not fatal.
"""
from __future__ import annotations

from ..events import StepDone, StepFailed
from ..instructions import Instruction, RetireExecutors, TakeOverSplits
from ..records import Role
from ..state import Change, ChangeKind, ExecutorState, JobState
from .base import BasePlanner, fail_change, issue
from .recovery import Replacement


class StragglerPlanner(BasePlanner):
    """Replace `change.lost[0]`, a slow live worker, then retire it (module doc)."""

    kind = ChangeKind.STRAGGLER

    def invalid(self, job: JobState, change: Change) -> str:
        if job.spec.sync != "bsp":
            return "a straggler is replaced at a BSP clock boundary; this job runs SSP"
        if job.keeps_worker_state:
            return "the app keeps training state on its workers: a replacement could not take it over"
        if job.pending_losses:
            return "a lost executor is waiting for its recovery"
        slow = change.lost[0] if len(change.lost) == 1 else ""
        x = job.executors.get(slow)
        if x is None or x.role is not Role.WORKER or x.state is not ExecutorState.READY \
                or not job.holdings.splits.get(slow):
            return f"{slow or change.lost} is not a worker training input splits"
        return ""

    def begin(self, job: JobState, change: Change, out: list[Instruction]) -> None:
        problem = self.invalid(job, change)
        if problem:
            fail_change(change, problem)
            change.stage = "done"
            return
        change.stage = "replace"
        Replacement.start(job, change, 1, out)

    def done(self, job: JobState, change: Change, ev: StepDone, out: list[Instruction]) -> None:
        instr = change.steps[ev.step]
        if change.stage == "replace":
            Replacement.done(job, change, ev, out)
            if isinstance(instr, TakeOverSplits):
                change.stage = "retire"
                change.leaving = [instr.old]
                issue(change, out, RetireExecutors(step=job.new_step(), executors=[instr.old]))
            elif not change.outstanding:          # no new worker came
                fail_change(change, "no replacement worker started")
                change.stage = "done"
            return
        change.stage = "done"                     # the slow one retired (or an undo ended)

    def failed(self, job: JobState, change: Change, ev: StepFailed, out: list[Instruction]) -> None:
        fail_change(change, f"replacing straggler {change.lost[0]} failed: {ev.error}")
        if change.stage == "replace":
            # The straggler keeps its place: new workers that took nothing over go again.
            started = change.new + [x.executor_id for x in ev.executors]
            idle = [e for e in dict.fromkeys(started) if e in job.executors and not job.holdings.splits.get(e)]
            if idle:
                change.stage = "undo"
                issue(change, out, RetireExecutors(step=job.new_step(), executors=idle, released=False))
                return
        if not change.outstanding:
            change.stage = "done"

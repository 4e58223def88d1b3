"""The stop-and-start sequence that the kill-based restart, Harmony's pause and resume and a
migration share: each takes the whole job through a checkpoint while training is stopped.

    pause       PauseTraining: training stops at the next clock boundary (no push in flight, so
                the model is a consistent cut; mid-epoch, every input block's place is kept)
    checkpoint  WriteCheckpoint of that cut (every server block; the workers' block state too,
                for apps that keep it: NMF, LDA)
    retire      RetireExecutors: every executor stops and its container goes back to the RM
    start       StartExecutors for servers and workers at once: per node as the target's
                placement says, else on its nodes, else anywhere, at the target's executor size
    restore     RestoreCheckpoint onto the new executors: blocks placed, partitions regenerated,
                the model restored and every input block put back at its place in the epoch
    resume      ResumeTraining: training goes on from the cut; no mini-batch runs twice or never

A planner runs a contiguous part of it (`stages`): the restart and the migration all six, the
pause the first three, the resume the last three (from the pause's checkpoint).

Rollback, by the stage that failed (the change then ends with the first error):
    pause, checkpoint   nothing is lost: training resumes -- unless it has ended meanwhile, or a
                        loss aborted the change: the recovery that follows resumes it (its
                        checkpoint path as always; a replacement or a rebuild in place once done,
                        as `job.training_stopped` says)
    retire              the executors' state is unknown: the job fails
    start, for a planner that keeps a short start (`keeps_short_start`: the restart)
                        the cluster gave fewer executors than asked within the launch timeout:
                        once both roles' starts have ended, if each role has at least the job's
                        minimum (min_workers / min_servers), the change goes on with what
                        started -- restored and training at that shape, which the job's next
                        report tells the RM -- rather than retiring them to go back (a busy
                        cluster would refuse the way back too, and the job failed with it);
                        going back short is kept the same way. Fewer than the minimum: below.
    start, or a restore cancelled by a loss
                        every executor now is one this change started: they are retired and the
                        job goes back to where it was -- the shape it had (anywhere: the nodes it
                        left may be taken), at its old size, restored from the cut and training
                        (`ResumePlanner`: paused again). This *is* the recovery of a loss among
                        the new executors, so such losses are taken off the pending ones.
    restore             the cut cannot be restored: the job fails (as the AM's restart did)
    resume              with a loss pending, the change ends and the recovery follows (the job has
                        its new shape, restored); otherwise the job fails
    a rollback step     the job fails
"""
from __future__ import annotations

from collections import Counter
from ..events import StepDone, StepFailed
from ..instructions import (CancelSteps, Instruction, RestoreCheckpoint, RetireExecutors, StartExecutors, WriteCheckpoint)
from ..records import Role, Target
from ..state import Change, ExecutorState, JobState
from .base import BasePlanner, end_job_failed, fail_change, issue, pause_training, resume_training

STAGES = ("pause", "checkpoint", "retire", "start", "restore", "resume")
_ALIVE = (ExecutorState.STARTING, ExecutorState.READY)


def alive(job: JobState) -> list[str]:
    """Every executor the job has now that is not leaving (starting or serving)."""
    return [e.executor_id for e in job.executors.values() if e.state in _ALIVE]


def current_target(job: JobState) -> Target:
    """What the job is now: its shape and executor size (no placement: a rollback starts the
    shape anywhere, since the nodes it left may have been given to another job meanwhile)."""
    w, s = job.shape
    return Target(workers=w, servers=s, memory_mb=job.memory_mb, vcores=job.vcores)


def placed(job: JobState, t: Target) -> bool:
    """Whether the job's executors are where `t` puts them: with a per-node placement, exactly its
    workers and servers on each of its nodes and none elsewhere; else every one on `t.nodes`
    (none named: anywhere). Starting executors count, as the AM's pool counted launching ones."""
    live = [e for e in job.executors.values() if e.state in _ALIVE]
    if t.placement:
        have = Counter((e.info.node, e.role) for e in live)
        return dict(have) == {(node, role): n for role in Role for node, n in t.per_node(role).items()}
    return not t.nodes or all(e.info.node in t.nodes for e in live)


class Relaunch(BasePlanner):
    """The sequence of the module doc over `stages`; subclasses say which and what ends it."""

    stages: tuple[str, ...] = STAGES
    reason = "reshape"              # the checkpoint's reason (the job record's)
    keeps_short_start = False       # a start short of its target goes on with what started (module doc)

    # -- hooks ---------------------------------------------------------------------------------------
    def prepare(self, job: JobState, change: Change, out: list[Instruction]) -> bool:
        """Before the first stage; False: the change ended already (its error set)."""
        return True

    def finished(self, job: JobState, change: Change, out: list[Instruction]) -> None:
        """The last stage is done."""
        return None

    def back_where_it_was(self, job: JobState, change: Change, at: float, out: list[Instruction]) -> None:
        """A failed start (module doc) has retired the new executors: go back to the shape the
        change started from, restored from the cut, training."""
        self._stage(job, change, "undo_start", at, out)

    # -- the sequence --------------------------------------------------------------------------------
    def begin(self, job: JobState, change: Change, out: list[Instruction]) -> None:
        change.before = current_target(job)
        if "checkpoint" not in self.stages and job.checkpoints:
            change.checkpoint = job.checkpoints[-1][1]      # the pause's cut: nothing trained since
        if not self.prepare(job, change, out):
            change.stage = "done"
            return
        self._stage(job, change, self.stages[0], change.at, out)

    def _stage(self, job: JobState, change: Change, stage: str, at: float, out: list[Instruction]) -> None:
        change.stage = stage
        if stage == "pause":
            pause_training(job, change, out)
        elif stage == "checkpoint":
            change.epoch = job.epoch
            issue(change, out, WriteCheckpoint(step=job.new_step(), epoch=change.epoch, reason=self.reason))
        elif stage in ("retire", "undo_retire"):
            leaving = alive(job)
            for eid in leaving:     # from now on their containers' ends are expected, not losses
                job.executors[eid].state = ExecutorState.RETIRING
            if leaving:
                issue(change, out, RetireExecutors(step=job.new_step(), executors=leaving,
                                                   released=stage == "retire"))
            else:
                self._next(job, change, at, out)
        elif stage in ("start", "undo_start"):
            target = change.target if stage == "start" else change.before
            assert target is not None
            if stage == "undo_start":
                job.memory_mb, job.vcores = target.memory_mb, target.vcores
            elif target.memory_mb is not None:   # the interpreter asks for containers of this size
                job.memory_mb, job.vcores = target.memory_mb, target.vcores
            for role in (Role.SERVER, Role.WORKER):
                per_node = target.per_node(role)
                count = sum(per_node.values()) or (target.servers if role is Role.SERVER else target.workers)
                issue(change, out, StartExecutors(step=job.new_step(), role=role, count=count,
                                                  nodes=[] if per_node else list(target.nodes), per_node=per_node,
                                                  keep_short=self.keeps_short_start))
        elif stage in ("restore", "undo_restore"):
            issue(change, out, RestoreCheckpoint(step=job.new_step(), directory=change.checkpoint,
                                                 servers=job.ids(Role.SERVER), workers=job.ids(Role.WORKER)))
        elif stage in ("resume", "undo_resume"):
            resume_training(job, change, out)
        else:
            raise AssertionError(f"no stage {stage!r}")

    def _next(self, job: JobState, change: Change, at: float, out: list[Instruction]) -> None:
        """The stage running now is over: the next one, or the end."""
        stage = change.stage
        if change.rolling_back:
            nxt = _UNDO_NEXT[stage]
            if stage == "undo_retire":
                self.back_where_it_was(job, change, at, out)
            elif nxt == "done":
                change.stage = "done"
            else:
                self._stage(job, change, nxt, at, out)
            return
        if stage == self.stages[-1]:
            change.stage = "done"
            self.finished(job, change, out)
            return
        self._stage(job, change, self.stages[self.stages.index(stage) + 1], at, out)

    def done(self, job: JobState, change: Change, ev: StepDone, out: list[Instruction]) -> None:
        stage = change.stage
        if stage == "checkpoint":
            job.checkpoints.append((change.epoch, ev.directory))
            job.checkpoint_owed = False         # this cut is at least as new as the one owed
            change.checkpoint = ev.directory
        elif stage in ("start", "undo_start"):
            change.new += [x.executor_id for x in ev.executors]
        elif stage in ("restore", "undo_restore") and ev.objective is not None:
            job.last_objective = ev.objective
        if change.outstanding:
            return
        if stage == "pause" and job.training_criterion and not change.rolling_back:
            # Training met its end while pausing (the AM's pause waits for the clock that ended it,
            # so it answers done): nothing is left to relaunch -- the change ends as one the
            # training outran, and FINISH follows, where the job went on to retire its executors
            # (PAUSED, converged, waiting for a resume only to end).
            fail_change(change, f"training ended ({job.training_criterion}) before the {self.kind.value}")
            change.stage = "done"
            return
        if change.short:
            self._settle_short_start(job, change, ev.at, out)
        elif change.error and not change.rolling_back:
            self._rollback(job, change, stage, False, ev.at, out)    # a step that ended before its cancel
        else:
            self._next(job, change, ev.at, out)

    # -- failures ------------------------------------------------------------------------------------
    def failed(self, job: JobState, change: Change, ev: StepFailed, out: list[Instruction]) -> None:
        stage = change.stage
        if (self.keeps_short_start and stage in ("start", "undo_start") and not ev.cancelled
                and not job.pending_losses):
            # Short (module doc): what started is kept; decided once the other role's start has ended.
            change.new += [x.executor_id for x in ev.executors]
            change.short.append(ev.error)
            if not change.outstanding:
                self._settle_short_start(job, change, ev.at, out)
            return
        if change.rolling_back:
            end_job_failed(job, change, f"{self.kind.value} failed ({change.error}) and so did going back "
                                        f"({stage.removeprefix('undo_')}: {ev.error})", out)
            return
        first = not change.error
        fail_change(change, f"{self.kind.value} failed at {stage}: {ev.error}")
        if stage == "start":
            change.new += [x.executor_id for x in ev.executors]
        if change.outstanding:
            if first:            # the other role's start is of no use now (a loss cancelled it already)
                out.append(CancelSteps(steps=sorted(change.outstanding)))
            return
        self._rollback(job, change, stage, ev.cancelled, ev.at, out)

    def _settle_short_start(self, job: JobState, change: Change, at: float, out: list[Instruction]) -> None:
        """Both roles' starts have ended, one or both short: go on with what started if each role
        has the job's minimum, else fail the start as any failed start (module doc)."""
        short, change.short = "; ".join(change.short), []
        workers, servers = job.shape
        if workers >= max(1, job.spec.min_workers) and servers >= max(1, job.spec.min_servers):
            change.descriptions.append(f"started short ({short}): {workers} workers, {servers} servers")
            self._next(job, change, at, out)
        elif change.rolling_back:
            end_job_failed(job, change, f"{self.kind.value} failed ({change.error}) and so did going back "
                                        f"(start: {short})", out)
        else:
            fail_change(change, f"{self.kind.value} failed at start: {short}")
            self._rollback(job, change, "start", False, at, out)

    def _rollback(self, job: JobState, change: Change, stage: str, cancelled: bool, at: float,
                  out: list[Instruction]) -> None:
        """Undo what the change did, by the stage that failed (module doc)."""
        change.rolling_back = True
        change.short = []
        losses = bool(job.pending_losses)
        if stage in ("pause", "checkpoint"):
            if stage == "checkpoint" and not losses and not job.training_criterion:
                self._stage(job, change, "undo_resume", at, out)
            else:
                change.stage = "done"
            return
        if stage == "resume" and losses:
            change.stage = "done"
            return
        if stage in ("retire", "resume") or (stage == "restore" and not (cancelled or losses)):
            end_job_failed(job, change, change.error, out)
            return
        job.pending_losses.clear()
        self._stage(job, change, "undo_retire", at, out)


# After each rollback stage (undo_retire: the planner's back_where_it_was).
_UNDO_NEXT = {"undo_retire": "undo_start", "undo_start": "undo_restore", "undo_restore": "undo_resume",
              "undo_resume": "done"}

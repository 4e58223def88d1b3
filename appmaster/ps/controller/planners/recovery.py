"""Recovery from executor losses as a planner (the AM's executor-loss recovery, docs/internals.md).

`admit` decides whether the job survives a loss (max_executor_failures, a checkpoint to go back
to); `needs_recovery` whether the loss needs one (a new worker that held no split trained
nothing); losses reported together are one event (`merge`). Two paths:

- Worker replacement, when every loss is a worker, the job trains BSP and its app keeps no
  training state on its workers: StartExecutors (one new worker per lost one, anywhere the RM has
  room) -> JoinExecutors -> TakeOverSplits (each replacement generates its lost worker's splits at
  the positions they had when the clock began and takes its place in the clock list; the servers
  apply each mini-batch's pushes once, so the lost clock runs again on it with nothing lost or
  applied twice) -> done: training goes on, no epoch is redone. A further worker lost meanwhile
  gets its own replacement in the same recovery; a server lost meanwhile, or any step that fails,
  falls back to the checkpoint path once the steps running have ended.
- The checkpoint path: training stops, every executor is retired, the job's shape starts afresh
  and continues from the latest checkpoint (its epoch count, objective and every input block's
  place come back with it). Apps that keep state on their workers (NMF's user factors, LDA's
  topic assignments) always take it for a lost worker: only their checkpoints hold that state.
- Server rebuild, when every loss is a server, the job keeps push logs (its spec's push_log) and
  trains BSP, its app keeps no training state
  on its workers and no worker has left since the latest checkpoint: StartExecutors (one new
  server per lost one) -> JoinExecutors -> RebuildServers (each lost server's blocks go to its
  replacement, from the latest checkpoint plus every worker's pushes since it: the workers' push
  logs, psruntime.push_log) -> done: the clock the server was lost in runs again from where it
  began and nothing before it is redone. Any failure or further loss falls back to the
  checkpoint path.
- When every loss is a server but the rebuild cannot be (or failed), the workers stay
  (`Change.keep_workers`) through the checkpoint path: only the servers are
  retired and started again, and the restore (RestoreCheckpoint with `workers_kept`) puts the
  checkpoint's model on the new servers and every block the workers hold back to its place and
  worker state at the checkpoint -- no input is generated again, which was most of a server's
  recovery. A worker lost meanwhile ends the keeping: the workers are retired and started too.

`Replacement` is the replace chain both this planner and the straggler's (planners/straggler.py)
run; the change's `bindings` map each worker being replaced to its replacement.
"""
from __future__ import annotations

from typing import Optional

from ..events import StepDone, StepFailed
from ..instructions import (CancelSteps, Instruction, JoinExecutors, RebuildServers,
                            RestoreCheckpoint, RetireExecutors, StartExecutors, TakeOverSplits)
from ..records import Role, Target
from ..state import Change, ChangeKind, Executor, ExecutorState, JobState
from .base import BasePlanner, end_job_failed, issue, pause_training, resume_training


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
    if lost.role is Role.WORKER:
        change.keep_workers = False   # the checkpoint path starts the workers again too
    if change.kind is ChangeKind.RECOVER and change.stage == "rebuild":
        change.reason = f"{description}: during the servers' rebuild"
        change.keep_workers = servers_only(job, change.lost)
        if change.outstanding:
            out.append(CancelSteps(steps=sorted(change.outstanding)))
        fall_back(job, change, out)
        return
    if change.kind is not ChangeKind.RECOVER or change.stage != "replace":
        return                    # the checkpoint path starts the whole shape again anyway
    if replaceable(job, [lost.executor_id]):
        Replacement.start(job, change, 1, out)
        return
    change.reason = f"{description}: not a worker to replace"
    if change.outstanding:        # the running steps end (cancelled), then the checkpoint path
        out.append(CancelSteps(steps=sorted(change.outstanding)))
    fall_back(job, change, out)


def fall_back(job: JobState, change: Change, out: list[Instruction]) -> None:
    """The replacement is given up: the checkpoint path, once the steps running have ended."""
    change.stage = "fallback"
    if not change.outstanding:
        change.stage = "pause"
        change.new = []           # replacements started meanwhile are retired with the rest
        pause_training(job, change, out)


def replaceable(job: JobState, lost: list[str]) -> bool:
    """Whether lost executors can be replaced in place (module doc): all workers that held
    splits, a BSP job, an app keeping no state on its workers."""
    return (job.spec.sync == "bsp" and not job.keeps_worker_state and bool(lost)
            and all((x := job.lost.get(e)) is not None and x.role is Role.WORKER for e in lost))


class Replacement:
    """New workers in the place of old ones (lost or slow), their splits where they stood:
    StartExecutors -> JoinExecutors -> TakeOverSplits. `change.bindings` maps each old worker to
    its replacement; `change.new` lists the replacements."""

    @staticmethod
    def start(job: JobState, change: Change, n: int, out: list[Instruction]) -> None:
        issue(change, out, StartExecutors(step=job.new_step(), role=Role.WORKER, count=n))

    @staticmethod
    def waiting(change: Change) -> list[str]:
        """The old workers with no replacement yet, in the order they were taken in."""
        return [e for e in change.lost if e not in change.bindings]

    @classmethod
    def done(cls, job: JobState, change: Change, ev: StepDone, out: list[Instruction]) -> None:
        """A step of the chain ended well: issue what follows it."""
        instr = change.steps[ev.step]
        if isinstance(instr, StartExecutors):
            new = [x.executor_id for x in ev.executors]
            change.new += new
            change.bindings.update(zip(cls.waiting(change), new))
            issue(change, out, JoinExecutors(step=job.new_step(), role=Role.WORKER, executors=new))
        elif isinstance(instr, JoinExecutors):
            old_of = {rep: old for old, rep in change.bindings.items()}
            for rep in instr.executors:
                old = old_of[rep]
                issue(change, out, TakeOverSplits(step=job.new_step(), old=old, new=rep,
                                                  splits=list(job.holdings.splits.get(old, []))))
        elif isinstance(instr, TakeOverSplits):
            h = job.holdings
            h.splits[instr.new] = list(instr.splits)
            h.splits.pop(instr.old, None)
            h.inactive.pop(instr.old, None)      # its inactive copies went with it

    @classmethod
    def complete(cls, change: Change) -> bool:
        """Every old worker has a replacement that took its place."""
        return not change.outstanding and not cls.waiting(change)


class RecoveryPlanner(BasePlanner):
    """Worker replacement, or the checkpoint path: pause -> retire all -> start the shape ->
    restore (module doc)."""

    kind = ChangeKind.RECOVER

    def begin(self, job: JobState, change: Change, out: list[Instruction]) -> None:
        w, s = _shape_before(job, change)
        change.target = Target(workers=w, servers=s)
        if replaceable(job, change.lost):
            change.stage = "replace"
            Replacement.start(job, change, len(change.lost), out)
            return
        if rebuildable(job, change.lost):
            change.stage = "rebuild"
            change.checkpoint = job.checkpoints[-1][1]
            issue(change, out, StartExecutors(step=job.new_step(), role=Role.SERVER, count=len(change.lost)))
            return
        change.keep_workers = servers_only(job, change.lost)
        fall_back(job, change, out)

    def done(self, job: JobState, change: Change, ev: StepDone, out: list[Instruction]) -> None:
        if change.stage == "replace":
            Replacement.done(job, change, ev, out)
            if Replacement.complete(change):
                _resume_if_stopped(job, change, out)
            elif not change.outstanding:       # fewer workers started than asked for
                change.reason = f"no replacement for {', '.join(Replacement.waiting(change))}"
                fall_back(job, change, out)
            return
        if change.stage == "rebuild":
            instr = change.steps[ev.step]
            if isinstance(instr, StartExecutors):
                change.new = [x.executor_id for x in ev.executors]
                issue(change, out, JoinExecutors(step=job.new_step(), role=Role.SERVER, executors=list(change.new)))
            elif isinstance(instr, JoinExecutors):
                issue(change, out, RebuildServers(step=job.new_step(), lost=list(change.lost), new=list(change.new),
                                                  directory=change.checkpoint))
            elif isinstance(instr, RebuildServers):
                _resume_if_stopped(job, change, out)
            return
        if change.stage == "fallback":
            fall_back(job, change, out)
            return
        if change.stage == "start":
            started = ev.executors if isinstance(change.steps[ev.step], StartExecutors) else []
            change.new += [x.executor_id for x in started]
        if change.stage in ("pause", "retire", "start") and not change.outstanding:
            _rebuild(job, change, out)
            return
        if change.stage == "restore":
            job.epoch = job.checkpoints[-1][0]
            change.stage = "resume"
            resume_training(job, change, out)
            return
        if change.stage == "resume":
            change.stage = "done"

    def failed(self, job: JobState, change: Change, ev: StepFailed, out: list[Instruction]) -> None:
        if change.stage == "restore" and change.keep_workers and not change.outstanding:
            # The kept workers could not be brought back (one stuck in its clock): everything
            # afresh, the new servers too (their blocks were half restored), as for a lost worker.
            change.keep_workers = False
            change.new = []
            change.reason = f"keeping the workers failed: {ev.error}"
            _rebuild(job, change, out)
            return
        if change.stage == "rebuild":
            # Back to the checkpoint (the workers kept), once what still runs has ended; the new
            # servers are retired with the rest.
            change.reason = f"rebuilding {', '.join(change.lost)} failed: {ev.error}"
            change.keep_workers = servers_only(job, change.lost)
            fall_back(job, change, out)
            return
        if change.stage in ("replace", "fallback"):
            # The replacement failed: once what still runs has ended, the checkpoint path (which
            # retires every executor, the new ones included).
            if change.stage == "replace":
                change.reason = f"replacing {', '.join(change.lost)} failed: {ev.error}"
            fall_back(job, change, out)
            return
        end_job_failed(job, change, f"recovery from {'; '.join(change.descriptions)} failed: {ev.error}", out)


def _resume_if_stopped(job: JobState, change: Change, out: list[Instruction]) -> None:
    """A replacement or rebuild in place is done: training goes on by itself, unless a change the
    loss aborted had stopped it (its pause done) -- then it is resumed here, or it never would be
    (the job sat in TRAINING with nothing training). One that has met its end criterion is not:
    FINISH follows."""
    if job.training_stopped and not job.training_criterion:
        change.stage = "resume"
        resume_training(job, change, out)
    else:
        change.stage = "done"


def rebuildable(job: JobState, lost: list[str]) -> bool:
    """Whether lost servers can be rebuilt from the latest checkpoint and the workers' push logs
    (module doc): BSP (its clocks number the pushes), no training state on the workers (a clock
    run again would apply theirs twice), and every worker since that checkpoint still here."""
    return (servers_only(job, lost) and job.spec.push_log and job.spec.sync == "bsp" and not job.keeps_worker_state
            and bool(job.checkpoints) and job.push_logs_incomplete_at < len(job.checkpoints))


def servers_only(job: JobState, lost: list[str]) -> bool:
    """Whether every loss is a server: the workers can stay through the checkpoint path."""
    return bool(lost) and all((x := job.lost.get(e)) is not None and x.role is Role.SERVER for e in lost)


def _rebuild(job: JobState, change: Change, out: list[Instruction]) -> None:
    """The checkpoint path after the pause: retire what does not stay, start what the shape
    lacks, then restore. Each stage issues its steps only once the previous ones have ended; a
    worker lost meanwhile (keeping revoked) sends a kept-workers rebuild back to retiring them."""
    assert change.target is not None
    new = set(change.new)
    stays = {x.executor_id: x.role for x in job.executors.values() if x.state is ExecutorState.READY
             and (x.executor_id in new or (change.keep_workers and x.role is Role.WORKER))}
    going = [x.executor_id for x in job.executors.values()
             if x.state in (ExecutorState.READY, ExecutorState.STARTING) and x.executor_id not in stays]
    if going:
        change.stage = "retire"
        issue(change, out, RetireExecutors(step=job.new_step(), executors=going, released=False))
        return
    have = {role: sum(1 for r in stays.values() if r is role) for role in Role}
    lacking = [(Role.SERVER, change.target.servers - have[Role.SERVER]),
               (Role.WORKER, change.target.workers - have[Role.WORKER])]
    if any(n > 0 for _, n in lacking):       # (again, for one lost while starting: admit bounds it)
        change.stage = "start"
        for role, n in lacking:
            if n > 0:
                issue(change, out, StartExecutors(step=job.new_step(), role=role, count=n))
        return
    change.stage = "restore"
    change.checkpoint = job.checkpoints[-1][1]
    issue(change, out, RestoreCheckpoint(step=job.new_step(), directory=change.checkpoint,
                                         servers=job.ids(Role.SERVER), workers=job.ids(Role.WORKER),
                                         workers_kept=change.keep_workers))


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

"""The PS-job controller: `handle(job, event) -> (job, instructions)`, pure.

Events in (events.py), instructions out (instructions.py), nothing else: no I/O, no asyncio, no
clock (time arrives in events). The AM's interpreter (appmaster.ps.runtime) and the simulator
(sim/sim_job.py) both drive a job through this one function, so a simulated job makes the same
decisions, in the same order, as a real one.

What it does with each event:
- lifecycle: Registered starts the job's first executors (after the policy's first directive
  where the RM's policy places new jobs), their set-up or the restore of an earlier attempt's
  checkpoint, then training; TrainingEnded leads through the final checkpoint and evaluation to
  SUCCEEDED; a user-code error or a loss the job cannot survive to FAILED; a stop to KILLED.
- the change slot: a directive, a /scale, a Cruise proposal, a checkpoint due or asked for, a
  loss or a straggler becomes a change with its planner (planners/) when rules.RULES says so;
  the planner issues steps, each answered by StepDone / StepFailed, until the change ends; then
  what waited for the slot is served (losses first, then the end of training, then the newest
  kept directive).
- bookkeeping: executors by state, who holds which block and split (moved by the steps that
  move them), epochs, clocks and checkpoints.
"""
from __future__ import annotations

from typing import Callable, Optional

from protocol.internal_api import RunState, ShapeDirective
from protocol.job_report import MAX_REFUSAL_CHARS

from . import events as ev
from .instructions import (CancelSteps, CommitSplits, Finish, Instruction, LaunchExecutor, MoveModelBlocks,
                           RebuildServers, ReleaseContainer, Reply, ReportProgress, RetireExecutors)
from .phases import Phase, Trigger
from .planners import PLANNERS, recovery, suspension
from .planners.base import fail_change, fire
from .planners.eps import target_of
from .records import ExecutorInfo, Holdings, Move, Role, Target
from .rules import Arrival, Rule, rule
from .state import Change, ChangeKind, Executor, ExecutorState, JobState, Origin

Out = list[Instruction]
# The lifecycle trigger each change fires as it takes the slot (START and FINISH move the job
# through their own phases).
CHANGE_TRIGGERS: dict[ChangeKind, Trigger] = {
    ChangeKind.EPS: Trigger.RESHAPE, ChangeKind.RESTART: Trigger.RESTART, ChangeKind.PLAN: Trigger.PLAN,
    ChangeKind.CHECKPOINT: Trigger.CHECKPOINT, ChangeKind.MIGRATE: Trigger.MIGRATE,
    ChangeKind.RECOVER: Trigger.RECOVER, ChangeKind.STRAGGLER: Trigger.RECOVER, ChangeKind.PAUSE: Trigger.PAUSE,
    ChangeKind.RESUME: Trigger.RESUME,
}


def handle(job: JobState, event: ev.Event) -> tuple[JobState, list[Instruction]]:
    """Apply `event` to `job` (in place) and return it with the instructions to carry out."""
    out: Out = []
    if job.phase.is_final:
        return job, out
    _HANDLERS[type(event)](job, event, out)
    for i in out:       # stopped on purpose from now on: their containers' ends are no loss
        if isinstance(i, RetireExecutors):
            for eid in i.executors:
                x = job.executors.get(eid)
                if x is not None:
                    x.state = ExecutorState.RETIRING
    return job, out


# ---- the change slot ---------------------------------------------------------------------------
def begin(job: JobState, change: Change, out: Out) -> None:
    """Put `change` in the job's slot and let its planner issue the first steps."""
    assert job.change is None, f"{change.kind.value} while {job.change and job.change.kind.value} runs"
    job.change = change
    trigger = CHANGE_TRIGGERS.get(change.kind)
    if trigger is not None:
        fire(job, trigger)
    PLANNERS[change.kind].begin(job, change, out)
    out.append(ReportProgress(changing=True, directive_version=job.applied_directive))
    _maybe_end(job, change, out)


def _maybe_end(job: JobState, change: Change, out: Out) -> None:
    if job.change is not change or change.stage != "done" or change.outstanding:
        return
    job.change = None
    if job.phase.changing and job.phase is not Phase.PAUSED:
        fire(job, Trigger.CHANGE_DONE, change.error)
    for request in change.requests:
        out.append(Reply(request=request, status=409 if change.error else 200, message=change.error,
                         directory=change.checkpoint if change.kind is ChangeKind.CHECKPOINT else ""))
    if job.phase.is_final:
        return
    out.append(ReportProgress(changing=False, directive_version=job.applied_directive))
    _serve(job, change.at, out)


def _serve(job: JobState, at: float, out: Out) -> None:
    """The slot is free: what waited for it, in order (rules.py)."""
    if job.change is None and job.phase is Phase.PAUSED and job.kept_directive is not None:
        d, job.kept_directive = job.kept_directive, None    # kept while pausing: normally the resume
        _apply_directive(job, d, at, out)
        return
    if job.change is not None or job.phase is not Phase.TRAINING:
        return
    if job.pending_losses:
        lost, job.pending_losses = job.pending_losses, []
        begin(job, Change(ChangeKind.RECOVER, Origin.JOB, at, lost=[e for e, _ in lost],
                          descriptions=[d for _, d in lost]), out)
        return
    if job.training_criterion:
        begin(job, Change(ChangeKind.FINISH, Origin.JOB, at), out)
        return
    if job.kept_directive is not None:
        d, job.kept_directive = job.kept_directive, None
        _apply_directive(job, d, at, out)


def _cancel(job: JobState, change: Change, why: str, out: Out) -> None:
    """ABORT: the running change's steps stop; each answers StepFailed and it rolls back."""
    fail_change(change, why)
    change.aborted = True
    if change.outstanding:
        out.append(CancelSteps(steps=sorted(change.outstanding)))


def fail_job(job: JobState, diagnostics: str, out: Out) -> None:
    if job.change is not None and job.change.outstanding:
        out.append(CancelSteps(steps=sorted(job.change.outstanding)))
    job.change = None
    fire(job, Trigger.FAIL, diagnostics)
    out.append(Finish(final_status="FAILED", diagnostics=diagnostics))


# ---- lifecycle ---------------------------------------------------------------------------------
def _registered(job: JobState, e: ev.Registered, out: Out) -> None:
    job.policy_places = e.policy_places_new_jobs and not job.spec.placement
    job.resume_from = e.resume_from
    job.adopt = e.adopt
    # Executors taken over are placed already: a policy's placement of new jobs has nothing to
    # wait for (its latest directive comes again, and is applied once the job trains).
    if not job.policy_places or job.adopt:
        begin(job, Change(ChangeKind.START, Origin.JOB, e.at), out)
        return
    # The AM's heartbeat runs from its registration on, so the policy's first directive can
    # arrive before this event (while the AM reads its checkpoint); it was kept, and the RM will
    # not send that version again: start on it now.
    kept = job.kept_directive
    if kept is not None and kept.run_state is not RunState.PAUSE:
        _start_on_directive(job, kept, e.at, out)


def _start_on_directive(job: JobState, d: ShapeDirective, at: float, out: Out) -> None:
    """Start a job whose placement the policy gives on its first RUN directive."""
    job.first_directive = d
    job.applied_directive = d.version
    job.refused_directive = ""
    job.kept_directive = None                    # an older PAUSE held the job back: this one supersedes it
    begin(job, Change(ChangeKind.START, Origin.DIRECTIVE, at, directive_version=d.version), out)


def _training_ended(job: JobState, e: ev.TrainingEnded, out: Out) -> None:
    job.training_criterion = e.criterion
    _serve(job, e.at, out)


def _stop(job: JobState, e: ev.StopRequested, out: Out) -> None:
    if job.change is not None and job.change.outstanding:
        out.append(CancelSteps(steps=sorted(job.change.outstanding)))
    job.change = None
    fire(job, Trigger.STOP, e.reason)
    out.append(Finish(final_status=None, diagnostics=e.reason))


def _user_error(job: JobState, e: ev.UserCodeError, out: Out) -> None:
    fail_job(job, e.message, out)


# ---- directives and requests -------------------------------------------------------------------
def _directive(job: JobState, e: ev.DirectiveArrived, out: Out) -> None:
    d = e.directive
    if d.version <= job.seen_directive:
        return                                   # a repeat: the RM resends until it is acted on
    job.seen_directive = d.version
    if job.phase is Phase.STARTING and job.policy_places and job.change is None:
        if d.run_state is RunState.PAUSE:
            job.kept_directive = d               # the policy holds the job back: keep the newest
            return
        _start_on_directive(job, d, e.at, out)
        return
    if job.phase in _BEFORE_TRAINING:
        job.kept_directive = d
        return
    r = rule(job.change.kind if job.change else None, Arrival.DIRECTIVE, paused=job.phase is Phase.PAUSED)
    if r is Rule.KEEP:
        job.kept_directive = d
    elif r is Rule.START:
        _apply_directive(job, d, e.at, out)


def _apply_directive(job: JobState, d: ShapeDirective, at: float, out: Out) -> None:
    """Turn a directive into the change it asks for (or none: the job has its shape already, or
    cannot make the change -- then the report says why)."""
    job.applied_directive = d.version
    job.refused_directive = ""
    spec = job.spec
    target = target_of(d, spec)
    if job.phase is Phase.PAUSED:
        if d.run_state is RunState.PAUSE:
            out.append(ReportProgress(changing=False, directive_version=d.version))
            return
        begin(job, Change(ChangeKind.RESUME, Origin.DIRECTIVE, at, target=target, directive_version=d.version), out)
        return
    if d.run_state is RunState.PAUSE:
        begin(job, Change(ChangeKind.PAUSE, Origin.DIRECTIVE, at, target=target, directive_version=d.version), out)
        return
    # An SSP job is reshaped by a restart from its checkpoint: EPS's live add/remove (and Cruise's
    # plans) keep BSP clock boundaries only. Acted on as no change instead (as it was), an SSP job
    # with an elastic range never took the shape its policy gave it, and the policy, planning the
    # cluster as if it had, left what it reserved for it idle: half the default trace's jobs
    # (docs/simulator.md, "SSP jobs and directives"). `ps scale` stays EPS's live change (400).
    kind = (ChangeKind.MIGRATE if suspension.resized(job, target) else
            ChangeKind.RESTART if job.spec.elastic_mode == "kill" or job.spec.sync != "bsp" else
            ChangeKind.PLAN if job.spec.optimizer == "cruise" else ChangeKind.EPS)
    change = Change(kind, Origin.DIRECTIVE, at, target=target, directive_version=d.version)
    # A change the job cannot make (more workers than input splits) is acted on as no change,
    # rather than started to fail after its containers came; the report says why (the job state's
    # `refused_directive`), so the RM does not send it again as one the job came short of.
    if not PLANNERS[kind].needed(job, change):
        out.append(ReportProgress(changing=False, directive_version=d.version))
        return
    problem = PLANNERS[kind].invalid(job, change)
    if problem:
        job.refused_directive = problem[:MAX_REFUSAL_CHARS]      # the report's bound
        out.append(ReportProgress(changing=False, directive_version=d.version))
        return
    begin(job, change, out)


def _scale(job: JobState, e: ev.ScaleRequested, out: Out) -> None:
    if job.phase is Phase.PAUSED:
        out.append(Reply(request=e.request, status=409,
                         message="the job is paused: its shape changes when it resumes"))
        return
    if job.phase is not Phase.TRAINING and job.change is None:
        out.append(Reply(request=e.request, status=409,
                         message=f"no elastic change in phase {job.phase.value}: the job must be training"))
        return
    r = rule(job.change.kind if job.change else None, Arrival.SCALE)
    if r is Rule.REJECT:
        assert job.change is not None
        out.append(Reply(request=e.request, status=409,
                         message=f"another change is running ({job.change.kind.value})"))
        return
    kind = ChangeKind.RESTART if job.spec.elastic_mode == "kill" else ChangeKind.EPS
    for name, d in (("workers", e.workers), ("servers", e.servers)):
        if not isinstance(d, int):      # undecoded input: no target can be computed (the planners refuse bools)
            out.append(Reply(request=e.request, status=400, message=f"{name} must be a signed integer change, got {d!r}"))
            return
    w, s = job.shape
    change = Change(kind, Origin.SCALE, e.at, requests=[e.request],
                    target=Target(workers=w + e.workers, servers=s + e.servers), delta=(e.workers, e.servers))
    problem = PLANNERS[kind].invalid(job, change)
    if problem:
        out.append(Reply(request=e.request, status=400, message=problem))
        return
    if job.applied_directive and not job.refused_directive:
        # The user reshaped the job past its directive: the RM must not take the new shape for
        # one the job came short of and send the directive again, undoing the user's change a
        # minute later (rm/directive_retry.py). A new directive clears this; a refusal already
        # given keeps its own reason (the directive is not sent again either way).
        job.refused_directive = (f"superseded by the job's own /scale to {w + e.workers} workers, "
                                 f"{s + e.servers} servers")
    begin(job, change, out)



def _checkpoint_requested(job: JobState, e: ev.CheckpointRequested, out: Out) -> None:
    r = rule(job.change.kind if job.change else None, Arrival.CHECKPOINT, paused=job.phase is Phase.PAUSED)
    if r is Rule.REJECT or not (job.phase.trains or job.phase is Phase.RESTARTING):
        out.append(Reply(request=e.request, status=409,
                         message=f"no checkpoint in phase {job.phase.value}: the model exists only while training"))
        return
    job.checkpoint_requests.append(e.request)     # KEEP: served at the next epoch end


def _plan(job: JobState, e: ev.PlanProposed, out: Out) -> None:
    if job.phase is not Phase.TRAINING or rule(job.change.kind if job.change else None, Arrival.PLAN) is not Rule.START:
        return
    begin(job, Change(ChangeKind.PLAN, Origin.OPTIMIZER, e.at, ops=list(e.ops), reason=e.reason), out)


def _straggler(job: JobState, e: ev.StragglerFound, out: Out) -> None:
    if job.phase is not Phase.TRAINING or rule(job.change.kind if job.change else None,
                                               Arrival.STRAGGLER) is not Rule.START:
        return
    change = Change(ChangeKind.STRAGGLER, Origin.JOB, e.at, lost=[e.executor_id], descriptions=[e.why])
    if PLANNERS[ChangeKind.STRAGGLER].invalid(job, change):
        return
    begin(job, change, out)


# ---- training progress -------------------------------------------------------------------------
def _clock_done(job: JobState, e: ev.ClockDone, out: Out) -> None:
    job.clock, job.epoch, job.iterations = e.clock, e.epoch, e.iterations


def _epoch_done(job: JobState, e: ev.EpochDone, out: Out) -> None:
    job.epoch = e.epoch + 1
    job.objectives.append(e.objective)
    every = job.spec.checkpoint_every_epochs
    due = (every > 0 and job.epoch % every == 0) or job.checkpoint_owed
    if job.change is None and job.phase is Phase.TRAINING and (due or job.checkpoint_requests):
        requests, job.checkpoint_requests = job.checkpoint_requests, []
        job.checkpoint_owed = False
        begin(job, Change(ChangeKind.CHECKPOINT, Origin.CHECKPOINT if requests else Origin.JOB, e.at,
                          requests=requests, epoch=job.epoch, reason="due" if due else "requested"), out)
    elif due:
        # The slot is busy (a change spans the epoch end) or training is not running: skipped, a
        # job that reshapes often went without checkpoints, and recoveries redid more epochs.
        job.checkpoint_owed = True


def _objective(job: JobState, e: ev.ObjectiveMeasured, out: Out) -> None:
    job.last_objective = e.objective


def _checkpoint_written(job: JobState, e: ev.CheckpointWritten, out: Out) -> None:
    job.checkpoints.append((e.epoch, e.directory))


# ---- executors ---------------------------------------------------------------------------------
def _allocated(job: JobState, e: ev.ContainersAllocated, out: Out) -> None:
    for cid in e.unknown:
        out.append(ReleaseContainer(container_id=cid))
    for c in e.containers:
        job.executors[c.executor_id] = Executor(c)
        job.containers[c.container_id] = c.executor_id
        out.append(LaunchExecutor(container_id=c.container_id, role=c.role))


def _ready(job: JobState, e: ev.ExecutorReady, out: Out) -> None:
    x = job.executors.get(e.executor.executor_id)
    if x is None:
        x = job.executors[e.executor.executor_id] = Executor(e.executor)
        job.containers[e.executor.container_id] = e.executor.executor_id
    if x.state is ExecutorState.STARTING:
        x.state = ExecutorState.READY


def _completed(job: JobState, e: ev.ContainersCompleted, out: Out) -> None:
    for container_id, description in e.containers:
        eid = job.containers.pop(container_id, None)
        if eid is None:
            continue
        x = job.executors.pop(eid)
        if x.state in _NO_LOSS or not job.phase.executors_expected_alive:
            continue
        x.state = ExecutorState.LOST
        _loss(job, x, description, e.at, out)


def _lost(job: JobState, e: ev.ExecutorLost, out: Out) -> None:
    x = job.executors.pop(e.executor_id, None)
    if x is None:
        return
    job.containers.pop(x.info.container_id, None)
    if x.state in _NO_LOSS or not job.phase.executors_expected_alive:
        return
    x.state = ExecutorState.LOST
    _loss(job, x, e.description, e.at, out)


# An executor whose end is no loss: one retiring, and one still starting -- it never served, and
# the StartExecutors step it belongs to fails by itself (or failed: the AM stops what it started
# when a start times out); counted as a loss, it failed the job at max_executor_failures 0, or
# sent it back to its checkpoint with a phantom executor in the shape it was restored to.
_NO_LOSS = (ExecutorState.RETIRING, ExecutorState.STARTING)


def _loss(job: JobState, x: Executor, description: str, at: float, out: Out) -> None:
    """An executor the job needed is gone (rules.py for what a change running now does)."""
    job.lost[x.executor_id] = x
    if x.role is Role.WORKER:
        job.push_logs_incomplete_at = len(job.checkpoints)
    running = job.change.kind if job.change else None
    r = rule(running, Arrival.LOSS, paused=job.phase is Phase.PAUSED)
    if r is Rule.IGNORE:
        return
    fatal = recovery.admit(job, x, description, merging=r is Rule.MERGE)
    if fatal is not None:
        fail_job(job, fatal, out)
        return
    if not recovery.needs_recovery(job, x):
        return                  # a new worker that trained nothing: its change fails on its own
    if r is Rule.FAIL:
        fail_job(job, description, out)
    elif r is Rule.MERGE:
        assert job.change is not None
        recovery.merge(job, job.change, x, description, out)
    elif r is Rule.ABORT:
        assert job.change is not None
        job.pending_losses.append((x.executor_id, description))
        _cancel(job, job.change, f"executor lost: {description}", out)
    else:                       # START: idle, training
        begin(job, Change(ChangeKind.RECOVER, Origin.JOB, at, lost=[x.executor_id], descriptions=[description]), out)


# ---- steps -------------------------------------------------------------------------------------
def _step_done(job: JobState, e: ev.StepDone, out: Out) -> None:
    change = job.change
    if change is None or e.step not in change.outstanding:
        return                   # a step of a change that was cancelled and has ended already
    change.outstanding.discard(e.step)
    _book(job, change, e.step, e.executors, e.holdings, ok=True)
    PLANNERS[change.kind].done(job, change, e, out)
    _maybe_end(job, change, out)


def _step_failed(job: JobState, e: ev.StepFailed, out: Out) -> None:
    change = job.change
    if change is None or e.step not in change.outstanding:
        return
    change.outstanding.discard(e.step)
    _book(job, change, e.step, e.executors, e.holdings, ok=False)
    PLANNERS[change.kind].failed(job, change, e, out)
    _maybe_end(job, change, out)


def _book(job: JobState, change: Change, step: int, started: list[ExecutorInfo],
          holdings: Optional[Holdings], ok: bool) -> None:
    """What a finished step changed, whatever its planner: new executors ready, retired ones
    retiring, blocks and splits with their new holders (as reported, else as instructed)."""
    for info in started:
        if info.executor_id in job.lost:
            continue             # lost before its start reported: its loss was handled already
        x = job.executors.get(info.executor_id)
        if x is None:
            job.executors[info.executor_id] = x = Executor(info)
            job.containers[info.container_id] = info.executor_id
        if x.state is ExecutorState.STARTING:
            x.state = ExecutorState.READY
    instr = change.steps.get(step)
    if isinstance(instr, RetireExecutors):
        for eid in instr.executors:
            if eid in job.executors:
                if job.executors[eid].role is Role.WORKER:
                    job.push_logs_incomplete_at = len(job.checkpoints)
                job.executors[eid].state = ExecutorState.RETIRING
            job.holdings.blocks.pop(eid, None)
            job.holdings.splits.pop(eid, None)
            job.holdings.inactive.pop(eid, None)
    if holdings is not None:
        job.holdings = holdings
    elif ok and isinstance(instr, MoveModelBlocks):
        _apply_moves(job.holdings.blocks, instr.moves)
        for d in instr.drop:
            job.holdings.blocks.pop(d, None)
    elif ok and isinstance(instr, CommitSplits):
        _commit(job.holdings, instr.moves, instr.keep_inactive, instr.joining)
    elif ok and isinstance(instr, RebuildServers):
        for old, new in zip(instr.lost, instr.new):
            job.holdings.blocks[new] = job.holdings.blocks.pop(old, [])


def _apply_moves(table: dict[str, list[int]], moves: list[Move]) -> None:
    for m in moves:
        if m.item in table.get(m.src, []):
            table[m.src].remove(m.item)
        table.setdefault(m.dst, []).append(m.item)


def _commit(h: Holdings, moves: list[Move], keep_inactive: bool, joining: list[str]) -> None:
    for w in joining:
        h.splits.setdefault(w, [])
    for m in moves:
        if m.item in h.splits.get(m.src, []):
            h.splits[m.src].remove(m.item)
            if keep_inactive:
                h.inactive.setdefault(m.src, []).append(m.item)
        h.splits.setdefault(m.dst, []).append(m.item)
        if m.reactivate and m.item in h.inactive.get(m.dst, []):
            h.inactive[m.dst].remove(m.item)


def _timer(job: JobState, e: ev.TimerFired, out: Out) -> None:
    change = job.change
    if change is not None:
        PLANNERS[change.kind].timer(job, change, e, out)
        _maybe_end(job, change, out)
    elif job.phase is Phase.PAUSED:
        again = suspension.retry(job, e)         # a resume whose executors did not come
        if again is not None:
            begin(job, again, out)


_BEFORE_TRAINING = frozenset({Phase.STARTING, Phase.LAUNCHING_SERVERS, Phase.LAUNCHING_WORKERS,
                              Phase.INITIALISING, Phase.RESTORING, Phase.ADOPTING})

_HANDLERS: dict[type, Callable[..., None]] = {
    ev.Registered: _registered, ev.DirectiveArrived: _directive, ev.ContainersAllocated: _allocated,
    ev.ContainersCompleted: _completed, ev.ExecutorReady: _ready, ev.ExecutorLost: _lost,
    ev.ClockDone: _clock_done, ev.EpochDone: _epoch_done, ev.ObjectiveMeasured: _objective,
    ev.TrainingEnded: _training_ended, ev.ScaleRequested: _scale, ev.CheckpointRequested: _checkpoint_requested,
    ev.PlanProposed: _plan, ev.StragglerFound: _straggler, ev.CheckpointWritten: _checkpoint_written,
    ev.TimerFired: _timer, ev.UserCodeError: _user_error, ev.StopRequested: _stop, ev.StepDone: _step_done,
    ev.StepFailed: _step_failed,
}

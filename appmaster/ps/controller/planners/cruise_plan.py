"""A Cruise reconfiguration plan as a planner (Cruise, dissertation §3.3.1 and Table 3.2): a DAG
of elastic operations, every op whose prerequisites (`PlanOp.after`) are done running at once,
each as a short sequence of steps:

    add(role, n)         StartExecutors -> JoinExecutors; its placeholders are bound to the real
                         executor ids (`change.bindings`), which later ops then name
    delete(x)            a worker: CommitSplits with no moves and `leaving` [x] (it leaves the
                         clock list at a boundary) -> RetireExecutors; a server: MoveModelBlocks
                         with no moves and `drop` [x] (it leaves the server lists) ->
                         WaitClockBoundary (no request on its way to it) -> RetireExecutors.
                         x holds nothing by then: the plan moved it all off first
    switch(x, role)      SwitchRole (x holds nothing of its old role by then)
    move model blocks    MoveModelBlocks from a server to a server, alongside the running epoch
    move input splits    StageSplits (their data, alongside training) -> CommitSplits at the next
                         clock boundary; the source keeps inactive copies unless it leaves in
                         this plan (a delete or a switch); the destination joins the clock list
                         with its first splits. A destination that is a server switching to
                         worker in this plan holds the staged data meanwhile (Cruise's plan
                         builder drops that edge to keep the graph acyclic); the commit waits
                         until its switch is done.

With no ops and a `target` (an RM directive under optimizer "cruise"), the plan's first stage is
ComputePlan: Cruise's optimizer, which lives outside the controller, answers with the ops.

Failure (as Cruise's executor had it): the first op that fails stops new ops from starting; ops
already running end (each is atomic on its own: a migration lands or leaves the block with its
source; staged splits that will not change hands are discarded, and an op waiting for a switch
gives up); the plan's new executors that took nothing over are retired; the change fails. The
job stays consistent and Cruise re-plans from the configuration as it is.
"""
from __future__ import annotations

from protocol.errors import PlanningError

from dataclasses import dataclass, field
from typing import Optional

import msgspec

from ..events import StepDone, StepFailed
from ..instructions import (CommitSplits, ComputePlan, DiscardStaged, Instruction, JoinExecutors, MoveModelBlocks,
                            RetireExecutors, StageSplits, StartExecutors, StepInstruction, SwitchRole,
                            WaitClockBoundary)
from ..records import Move, PlanOp, PlanOpKind, Role
from ..state import Change, ChangeKind, ExecutorState, JobState
from .base import BasePlanner, fail_change, issue


@dataclass
class OpRun:
    """One op of a running plan: where it is, its outstanding steps, what it moves and when it ran
    (the events' times: the plan's record for the job status)."""

    stage: str = "pending"       # pending | start | join | leave | boundary | retire | switch | move |
    #                              stage | await | commit | undo | done | failed
    steps: set[int] = field(default_factory=set)
    moves: list[Move] = field(default_factory=list)
    new: list[str] = field(default_factory=list)
    started_at: Optional[float] = None
    ended_at: Optional[float] = None
    error: str = ""

    @property
    def running(self) -> bool:
        return self.stage not in ("pending", "done", "failed")


def plan_problem(job: JobState, ops: list[PlanOp]) -> str:
    """Why `ops` is not a plan the controller can run ("" if it is): ids unique, prerequisites
    known and acyclic, every executor named one the job has or an add's placeholder."""
    ids = [op.op_id for op in ops]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        return f"duplicate op ids {dup}"
    known_ops = set(ids)
    existing = {e.executor_id for e in job.executors.values() if e.state is ExecutorState.READY}
    placeholders: set[str] = set()
    for op in ops:
        unknown = sorted(set(op.after) - known_ops)
        if unknown:
            return f"{op.op_id} waits for unknown ops {unknown}"
        if op.kind is PlanOpKind.ADD:
            if op.role is None or op.n < 1 or len(op.placeholders) != op.n:
                return f"{op.op_id}: an add names a role and n >= 1 executors by n placeholders"
            clash = sorted((set(op.placeholders) & existing) | (set(op.placeholders) & placeholders))
            if clash:
                return f"{op.op_id}: placeholders {clash} already name executors"
            placeholders |= set(op.placeholders)
    names = existing | placeholders
    for op in ops:
        named = ([op.executor] if op.kind in (PlanOpKind.DELETE, PlanOpKind.SWITCH) else
                 [op.src, op.dst] if op.kind is PlanOpKind.MOVE else [])
        missing = [n for n in named if n not in names]
        if missing:
            return f"{op.op_id}: no executor {missing[0]!r} in the job or the plan"
        if op.kind is PlanOpKind.SWITCH and op.role is None:
            return f"{op.op_id}: a switch names the role to switch to"
        if op.kind is PlanOpKind.MOVE and (not op.blocks or op.src == op.dst):
            return f"{op.op_id}: a move takes blocks from one executor to another"
    return _cycle(ops)


def _cycle(ops: list[PlanOp]) -> str:
    remaining = {op.op_id: set(op.after) for op in ops}
    while remaining:
        free = [o for o, deps in remaining.items() if not deps]
        if not free:
            return f"the plan has a dependency cycle among {sorted(remaining)}"
        for o in free:
            del remaining[o]
        for deps in remaining.values():
            deps.difference_update(free)
    return ""


class CruisePlanPlanner(BasePlanner):
    """Runs a Cruise plan op by op, concurrently where the DAG allows (module doc)."""

    kind = ChangeKind.PLAN

    # -- what the change is ----------------------------------------------------------------------
    def needed(self, job: JobState, change: Change) -> bool:
        """A plan with ops, or a directive granting the job a different number of containers
        (Cruise picks the split of the ones it has: a directive for as many changes nothing)."""
        if change.ops:
            return True
        if change.target is None:
            return False
        return change.target.workers + change.target.servers != sum(job.shape)

    def invalid(self, job: JobState, change: Change) -> str:
        if job.spec.sync != "bsp":
            return "Cruise plans move input splits at BSP clock boundaries; this job runs SSP"
        return plan_problem(job, change.ops) if change.ops else ""

    # -- running it --------------------------------------------------------------------------------
    def begin(self, job: JobState, change: Change, out: list[Instruction]) -> None:
        problem = self.invalid(job, change)
        if problem:
            fail_change(change, f"plan refused: {problem}")
            change.stage = "done"
            return
        if not change.ops:
            if change.target is None:
                change.stage = "done"             # an empty proposal: nothing to do
                return
            change.stage = "compute"
            t = change.target
            issue(change, out, ComputePlan(step=job.new_step(), workers=t.workers, servers=t.servers,
                                           nodes=self._nodes(change)))
            return
        self._run(job, change, change.at, out)

    def _run(self, job: JobState, change: Change, at: float, out: list[Instruction]) -> None:
        change.stage = "ops"
        change.op_runs = {op.op_id: OpRun() for op in change.ops}
        self._progress(job, change, at, out)

    @staticmethod
    def _nodes(change: Change) -> list[str]:
        """Where added executors may start: a directive's nodes, or its placement's node set
        (Cruise picks the worker / server split itself, so only the placement's nodes bind it)."""
        t = change.target
        if t is None:
            return []
        return list(t.nodes) or [node for node, _, _ in t.placement]

    def done(self, job: JobState, change: Change, ev: StepDone, out: list[Instruction]) -> None:
        if change.stage == "compute":
            change.ops = list(ev.ops)
            if not change.ops:
                change.stage = "done"             # Cruise keeps the configuration it has
                return
            problem = self.invalid(job, change)
            if problem:
                fail_change(change, f"Cruise's plan refused: {problem}")
                change.stage = "done"
                return
            self._run(job, change, ev.at, out)
            return
        ended = self._ended(change, ev)
        if ended is not None and not ended[1].steps:
            self._advance(job, change, self._op(change, ended[0]), ended[1], ev.at, out)
        self._progress(job, change, ev.at, out)

    def failed(self, job: JobState, change: Change, ev: StepFailed, out: list[Instruction]) -> None:
        if change.stage == "compute":
            fail_change(change, f"Cruise could not plan: {ev.error}")
            change.stage = "done"
            return
        ended = self._ended(change, ev)
        if ended is None:                           # the plan's own rollback
            fail_change(change, ev.error)
        else:
            op_id, run = ended
            change.new += [n for n in run.new if n not in change.new]
            run.error = run.error or ev.error
            fail_change(change, f"{op_id}: {ev.error}")
            if not run.steps:
                self._undo(job, change, op_id, run, ev.at, out)
        self._progress(job, change, ev.at, out)

    @staticmethod
    def _ended(change: Change, ev: StepDone | StepFailed) -> Optional[tuple[str, OpRun]]:
        """The op whose step `ev` ended, with its run (None: a step of the plan's own rollback)."""
        op_id = change.ops_running.pop(ev.step, None)
        if op_id is None:
            return None
        run = change.op_runs[op_id]
        run.steps.discard(ev.step)
        if run.stage == "start":
            run.new = [x.executor_id for x in ev.executors]
        return op_id, run

    # -- the DAG -------------------------------------------------------------------------------------
    @staticmethod
    def _op(change: Change, op_id: str) -> PlanOp:
        return next(op for op in change.ops if op.op_id == op_id)

    def _progress(self, job: JobState, change: Change, at: float, out: list[Instruction]) -> None:
        """Start the ready ops (none once an op failed), settle ops waiting for a switch, and end
        the plan once nothing runs."""
        if change.stage not in ("ops", "undo"):
            return
        runs = change.op_runs
        if change.stage == "ops":
            while True:               # an op may end at once (a switch to the role it has)
                self._settle_waiting(job, change, at, out)
                ready = [op for op in change.ops if runs[op.op_id].stage == "pending"
                         and all(runs[d].stage == "done" for d in op.after)] if not change.error else []
                if not ready:
                    if change.outstanding or not any(r.stage == "await" for r in runs.values()):
                        break
                    # Nothing runs that could make their destinations workers (a plan whose
                    # switch waits for the very move onto it): they give up.
                    self._settle_waiting(job, change, at, out, stuck=True)
                    continue
                for op in ready:
                    if not change.error:
                        runs[op.op_id].started_at = at
                        self._advance(job, change, op, runs[op.op_id], at, out)
            if any(r.running for r in runs.values()) or change.outstanding:
                return
            if change.error:
                self._retire_newcomers(job, change, out)
                if change.outstanding:
                    change.stage = "undo"
                    return
        elif change.outstanding:
            return
        change.stage = "done"

    def _settle_waiting(self, job: JobState, change: Change, at: float, out: list[Instruction],
                        stuck: bool = False) -> None:
        """Input moves onto an executor switching to worker commit once it is one, and give up
        (discarding what they staged) once it cannot become one (`stuck`: nothing is left
        running that could make it one)."""
        for op in change.ops:
            run = change.op_runs[op.op_id]
            if run.stage != "await":
                continue
            dst = self._resolve(change, op.dst)
            if self._role(job, dst) is Role.WORKER:
                self._commit(job, change, op, run, out)
            elif stuck or change.error or not self._switch_pending(job, change, dst):
                run.error = f"{dst} did not become a worker"
                fail_change(change, f"{op.op_id}: {run.error}")
                self._undo(job, change, op.op_id, run, at, out)

    def _switch_pending(self, job: JobState, change: Change, executor: str) -> bool:
        return any(op.kind is PlanOpKind.SWITCH and op.role is Role.WORKER
                   and self._resolve(change, op.executor) == executor
                   and change.op_runs[op.op_id].stage not in ("done", "failed") for op in change.ops)

    # -- one op --------------------------------------------------------------------------------------
    def _issue(self, job: JobState, change: Change, op: PlanOp, run: OpRun, out: list[Instruction],
               step: StepInstruction) -> None:
        run.steps.add(issue(change, out, step))
        change.ops_running[step.step] = op.op_id

    def _advance(self, job: JobState, change: Change, op: PlanOp, run: OpRun, at: float,
                 out: list[Instruction]) -> None:
        """The op's next stage (module doc): issue its step, or end the op."""
        stage = run.stage
        try:
            if stage == "undo":
                self._end(change, op.op_id, run, at, ok=False)
            elif op.kind is PlanOpKind.ADD:
                self._advance_add(job, change, op, run, at, out)
            elif op.kind is PlanOpKind.DELETE:
                self._advance_delete(job, change, op, run, at, out)
            elif op.kind is PlanOpKind.SWITCH:
                self._advance_switch(job, change, op, run, at, out)
            elif op.model:
                self._advance_model_move(job, change, op, run, at, out)
            else:
                self._advance_input_move(job, change, op, run, at, out)
        except _OpRefused as e:
            run.error = str(e)
            fail_change(change, f"{op.op_id}: {e}")
            self._end(change, op.op_id, run, at, ok=False)

    def _advance_add(self, job: JobState, change: Change, op: PlanOp, run: OpRun, at: float,
                     out: list[Instruction]) -> None:
        assert op.role is not None
        if run.stage == "pending":
            run.stage = "start"
            self._issue(job, change, op, run, out, StartExecutors(step=job.new_step(), role=op.role, count=op.n,
                                                                  nodes=self._nodes(change)))
        elif run.stage == "start":
            change.new += [n for n in run.new if n not in change.new]
            if len(run.new) != op.n:
                raise _OpRefused(f"an add of {op.n} {op.role.value}s started {len(run.new)}")
            change.bindings.update(zip(op.placeholders, run.new))
            run.stage = "join"
            self._issue(job, change, op, run, out, JoinExecutors(step=job.new_step(), role=op.role,
                                                                 executors=list(run.new)))
        else:
            self._end(change, op.op_id, run, at, ok=True)

    def _advance_delete(self, job: JobState, change: Change, op: PlanOp, run: OpRun, at: float,
                        out: list[Instruction]) -> None:
        x = self._resolve(change, op.executor)
        h = job.holdings
        if run.stage == "pending":
            if h.splits.get(x) or h.blocks.get(x):
                raise _OpRefused(f"{x} still holds {'input splits' if h.splits.get(x) else 'model blocks'}")
            change.leaving.append(x)
            if x in h.splits:
                run.stage = "leave"
                self._issue(job, change, op, run, out, CommitSplits(step=job.new_step(), moves=[],
                                                                    keep_inactive=False, leaving=[x]))
            elif self._role(job, x) is Role.SERVER:
                run.stage = "leave"
                self._issue(job, change, op, run, out, MoveModelBlocks(step=job.new_step(), moves=[], drop=[x]))
            else:
                self._retire(job, change, op, run, x, out)
        elif run.stage == "leave" and self._role(job, x) is Role.SERVER:
            run.stage = "boundary"
            self._issue(job, change, op, run, out, WaitClockBoundary(step=job.new_step()))
        elif run.stage in ("leave", "boundary"):
            self._retire(job, change, op, run, x, out)
        else:
            self._end(change, op.op_id, run, at, ok=True)

    def _retire(self, job: JobState, change: Change, op: PlanOp, run: OpRun, x: str, out: list[Instruction]) -> None:
        run.stage = "retire"
        self._issue(job, change, op, run, out, RetireExecutors(step=job.new_step(), executors=[x]))

    def _advance_switch(self, job: JobState, change: Change, op: PlanOp, run: OpRun, at: float,
                        out: list[Instruction]) -> None:
        x = self._resolve(change, op.executor)
        assert op.role is not None
        h = job.holdings
        if run.stage == "pending":
            if self._role(job, x) is op.role:
                self._end(change, op.op_id, run, at, ok=True)
                return
            if h.splits.get(x) or h.blocks.get(x):
                raise _OpRefused(f"{x} still holds {'input splits' if h.splits.get(x) else 'model blocks'}")
            run.stage = "switch"
            self._issue(job, change, op, run, out, SwitchRole(step=job.new_step(), executor=x, role=op.role))
            return
        # Switched: the executor's role and what it may hold follow (a new worker joins the clock
        # list with its first splits, as an added one does).
        e = job.executors.get(x)
        if e is not None:
            e.info = msgspec.structs.replace(e.info, role=op.role)
        if op.role is Role.SERVER:
            h.splits.pop(x, None)
            h.inactive.pop(x, None)
            h.blocks.setdefault(x, [])
            job.push_logs_incomplete_at = len(job.checkpoints)     # its push log went with it
        else:
            h.blocks.pop(x, None)
        self._end(change, op.op_id, run, at, ok=True)

    def _advance_model_move(self, job: JobState, change: Change, op: PlanOp, run: OpRun, at: float,
                            out: list[Instruction]) -> None:
        if run.stage != "pending":
            self._end(change, op.op_id, run, at, ok=True)
            return
        src, dst = self._resolve(change, op.src), self._resolve(change, op.dst)
        if self._role(job, dst) is not Role.SERVER:
            raise _OpRefused(f"model blocks moved onto {dst}, which is not a server")
        missing = sorted(set(op.blocks) - set(job.holdings.blocks.get(src, [])))
        if missing:
            raise _OpRefused(f"{src} does not hold model blocks {missing[:5]}")
        run.moves = [Move(b, src, dst) for b in op.blocks]
        run.stage = "move"
        self._issue(job, change, op, run, out, MoveModelBlocks(step=job.new_step(), moves=run.moves))

    def _advance_input_move(self, job: JobState, change: Change, op: PlanOp, run: OpRun, at: float,
                            out: list[Instruction]) -> None:
        if run.stage == "pending":
            src, dst = self._resolve(change, op.src), self._resolve(change, op.dst)
            missing = sorted(set(op.blocks) - set(job.holdings.splits.get(src, [])))
            if missing:
                raise _OpRefused(f"{src} does not hold input splits {missing[:5]}")
            inactive = set(job.holdings.inactive.get(dst, []))
            run.moves = [Move(b, src, dst, reactivate=b in inactive) for b in op.blocks]
            data = [m for m in run.moves if not m.reactivate]
            if data:
                run.stage = "stage"
                self._issue(job, change, op, run, out, StageSplits(step=job.new_step(), moves=data))
                return
            run.stage = "stage"          # only state travels: straight to the hand-over
        if run.stage == "stage":
            dst = self._resolve(change, op.dst)
            if self._role(job, dst) is Role.WORKER:
                self._commit(job, change, op, run, out)
            else:
                run.stage = "await"       # settled by _settle_waiting once its switch ends
            return
        self._end(change, op.op_id, run, at, ok=True)

    def _commit(self, job: JobState, change: Change, op: PlanOp, run: OpRun, out: list[Instruction]) -> None:
        src, dst = self._resolve(change, op.src), self._resolve(change, op.dst)
        run.stage = "commit"
        self._issue(job, change, op, run, out, CommitSplits(
            step=job.new_step(), moves=run.moves, keep_inactive=src not in self._leaving(change),
            joining=[] if dst in job.holdings.splits else [dst]))

    def _undo(self, job: JobState, change: Change, op_id: str, run: OpRun, at: float, out: list[Instruction]) -> None:
        """A failed op's own rollback: staged input data that will not change hands is dropped;
        an add's executors are retired with the plan's other idle newcomers at its end."""
        op = self._op(change, op_id)
        data = [m for m in run.moves if not m.reactivate]
        if op.kind is PlanOpKind.MOVE and not op.model and run.stage in ("stage", "await", "commit") and data:
            run.stage = "undo"
            self._issue(job, change, op, run, out, DiscardStaged(step=job.new_step(), moves=data))
            return
        self._end(change, op_id, run, at, ok=False)

    def _retire_newcomers(self, job: JobState, change: Change, out: list[Instruction]) -> None:
        h = job.holdings
        idle = [e for e in change.new if e in job.executors and job.executors[e].state is ExecutorState.READY
                and not h.blocks.get(e) and not h.splits.get(e)]
        if idle:
            issue(change, out, RetireExecutors(step=job.new_step(), executors=idle, released=False))

    def _end(self, change: Change, op_id: str, run: OpRun, at: float, ok: bool) -> None:
        run.stage = "done" if ok and not run.error else "failed"
        run.ended_at = at
        if run.stage == "done":
            change.ops_done.add(op_id)

    # -- names -----------------------------------------------------------------------------------------
    @staticmethod
    def _resolve(change: Change, name: str) -> str:
        return change.bindings.get(name, name)

    @staticmethod
    def _role(job: JobState, executor: str) -> Optional[Role]:
        e = job.executors.get(executor)
        return e.role if e is not None else None

    def _leaving(self, change: Change) -> set[str]:
        """Executors that leave their role in this plan: their outgoing splits keep no copies."""
        return {self._resolve(change, op.executor) for op in change.ops
                if op.kind in (PlanOpKind.DELETE, PlanOpKind.SWITCH)}


class _OpRefused(PlanningError):
    """An op meets a state it cannot act on (the plan was made for another configuration)."""

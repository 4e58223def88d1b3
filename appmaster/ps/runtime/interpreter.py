"""The PS AM as an interpreter of the PS-job controller (appmaster.ps.controller).

The controller decides; this module carries its instructions out on the real job and turns what
happens back into events. `feed(event)` runs the controller's `handle` and then each instruction:
a step instruction starts a task that runs the step with the reconfiguration layer's primitives
(appmaster.ps.reconfiguration) and answers `StepDone` / `StepFailed`; the others (launch an
executor, reply to a request, report to the RM, set a timer, finish) are done at once. Events fed
while an earlier one is being handled wait their turn, so the controller sees one at a time.

What each step does here is the contract in appmaster.ps.controller.instructions; the EPS steps
keep the per-operation records (`ElasticOpRecord`) the job's status and `ps scale` show.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Optional, cast

import msgspec
from msgspec import UNSET

from protocol import executor_ops as ops
from protocol.checkpoint_manifest import JobRecord
from protocol.ps_job_spec import PSJobSpec
from protocol.ps_status import ResumedFrom
from protocol.shape_history import (ExecutorCounts, KillRestartChange, RebuildServerChange, RecoveryChange,
                                    ReplaceWorkerChange, ShapeChange, StragglerChange, SuspendChange)

from ..checkpoints import read_job_checkpoint
from ..controller import events as ev
from ..controller import instructions as ins
from ..controller.core import handle
from ..controller.records import ExecutorInfo, Holdings, Move, PlanOp
from ..controller.records import Role as CRole
from ..controller.planners.eps import Part
from ..controller.state import Change, ChangeKind, JobState
from ..eps_decisions import Transfer
from ..eps_records import ElasticOpFailed, ElasticOpRecord
from .executor_pool import ExecutorRecord, Role
from .executor_rpc import ExecutorCallError
from ..reconfiguration import LaunchFailed, Reconfiguration, keeps_worker_state

log = logging.getLogger(__name__)

RELEASE_TIMEOUT_S = 90.0       # retired executors reported gone before a restart starts new ones
FAILURE_REPORT_GRACE_S = 10.0  # how long a failed call waits for its executor's loss to be reported
RESTORE_RTOL = 1e-4            # restored objective vs the cut's (float32 sums in another order)


def _op_name(change: Change, part: "Part") -> str:
    """An EPS part's name in the job's history: its function, or -- for a directive's per-node
    placement or a relocation onto its nodes -- place_/relocate_ with the role and the direction."""
    direction = "add" if part.op.startswith("add") else "remove"
    if change.target is not None and change.target.placement:
        return f"place_{part.role.value}s_{direction}"
    if part.group >= 2:
        return f"relocate_{part.role.value}s_{direction}"
    return part.op


def info_of(rec: ExecutorRecord) -> ExecutorInfo:
    return ExecutorInfo(executor_id=rec.executor_id, role=CRole(rec.role.value), container_id=rec.container_id,
                        node=rec.container.node_id)


def transfers(moves: list[Move]) -> list[Transfer]:
    return [Transfer(m.item, m.src, m.dst, m.reactivate) for m in moves]


class LogEntry(msgspec.Struct, frozen=True):
    """One event the controller handled, the phase after it and what it said to do."""

    event: ev.Event
    phase: str
    instructions: list[str]


class ControllerLog(msgspec.Struct, frozen=True):
    """The controller log an AM leaves in its dir (CONTROLLER_LOG_FILE): the spec and every event
    but the per-clock ones, in order -- what the simulator replays for the same decisions."""

    spec: PSJobSpec
    entries: list[LogEntry]


CONTROLLER_LOG_FILE = "controller_log.json"


@dataclass
class ChangeRecords:
    """What the interpreter records of the change in the slot: one ElasticOpRecord per EPS part
    (by the part's index), when it began, and the old shape."""

    started: float
    before: tuple[int, int]
    epoch: int
    parts: dict[int, ElasticOpRecord] = field(default_factory=dict)
    step_part: dict[int, int] = field(default_factory=dict)
    cut_objective: Optional[float] = None
    cut_clock: int = 0
    step_s: dict[str, float] = field(default_factory=dict)          # seconds by step kind
    replacements: dict[str, str] = field(default_factory=dict)     # a worker replaced -> its replacement
    nodes: list[str] = field(default_factory=list)
    restored: Optional[float] = None
    checkpoint: str = ""
    checkpoint_time: Optional[float] = None     # when the checkpoint restored was written (Unix s)
    workers_kept: int = 0          # workers that stayed through the restore (lost servers only)
    keys_replayed: Optional[int] = None     # lost servers rebuilt from the workers' push logs
    step_bytes: dict[int, int] = field(default_factory=dict)    # input data moved, by step (Cruise's records)
    clock_redone: bool = False     # a lost worker's clock ran again on its replacement (the loop's hook)
    # When each EPS part's first step began and its last one ended (perf_counter seconds, by the
    # part's index): a part's duration is its own, not its change's (the other role's part may
    # still run).
    part_began: dict[int, float] = field(default_factory=dict)
    part_ended: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Adoption:
    """The master's take-over of a failed attempt's executors (AdoptExecutors): the executors, the
    epochs the job has done, and the latest checkpoint (and its epoch) a recovery goes back to."""

    executors: list[ExecutorRecord]
    epochs_done: int
    checkpoint: str = ""
    checkpoint_epoch: int = 0


@dataclass
class Hooks:
    """What the master supplies: the effects that are the master's own business."""

    launch: Callable[[str, Role], Awaitable[None]]
    release: Callable[[str], None]
    reply: Callable[[ins.Reply], None]
    report: Callable[[bool, int], None]
    finish: Callable[[ins.Finish], None]
    setup: Callable[[], Awaitable[Optional[float]]]
    score: Callable[[], Awaitable[None]]
    job_record: Callable[[], JobRecord]
    on_change_end: Callable[[Change, "ChangeRecords", list[ElasticOpRecord]], None]
    plan: Callable[[ins.ComputePlan], Awaitable[list[PlanOp]]]
    restore_attempt: Callable[[list[ExecutorRecord], list[ExecutorRecord]], Awaitable[ResumedFrom]]
    replaced: Callable[[str, str], None]
    adopt: Callable[[], Awaitable[Adoption]]


class JobInterpreter:
    """Runs one PS job's controller against the real job (module doc)."""

    def __init__(self, job: JobState, steps: Reconfiguration, hooks: Hooks) -> None:
        self.job = job
        self.steps = steps
        self.training = steps.training
        self.hooks = hooks
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.timers: dict[str, asyncio.TimerHandle] = {}
        self.records: Optional[ChangeRecords] = None
        self._queue: deque[ev.Event] = deque()
        self._feeding = False
        self.train_task: Optional[asyncio.Task[None]] = None
        self.trained = asyncio.Event()          # set whenever the train task is not running
        self.trained.set()
        self.on_train_end: Optional[Callable[[Optional[BaseException]], None]] = None
        self.change_ended = asyncio.Event()
        self._fed = asyncio.Event()            # set after every event: `until` re-checks then
        self._launches: set[asyncio.Future[None]] = set()
        # What happened, for the controller log the AM leaves (events but the per-clock ones,
        # each with the phase after it and the kinds of the instructions it gave).
        self.log: list[LogEntry] = []

    # -- events in -----------------------------------------------------------------------------
    def now(self) -> float:
        return time.time()

    def feed(self, event: ev.Event) -> None:
        """Hand `event` to the controller and carry out what it says (module doc)."""
        self._queue.append(event)
        if self._feeding:
            return
        self._feeding = True
        try:
            while self._queue:
                e = self._queue.popleft()
                before = self.job.change
                _, out = handle(self.job, e)
                if not isinstance(e, ev.ClockDone):
                    self.log.append(LogEntry(event=e, phase=self.job.phase.value,
                                             instructions=[type(i).__name__ for i in out]))
                if before is None and self.job.change is not None:
                    self._begin_records(self.job.change)
                for i in out:
                    self._do(i)
                self._parts_ended(before)
                if before is not None and self.job.change is not before:
                    self._end_records(before)
                    if self.job.change is not None and self.job.change is not before:
                        self._begin_records(self.job.change)
        finally:
            self._feeding = False
            self._fed.set()

    def poke(self) -> None:
        """Wake every `until` to check its condition again (state changed without an event)."""
        self._fed.set()

    async def until(self, done: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until `done()` holds, re-checked after every event fed, for up to `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._fed.clear()
            try:
                async with asyncio.timeout(left):
                    await self._fed.wait()
            except asyncio.TimeoutError:
                return done()
        return True

    # -- records of a change -------------------------------------------------------------------
    def _begin_records(self, change: Change) -> None:
        # Each change and step is logged (a few lines per change): a change that does not end is
        # then told by its last step in the AM's log, which is all a hung job leaves behind.
        log.info("change %s began (%s%s)", change.kind.value, change.origin.value,
                 f": {change.reason}" if change.reason else "")
        self.records = ChangeRecords(started=time.time(), before=self.job.shape, epoch=self.job.epoch)
        self.change_ended.clear()

    def _end_records(self, change: Change) -> None:
        log.info("change %s ended%s", change.kind.value, f" with an error: {change.error}" if change.error else "")
        rec, self.records = self.records, None
        if rec is None:
            return
        now = time.perf_counter()
        parts = [rec.parts[i] for i in sorted(rec.parts)]
        for i, p in zip(sorted(rec.parts), parts):
            p.duration_s = rec.part_ended.get(i, now) - rec.part_began[i]
            p.workers_after, p.servers_after = self.training.membership.shape()
            if change.error and not p.error:
                p.error = change.error
        self.hooks.on_change_end(change, rec, parts)
        self.change_ended.set()

    def _part_record(self, step: ins.StepInstruction) -> Optional[ElasticOpRecord]:
        rec, change = self.records, self.job.change
        if rec is None or change is None or change.kind is not ChangeKind.EPS:
            return None
        for i, part in enumerate(change.parts):
            if step.step in part.steps:
                if i not in rec.parts:
                    w, s = self.training.membership.shape()
                    rec.parts[i] = ElasticOpRecord(_op_name(change, part), part.n, time.time(),
                                                   self.training.loop.epochs_done, w, s)
                    rec.part_began[i] = time.perf_counter()
                return rec.parts[i]
        return None

    def _parts_ended(self, change: Optional[Change]) -> None:
        """Mark the end of every EPS part of `change` that has just finished (no step left)."""
        rec = self.records
        if rec is None or change is None or change.kind is not ChangeKind.EPS:
            return
        for i, part in enumerate(change.parts):
            if i in rec.part_began and i not in rec.part_ended and part.stage == "done" and not part.steps:
                rec.part_ended[i] = time.perf_counter()

    # -- instructions out ----------------------------------------------------------------------
    def _do(self, i: ins.Instruction) -> None:
        if isinstance(i, ins.STEP_TYPES):
            step = cast(ins.StepInstruction, i)
            record = self._part_record(step)
            task = self.tasks[step.step] = asyncio.ensure_future(self._run(step, record))
            task.add_done_callback(functools.partial(self._step_task_ended, step.step))
        elif isinstance(i, ins.LaunchExecutor):
            t = asyncio.ensure_future(self.hooks.launch(i.container_id, Role(i.role.value)))
            self._launches.add(t)
            t.add_done_callback(self._launches.discard)
        elif isinstance(i, ins.ReleaseContainer):
            self.hooks.release(i.container_id)
        elif isinstance(i, ins.CancelSteps):
            for s in i.steps:
                running = self.tasks.get(s)
                if running is not None and not running.done():
                    running.cancel()
        elif isinstance(i, ins.Reply):
            self.hooks.reply(i)
        elif isinstance(i, ins.ReportProgress):
            self.hooks.report(i.changing, i.directive_version)
        elif isinstance(i, ins.SetTimer):
            old = self.timers.pop(i.timer, None)
            if old is not None:
                old.cancel()
            delay = max(0.0, i.at - self.now())
            self.timers[i.timer] = asyncio.get_running_loop().call_later(delay, self._timer_fired, i.timer)
        elif isinstance(i, ins.Finish):
            self.hooks.finish(i)
        elif isinstance(i, ins.WithdrawAsks):
            pass    # a StartExecutors step withdraws its own asks when it ends (Reconfiguration._start)

    def _step_task_ended(self, step: int, task: "asyncio.Future[None]") -> None:
        """A step's task cancelled before it ever ran (CancelSteps in the same breath as the step:
        a second loss merged into a recovery whose replacement had just been issued) never enters
        `_run`, so nothing answered it and its change would wait for it forever: answer it here."""
        if task.cancelled() and self.tasks.get(step) is task:
            del self.tasks[step]
            self.feed(ev.StepFailed(at=self.now(), step=step, error="cancelled", cancelled=True,
                                    holdings=self.holdings()))

    def _timer_fired(self, name: str) -> None:
        self.feed(ev.TimerFired(at=self.now(), timer=name))

    async def _run(self, step: ins.StepInstruction, record: Optional[ElasticOpRecord]) -> None:
        t0 = time.perf_counter()
        log.info("step %s #%d started", type(step).__name__, step.step)
        try:
            done = await self._step(step, record)
            log.info("step %s #%d done in %.3fs", type(step).__name__, step.step, time.perf_counter() - t0)
            if self.records is not None:
                kind = type(step).__name__
                self.records.step_s[kind] = self.records.step_s.get(kind, 0.0) + time.perf_counter() - t0
        except asyncio.CancelledError:
            self.tasks.pop(step.step, None)
            self.feed(ev.StepFailed(at=self.now(), step=step.step, error="cancelled", cancelled=True,
                                    holdings=self.holdings()))
            return
        except Exception as e:  # noqa: BLE001 - every failure of a step is the controller's to handle
            cancelled = False
            if isinstance(e, ExecutorCallError):
                # The executor probably died: its container's exit (the loss, which the controller
                # handles first) usually comes a moment after the failed call. The loss may cancel
                # this step meanwhile (ABORT): it must still be answered, or its change never ends.
                try:
                    await self._loss_reported(FAILURE_REPORT_GRACE_S)
                except asyncio.CancelledError:
                    cancelled = True
            self.tasks.pop(step.step, None)
            log.warning("step %s failed: %s: %s", type(step).__name__, type(e).__name__, e,
                        exc_info=log.isEnabledFor(logging.DEBUG))
            if record is not None and not record.error:
                record.error = f"{type(e).__name__}: {e}"
            # A start that came short names what it kept (the restart goes on with it, if enough).
            kept = [info_of(x) for x in e.started] if isinstance(e, LaunchFailed) else []
            self.feed(ev.StepFailed(at=self.now(), step=step.step, error=f"{type(e).__name__}: {e}",
                                    cancelled=cancelled, executors=kept, holdings=self.holdings()))
            return
        self.tasks.pop(step.step, None)
        self.feed(done)

    async def _loss_reported(self, timeout_s: float) -> None:
        before = len(self.job.lost)
        await self.until(lambda: len(self.job.lost) != before or self.job.phase.is_final, timeout_s)

    def holdings(self) -> Holdings:
        """Who holds what now, as the AM's own books say (the ownership table, the split ledger)."""
        placement = self.training.placement
        blocks: dict[str, list[int]] = {}
        for s in self.training.membership.servers:
            blocks[s.executor_id] = list(placement.blocks_of(s.executor_id))
        ledger = self.steps.splits()      # before training: built from the workers' partitions
        return Holdings(blocks=blocks, splits={w: list(s) for w, s in ledger.holdings().items()},
                        inactive={w: list(s) for w, s in ledger.inactive_holdings().items() if s})

    def _done(self, step: ins.StepInstruction, **kw: object) -> ev.StepDone:
        return ev.StepDone(at=self.now(), step=step.step, **kw)   # type: ignore[arg-type]

    # -- the steps -----------------------------------------------------------------------------
    async def _step(self, s: ins.StepInstruction, rec: Optional[ElasticOpRecord]) -> ev.StepDone:
        steps, training = self.steps, self.training
        pool, placement, membership = training.pool, training.placement, training.membership
        if isinstance(s, ins.StartExecutors):
            role = Role(s.role.value)
            size = self.job.size
            if size is not None:
                steps.resource = type(steps.resource)(size[0], size[1])
            asked = time.monotonic()
            new = await (steps.start_placed(role, dict(s.per_node), s.keep_short) if s.per_node
                         else steps.start_executors(role, s.count, s.nodes, s.keep_short))
            if rec is not None and new:
                granted = max(e.allocated_at for e in new)
                rec.add_phase("allocate", granted - asked)
                rec.add_phase("start", max(e.ready_at for e in new) - granted)
                rec.executors_added += [e.executor_id for e in new]
                rec.containers_added += [e.container_id for e in new]
            return self._done(s, executors=[info_of(e) for e in new])
        if isinstance(s, ins.JoinExecutors):
            new = [pool.executors[x] for x in s.executors]
            t0 = time.monotonic()
            for gone in pool.lost:            # no broadcast may wait on a dead worker's address
                if gone in pool.executors and pool.executors[gone].role is Role.WORKER:
                    placement.drop_address(gone)
            await steps.join(new, Role(s.role.value))
            if s.role is CRole.SERVER:
                membership.add_servers(new)      # they answer the objective (0 until blocks land)
            if rec is not None:
                rec.add_phase("register", time.monotonic() - t0)
            return self._done(s)
        if isinstance(s, ins.MoveModelBlocks):
            drop = [pool.executors[x] for x in s.drop if x in pool.executors]
            fake = rec or ElasticOpRecord("move", len(s.moves), time.time(), 0, 0, 0)
            with fake.timed("move_blocks"):
                await steps.move_model_blocks(fake, transfers(s.moves), drop=drop)
                if drop:
                    await placement.forget(x.executor_id for x in drop)
            fake.epoch_switched = training.loop.epochs_done + 1
            return self._done(s, holdings=self.holdings())
        if isinstance(s, ins.StageSplits):
            fake = rec or ElasticOpRecord("stage", len(s.moves), time.time(), 0, 0, 0)
            sent = fake.bytes_sent
            with fake.timed("stage_splits"):
                await steps.stage_splits(fake, transfers(s.moves))
            self._count_bytes(s, fake.bytes_sent - sent)
            return self._done(s)
        if isinstance(s, ins.CommitSplits):
            return await self._commit(s, rec)
        if isinstance(s, ins.DiscardStaged):
            await steps.discard_staged(transfers(s.moves))
            return self._done(s)
        if isinstance(s, ins.RetireExecutors):
            retiring = [pool.executors[x] for x in s.executors if x in pool.executors]
            for g in retiring:
                if g.role is Role.SERVER:
                    membership.remove_servers([g.executor_id])
            if rec is not None:
                with rec.timed("retire"):
                    await steps.retire(retiring, rec, released=s.released)
            else:
                await steps.retire(retiring, released=s.released)
            return self._done(s)
        if isinstance(s, ins.SwitchRole):
            await steps.switch_role(pool.executors[s.executor], Role(s.role.value))
            return self._done(s, holdings=self.holdings())
        if isinstance(s, ins.SendExecutorRequest):
            await training.rpc.send_all([pool.executors[x] for x in s.executors], s.request)
            return self._done(s)
        if isinstance(s, ins.WaitClockBoundary):
            if rec is not None:
                with rec.timed("boundary"):
                    await steps.wait_boundary()
            else:
                await steps.wait_boundary()
            return self._done(s)
        if isinstance(s, ins.PauseTraining):
            steps.pause()
            self.poke()                   # whoever waits on training stopping (`until`) looks again
            await self.trained.wait()
            return self._done(s)
        if isinstance(s, ins.ResumeTraining):
            self.start_training()
            return self._done(s)
        if isinstance(s, ins.SetupTraining):
            await self.hooks.setup()
            return self._done(s, holdings=self.holdings())
        if isinstance(s, ins.WriteCheckpoint):
            return await self._checkpoint(s)
        if isinstance(s, ins.RestoreCheckpoint):
            return await self._restore(s)
        if isinstance(s, ins.RebuildServers):
            return await self._rebuild(s)
        if isinstance(s, ins.AdoptExecutors):
            a = await self.hooks.adopt()
            return self._done(s, executors=[info_of(r) for r in a.executors], holdings=self.holdings(),
                              epochs_done=a.epochs_done, directory=a.checkpoint, checkpoint_epoch=a.checkpoint_epoch)
        if isinstance(s, ins.ScoreModel):
            await self.hooks.score()
            return self._done(s)
        if isinstance(s, ins.TakeOverSplits):
            return await self._take_over(s)
        if isinstance(s, ins.ComputePlan):
            ops_ = await self.hooks.plan(s)
            return self._done(s, ops=ops_)
        raise AssertionError(f"unknown step {s!r}")

    async def _commit(self, s: ins.CommitSplits, rec: Optional[ElasticOpRecord]) -> ev.StepDone:
        steps, membership, pool = self.steps, self.training.membership, self.training.pool
        ledger = steps.splits()
        fake = rec or ElasticOpRecord("commit", len(s.moves), time.time(), 0, 0, 0)
        sent = fake.bytes_sent
        for w in s.joining:
            if w not in ledger.active:
                ledger.add_worker(w)

        async def switch() -> None:
            try:
                await steps.commit_splits(fake, transfers(s.moves), keep_inactive=s.keep_inactive)
            finally:
                # The clock list: joining workers that hold splits train from the next clock; a
                # leaving worker whose splits all moved leaves it.
                membership.add_workers(pool.executors[w] for w in s.joining if ledger.active_of(w))
                gone = [w for w in s.leaving if not ledger.active_of(w)]
                membership.remove_workers(gone)
                for w in gone:
                    ledger.remove_worker(w)
                for member in membership.workers:
                    if member.executor_id in ledger.active:
                        member.blocks = ledger.active_of(member.executor_id)
                fake.epoch_switched = self.training.loop.epochs_done

        with fake.timed("boundary"):
            _, lost = await steps.at_boundary(switch)
        fake.training_time_lost_s += lost
        self._count_bytes(s, fake.bytes_sent - sent)
        return self._done(s, holdings=self.holdings())

    def _count_bytes(self, s: ins.StepInstruction, n: int) -> None:
        if self.records is not None and n:
            self.records.step_bytes[s.step] = n

    async def _checkpoint(self, s: ins.WriteCheckpoint) -> ev.StepDone:
        """At an epoch end or a clock boundary with training stopped (a cut): every server block,
        the workers' block state where the app keeps it, and -- mid-epoch -- every input block's
        place and the objective there."""
        training, steps = self.training, self.steps
        loop, metrics = training.loop, training.metrics
        job = self.hooks.job_record()
        clock = 0
        positions: dict[int, tuple[int, int]] = {}
        objective = metrics.objectives[-1] if metrics.objectives else metrics.initial_objective
        if self.trained.is_set() and training.membership.workers and s.reason not in ("due", "requested", "final",
                                                                                       "initial"):
            replies = await training.rpc.call_all(training.membership.workers, ops.Positions(), ops.PositionsReply)
            positions = {int(b): (int(e), int(row)) for r in replies for b, (e, row) in r.positions.items()}
            if any(e == loop.epochs_done and row > 0 for e, row in positions.values()):
                clock = loop.clocks_done
                objective = await training.evaluation.objective()
        last = steps.checkpointer.last
        if last is not None and (last.epoch, last.clock) == (s.epoch, clock) and s.reason != "final":
            info = last
        else:
            record = msgspec.structs.replace(job, objective=objective, reason=s.reason,
                                             positions=positions or None)
            info = await steps.checkpoint(loop.epochs_done, record, clock=clock)
        if self.records is not None:
            self.records.cut_objective = objective
            self.records.cut_clock = clock
            self.records.checkpoint = info.dir
        return self._done(s, directory=info.dir)

    async def _restore(self, s: ins.RestoreCheckpoint) -> ev.StepDone:
        """The checkpoint onto the (new) executors, its epoch, counters and every input block's
        place coming back with it."""
        training, steps = self.training, self.steps
        pool = training.pool
        servers = [pool.executors[x] for x in s.servers]
        workers = [pool.executors[x] for x in s.workers]
        if self.job.change is not None and self.job.change.kind is ChangeKind.START:
            resumed = await self.hooks.restore_attempt(servers, workers)
            steps.pause()
            restored0 = resumed.objective_restored
            # The checkpoint resumed from (its local copy) is this attempt's recovery point, as a
            # taken-over attempt's is: with none, the start wrote an "initial" one labelled at
            # clock 0 of a mid-epoch model, which a later loss restored and trained again.
            return self._done(s, holdings=self.holdings(),
                              objective=math.nan if restored0 is None else float(restored0),
                              directory=resumed.dir, epochs_done=training.loop.epochs_done,
                              checkpoint_epoch=resumed.epoch)
        manifest = read_job_checkpoint(s.directory)
        training.metrics.truncate_epochs(manifest.epoch)
        restored = await steps.continue_from_checkpoint(servers, workers, s.directory, manifest, s.workers_kept)
        steps.pause()                 # ResumeTraining lets it run (restart_on leaves it resumed)
        if self.records is not None:
            self.records.restored = restored
            self.records.checkpoint_time = manifest.time or None
            self.records.workers_kept = len(workers) if s.workers_kept else 0
            cut = self.records.cut_objective
            if cut is not None and not math.isclose(restored, cut, rel_tol=RESTORE_RTOL, abs_tol=1e-9):
                log.warning("restored objective %.9g differs from the checkpoint's %.9g", restored, cut)
        return self._done(s, holdings=self.holdings(), objective=restored)

    async def _rebuild(self, s: ins.RebuildServers) -> ev.StepDone:
        """Lost servers rebuilt from the latest checkpoint and the workers' push logs."""
        pool = self.training.pool
        manifest = read_job_checkpoint(s.directory)
        if manifest.clocks is None:
            raise ElasticOpFailed(f"checkpoint {s.directory} does not say after which clock it was cut")
        keys = await self.steps.rebuild_servers([pool.executors[x] for x in s.lost], [pool.executors[x] for x in s.new],
                                                s.directory, manifest.clocks)
        if self.records is not None:
            self.records.checkpoint = s.directory
            self.records.checkpoint_time = manifest.time or None
            self.records.keys_replayed = keys
        return self._done(s, holdings=self.holdings())

    async def _take_over(self, s: ins.TakeOverSplits) -> ev.StepDone:
        """`new` generates `old`'s splits and puts them where they stood when the clock began (a
        lost worker's clock is run again) -- or, for a live straggler, where they stand at the
        next clock boundary; then it takes `old`'s place in the ledger and the clock list."""
        training, steps = self.training, self.steps
        pool, rpc, loop = training.pool, training.rpc, training.loop
        new = pool.executors[s.new]
        old = pool.executors.get(s.old)

        async def take() -> None:
            r = await rpc.call(new, ops.LoadSplits(blocks=list(s.splits)), ops.WorkerSetupReply)
            new.data_bytes = r.data_bytes
            if old is not None:
                new.partition = old.partition
                training.placement.drop_address(old.executor_id)
            positions = loop.clock_start_positions(list(s.splits))
            await rpc.send(new, ops.SetPositions(positions={str(b): p for b, p in positions.items()}))
            steps.splits().replace_worker(s.old, s.new)
            steps.sync_workers_with_ledger()
            self.hooks.replaced(s.old, s.new)
            if self.records is not None:
                self.records.replacements[s.old] = s.new
                self.records.nodes.append(new.container.node_id)

        change = self.job.change     # a straggler's change runs in phase RECOVERING too: tell them by kind
        if old is not None and old.executor_id not in pool.lost and change is not None \
                and change.kind is ChangeKind.STRAGGLER:
            await steps.at_boundary(take)         # a live straggler: at a boundary, no clock running
        else:
            await take()
        return self._done(s, holdings=self.holdings())

    # -- training ------------------------------------------------------------------------------
    def start_training(self) -> None:
        """Let training run (again): a task that trains until it ends, is paused, or fails."""
        if self.train_task is not None and not self.train_task.done():
            self.steps.resume()
            return
        self.steps.resume()
        self.trained.clear()
        self.train_task = asyncio.ensure_future(self._train())

    async def _train(self) -> None:
        err: Optional[BaseException] = None
        try:
            await self.train_coro()
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - handed to the master
            err = e
        finally:
            self.trained.set()
        if self.on_train_end is not None:
            self.on_train_end(err)

    train_coro: Callable[[], Awaitable[None]]

    async def close(self) -> None:
        for t in list(self.tasks.values()) + ([self.train_task] if self.train_task else []):
            t.cancel()
        for h in self.timers.values():
            h.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)


# A kill-based restart's record names its steps' seconds as the restart always did.
RESTART_STEP_NAMES = {"PauseTraining": "wait_boundary_s", "WriteCheckpoint": "checkpoint_s",
                      "RetireExecutors": "release_s", "StartExecutors": "allocate_s",
                      "RestoreCheckpoint": "restore_s"}


def change_history(change: Change, rec: ChangeRecords, shape_after: tuple[int, int], epoch: int,
                   clock: int, nodes: Optional[list[str]] = None) -> Optional[ShapeChange]:
    """The shape-history record of a change that is not EPS's (EPS records one per part)."""
    w0, s0 = rec.before
    w1, s1 = shape_after
    before, after = ExecutorCounts(w0, s0), ExecutorCounts(w1, s1)
    seconds = round(time.time() - rec.started, 4)
    ok = not change.error
    if change.kind is ChangeKind.RESTART:
        steps = {name: round(rec.step_s[kind], 4) for kind, name in RESTART_STEP_NAMES.items() if kind in rec.step_s}
        return KillRestartChange(changed=ok, phase="RESTORED" if ok else "FAILED", before=before, workers=w1,
                                 servers=s1, time=rec.started, seconds=seconds, lost_s=seconds, steps=steps,
                                 error=change.error, op="resize", requested=(change.target.workers +
                                                                             change.target.servers
                                                                             if change.target else 0),
                                 after=after, duration_s=seconds, training_time_lost_s=seconds, ok=ok,
                                 epoch=epoch, checkpoint=rec.checkpoint, objective_before=rec.cut_objective,
                                 objective_restored=rec.restored if rec.restored is not None else UNSET)
    if change.kind in (ChangeKind.PAUSE, ChangeKind.RESUME, ChangeKind.MIGRATE):
        extra: dict[str, object] = {}
        if rec.restored is not None:
            extra["objective_restored"] = rec.restored
        if rec.checkpoint:
            extra["checkpoint"] = rec.checkpoint
        if change.kind is not ChangeKind.PAUSE and nodes is not None:
            extra["nodes"] = nodes
        return SuspendChange(op=change.kind.value, time=rec.started, seconds=seconds, ok=ok, epoch=epoch,
                             clock=clock, objective_before=rec.cut_objective, workers=w1, servers=s1,
                             **extra)   # type: ignore[arg-type]
    if change.kind is ChangeKind.STRAGGLER:
        return StragglerChange(op="replace", time=rec.started, lost=list(change.descriptions), workers=w1,
                               servers=s1, epoch=epoch, clock=clock, clock_redone=False, epochs_redone=0,
                               before=before, after=after, changed=ok, error=change.error, seconds=seconds,
                               duration_s=seconds, lost_s=0.0, replacements=dict(rec.replacements),
                               nodes=list(rec.nodes))
    if change.kind is ChangeKind.RECOVER:
        if change.target is not None:      # the shape before the losses (a replacement keeps it)
            before = ExecutorCounts(change.target.workers, change.target.servers)
        if rec.keys_replayed is not None and not change.error:
            return RebuildServerChange(op="rebuild", time=rec.started, lost=list(change.descriptions), workers=w1,
                                       servers=s1, epoch=epoch, clock=clock, clock_redone=True, epochs_redone=0,
                                       before=before, after=after, changed=ok, error=change.error,
                                       seconds=seconds, duration_s=seconds, lost_s=seconds,
                                       replacements=dict(zip(change.lost, change.new)), checkpoint=rec.checkpoint,
                                       keys_replayed=rec.keys_replayed)
        if not change.checkpoint:
            return ReplaceWorkerChange(op="replace", time=rec.started, lost=list(change.descriptions), workers=w1,
                                       servers=s1, epoch=epoch, clock=clock, clock_redone=rec.clock_redone,
                                       epochs_redone=0,
                                       before=before, after=after, changed=ok, error=change.error,
                                       seconds=seconds, duration_s=seconds, lost_s=seconds,
                                       replacements=dict(rec.replacements), nodes=list(rec.nodes))
        return RecoveryChange(op="recover", time=rec.started, lost=list(change.descriptions), workers=w1, servers=s1,
                              checkpoint=change.checkpoint, epoch=epoch, epochs_redone=max(0, rec.epoch - epoch),
                              checkpoint_time=rec.checkpoint_time, before=before, after=after, changed=ok,
                              error=change.error, seconds=seconds, duration_s=seconds, lost_s=seconds,
                              workers_kept=rec.workers_kept,
                              objective_restored=rec.restored if rec.restored is not None else UNSET)
    return None


__all__ = ["ChangeRecords", "Hooks", "JobInterpreter", "change_history", "info_of", "keeps_worker_state",
           "RELEASE_TIMEOUT_S"]

"""Cruise's optimizer (appmaster.cruise) inside the PS AM: it proposes plans, the PS-job
controller carries them out.

Inputs: each worker's per-mini-batch compute and communication times (from its run_clock replies,
via JobMetrics' batch listeners), and at every epoch boundary one status round over the job's
executors: workers' cumulative training counters (samples, bytes pulled + pushed), servers'
service counters (requests, busy seconds, bytes served) and the node link rate the cluster
declares. They become the optimizer's moving averages.

Decisions: at an epoch boundary with no change in the job's slot, once the trigger policy allows
(every worker has run the configured number of mini-batches since the last change), the optimizer
solves for the current slots; a plan predicted to gain at least the threshold is proposed to the
controller (`PlanProposed`, its ops as `plan_ops` converts them: appmaster.cruise.plan's DAG as the
controller's `PlanOp` list). The controller's Cruise planner (controller/planners/cruise_plan.py)
runs it while training goes on: model moves overlap training, input splits change hands at the
next clock boundary. Under an RM directive the controller asks instead (its `ComputePlan` step):
`plan_for` re-solves for the containers the directive grants.

History: every plan the controller took is kept with its predicted epoch time before / after and
the measured ones (mean of the last epochs before the plan started, and of the first epochs that
started after it finished), per-op timings (the controller's record of each op), and the bytes
moved -- the job status's "cruise" section. The driver runs nothing itself: no steps, no guard.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from appmaster.cruise.optimizer import CruiseConfig, CruiseOptimizer, Decision, JobSizes
from appmaster.cruise.plan import AddOp, BlockKind, DeleteOp, MoveOp, Op, Plan, SwitchOp
from appmaster.cruise.plan_builder import ExecutorState as CruiseExecutor
from appmaster.cruise.profiling import SlotInfo
from appmaster.cruise.targets import Role
from protocol import executor_ops as ops
from protocol.errors import PlanningError
from protocol.ps_job_spec import PSJobSpec
from protocol.ps_status import CruisePlanRecord, CruiseStatus, OpTimingRecord, PlanRunRecord
from psruntime.apps.base import AnyPSApp

from .controller import events as cev
from .controller import instructions as ins
from .controller.phases import Phase
from .controller.records import Holdings, Move, PlanOp, PlanOpKind
from .controller.records import Role as CRole
from .controller.state import Change, ChangeKind, JobState
from .runtime.executor_pool import ExecutorRecord
from .metrics import EpochRecord
from .training import Training

log = logging.getLogger(__name__)

EPOCHS_MEASURED = 2          # epochs averaged for the measured epoch time before / after a plan
HISTORY_LIMIT = 50
MAX_PLAN_FAILURES = 2        # consecutive failed plans after which Cruise stops reconfiguring the job


# ---- a plan for the controller ---------------------------------------------------------------------
def plan_ops(plan: Plan) -> list[PlanOp]:
    """`plan` as the controller's ops, in dependency order: each op's prerequisites become its
    `after`, an add keeps its placeholders, a move says whether it carries model blocks."""
    return [_plan_op(plan.ops[o], sorted(plan.deps[o])) for o in plan.order]


def _plan_op(op: Op, after: list[str]) -> PlanOp:
    if isinstance(op, AddOp):
        return PlanOp(op_id=op.op_id, kind=PlanOpKind.ADD, after=after, role=CRole(op.role.value), n=op.n,
                      placeholders=list(op.placeholders))
    if isinstance(op, DeleteOp):
        return PlanOp(op_id=op.op_id, kind=PlanOpKind.DELETE, after=after, executor=op.executor)
    if isinstance(op, SwitchOp):
        return PlanOp(op_id=op.op_id, kind=PlanOpKind.SWITCH, after=after, executor=op.executor,
                      role=CRole(op.role.value))
    return PlanOp(op_id=op.op_id, kind=PlanOpKind.MOVE, after=after, model=op.kind is BlockKind.MODEL,
                  blocks=list(op.blocks), src=op.src, dst=op.dst)


# ---- records of a plan the controller ran -----------------------------------------------------------
@dataclass
class OpTiming:
    """When one op ran, relative to the plan's start, and what it did."""

    op_id: str
    op: str
    start_s: float
    end_s: Optional[float] = None
    bytes_moved: int = 0
    error: str = ""

    @property
    def seconds(self) -> Optional[float]:
        return None if self.end_s is None else self.end_s - self.start_s

    def record(self) -> OpTimingRecord:
        return OpTimingRecord(id=self.op_id, op=self.op, start_s=round(self.start_s, 4),
                              end_s=None if self.end_s is None else round(self.end_s, 4),
                              seconds=None if self.seconds is None else round(self.seconds, 4),
                              bytes=self.bytes_moved, error=self.error)


@dataclass
class PlanRun:
    """One execution of a plan: `plan`'s op states as the controller left them, per-op timings,
    total time, bytes moved, the first error."""

    plan: Plan
    timings: dict[str, OpTiming] = field(default_factory=dict)
    seconds: float = 0.0
    error: str = ""
    max_concurrency: int = 0

    @property
    def ok(self) -> bool:
        return not self.error and self.plan.finished

    @property
    def bytes_moved(self) -> int:
        return sum(t.bytes_moved for t in self.timings.values())

    def record(self) -> PlanRunRecord:
        """The run as the job status serves it (protocol.ps_status)."""
        return PlanRunRecord(ok=bool(self.ok), seconds=round(self.seconds, 4), bytes_moved=self.bytes_moved,
                             max_concurrency=self.max_concurrency, error=self.error,
                             ops=[self.timings[o].record() for o in self.plan.order if o in self.timings],
                             plan=self.plan.to_json())


_OP_NAMES = {AddOp: "add", DeleteOp: "delete", SwitchOp: "switch", MoveOp: "move"}


def plan_run(plan: Plan, change: Change, at: float, step_bytes: Mapping[int, int] = {},
             block_bytes: float = 0.0) -> PlanRun:
    """What the controller did of `plan` so far (`change` is its PLAN change, `at` now or its end):
    a fresh copy of `plan` with every op's state replayed from the controller's op runs, each op's
    timing, and the bytes it moved (model blocks by their size, input splits as their steps
    measured them: `step_bytes` by step id)."""
    run = PlanRun(Plan(list(plan.ops.values()), plan.deps), seconds=max(0.0, at - change.at), error=change.error)
    copy = run.plan
    for op_id in copy.order:      # every op started once all it waits for were done: this order replays it
        r = change.op_runs.get(op_id)
        if r is None or r.started_at is None:
            continue
        op = copy.ops[op_id]
        copy.start(op_id)
        timing = OpTiming(op_id, _OP_NAMES[type(op)], r.started_at - change.at,
                          None if r.ended_at is None else r.ended_at - change.at, error=r.error)
        if isinstance(op, MoveOp):
            timing.bytes_moved = (int(len(op.blocks) * block_bytes) if op.kind is BlockKind.MODEL
                                  else _measured(change, r.moves, step_bytes))
        run.timings[op_id] = timing
        if r.stage == "done":
            copy.done(op_id, [change.bindings.get(p, p) for p in op.placeholders] if isinstance(op, AddOp) else None)
        elif r.stage == "failed":
            copy.fail(op_id, r.error or "failed")
    copy.bindings.update(change.bindings)
    run.max_concurrency = _concurrency([(t.start_s, t.end_s) for t in run.timings.values()])
    return run


def _measured(change: Change, moves: list[Move], step_bytes: Mapping[int, int]) -> int:
    """The bytes the steps that moved `moves` (an input move's staging and commit) measured."""
    mine = set(moves)
    return sum(n for step, n in step_bytes.items()
               if isinstance(s := change.steps.get(step), (ins.StageSplits, ins.CommitSplits))
               and s.moves and set(s.moves) <= mine)


def _concurrency(spans: list[tuple[float, Optional[float]]]) -> int:
    """The most ops that ran at once (an op ends before one that starts at the same moment)."""
    best = 1 if spans else 0
    for start, _ in spans:
        best = max(best, sum(1 for s, e in spans if s <= start and (e is None or e > start)))
    return best


@dataclass
class PlanRecord:
    """One plan the controller took, for the job status (`plan_history`)."""

    decision: Decision
    started: float                                   # unix time
    shape_before: tuple[int, int]
    epoch_started: int
    measured_before_s: Optional[float]
    run: Optional[PlanRun] = None
    finished: Optional[float] = None
    shape_after: Optional[tuple[int, int]] = None
    measured_after: list[float] = field(default_factory=list)
    error: str = ""

    @property
    def measured_after_s(self) -> Optional[float]:
        return sum(self.measured_after) / len(self.measured_after) if self.measured_after else None

    def record(self) -> CruisePlanRecord:
        """The plan as the job status serves it (`cruise.plan_history`, protocol.ps_status)."""
        d = self.decision
        return CruisePlanRecord(time=self.started, trigger=d.trigger, epoch=self.epoch_started,
                                shape_before=list(self.shape_before),
                                shape_after=list(self.shape_after) if self.shape_after else None,
                                chosen_shape=list(d.target.shape) if d.target else None,
                                predicted_epoch_before_s=d.before_s, predicted_epoch_after_s=d.after_s,
                                predicted_gain=d.gain, measured_epoch_before_s=self.measured_before_s,
                                measured_epoch_after_s=self.measured_after_s,
                                plan_s=self.run.seconds if self.run else None,
                                bytes_moved=self.run.bytes_moved if self.run else 0,
                                ops=len(d.plan.ops) if d.plan else 0, finished=self.finished, error=self.error,
                                run=self.run.record() if self.run else None)


# ---- the driver ------------------------------------------------------------------------------------
class CruiseDriver:
    """Feeds the optimizer, proposes its plans to the controller, records how they went (module doc).

    `holdings` says who holds which model block and input split now (the AM's books): the
    configuration the optimizer plans from.
    """

    def __init__(self, optimizer: CruiseOptimizer, training: Training, holdings: Callable[[], Holdings],
                 vcores: int = 1, block_bytes: Callable[[], float] = lambda: 0.0,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.optimizer = optimizer
        self.training = training
        self.holdings = holdings
        self.vcores = vcores
        self.block_bytes = block_bytes            # bytes of one model block (a model move's bytes)
        self.wall_clock = wall_clock
        self.history: list[PlanRecord] = []
        self.current: Optional[PlanRecord] = None            # the plan the controller runs now
        self._batches: dict[str, list[float]] = {}          # worker -> [batches, compute_s, comm_s]
        self._counters: dict[str, dict[str, float]] = {}    # executor -> last cumulative counters
        self._waiting: list[PlanRecord] = []                 # plans whose measured epoch time is due
        self.last_error = ""
        self.failures = 0                                    # consecutive failed plans

    # -- inputs --------------------------------------------------------------------------------
    def on_batches(self, worker: str, compute_s: list[float], comm_s: list[float]) -> None:
        """A worker's per-mini-batch times of one epoch (JobMetrics batch listener)."""
        acc = self._batches.setdefault(worker, [0.0, 0.0, 0.0])
        acc[0] += len(compute_s)
        acc[1] += sum(compute_s)
        acc[2] += sum(comm_s)

    async def _poll(self, feed: bool = True) -> None:
        """One status round: feed workers' epoch figures and servers' counters to the optimizer
        (`feed` False: only move the counters' baselines on, e.g. while a change runs)."""
        membership, rpc = self.training.membership, self.training.rpc
        workers, servers = membership.workers, membership.servers
        replies = await asyncio.gather(*(rpc.call(r, ops.Status(), ops.StatusReply) for r in workers + servers),
                                       return_exceptions=True)
        for i, (rec, st) in enumerate(zip(workers + servers, replies)):
            if isinstance(st, BaseException):
                continue
            if feed:
                self._feed(rec, st, is_worker=i < len(workers))
            else:
                self._rebase(rec.executor_id, st)
        self._batches.clear()

    def _rebase(self, eid: str, st: ops.StatusReply) -> None:
        last = self._counters.setdefault(eid, {})
        for k, v in st.train_counters.items():
            last[k] = float(v)

    def _feed(self, rec: ExecutorRecord, st: ops.StatusReply, is_worker: bool) -> None:
        eid = rec.executor_id
        if st.link_bps is not None and st.link_bps > 0:
            self.optimizer.metrics.record_link(eid, st.link_bps / 8.0)
        if st.host and st.host_cores:
            self.optimizer.metrics.record_host(eid, st.host, st.host_cores)
        last = self._counters.setdefault(eid, {})
        train = st.train_counters
        acc = self._batches.get(eid)
        if is_worker and acc and acc[0] >= 1:
            samples = _delta(train, last, "samples")
            nbytes = _delta(train, last, "bytes")
            if not samples:     # an executor without counters: the rows of the splits it trains
                samples = len(rec.blocks) * self.optimizer.job.samples_per_block
            try:
                self.optimizer.record_worker(eid, int(acc[0]), samples, acc[1], acc[2], nbytes or None)
            except ValueError as e:
                log.debug("worker report of %s ignored: %s", eid, e)
        self._rebase(eid, st)
        if not is_worker and st.busy_s is not None and st.bytes_served is not None:
            try:
                self.optimizer.record_server(eid, float(st.data_requests), st.busy_s, st.bytes_served)
            except ValueError as e:
                log.debug("server report of %s ignored: %s", eid, e)

    # -- configuration ---------------------------------------------------------------------------
    def configuration(self) -> tuple[list[CruiseExecutor], list[SlotInfo]]:
        """The executors as the optimizer sees them (role, owned blocks) and their slots."""
        h = self.holdings()
        out = [CruiseExecutor(w, Role.WORKER, frozenset(s)) for w, s in sorted(h.splits.items())]
        out += [CruiseExecutor(s, Role.SERVER, frozenset(b)) for s, b in h.blocks.items()]
        return out, [SlotInfo(e.executor_id, "default", self.vcores) for e in out]

    def shape(self) -> tuple[int, int]:
        return self.training.membership.shape()

    @property
    def running(self) -> bool:
        return self.current is not None

    # -- decisions -------------------------------------------------------------------------------
    async def on_epoch(self, rec: EpochRecord, job: JobState, feed: Callable[[cev.Event], None]) -> Optional[Decision]:
        """Epoch-boundary hook: measure, and when the optimizer decides to reconfigure, propose
        its plan to the controller (`feed`). Returns the decision taken now, if any."""
        self._measure(rec)
        if self._busy(job) or self.failures >= MAX_PLAN_FAILURES:
            await self._poll(feed=False)      # this epoch's figures describe no one shape
            return None
        await self._poll()
        self.optimizer.set_configuration(*self.configuration())
        decision = self.optimizer.maybe_decide()
        if decision is None:
            return None
        if decision.action != "reconfigure" or decision.plan is None:
            log.info("cruise: %s (%s)", decision.action, decision.reason)
            return decision
        ops_ = self._begin(decision)
        feed(cev.PlanProposed(at=self.wall_clock(), ops=ops_, reason=f"{decision.trigger}: {decision.reason}"))
        change = job.change
        if self.current is not None and not (change is not None and change.kind is ChangeKind.PLAN
                                             and change.ops == ops_):
            self._withdraw("the job was busy with another change")   # the status poll's await let one in
        return decision

    @staticmethod
    def _busy(job: JobState) -> bool:
        return job.change is not None or job.phase is not Phase.TRAINING

    def plan_for(self, s: ins.ComputePlan) -> list[PlanOp]:
        """The controller's ComputePlan under an RM directive: the policy grants this job
        `workers + servers` containers and Cruise decides their split. The plan's ops (none: keep
        the configuration); raises when the optimizer cannot decide."""
        self.optimizer.set_configuration(*self.configuration())
        decision = self.optimizer.on_capacity_change(s.workers + s.servers)
        if decision.action != "reconfigure" or decision.plan is None:
            if decision.reason.startswith("cannot decide"):
                raise PlanningError(f"Cruise: {decision.reason}")
            log.info("cruise: %s for %d containers (%s)", decision.action, s.workers + s.servers, decision.reason)
            return []
        return self._begin(decision)

    def _begin(self, decision: Decision) -> list[PlanOp]:
        """Record the plan of `decision` as the one the controller runs; its ops."""
        assert decision.plan is not None
        epochs = self.training.metrics.epochs[-EPOCHS_MEASURED:]
        before = sum(e.epoch_time_s for e in epochs) / len(epochs) if epochs else None
        record = PlanRecord(decision, self.wall_clock(), self.shape(), self.training.loop.epochs_done, before)
        self._waiting.clear()        # epochs from now on overlap this plan: they measure no earlier one
        self.history.append(record)
        del self.history[:-HISTORY_LIMIT]
        self.current = record
        log.info("cruise: reconfigure %s -> %s (predicted %.3fs -> %.3fs), %d ops", record.shape_before,
                 decision.target.shape if decision.target else None, decision.before_s or 0.0,
                 decision.after_s or 0.0, len(decision.plan.ops))
        return plan_ops(decision.plan)

    def _withdraw(self, why: str) -> None:
        """The controller did not take the proposal: it never ran, and the optimizer may decide again."""
        record, self.current = self.current, None
        if record is not None and record in self.history:
            self.history.remove(record)
        self.optimizer.in_progress = None
        log.info("cruise: plan not started: %s", why)

    def ended(self, change: Change, at: float, step_bytes: Mapping[int, int] = {}) -> None:
        """A PLAN change left the controller's slot (at `at`): its outcome joins the plan's record
        and the optimizer measures the configuration the job really has now."""
        record, self.current = self.current, None
        if record is None:
            return         # a directive's: Cruise kept the configuration, or could not plan
        assert record.decision.plan is not None
        record.run = plan_run(record.decision.plan, change, at, step_bytes, self.block_bytes())
        record.finished = at
        record.shape_after = self.shape()
        record.error = change.error
        if change.error:
            self.failures += 1
            self.last_error = change.error
            log.warning("cruise plan failed: %s", change.error)
        else:
            self.failures = 0
        # Measurements restart on the shape the job really has now, whatever the plan did (the
        # cumulative counters' baselines stay: the next poll differences from them).
        self._batches.clear()
        self.optimizer.reconfigured(*self.configuration())
        self._waiting.append(record)

    def _measure(self, rec: EpochRecord) -> None:
        """Epochs that started after a plan finished are its measured epoch time."""
        started = rec.time - rec.epoch_time_s
        for p in list(self._waiting):
            if p.finished is not None and started >= p.finished:
                p.measured_after.append(rec.epoch_time_s)
                if len(p.measured_after) >= EPOCHS_MEASURED:
                    self._waiting.remove(p)

    def status(self, change: Optional[Change] = None) -> CruiseStatus:
        """The job status's "cruise" section: current shape, state, plan history, decisions;
        `change` is the controller's change in progress (the running plan's, if it is a plan)."""
        running = self.current if change is not None and change.kind is ChangeKind.PLAN else None
        current = (plan_run(running.decision.plan, change, self.wall_clock(), {}, self.block_bytes())
                   if running is not None and running.decision.plan is not None and change is not None else None)
        return CruiseStatus(optimizer="cruise", shape=list(self.shape()), running=running is not None,
                            current_plan=current.record() if current else None, last_error=self.last_error,
                            plan_history=[p.record() for p in self.history],
                            decisions=[d.to_json() for d in self.optimizer.decisions[-20:]],
                            why_not_ready=(f"{self.failures} plans failed in a row: Cruise stopped reconfiguring"
                                           if self.failures >= MAX_PLAN_FAILURES else self.optimizer.why_not_ready()),
                            metrics=self.optimizer.metrics.to_json())


def _delta(now: dict[str, Any], last: dict[str, float], key: str) -> Optional[float]:
    if key not in now:
        return None
    d = float(now[key]) - last.get(key, 0.0)
    return d if d > 0 else None


def job_sizes(spec: PSJobSpec, app: AnyPSApp, input_blocks: int) -> JobSizes:
    """The optimizer's job sizes from the spec and the app: splits, rows per split, model blocks,
    mini-batch size, and a dense pull of the model as the bytes each way per mini-batch until
    workers report what they really exchange."""
    return JobSizes(input_blocks=input_blocks, samples_per_block=float(app.rows_per_block),
                    model_blocks=spec.num_blocks, batch_size=int(app.hparams.batch_size),
                    nominal_bytes_per_batch=float(app.model_nbytes()),
                    max_workers=spec.max_workers, max_servers=spec.max_servers)


def build_cruise_driver(spec: PSJobSpec, app: AnyPSApp, training: Training, holdings: Callable[[], Holdings],
                        split_count: int) -> CruiseDriver:
    """The Cruise driver of a PS job whose spec says optimizer "cruise"; build it once training is
    set up (`split_count`: the input splits the workers generated)."""
    opts = spec.cruise
    optimizer = CruiseOptimizer(job_sizes(spec, app, split_count),
                                CruiseConfig(min_batches=opts.min_batches, min_interval_s=opts.min_interval_s,
                                             gain_threshold=opts.gain_threshold, pool_classes=True))
    driver = CruiseDriver(optimizer, training, holdings, spec.executor_vcores,
                          block_bytes=lambda: app.model_nbytes() / spec.num_blocks)
    training.metrics.batch_listeners.append(driver.on_batches)
    return driver

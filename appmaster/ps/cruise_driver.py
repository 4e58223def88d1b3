"""Runs the Cruise optimizer (appmaster.cruise) inside the PS AM while the job trains.

Inputs: each worker's per-mini-batch compute and communication times (from its run_clock replies,
via JobMetrics' batch listeners), and at every epoch boundary one status round over the job's
executors: workers' cumulative training counters (samples, bytes pulled + pushed), servers'
service counters (requests, busy seconds, bytes served) and the node link rate the cluster
declares. They become the optimizer's moving averages.

Decisions: at an epoch boundary, once the trigger policy allows (every worker has run the
configured number of mini-batches since the last change), the optimizer solves for the current
slots; a plan predicted to gain at least the threshold is executed as a background task
(plan_executor), so training goes on: model moves overlap training, input splits change hands at
the next clock boundary (the AM's BSP iteration), with their place in the running epoch. `on_capacity_change(n)` re-solves for capacity the RM grants or reclaims.

History: every executed plan is kept with its predicted epoch time before / after and the measured
ones (mean of the last epochs before the plan started, and of the first epochs that started after
it finished), per-op timings, and the bytes moved -- the job status's "cruise" section.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from appmaster.cruise.optimizer import CruiseConfig, CruiseOptimizer, Decision, JobSizes
from appmaster.cruise.plan_builder import ExecutorState as CruiseExecutor
from appmaster.cruise.profiling import SlotInfo
from appmaster.cruise.targets import Role
from protocol import executor_ops as ops
from protocol.internal_api import NodePlacement
from protocol.ps_job_spec import PSJobSpec
from protocol.ps_status import CruisePlanRecord, CruiseStatus
from psruntime.apps.base import AnyPSApp

from .directives import Shape
from .executor_pool import ExecutorRecord
from .metrics import EpochRecord
from .plan_executor import AmPlanRuntime, PlanExecutor, PlanFailed, PlanRun, PlanRuntime
from .reconfiguration import ChangeBusy, Reconfiguration

log = logging.getLogger(__name__)

EPOCHS_MEASURED = 2          # epochs averaged for the measured epoch time before / after a plan
HISTORY_LIMIT = 50
MAX_PLAN_FAILURES = 2        # consecutive failed plans after which Cruise stops reconfiguring the job


@dataclass
class PlanRecord:
    """One executed plan, for the job status (`plan_history`)."""

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


class CruiseDriver:
    """Feeds the optimizer, asks for decisions at epoch boundaries, executes plans (module doc).

    `steps` is the job's reconfiguration layer: its split ledger and its one-change-at-a-time
    guard are shared with EPS, so EPS and Cruise never change the job at the same time; a plan
    holds the guard while it runs.
    """

    def __init__(self, optimizer: CruiseOptimizer, steps: Reconfiguration, runtime: PlanRuntime,
                 vcores: int = 1, wall_clock: Callable[[], float] = time.time,
                 on_change: Optional[Callable[[bool], None]] = None) -> None:
        self.optimizer = optimizer
        self.steps = steps
        self.training = steps.training
        self.runtime = runtime
        self.executor = PlanExecutor(runtime)
        self.vcores = vcores
        self.wall_clock = wall_clock
        self.on_change = on_change
        self.history: list[PlanRecord] = []
        self.task: Optional[asyncio.Task[None]] = None
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
        (`feed` False: only move the counters' baselines on, e.g. while a plan runs)."""
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
        ledger = self.steps.splits()
        placement = self.training.placement
        out = [CruiseExecutor(w, Role.WORKER, frozenset(ledger.active_of(w))) for w in sorted(ledger.active)]
        out += [CruiseExecutor(s.executor_id, Role.SERVER, frozenset(placement.blocks_of(s.executor_id)))
                for s in self.training.membership.servers]
        return out, [SlotInfo(e.executor_id, "default", self.vcores) for e in out]

    def shape(self) -> tuple[int, int]:
        return self.training.membership.shape()

    # -- decisions -------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    async def on_epoch(self, rec: EpochRecord) -> Optional[Decision]:
        """Epoch-boundary hook: measure, and maybe start a plan. Returns a decision taken now."""
        self._measure(rec)
        if self.running or self.steps.busy or self.failures >= MAX_PLAN_FAILURES:
            await self._poll(feed=False)      # this epoch's figures describe no one shape
            return None
        await self._poll()
        self.optimizer.set_configuration(*self.configuration())
        decision = self.optimizer.maybe_decide()
        if decision is not None and decision.action == "reconfigure":
            self._start(decision, rec)
        elif decision is not None:
            log.info("cruise: %s (%s)", decision.action, decision.reason)
        return decision

    async def on_capacity_change(self, capacity: int) -> Decision:
        """The RM grants or reclaims containers: re-solve for `capacity` slots and execute."""
        if self.running:
            raise RuntimeError("a Cruise plan is running; capacity changes wait for it")
        self.optimizer.set_configuration(*self.configuration())
        decision = self.optimizer.on_capacity_change(capacity)
        if decision.action == "reconfigure":
            last = self.training.metrics.epochs[-1] if self.training.metrics.epochs else None
            self._start(decision, last)
        return decision

    async def reshape(self, target: Shape, nodes: tuple[str, ...],
                      placement: Sequence[NodePlacement] = ()) -> Decision:
        """An RM shape directive (appmaster.ps.directives.Reshaper): Cruise splits the granted
        containers itself; executors it adds start on `nodes` when the directive names them. A
        per-node `placement` is not followed: Cruise decides the worker / server split, so only
        the placement's node set binds it."""
        self.runtime_nodes(nodes)
        return await self.resize(target.workers, target.servers)

    def runtime_nodes(self, nodes: tuple[str, ...]) -> None:
        if isinstance(self.runtime, AmPlanRuntime):
            self.runtime.nodes = nodes

    async def resize(self, workers: int, servers: int) -> Decision:
        """An RM shape directive (appmaster.ps.directives calls `resize` on ops that have it): the
        policy grants this job `workers + servers` containers; Cruise decides their split, executes
        the plan and returns once it is done. Raises when it could not be carried out."""
        if self.task is not None and not self.task.done():
            await asyncio.gather(self.task, return_exceptions=True)     # one change at a time
        decision = await self.on_capacity_change(workers + servers)
        if decision.action != "reconfigure":
            if decision.reason.startswith("cannot decide"):
                raise RuntimeError(f"Cruise: {decision.reason}")
            return decision
        assert self.task is not None
        await asyncio.gather(self.task, return_exceptions=True)
        if self.history and self.history[-1].decision is decision and self.history[-1].error:
            raise RuntimeError(f"Cruise plan for {workers + servers} containers failed: {self.history[-1].error}")
        return decision

    def _start(self, decision: Decision, rec: Optional[EpochRecord]) -> None:
        epochs = self.training.metrics.epochs[-EPOCHS_MEASURED:]
        before = sum(e.epoch_time_s for e in epochs) / len(epochs) if epochs else None
        record = PlanRecord(decision, self.wall_clock(), self.shape(), self.training.loop.epochs_done, before)
        self._waiting.clear()        # epochs from now on overlap this plan: they measure no earlier one
        self.history.append(record)
        del self.history[:-HISTORY_LIMIT]
        log.info("cruise: reconfigure %s -> %s (predicted %.3fs -> %.3fs), %d ops", record.shape_before,
                 decision.target.shape if decision.target else None, decision.before_s or 0.0,
                 decision.after_s or 0.0, len(decision.plan.ops) if decision.plan else 0)
        self.task = asyncio.ensure_future(self._execute(record))

    async def _execute(self, record: PlanRecord) -> None:
        assert record.decision.plan is not None
        if self.on_change:
            self.on_change(True)
        try:
            async with self.steps.exclusive("cruise plan"):     # EPS calls get ElasticBusy meanwhile
                record.run = await self.executor.execute(record.decision.plan)
            self.failures = 0
        except ChangeBusy as e:
            record.error = f"not started: {e}"
            log.info("cruise plan not started: %s", e)
        except asyncio.CancelledError:
            record.error = "cancelled: the job ended while the plan ran"
            if self.executor.last is not None and self.executor.last.plan is record.decision.plan:
                record.run = self.executor.last
            raise
        except PlanFailed as e:
            self.failures += 1
            record.run, record.error = e.run, e.run.error
            self.last_error = record.error
            log.warning("cruise plan failed: %s", record.error)
        except Exception as e:  # noqa: BLE001 - the job trains on; the record says what happened
            self.failures += 1
            record.error = f"{type(e).__name__}: {e}"
            self.last_error = record.error
            log.exception("cruise plan failed")
        finally:
            record.finished = self.wall_clock()
            record.shape_after = self.shape()
            # Measurements restart on the shape the job really has now, whatever the plan did
            # (the cumulative counters' baselines stay: the next poll differences from them).
            self._batches.clear()
            self.optimizer.reconfigured(*self.configuration())
            self._waiting.append(record)
            if self.on_change:
                self.on_change(False)

    def _measure(self, rec: EpochRecord) -> None:
        """Epochs that started after a plan finished are its measured epoch time."""
        started = rec.time - rec.epoch_time_s
        for p in list(self._waiting):
            if p.finished is not None and started >= p.finished:
                p.measured_after.append(rec.epoch_time_s)
                if len(p.measured_after) >= EPOCHS_MEASURED:
                    self._waiting.remove(p)

    async def close(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    def status(self) -> CruiseStatus:
        """The job status's "cruise" section: current shape, state, plan history, decisions."""
        running = self.executor.current
        return CruiseStatus(optimizer="cruise", shape=list(self.shape()), running=self.running,
                            current_plan=running.record() if running else None, last_error=self.last_error,
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
                    nominal_bytes_per_batch=float(app.model_nbytes()))


def build_cruise_driver(spec: PSJobSpec, app: AnyPSApp, steps: Reconfiguration,
                        on_change: Optional[Callable[[bool], None]] = None) -> CruiseDriver:
    """The Cruise driver of a PS job whose spec says optimizer "cruise"; build it once training is
    set up (the split count comes from the workers)."""
    opts = spec.cruise
    optimizer = CruiseOptimizer(job_sizes(spec, app, steps.split_count()),
                                CruiseConfig(min_batches=opts.min_batches, min_interval_s=opts.min_interval_s,
                                             gain_threshold=opts.gain_threshold, pool_classes=True))
    runtime = AmPlanRuntime(steps, block_bytes=lambda: app.model_nbytes() / spec.num_blocks)
    driver = CruiseDriver(optimizer, steps, runtime, spec.executor_vcores, on_change=on_change)
    steps.training.metrics.batch_listeners.append(driver.on_batches)
    return driver

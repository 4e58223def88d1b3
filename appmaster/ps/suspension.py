"""Pause and resume a PS job (Harmony §4.3.2), as compositions of the reconfiguration layer.

Pause: training stops at the next clock boundary (no push in flight: a consistent cut); every
input block's place in its epoch is collected and the objective at the cut measured; the model
(and the workers' block state for NMF / LDA) is checkpointed to the AM's durable dir; every
executor is retired and its container given back to the RM. The job holds nothing but its AM.

Resume: executors are asked for where the directive places them (per node, exactly that many of
each role; anywhere when it names no node), the blocks are placed afresh, the checkpoint restored
and every input block put back at its place in the epoch, so training continues the same
objective trajectory: nothing is lost or applied twice.

The two halves (`take_cut`, `restart_from`) are also the kill-based baseline's restart
(appmaster.ps.kill_restart), which runs them back to back. The pure part, `SuspendState` and its
`TRANSITIONS`, says which request is allowed when; `JobSuspension` does the I/O on the PS AM.

A *migration* (a running job moved to another group's nodes) is not here: it is a directive whose
placement names other nodes, carried out live by the job's reshaper (EPS relocates executors with
block moves while training runs; better than the paper, which pauses), or by the kill-based
restart for a job that cannot move live.
"""
from __future__ import annotations

import asyncio
import enum
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, TypeVar

import msgspec

from protocol import executor_ops as ops
from protocol.checkpoint_manifest import JobRecord
from protocol.internal_api import NodePlacement, counts_on_nodes
from protocol.records import Resource
from protocol.remote_exception import Conflict
from protocol.state_machine import TransitionTable
from protocol.ps_status import SuspensionCut, SuspensionStatus
from protocol.shape_history import SuspendChange

from .executor_pool import ExecutorRecord, Role
from .reconfiguration import LaunchFailed, Reconfiguration

log = logging.getLogger(__name__)
T = TypeVar("T")

RELEASE_TIMEOUT_S = 60.0        # retired executors' containers reported complete
RESTORE_RTOL = 1e-4             # restored objective vs. the checkpoint's (float32 sums in another order)


# ===== the cut: one consistent stop of training, on disk ========================================

@dataclass(frozen=True)
class Cut:
    """Where training stopped: the checkpoint that holds it and every input block's place."""

    epoch: int
    clock: int                                   # clocks into the epoch (0: at an epoch's end)
    objective: Optional[float]
    checkpoint: dict[str, Any]                   # the checkpointer's manifest (its "dir" holds the model)
    positions: dict[int, tuple[int, int]]        # input block -> (epoch, next row)

    @property
    def mid_epoch(self) -> bool:
        return self.clock > 0


async def take_cut(steps: Reconfiguration, job: JobRecord, reason: str) -> Cut:
    """At a clock boundary (training stopped): collect every input block's place, measure the
    objective there (mid-epoch, the last epoch's is not the model's), and checkpoint -- reusing
    a checkpoint already taken at exactly this point."""
    training = steps.training
    loop, metrics = training.loop, training.metrics
    epoch = loop.epochs_done
    replies = await training.rpc.call_all(training.membership.workers, ops.Positions(), ops.PositionsReply)
    positions = {int(b): (int(e), int(row)) for r in replies for b, (e, row) in r.positions.items()}
    mid_epoch = any(e == epoch and row > 0 for e, row in positions.values())
    clock = loop.clocks_done if mid_epoch else 0
    objective = metrics.objectives[-1] if metrics.objectives else metrics.initial_objective
    if mid_epoch:
        objective = await training.evaluation.objective()
    last = steps.checkpointer.last
    if last is None or (last["epoch"], last.get("clock", 0)) != (epoch, clock):
        last = await steps.checkpoint(epoch, msgspec.structs.replace(job, objective=objective, reason=reason,
                                                                     positions=positions), clock=clock)
    return Cut(epoch, clock, objective, last, positions)


async def start_placed(steps: Reconfiguration, workers: int, servers: int,
                       placement: Sequence[NodePlacement] = (), nodes: Sequence[str] = ()
                       ) -> tuple[list[ExecutorRecord], list[ExecutorRecord]]:
    """New servers and workers: per node exactly as `placement` says, else spread over `nodes`
    (anywhere when empty)."""
    if placement:
        return await asyncio.gather(steps.start_placed(Role.SERVER, counts_on_nodes(placement, Role.SERVER)),
                                    steps.start_placed(Role.WORKER, counts_on_nodes(placement, Role.WORKER)))
    return await asyncio.gather(steps.start_executors(Role.SERVER, servers, nodes),
                                steps.start_executors(Role.WORKER, workers, nodes))


async def restart_from(steps: Reconfiguration, cut: Cut, servers: list[ExecutorRecord],
                       workers: list[ExecutorRecord]) -> float:
    """Set the job up on new executors from `cut` and let training run; returns the restored
    objective (a mismatch with the cut's is logged: float32 sums in another order differ a little)."""
    restored = await steps.restart_on(servers, workers, cut.checkpoint["dir"], cut.positions)
    if cut.objective is not None and not math.isclose(restored, cut.objective, rel_tol=RESTORE_RTOL, abs_tol=1e-9):
        log.warning("restored objective %.9g differs from the checkpoint's %.9g", restored, cut.objective)
    return restored


# ===== pure part ==================================================================================

class SuspendState(str, enum.Enum):
    """Whether the job runs or is paused."""

    RUNNING = "RUNNING"
    PAUSING = "PAUSING"       # asked to pause: training stops at the next clock boundary
    PAUSED = "PAUSED"         # checkpointed, no executors
    RESUMING = "RESUMING"     # executors starting, checkpoint being restored


class SuspendEvent(str, enum.Enum):
    PAUSE = "PAUSE"           # a pause was asked for
    STOPPED = "STOPPED"       # training stopped at the boundary, the cut is on disk, executors gone
    RESUME = "RESUME"         # a resume was asked for
    RESUMED = "RESUMED"       # training runs again
    FAILED = "FAILED"         # a step failed (the job fails with it)


TRANSITIONS: TransitionTable[SuspendState, SuspendEvent, SuspendState] = TransitionTable({
    (SuspendState.RUNNING, SuspendEvent.PAUSE): SuspendState.PAUSING,
    (SuspendState.PAUSING, SuspendEvent.STOPPED): SuspendState.PAUSED,
    # The job converged (or stopped) before reaching the boundary: nothing to pause.
    (SuspendState.PAUSING, SuspendEvent.FAILED): SuspendState.RUNNING,
    (SuspendState.PAUSED, SuspendEvent.RESUME): SuspendState.RESUMING,
    (SuspendState.RESUMING, SuspendEvent.RESUMED): SuspendState.RUNNING,
    (SuspendState.RESUMING, SuspendEvent.FAILED): SuspendState.PAUSED,
}, lambda state, event: Conflict(f"the job is {state.value.lower()}: it cannot take {event.value.lower()} now"))


@dataclass
class SuspendTarget:
    """What a resume brings the job back as."""

    workers: int
    servers: int
    placement: tuple[NodePlacement, ...] = ()
    nodes: tuple[str, ...] = ()
    resource: Optional[Resource] = None      # each new executor's container (None: as before)


# ===== the I/O ====================================================================================

@dataclass
class JobSuspension:
    """Pauses and resumes one PS job (see the module doc). The master's training driver calls
    `hold_if_requested()` whenever training stops at a boundary; `pause()` / `resume()` are what
    the RM's directives (appmaster.ps.directives) call."""

    steps: Reconfiguration
    job_record: Callable[[], JobRecord]
    on_record: Callable[[SuspendChange], None]
    on_state: Callable[[], None] = lambda: None                # the shape report changes
    wall_clock: Callable[[], float] = time.time
    clock: Callable[[], float] = time.perf_counter
    state: SuspendState = SuspendState.RUNNING
    cut: Optional[Cut] = None
    pauses: int = 0
    paused_s: float = 0.0                                      # total time spent paused
    _paused_at: Optional[float] = None
    _stopped: Optional["asyncio.Future[Cut]"] = None
    _resume: Optional["asyncio.Future[SuspendTarget]"] = None
    _resumed: Optional["asyncio.Future[float]"] = None
    _history: list[SuspendChange] = field(default_factory=list)

    @property
    def paused(self) -> bool:
        return self.state is not SuspendState.RUNNING

    def _step(self, event: SuspendEvent) -> None:
        self.state = TRANSITIONS.next(self.state, event)
        self.on_state()

    # -- what directives call --------------------------------------------------------------------
    async def pause(self) -> Cut:
        """Stop training at the next clock boundary, checkpoint, give every executor back; returns
        once paused. Conflict when the job is not running (or finished before the boundary)."""
        self._step(SuspendEvent.PAUSE)
        loop = asyncio.get_running_loop()
        self._stopped = loop.create_future()
        self._resume = loop.create_future()
        log.info("pausing the job at the next clock boundary")
        self.steps.pause()
        return await self._stopped

    async def resume(self, workers: int, servers: int, placement: Sequence[NodePlacement] = (),
                     nodes: Sequence[str] = (), resource: Optional[Resource] = None) -> float:
        """Start `workers` and `servers` executors (per node as `placement` says, else on `nodes`,
        else anywhere; each of `resource` when given, e.g. sized by Harmony to fit its group's
        nodes) and continue from the pause's cut; returns the restored objective once training
        runs again."""
        target = SuspendTarget(workers, servers, tuple(placement), tuple(nodes), resource)
        if self._resume is None or self.state is not SuspendState.PAUSED:
            raise Conflict(f"the job is {self.state.value.lower()}, not paused: nothing to resume")
        self._step(SuspendEvent.RESUME)
        self._resumed = asyncio.get_running_loop().create_future()
        self._resume.set_result(target)
        return await self._resumed

    # -- what the master's training driver calls -----------------------------------------------------
    async def hold_if_requested(self, stopping: Callable[[], bool]) -> bool:
        """Training stopped at a boundary. If a pause asked for it: cut, release, wait for the
        resume, restart -- then return True (train on). False: no pause was asked for (or the job
        converged first, or is stopping): the caller goes on as it would have."""
        if self.state is not SuspendState.PAUSING or self._stopped is None or self._resume is None:
            return False
        stopped, resume = self._stopped, self._resume
        if stopping() or self.steps.training.loop.converged:
            self._step(SuspendEvent.FAILED)
            settle(stopped, Conflict("the job finished training before it could pause"))
            return False
        t0 = self.clock()
        try:
            cut = await take_cut(self.steps, self.job_record(), reason="pause")
            await self.steps.retire_all(RELEASE_TIMEOUT_S)
        except BaseException as e:
            settle(stopped, e if isinstance(e, Exception) else Conflict("the job stopped while pausing"))
            raise
        self.cut = cut
        self.pauses += 1
        self._paused_at = self.clock()
        self._step(SuspendEvent.STOPPED)
        self._record(SuspendChange(op="pause", time=self.wall_clock(), seconds=round(self.clock() - t0, 4), ok=True,
                                   epoch=cut.epoch, clock=cut.clock, checkpoint=cut.checkpoint["dir"],
                                   objective_before=cut.objective))
        settle(stopped, cut)
        log.info("paused at epoch %d clock %d (%s)", cut.epoch, cut.clock, cut.checkpoint["dir"])
        while True:
            target = await resume
            t1 = self.clock()
            assert self._resumed is not None
            if target.resource is not None:
                self.steps.resource = target.resource      # every executor of the job is new: one size again
            try:
                servers, workers = await start_placed(self.steps, target.workers, target.servers,
                                                      target.placement, target.nodes)
                restored = await restart_from(self.steps, cut, servers, workers)
                break
            except LaunchFailed as e:
                # No containers where the directive placed the job (yet): it holds nothing, so it
                # stays paused on its cut and a later resume tries again -- failing the job here
                # would throw its progress away for a placement it could not get.
                await self.steps.retire_all(RELEASE_TIMEOUT_S)
                self._step(SuspendEvent.FAILED)
                resume = self._resume = asyncio.get_running_loop().create_future()
                settle(self._resumed, e)
                log.warning("resume failed, the job stays paused: %s", e)
            except BaseException as e:
                settle(self._resumed, e if isinstance(e, Exception) else Conflict("the job stopped while resuming"))
                raise        # the job has no executors: it fails with this error
        if self._paused_at is not None:
            self.paused_s += t1 - self._paused_at
        self._step(SuspendEvent.RESUMED)
        self._record(SuspendChange(op="resume", time=self.wall_clock(), seconds=round(self.clock() - t1, 4), ok=True,
                                   epoch=cut.epoch, clock=cut.clock, objective_before=cut.objective,
                                   objective_restored=restored, workers=target.workers, servers=target.servers,
                                   nodes=sorted({p.node for p in target.placement} or set(target.nodes))))
        settle(self._resumed, restored)
        log.info("resumed with %d workers, %d servers: objective %.6g", target.workers, target.servers, restored)
        return True

    def _record(self, rec: SuspendChange) -> None:
        self._history.append(rec)
        self.on_record(rec)

    def status(self) -> SuspensionStatus:
        """The job status's "suspension" section."""
        cut = None if self.cut is None else SuspensionCut(epoch=self.cut.epoch, clock=self.cut.clock,
                                                          checkpoint=str(self.cut.checkpoint["dir"]))
        return SuspensionStatus(state=self.state.value, pauses=self.pauses, paused_s=round(self.paused_s, 3),
                                cut=cut, history=list(self._history))


def settle(fut: "asyncio.Future[T]", outcome: "T | BaseException") -> None:
    """Resolve a waiter's future with a result or an exception, unless it is already resolved
    (the change it waits on may end by more than one path). Shared with kill_restart."""
    if fut.done():
        return
    if isinstance(outcome, BaseException):
        fut.set_exception(outcome)
    else:
        fut.set_result(outcome)


__all__ = ["Cut", "JobSuspension", "SuspendEvent", "SuspendState", "SuspendTarget", "TRANSITIONS",
           "restart_from", "settle", "start_placed", "take_cut"]

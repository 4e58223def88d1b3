"""A PS job's training loop: BSP or SSP clocks of mini-batches, epoch by epoch, paced by the AM.

Training runs in clocks (BSP iterations): in each clock every worker runs its next `clock_batches`
mini-batches of the epoch (appmaster.ps.clock_pacing; the worker keeps its place in each block
across clocks), flushes, and the AM waits for all of them (the barrier). An epoch ends when every
input block had its pass; then the objective is gathered with no push in flight, so it is exact.
SSP lets each worker start clock c while the slowest has finished at least c-s clocks; a worker's
part of the objective of epoch e is taken when it finished its pass of e, and the epoch's objective
once every worker has (approximate: faster workers may be ahead). Stops at the app's convergence
rule (which includes max_epochs), at an epoch's end on early stopping (`stop_early`, decided on the
held-out metric by the AM), or at a clock boundary when asked to (`stop`).

Elastic changes hook into the BSP loop through its `boundaries` (appmaster.ps.boundary_scheduler);
a step that waits for the clock boundary ends the running clock early (EndClock to its workers:
each stops after its mini-batch in progress -- before it, if it was still pulling -- and flushes,
and the clock's replies count what ran),
so a switch-over waits about one mini-batch instead of the rest of a clock; the epoch goes on
from where the workers stopped, in the next clock.
`iterations` counts mini-batch rounds (per clock, the most any worker ran) and `on_clock` is called
after every clock, so progress reports (early feedback) move per clock. Under BSP the objective is
also sampled every few clocks (appmaster.ps.clock_objectives: the exact objective, evaluated at a
clock boundary while no elastic step is in flight, paced to a share of the training time) and at
every epoch's end, into `metrics.clock_objectives` (JobReport.clock_objectives, for Optimus's
per-clock fits); a sample that fails (a worker lost meanwhile) is skipped, and the next clock meets
the loss as it would have. With the spec's
`audit_updates`, every mini-batch also pushes +1 to AUDIT_KEY and at every BSP epoch's end the
servers' count must equal the workers' (the exactly-once audit).

A lost worker (BSP): every clock's run_clock calls are gathered with their failures, so the other
workers finish the clock; if no failed worker answered (each is gone, not refusing), then
`replace_lost_workers` (appmaster.ps.recovery) may put a replacement in each lost worker's place,
holding its splits at the positions they had when the clock began (`positions`: each input
block's [epoch, next_row] as the workers last reported it), and the replacements alone run the
clock again; the servers drop the pushes the lost worker had made already (psruntime.store.push_ids),
so no update is lost or applied twice and the epoch goes on.
Without a replacement the survivors' part of the clock is counted and the failure is raised.

A clock waits on nothing forever. A worker's reply wait ends with ExecutorLost as soon as the
pool learns the worker is gone (its container's completion, as the RM reports it: the address
is marked lost and the request fails, appmaster.ps.runtime.executor_pool); a server lost while the clock
runs ends the whole clock with ExecutorLost for that server (the workers may be blocked pulling
from it; the master then goes back to the latest checkpoint and replaces every executor, which
tears the blocked workers down). A host that vanishes without a word is reported by the RM within
its NM expiry, and the data plane's keepalive drops its connections within about 30 s besides.
Last, a backstop for a worker that is alive but stopped answering: a reply later than the
`reply_deadline` (default: 10 times the slowest clock seen, at least 300 s, so a healthy slow clock
never meets it; timed by `deadline_sleep`, injectable) gives the worker up as lost
(`ExecutorPool.declare_lost`) and calls `on_unresponsive` (the master stops its container, so its
loss is reported and recovered from like any other).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from typing import Annotated, Any, Awaitable, Callable, Optional, Sequence, Union

import msgspec
import numpy as np

from protocol import executor_ops as ops
from protocol.ps_job_spec import PSJobSpec
from psruntime.apps.base import AnyPSApp, ObjectivePart
from psruntime.apps.random_streams import block_row_range
from psruntime.wire.dataplane import DataPlaneClient, PeerLost
from psruntime.store.store_client import StoreClient

from .boundary_scheduler import BoundaryScheduler
from .clock_objectives import epoch_fraction
from .clock_pacing import ClockPacer
from .evaluation import Evaluation
from .runtime.executor_pool import ExecutorRecord
from .runtime.executor_rpc import Answered, ExecutorCallError, ExecutorLost, ExecutorRpc
from .membership import Membership
from .metrics import EpochRecord, JobMetrics
from .model_placement import ModelPlacement

log = logging.getLogger(__name__)

EpochHook = Callable[[EpochRecord], Awaitable[None]]
# Workers whose run_clock failed -> their replacements, in the same order (None: not replaced).
WorkerLossHook = Callable[[list[ExecutorRecord]], Awaitable[Optional[list[ExecutorRecord]]]]
Position = tuple[int, int]      # an input block's (epoch, next_row)
DeadlineSleep = Callable[[float], Awaitable[None]]      # sleeps that many seconds (tests: a manual clock)
Unresponsive = Callable[[ExecutorRecord, str], None]    # a worker given up on, and why
ClockAnswer = Answered[ops.RunClockReply]               # a clock's figures, per-mini-batch times as arrays

AUDIT_KEY = "eps:minibatches"   # with spec.audit_updates: +1 per mini-batch, counted by the servers


class ReplyDeadline(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How long the AM waits for a worker's run_clock reply before it gives the worker up as lost:
    the longer of `floor_s` and `factor` times the slowest clock seen so far (module doc). Only a
    worker that is alive but stopped answering meets it; a gone one is reported long before."""

    floor_s: Annotated[float, msgspec.Meta(gt=0)] = 300.0
    factor: Annotated[float, msgspec.Meta(ge=1)] = 10.0

    def seconds(self, slowest_clock_s: float) -> float:
        return max(self.floor_s, self.factor * slowest_clock_s)


DEFAULT_REPLY_DEADLINE = ReplyDeadline()


class ClockLoop:
    """Epochs of BSP / SSP clocks over the job's members (see the module doc)."""

    def __init__(self, spec: PSJobSpec, app: AnyPSApp, rpc: ExecutorRpc, client: DataPlaneClient,
                 membership: Membership, placement: ModelPlacement, evaluation: Evaluation, metrics: JobMetrics,
                 wall_clock: Callable[[], float] = time.time, on_clock: Optional[Callable[[], None]] = None,
                 reply_deadline: ReplyDeadline = DEFAULT_REPLY_DEADLINE,
                 deadline_sleep: DeadlineSleep = asyncio.sleep) -> None:
        self.spec = spec
        self.app = app
        self.rpc = rpc
        self.client = client
        self.membership = membership
        self.placement = placement
        self.evaluation = evaluation
        self.metrics = metrics
        self.wall_clock = wall_clock
        self.on_clock = on_clock                    # called after every BSP clock (progress reports)
        self.epochs_done = 0
        self.converged = False
        self.early_stop: Optional[str] = None       # why training ended on held-out quality, if it did
        self.iterations = 0                         # mini-batch rounds: per clock, the most any worker ran
        self.clocks_done = 0                        # BSP clocks (iterations) run
        self.pacer = ClockPacer(spec.clock_batches)
        # spec.audit_updates: the servers' count of applied mini-batches and the workers' count of
        # mini-batches run; under BSP both are compared at every epoch's end (nothing in flight).
        self.minibatches_applied: Optional[int] = None
        self.minibatches_run = 0
        self.audit_mismatches: list[dict[str, int]] = []
        self.positions: dict[int, Position] = {}    # input block -> where its last clock left it
        self.replace_lost_workers: Optional[WorkerLossHook] = None
        self.reply_deadline = reply_deadline
        self.deadline_sleep = deadline_sleep
        self.on_unresponsive: Optional[Unresponsive] = None    # the master stops the worker's container
        self.slowest_clock_s = 0.0                  # the longest clock a worker reported (its deadline)
        # Rows of each input block (the epoch fraction of a clock objective is counted in rows).
        self.block_rows = [hi - lo for lo, hi in (block_row_range(app.num_rows, app.rows_per_block, b)
                                                  for b in range(app.num_blocks))]
        self._stop = False
        self._looping = False
        self.boundaries = BoundaryScheduler(self._why_closed)
        self.boundaries.on_wanted = self._cut_clock
        self._in_clock: list[ExecutorRecord] = []     # the workers of the clock in flight (BSP)
        self._cuts: set[asyncio.Task[None]] = set()   # EndClock calls on their way

    @property
    def stopping(self) -> bool:
        return self._stop

    def _why_closed(self) -> Optional[str]:
        if self.spec.sync != "bsp":
            return "elastic changes need BSP training (this job runs SSP)"
        if not self._looping or self.converged or self._stop:
            return "training is not running"
        return None

    def stop(self) -> None:
        """Stop at the next clock boundary (the job is being shut down, paused or restarted)."""
        self._stop = True

    def resume(self) -> None:
        """Allow `train` to run again after a stop (a restarted job continues its epochs)."""
        self._stop = False

    def continue_from(self, epochs_done: int, iterations: int, clocks_done: int,
                      minibatches_run: Optional[int] = None) -> None:
        """A job resumed from a checkpoint continues its epoch count and progress counters (and the
        audit's count of mini-batches run, which the checkpoint's model matches)."""
        self.epochs_done, self.iterations, self.clocks_done = epochs_done, iterations, clocks_done
        self.metrics.clock_objectives.go_back(iterations)
        if minibatches_run is not None:
            self.minibatches_run = minibatches_run

    def reset_positions(self, positions: Optional[dict[int, Position]] = None) -> None:
        """The input blocks start from `positions` (none: from the start of the epoch), e.g. after
        a restart from a checkpoint."""
        self.positions = dict(positions or {})

    def clock_start_positions(self, blocks: Sequence[int]) -> dict[int, Position]:
        """Where `blocks` stood when the running clock began (between clocks: where the next one
        begins). A block not reported yet has not trained in this run: (0, 0), which a clock of
        any epoch reads as "from the first row"."""
        return {b: self.positions.get(b, (0, 0)) for b in blocks}

    def recheck_convergence(self) -> None:
        self.converged = self.early_stop is not None or self.app.is_converged(self.metrics.objectives)

    def stop_early(self, reason: str) -> None:
        """End training after the current epoch because of held-out quality (early stopping): the
        job is done, as if converged (a pending restart does not resume it)."""
        self.early_stop = reason
        self.converged = True

    async def train(self, on_epoch: EpochHook) -> None:
        """Train until converged or stopped."""
        if self.spec.sync == "ssp":
            await self._train_ssp(on_epoch)
        else:
            await self._train_bsp(on_epoch)

    def _finish_epoch(self, epoch: int, objective: float, seconds: float, evaluation_s: float = 0.0) -> EpochRecord:
        rec = EpochRecord(epoch=epoch, objective=objective, epoch_time_s=seconds, time=self.wall_clock(),
                          evaluation_s=evaluation_s)
        self.metrics.record_epoch(rec)
        if self.spec.sync == "bsp":     # an SSP epoch's objective is approximate, and counts no iterations
            self.metrics.clock_objectives.record(self.iterations, float(epoch + 1), objective)
        self.epochs_done = epoch + 1
        self.recheck_convergence()
        log.info("epoch %d objective %.6g (%.3fs)%s", epoch, objective, seconds,
                 " converged" if self.converged else "")
        return rec

    def _clock_request(self, num_workers: int, epoch: int, clock: int = -1) -> ops.RunClock:
        """`clock` (BSP): the clocks counted as this one begins, under which the workers' push
        logs keep its pushes (psruntime.push_log); SSP's unaligned clocks keep none."""
        return ops.RunClock(epoch=epoch, batches=self.pacer.batches, num_workers=num_workers,
                            count_key=AUDIT_KEY if self.spec.audit_updates else None, clock=clock)

    def _record_batches(self, rec: ExecutorRecord, arrays: list[np.ndarray], reply: ops.RunClockReply) -> None:
        # compute, comm, then (executors that count them) the parts of each waited for a grant;
        # the bytes the step's pulls and pushes carried come in the reply
        if len(arrays) == 2:
            self.metrics.record_batches(rec.executor_id, arrays[0], arrays[1], bytes_moved=reply.bytes_moved)
        elif len(arrays) == 4:
            self.metrics.record_batches(rec.executor_id, arrays[0], arrays[1], arrays[2], arrays[3],
                                        bytes_moved=reply.bytes_moved)

    # -- BSP ----------------------------------------------------------------------------------
    async def _train_bsp(self, on_epoch: EpochHook) -> None:
        self._looping = True
        try:
            while not (self.converged or self._stop):
                epoch = self.epochs_done
                t0 = time.perf_counter()
                eval0 = self.metrics.clock_objectives.eval_s
                self.boundaries.begin_epoch()
                try:
                    finished = await self._run_clocks(epoch)
                except BaseException:
                    await self.boundaries.abort_epoch()
                    raise
                # Barrier: transmissions overlapping this epoch end before its objective (and before
                # a checkpoint, even when training stops mid-epoch).
                await self.boundaries.end_epoch()
                if not finished:
                    return          # stopped at a clock boundary, in the middle of the epoch
                seconds = time.perf_counter() - t0
                # The epoch's mid-epoch objective samples (inside `seconds`): reported apart, so
                # its training time alone can be told.
                sampled = max(0.0, self.metrics.clock_objectives.eval_s - eval0)
                if self.spec.audit_updates:
                    await self._check_audit(epoch)
                await on_epoch(self._finish_epoch(epoch, await self.evaluation.objective(), seconds, sampled))
        finally:
            self._looping = False
            self.boundaries.close()

    async def _run_clocks(self, epoch: int) -> bool:
        """The clocks of `epoch` until every worker's blocks had their pass; False if stopped at a
        clock boundary first. Boundary steps run before each clock, while no worker trains."""
        while True:
            await self.boundaries.run_boundary()
            if self._stop:
                return False
            workers = self.membership.workers
            request = self._clock_request(len(workers), epoch, self.clocks_done if self.spec.push_log else -1)
            t0 = time.perf_counter()
            results = await self._clock_calls(workers, request)
            ran = [(w, r) for w, r in zip(workers, results) if isinstance(r, Answered)]
            if len(ran) < len(workers):
                ran += await self._redo_lost(request, [(w, r) for w, r in zip(workers, results)
                                                       if not isinstance(r, Answered)], ran)
            replies = [a.reply for _, a in ran]
            self._end_clock([w for w, _ in ran], [a.arrays for _, a in ran], replies)
            # The clock's time as training lost it (barrier and round trips included): what the
            # samples' evaluation budget is a share of.
            self.metrics.clock_objectives.trained(time.perf_counter() - t0)
            if all(r.epoch_done for r in replies):
                return True
            await self._sample_objective(epoch)

    async def _sample_objective(self, epoch: int) -> None:
        """At a clock boundary in `epoch`: the exact objective, if a sample is due (module doc)."""
        samples = self.metrics.clock_objectives
        if self._stop or not self.boundaries.quiet:
            return
        epochs = epoch + epoch_fraction(self.positions, epoch, self.block_rows)
        if not samples.due(epochs):
            return
        t0 = time.perf_counter()
        try:
            objective = await self.evaluation.objective()
        except Exception as e:  # noqa: BLE001 - a sample is optional; the next clock handles a loss
            log.info("objective sample at %.3f epochs skipped: %s", epochs, e)
            return
        samples.record(self.iterations, epochs, objective, time.perf_counter() - t0)

    async def _redo_lost(self, request: ops.RunClock, failed: list[tuple[ExecutorRecord, BaseException]],
                         ran: list[tuple[ExecutorRecord, ClockAnswer]]) -> list[tuple[ExecutorRecord, ClockAnswer]]:
        """Workers whose clock failed: their replacements run it again, alone (see the module doc);
        without replacements, the survivors' clock is counted and the first failure raised."""
        errors = [e for _, e in failed]
        replacements = None
        if self.replace_lost_workers is not None and all(isinstance(e, ExecutorCallError) and not e.answered
                                                         for e in errors):
            replacements = await self.replace_lost_workers([w for w, _ in failed])
        if replacements is None:
            self._end_clock([w for w, _ in ran], [a.arrays for _, a in ran], [a.reply for _, a in ran])
            raise errors[0]
        log.info("clock %d runs again on %s (replacing %s)", self.clocks_done,
                 ", ".join(w.executor_id for w in replacements), ", ".join(w.executor_id for w, _ in failed))
        results = await self._clock_calls(replacements, request)
        lost = [r for r in results if not isinstance(r, Answered)]
        if lost:
            # As without replacements: what ran (the survivors, the replacements that answered)
            # was pushed and applied, so it is counted before the failure goes up. Uncounted, the
            # clock was issued again and the survivors' push logs dropped its applied pushes.
            done = ran + [(w, r) for w, r in zip(replacements, results) if isinstance(r, Answered)]
            self._end_clock([w for w, _ in done], [a.arrays for _, a in done], [a.reply for _, a in done])
            raise lost[0]
        return list(zip(replacements, [r for r in results if isinstance(r, Answered)]))

    async def _clock_calls(self, workers: Sequence[ExecutorRecord],
                           request: ops.RunClock) -> list[Union[ClockAnswer, BaseException]]:
        """`request` on every one of `workers`: each one's reply or failure, in their order. Ends
        when every worker answered, failed or was lost, or passed the reply deadline (then it is
        given up as lost); ExecutorLost for a server of the job lost meanwhile (module doc)."""
        calls = [asyncio.ensure_future(self.rpc.exchange(w, request, ops.RunClockReply)) for w in workers]
        self._in_clock = list(workers)
        server_lost = self.membership.pool.watch_losses(self.membership.servers)
        deadline_s = self.reply_deadline.seconds(self.slowest_clock_s)
        deadline = asyncio.ensure_future(self.deadline_sleep(deadline_s))
        given_up: dict[int, BaseException] = {}
        try:
            watched: set[asyncio.Future[Any]] = {server_lost, deadline}
            while not all(c.done() for c in calls):
                await asyncio.wait({*watched, *(c for c in calls if not c.done())},
                                   return_when=asyncio.FIRST_COMPLETED)
                if server_lost.done():
                    server = server_lost.result()
                    reason = self.membership.pool.lost.get(server.executor_id, "lost")
                    raise ExecutorLost(server, "run_clock", PeerLost(server.address, reason))
                if deadline.done() and deadline in watched:
                    watched.discard(deadline)
                    why = f"no run_clock reply within {deadline_s:g}s"
                    for i, (w, c) in enumerate(zip(workers, calls)):
                        if not c.done():
                            given_up[i] = ExecutorLost(w, "run_clock", PeerLost(w.address, why))
                            c.cancel()
                            self._give_up(w, why)
        finally:
            self._in_clock = []
            server_lost.cancel()
            deadline.cancel()
            for c in calls:
                if c.done() and not c.cancelled():
                    c.exception()       # read: after a server's loss nobody else looks at it
                c.cancel()
        return [given_up[i] if i in given_up else (c.exception() or c.result()) for i, c in enumerate(calls)]

    def _cut_clock(self) -> None:
        """A step waits for the clock boundary: the running clock's workers end it after their
        mini-batch in progress (module doc). Best effort: a worker that misses it (lost, or its
        clock already over) ends the clock as planned."""
        workers, self._in_clock = self._in_clock, []       # once per clock
        for w in workers:
            t = asyncio.ensure_future(self.rpc.send(w, ops.EndClock()))
            self._cuts.add(t)
            t.add_done_callback(self._cut_sent)

    def _cut_sent(self, t: "asyncio.Task[None]") -> None:
        self._cuts.discard(t)
        if not t.cancelled() and t.exception() is not None:
            log.debug("end_clock not delivered: %s", t.exception())

    def _give_up(self, worker: ExecutorRecord, why: str) -> None:
        log.warning("%s: giving %s (%s) up as lost", why, worker.executor_id, worker.container_id)
        self.membership.pool.declare_lost(worker, why)
        if self.on_unresponsive is not None:
            self.on_unresponsive(worker, why)

    def _end_clock(self, workers: list[ExecutorRecord], times: list[list[np.ndarray]],
                   replies: list[ops.RunClockReply]) -> None:
        for w, t, r in zip(workers, times, replies):
            self._record_batches(w, t, r)
            self.positions.update((int(b), (p[0], p[1])) for b, p in r.positions.items())
        slowest = max(replies, key=lambda r: r.seconds, default=None)
        if slowest is not None:
            self.pacer.observe(slowest.batches, slowest.seconds)
            self.slowest_clock_s = max(self.slowest_clock_s, slowest.seconds)
        self.iterations += max((r.batches for r in replies), default=0)
        self.minibatches_run += sum(r.batches for r in replies)
        self.clocks_done += 1
        if self.on_clock is not None:
            self.on_clock()

    async def _check_audit(self, epoch: int) -> None:
        """Exactly-once audit at an epoch's end: every mini-batch run was applied once."""
        got = await StoreClient(self.placement.table, self.client).pull([AUDIT_KEY])
        self.minibatches_applied = int(got[AUDIT_KEY][0]) if AUDIT_KEY in got else 0
        if self.minibatches_applied != self.minibatches_run:
            log.error("audit: after epoch %d the servers applied %d mini-batches, the workers ran %d",
                      epoch, self.minibatches_applied, self.minibatches_run)
            self.audit_mismatches.append({"epoch": epoch, "applied": self.minibatches_applied,
                                          "run": self.minibatches_run})

    # -- SSP ----------------------------------------------------------------------------------
    async def _train_ssp(self, on_epoch: EpochHook) -> None:
        workers = self.membership.workers
        staleness = self.spec.ssp_staleness
        clocks = {w.executor_id: 0 for w in workers}       # clocks each worker finished (this run)
        parts: dict[int, dict[str, ObjectivePart]] = defaultdict(dict)
        started: dict[int, float] = {}
        changed = asyncio.Condition()
        finished_epochs: asyncio.Queue[int] = asyncio.Queue()

        def may_start(clock: int) -> bool:
            return self.converged or self._stop or clock - min(clocks.values()) <= staleness

        async def run(w: ExecutorRecord) -> None:
            epoch, clock = self.epochs_done, 0
            while True:
                async with changed:
                    await changed.wait_for(lambda: may_start(clock))
                if self.converged or self._stop:
                    return
                started.setdefault(epoch, time.perf_counter())
                [f] = await self._clock_calls([w], self._clock_request(len(workers), epoch))
                if not isinstance(f, Answered):
                    raise f
                r = f.reply
                self._record_batches(w, f.arrays, r)
                self.pacer.observe(r.batches, r.seconds)
                self.slowest_clock_s = max(self.slowest_clock_s, r.seconds)
                if r.epoch_done:
                    # This worker's part of the epoch objective (approximate: others may be ahead).
                    parts[epoch][w.executor_id] = await self.evaluation.worker_part(w)
                    if len(parts[epoch]) == len(workers):
                        finished_epochs.put_nowait(epoch)
                    epoch += 1
                clock += 1
                async with changed:
                    clocks[w.executor_id] = clock
                    changed.notify_all()

        async def collect() -> None:
            while not (self.converged or self._stop):
                epoch = await finished_epochs.get()
                if epoch < 0:
                    break           # every runner returned (stopped): no epoch finishes any more
                seconds = time.perf_counter() - started[epoch]
                objective = float(self.app.combine(list(parts.pop(epoch).values()),
                                                   await self.evaluation.server_parts()))
                await on_epoch(self._finish_epoch(epoch, objective, seconds))
            async with changed:
                changed.notify_all()

        def runner_done(_: object) -> None:
            if all(t.done() for t in runners):
                finished_epochs.put_nowait(-1)

        runners = [asyncio.create_task(run(w)) for w in workers]
        for t in runners:
            t.add_done_callback(runner_done)
        collector = asyncio.create_task(collect())
        try:
            # A runner that fails (its worker lost, or a server: ExecutorLost) ends the training
            # at once; the others and the collector are cancelled below.
            await asyncio.wait([collector, *runners], return_when=asyncio.FIRST_EXCEPTION)
            for t in [*runners, collector]:
                err = t.exception() if t.done() and not t.cancelled() else None
                if err is not None:
                    raise err
            await collector
            await asyncio.gather(*runners)
        finally:
            for t in [*runners, collector]:
                t.cancel()

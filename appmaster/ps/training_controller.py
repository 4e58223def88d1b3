"""Drives a PS job's training over the executors' control ops (psruntime.app_role).

Setup: the ownership table spreads the model blocks round-robin over the servers and is broadcast
to every executor; each executor binds the app, worker i of W generates input partition i of W,
worker-0 puts the initial model, every worker initialises its blocks, and the untrained objective
is measured. Training runs in clocks (BSP iterations): in each clock every worker runs its next
`clock_batches` mini-batches of the epoch (appmaster.ps.clock_pacing; the worker keeps its place in
each block across clocks), flushes, and the AM waits for all of them (the barrier). An epoch ends
when every input block had its pass; then the AM gathers the objective (workers' parts over their
data, servers' parts over their keys) with no push in flight, so it is exact. SSP lets each worker
start clock c while the slowest has finished at least c-s clocks; a worker's part of the objective
of epoch e is taken when it finished its pass of e, and the epoch's objective once every worker
has (approximate: faster workers may be ahead). Stops at the app's convergence rule or max_epochs,
or at a clock boundary when asked to (`stop`).

Elastic changes (appmaster.ps.elastic_ops) hook into the BSP loop at two points: `overlap_epoch(fn)`
runs fn alongside the running (or next) epoch's clocks and makes that epoch's end wait for it --
EPS's transmissions overlap training, and the barrier keeps them from overlapping the objective or a
checkpoint; `at_boundary(fn)` runs fn at the next clock boundary, while no worker trains (the
switch-over: input splits change hands with their place in the epoch, so every block is still
trained once per epoch). `workers` and `servers` are the executors in the job's barrier (EPS's
clock and worker / server lists): an executor that has announced itself is not part of training
until a change adds it. `iterations` counts mini-batch rounds (per clock, the most any worker ran)
and `on_clock` is called after every clock, so progress reports (early feedback) move per clock.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from typing import Any, Awaitable, Callable, Optional

import numpy as np

from protocol.ps_job_spec import PSJobSpec
from psruntime.apps.base import ObjectivePart, PSApp
from psruntime.dataplane import DataPlaneClient
from psruntime.frame_codec import Frame
from psruntime.migration_controller import MigrationController
from psruntime.ownership_table import OwnershipTable
from psruntime.store_client import StoreClient

from .clock_pacing import ClockPacer
from .executor_pool import ExecutorPool, ExecutorRecord, ExecutorState, Role
from .metrics import EpochRecord, JobMetrics

log = logging.getLogger(__name__)

EpochHook = Callable[[EpochRecord], Awaitable[None]]
Step = Callable[[], Awaitable[Any]]


AUDIT_KEY = "eps:minibatches"   # with spec.audit_updates: +1 per mini-batch, counted by the servers


class TrainingNotRunning(RuntimeError):
    """An elastic step offered while no BSP training loop runs (not started, ended, or SSP)."""


class ExecutorCallError(RuntimeError):
    """A control op on an executor failed (it died, or answered with an error)."""

    def __init__(self, executor: ExecutorRecord, op: str, cause: BaseException) -> None:
        super().__init__(f"{op} on {executor.executor_id} ({executor.role.value}, {executor.container_id}) "
                         f"failed: {cause}")
        self.executor = executor
        self.op = op


class TrainingController:
    """Setup, epochs, objective, status polling and final model of one PS job."""

    def __init__(self, spec: PSJobSpec, app: PSApp, pool: ExecutorPool, metrics: JobMetrics,
                 client: DataPlaneClient, wall_clock: Callable[[], float] = time.time,
                 on_clock: Optional[Callable[[], None]] = None) -> None:
        self.spec = spec
        self.app = app
        self.pool = pool
        self.metrics = metrics
        self.client = client
        self.wall_clock = wall_clock
        self.controller: Optional[MigrationController] = None
        self.epochs_done = 0
        self.converged = False
        self._stop = False
        # In the BSP barrier / serving model blocks; until set (setup, elastic changes): the READY ones.
        self._workers: Optional[list[ExecutorRecord]] = None
        self._servers: Optional[list[ExecutorRecord]] = None
        self.iterations = 0                         # mini-batch rounds: per clock, the most any worker ran
        # spec.audit_updates: the servers' count of applied mini-batches and the workers' count of
        # mini-batches run; under BSP both are compared at every epoch's end (nothing in flight).
        self.minibatches_applied: Optional[int] = None
        self.minibatches_run = 0
        self.audit_mismatches: list[dict[str, int]] = []
        self._looping = False
        self._in_epoch: Optional[list[asyncio.Task[Any]]] = None     # steps overlapping the running epoch
        self._workers_done_at: Optional[float] = None                # when the running epoch's workers finished
        self._next_epoch: list[tuple[Step, asyncio.Future[tuple[Any, float]]]] = []
        self._boundary: list[tuple[Step, asyncio.Future[tuple[Any, float]]]] = []
        self.pacer = ClockPacer(getattr(spec, "clock_batches", 0))
        self.clocks_done = 0                        # BSP clocks (iterations) run by this controller
        self.on_clock = on_clock                    # called after every BSP clock (progress reports)

    @property
    def workers(self) -> list[ExecutorRecord]:
        """The workers in the BSP barrier (EPS's clock list), in partition order."""
        return list(self._workers) if self._workers is not None else self._ready(Role.WORKER)

    @workers.setter
    def workers(self, recs: list[ExecutorRecord]) -> None:
        self._workers = list(recs)

    @property
    def servers(self) -> list[ExecutorRecord]:
        """The servers that serve (or are about to serve) model blocks."""
        return list(self._servers) if self._servers is not None else self._ready(Role.SERVER)

    @servers.setter
    def servers(self, recs: list[ExecutorRecord]) -> None:
        self._servers = list(recs)

    @property
    def table(self) -> OwnershipTable:
        if self.controller is None:
            raise RuntimeError("the ownership table is set up by setup()")
        return self.controller.table

    # -- calls -------------------------------------------------------------------------------
    async def call(self, rec: ExecutorRecord, header: dict[str, Any]) -> Frame:
        try:
            return await self.client.request(rec.address, header)
        except Exception as e:  # noqa: BLE001 - any failure is that executor's, named as such
            raise ExecutorCallError(rec, str(header.get("op")), e) from e

    async def call_all(self, recs: list[ExecutorRecord], header: dict[str, Any]) -> list[Frame]:
        return list(await asyncio.gather(*(self.call(r, header) for r in recs)))

    def _ready(self, role: Role) -> list[ExecutorRecord]:
        recs = self.pool.of_role(role, ExecutorState.READY)
        return sorted(recs, key=lambda e: int(e.executor_id.rsplit("-", 1)[1]))

    # -- setup -------------------------------------------------------------------------------
    def app_setup_request(self) -> dict[str, Any]:
        """The `app_setup` op that binds an executor to this job's app, data spec and hparams."""
        return {"op": "app_setup", "app": self.spec.app, "data": self.spec.app_data(),
                "hparams": self.spec.app_hparams()}

    async def place_model(self, servers: list[ExecutorRecord], workers: list[ExecutorRecord]) -> None:
        """Make `servers` and `workers` the job's executors: the blocks round-robin over the servers
        (broadcast to everyone), and every executor bound to the app."""
        self.servers, self.workers = list(servers), list(workers)
        everyone = servers + workers
        table = OwnershipTable.round_robin(self.spec.num_blocks, [s.executor_id for s in servers],
                                           {e.executor_id: e.address for e in everyone})
        self.controller = MigrationController(table, self.client)
        await self.controller.broadcast()
        for s in servers:
            s.blocks = table.blocks_owned_by(s.executor_id)
        await self.call_all(everyone, self.app_setup_request())

    async def setup_worker(self, worker: ExecutorRecord, partition: int, num_partitions: int) -> None:
        """Have `worker` generate (or load) input partition `partition` of `num_partitions`."""
        r = await self.call(worker, {"op": "worker_setup", "partition": partition, "num_partitions": num_partitions})
        worker.partition = partition
        worker.data_bytes = int(r.header["data_bytes"])
        worker.blocks = list(r.header["blocks"])

    async def setup(self) -> float:
        """Place the model, bind the app, generate and initialise data; returns the initial objective."""
        servers, workers = self._ready(Role.SERVER), self._ready(Role.WORKER)
        await self.place_model(servers, workers)
        await asyncio.gather(*(self.setup_worker(w, i, len(workers)) for i, w in enumerate(workers)))
        await self.call(workers[0], {"op": "init_model"})
        await self.call_all(workers, {"op": "init_blocks"})
        initial = await self.objective()
        self.metrics.initial_objective = initial
        await self.refresh_status()
        log.info("set up %d servers, %d workers, %d blocks; initial objective %.6g",
                 len(servers), len(workers), self.spec.num_blocks, initial)
        return initial

    # -- objective ---------------------------------------------------------------------------
    async def server_parts(self) -> list[float]:
        return [float(f.header["value"]) for f in await self.call_all(list(self.servers),
                                                                      {"op": "server_objective"})]

    async def objective(self) -> float:
        """The exact objective of the current model (call only with no epoch running)."""
        worker_frames, server_parts = await asyncio.gather(
            self.call_all(list(self.workers), {"op": "objective"}), self.server_parts())
        parts = [ObjectivePart(float(f.header["value"]), int(f.header["count"])) for f in worker_frames]
        return float(self.app.combine(parts, server_parts))

    # -- training ----------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop at the next clock boundary (e.g. the job is being shut down or restarted)."""
        self._stop = True

    def _record_batches(self, rec: ExecutorRecord, frame: Frame) -> None:
        if len(frame.arrays) == 2:
            self.metrics.record_batches(rec.executor_id, frame.arrays[0], frame.arrays[1])

    def _finish_epoch(self, epoch: int, objective: float, seconds: float) -> EpochRecord:
        rec = EpochRecord(epoch=epoch, objective=objective, epoch_time_s=seconds, time=self.wall_clock())
        self.metrics.record_epoch(rec)
        self.epochs_done = epoch + 1
        self.converged = self.app.is_converged(self.metrics.objectives)
        log.info("epoch %d objective %.6g (%.3fs)%s", epoch, objective, seconds,
                 " converged" if self.converged else "")
        return rec

    async def train(self, on_epoch: EpochHook) -> None:
        """Train until converged (the app's rule, which includes its max_epochs) or stopped."""
        if self.spec.sync == "ssp":
            await self._train_ssp(on_epoch)
        else:
            await self._train_bsp(on_epoch)

    async def _train_bsp(self, on_epoch: EpochHook) -> None:
        self._looping = True
        try:
            while not (self.converged or self._stop):
                epoch = self.epochs_done
                t0 = time.perf_counter()
                self._workers_done_at = None
                self._in_epoch = [self._spawn(fn, fut) for fn, fut in self._next_epoch]
                self._next_epoch = []
                try:
                    finished = await self._run_clocks(epoch)
                except BaseException:
                    steps, self._in_epoch = self._in_epoch, None
                    for t in steps:
                        t.cancel()
                    await asyncio.gather(*steps, return_exceptions=True)
                    raise
                # Barrier: transmissions overlapping this epoch end before its objective (and before
                # a checkpoint, even when training stops mid-epoch).
                self._workers_done_at = time.perf_counter()
                steps, self._in_epoch = self._in_epoch, None
                await asyncio.gather(*steps, return_exceptions=True)
                if not finished:
                    return          # stopped at a clock boundary, in the middle of the epoch
                seconds = time.perf_counter() - t0
                if self._audit():
                    await self._check_audit(epoch)
                await on_epoch(self._finish_epoch(epoch, await self.objective(), seconds))
        finally:
            self._looping = False
            self._abandon_steps()

    async def _run_clocks(self, epoch: int) -> bool:
        """The clocks of `epoch` until every worker's blocks had their pass; False if stopped at a
        clock boundary first. Boundary steps run before each clock, while no worker trains."""
        while True:
            await self._run_boundary()
            if self._stop:
                return False
            workers = list(self.workers)
            frames = await self.call_all(workers, {"op": "run_clock", "epoch": epoch, "batches": self.pacer.batches,
                                                   "num_workers": len(workers), **self._audit()})
            self._end_clock(workers, frames)
            if all(f.header.get("epoch_done", True) for f in frames):
                return True

    def _end_clock(self, workers: list[ExecutorRecord], frames: list[Frame]) -> None:
        batches = [int(f.header.get("batches", 0)) for f in frames]
        for w, f in zip(workers, frames):
            self._record_batches(w, f)
        slowest = max(frames, key=lambda f: float(f.header.get("seconds", 0.0)), default=None)
        if slowest is not None:
            self.pacer.observe(int(slowest.header.get("batches", 0)), float(slowest.header.get("seconds", 0.0)))
        self.iterations += max(batches, default=0)
        self.minibatches_run += sum(batches)
        self.clocks_done += 1
        if self.on_clock is not None:
            self.on_clock()

    # -- elastic steps -----------------------------------------------------------------------
    def _spawn(self, fn: Step, fut: "asyncio.Future[tuple[Any, float]]", boundary: bool = False) -> "asyncio.Task[Any]":
        """Run a step; its future gets (result, seconds training waited for it): all of a boundary
        step, and of an overlapped step what it ran past its epoch's workers."""
        async def run() -> None:
            t0 = time.perf_counter()
            try:
                result = await fn()
            except BaseException as e:  # noqa: BLE001 - the step's caller gets its error, training goes on
                if not fut.done():
                    fut.set_exception(e)
                if isinstance(e, asyncio.CancelledError):
                    raise
                return
            now = time.perf_counter()
            if boundary:
                lost = now - t0
            else:
                lost = now - self._workers_done_at if self._workers_done_at is not None else 0.0
            if not fut.done():
                fut.set_result((result, max(0.0, lost)))
        return asyncio.ensure_future(run())

    def _check_elastic(self) -> None:
        if self.spec.sync != "bsp":
            raise TrainingNotRunning("elastic changes need BSP training (this job runs SSP)")
        if not self._looping or self.converged or self._stop:
            raise TrainingNotRunning("training is not running")

    async def overlap_epoch(self, fn: Step) -> tuple[Any, float]:
        """Run `fn` alongside the running epoch (or the next one, between epochs); that epoch ends
        only once `fn` is done. Returns (fn's result, seconds the epoch's end waited for it)."""
        self._check_elastic()
        fut: asyncio.Future[tuple[Any, float]] = asyncio.get_running_loop().create_future()
        if self._in_epoch is not None:
            self._in_epoch.append(self._spawn(fn, fut))
        else:
            self._next_epoch.append((fn, fut))
        return await fut

    async def at_boundary(self, fn: Step) -> tuple[Any, float]:
        """Run `fn` at the next clock boundary, while no worker trains. Returns (fn's result, seconds
        training waited for it)."""
        self._check_elastic()
        fut: asyncio.Future[tuple[Any, float]] = asyncio.get_running_loop().create_future()
        self._boundary.append((fn, fut))
        return await fut

    async def clock_boundary(self) -> None:
        """Wait for the next clock boundary: every worker has flushed its clock, so no request a
        worker routed by an older ownership table is still in flight. At once when training is
        not running (nothing is in flight then either)."""
        if self.spec.sync != "bsp" or not self._looping or self.converged or self._stop:
            return
        try:
            await self.at_boundary(_nothing)
        except TrainingNotRunning:
            pass

    async def _run_boundary(self) -> None:
        while self._boundary:
            pending, self._boundary = self._boundary, []
            for fn, fut in pending:
                await self._spawn(fn, fut, boundary=True)

    def _abandon_steps(self) -> None:
        pending = self._next_epoch + self._boundary
        self._next_epoch, self._boundary = [], []
        for _, fut in pending:
            if not fut.done():
                fut.set_exception(TrainingNotRunning("training ended before the change could be made"))

    async def _train_ssp(self, on_epoch: EpochHook) -> None:
        workers = list(self.workers)
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
                f = await self.call(w, {"op": "run_clock", "epoch": epoch, "batches": self.pacer.batches,
                                        "num_workers": len(workers), **self._audit()})
                self._record_batches(w, f)
                self.pacer.observe(int(f.header.get("batches", 0)), float(f.header.get("seconds", 0.0)))
                if f.header.get("epoch_done", True):
                    # This worker's part of the epoch objective (approximate: others may be ahead).
                    o = await self.call(w, {"op": "objective"})
                    parts[epoch][w.executor_id] = ObjectivePart(float(o.header["value"]), int(o.header["count"]))
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
                seconds = time.perf_counter() - started[epoch]
                objective = float(self.app.combine(list(parts.pop(epoch).values()), await self.server_parts()))
                await on_epoch(self._finish_epoch(epoch, objective, seconds))
            async with changed:
                changed.notify_all()

        runners = [asyncio.create_task(run(w)) for w in workers]
        try:
            await collect()
            await asyncio.gather(*runners)
        finally:
            for t in runners:
                t.cancel()

    def _audit(self) -> dict[str, Any]:
        return {"count_key": AUDIT_KEY} if getattr(self.spec, "audit_updates", False) else {}

    async def _check_audit(self, epoch: int) -> None:
        """Exactly-once audit at an epoch's end: every mini-batch run was applied once."""
        got = await StoreClient(self.table, self.client).pull([AUDIT_KEY])
        self.minibatches_applied = int(got[AUDIT_KEY][0]) if AUDIT_KEY in got else 0
        if self.minibatches_applied != self.minibatches_run:
            log.error("audit: after epoch %d the servers applied %d mini-batches, the workers ran %d",
                      epoch, self.minibatches_applied, self.minibatches_run)
            self.audit_mismatches.append({"epoch": epoch, "applied": self.minibatches_applied,
                                          "run": self.minibatches_run})

    # -- status and model ----------------------------------------------------------------------
    async def refresh_status(self) -> None:
        """Poll every ready executor's status: RSS, model bytes and blocks, request service times."""
        recs = self.pool.of_role(Role.SERVER, ExecutorState.READY) + self.pool.of_role(Role.WORKER, ExecutorState.READY)
        frames = await asyncio.gather(*(self.call(r, {"op": "status"}) for r in recs), return_exceptions=True)
        for r, f in zip(recs, frames):
            if isinstance(f, BaseException):
                continue          # a dead executor is reported by its container's completion
            h = f.header
            r.rss_bytes = int(h.get("rss_bytes", 0))
            if r.role is Role.SERVER:
                r.model_bytes = int(h.get("store_bytes", 0))
                r.blocks = list(h.get("blocks", r.blocks))
                if "busy_s" in h:
                    self.metrics.record_server(r.executor_id, int(h["data_requests"]), float(h["busy_s"]))

    async def model(self) -> np.ndarray:
        """The whole model (num_keys, key_length), pulled from the servers as arrays."""
        app = self.app
        store = StoreClient(self.table, self.client)
        values, _found = await store.pull_array(app.model_keys(), (app.key_length,), np.float32)
        return np.asarray(values, np.float32).reshape(app.num_keys, app.key_length)

    async def evaluate(self) -> dict[str, float]:
        model = await self.model()
        return await asyncio.to_thread(lambda: self.app.evaluate(model, self.app.generate_heldout()))


async def _nothing() -> None:
    """A boundary step that only marks the boundary (see TrainingController.clock_boundary)."""

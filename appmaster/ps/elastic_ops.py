"""EPS's four elastic functions on the PS AM (EPS §3.2-3.3): add or remove workers or servers of a
running job without restarting it and without losing training progress.

    add_servers(n)     containers are asked from the RM and n server executors start while training
                       goes on (barrier 1); the AM decides round-robin which model blocks each new
                       server takes (eps_decisions.balance_onto); the dependency update broadcasts
                       the new servers' addresses (every executor's server list); the blocks migrate
                       server-to-server with the elastic store's two-step protocol (psruntime.
                       migration_controller) alongside training (the running clocks), each move
                       broadcasting the new ownership table; the epoch ends only once they landed
                       (barrier 4).
    remove_servers(n)  the most recently added servers' blocks go round-robin to the others
                       (eps_decisions.drain), alongside training; they leave the server lists and,
                       at the next clock boundary (every worker flushed, so none still has a
                       request on its way to them), their containers are stopped and released.
    add_workers(n)     n worker executors start; the AM decides round-robin which input splits the
                       current workers hand over; the senders stage the splits' input data at the new
                       workers alongside training (worker-to-worker transmission); at the next
                       clock boundary the splits' worker-local state follows (with each split's
                       place in the running epoch), the senders keep their copies as *inactive*
                       splits on local disk (eps_datasets), and the new workers join the BSP
                       barrier (the clock list) at the next clock, in the current epoch.
    remove_workers(n)  the most recently added workers' splits go back round-robin: to a remaining
                       worker that still holds an inactive copy (re-activated: only state travels),
                       else staged alongside training; at the next clock boundary the state follows
                       and the workers leave the barrier; then their containers are stopped and
                       released.

Exactly-once. Model blocks move with the store's protocol: every update reaches the block once,
at the source before the snapshot or at the destination after. Input splits change hands only
at a clock boundary (an iteration of the AM's BSP clock), while no worker trains, and carry their
place in the epoch in their state, so no mini-batch is trained twice or skipped in an epoch and
BSP epoch numbers stay the same for every worker (the AM paces clocks and epochs).

One change at a time: a second call while one runs gets ElasticBusy (HTTP 409); an impossible
change (above the job's max_workers / max_servers or the number of splits / blocks, below one
worker or server, n < 1) gets ElasticOpError (HTTP 400), and neither changes anything.
Elastic changes need BSP training (the AM-paced clock barrier is the switch-over point).
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, Optional

from protocol.ps_job_spec import PSJobSpec
from protocol.records import Resource
from psruntime.dataplane import DataPlaneClient

from ..am_client import ApplicationMaster
from .eps_datasets import SplitLedger
from .eps_decisions import Transfer, balance_onto, drain, group_by_route, pick_leaving
from .eps_split_transfers import SplitTransmitter
from .eps_records import ElasticBusy, ElasticOpError, ElasticOpFailed, ElasticOpRecord
from .executor_pool import ExecutorPool, ExecutorRecord, ExecutorState, Role
from .job import JobPhase
from .training_controller import TrainingController, TrainingNotRunning

log = logging.getLogger(__name__)

LAUNCH_TIMEOUT_S = 120.0
HISTORY_LIMIT = 100

__all__ = ["ElasticBusy", "ElasticOpError", "ElasticOpFailed", "ElasticOpRecord", "ElasticOps"]


def _index(e: ExecutorRecord) -> int:
    return int(e.executor_id.rsplit("-", 1)[1])


class ElasticOps:
    """EPS's add / remove of workers and servers for one PS job (see the module doc).

    Reachable as `PSApplicationMaster.elastic`. Every call returns an ElasticOpRecord (also kept in
    `history`) or raises ElasticOpError / ElasticBusy.
    """

    def __init__(self, am: ApplicationMaster, spec: PSJobSpec, pool: ExecutorPool, training: TrainingController,
                 client: DataPlaneClient, resource: Resource, phase: Callable[[], JobPhase], *,
                 retiring: Optional[set[str]] = None, on_start: Optional[Callable[[], None]] = None,
                 on_record: Optional[Callable[[dict[str, Any]], None]] = None,
                 launch_timeout_s: float = LAUNCH_TIMEOUT_S, wall_clock: Callable[[], float] = time.time) -> None:
        self.am = am
        self.spec = spec
        self.pool = pool
        self.training = training
        self.client = client
        self.resource = resource
        self.phase = phase
        self.launch_timeout_s = launch_timeout_s
        self.wall_clock = wall_clock
        # The master's hooks: containers stopped on purpose (their exit is no failure), "a change
        # started" (the shape report says changing) and "a change ended" (its shape history).
        self.retiring = retiring if retiring is not None else set()
        self.on_start = on_start
        self.on_record = on_record
        self.history: list[ElasticOpRecord] = []
        self.current: Optional[ElasticOpRecord] = None
        self._busy = False
        self._ledger: Optional[SplitLedger] = None
        self.splits = SplitTransmitter(training, pool, client)

    # -- the four functions ------------------------------------------------------------------
    async def add_workers(self, n: int) -> ElasticOpRecord:
        return await self._one("add_workers", Role.WORKER, n, +1, self._add_workers)

    async def add_servers(self, n: int) -> ElasticOpRecord:
        return await self._one("add_servers", Role.SERVER, n, +1, self._add_servers)

    async def remove_workers(self, n: int) -> ElasticOpRecord:
        return await self._one("remove_workers", Role.WORKER, n, -1, self._remove_workers)

    async def remove_servers(self, n: int) -> ElasticOpRecord:
        return await self._one("remove_servers", Role.SERVER, n, -1, self._remove_servers)

    async def scale(self, workers: int = 0, servers: int = 0) -> list[ElasticOpRecord]:
        """A relative change of both roles (POST /scale, `elastane ps scale`): removals first (they
        free resources), then additions, each pair concurrently; validated as a whole before
        anything starts."""
        for name, d in (("workers", workers), ("servers", servers)):
            if not isinstance(d, int) or isinstance(d, bool):
                raise ElasticOpError(f"{name} must be a signed integer change, got {d!r}")
        if workers == 0 and servers == 0:
            raise ElasticOpError("nothing to change: give workers and/or servers as +N or -N")
        self._check_now()
        self._check_shape(len(self.training.workers) + workers, len(self.training.servers) + servers)
        steps: list[tuple[str, Role, int, Callable[[ElasticOpRecord, int], Awaitable[None]]]] = []
        if servers < 0:
            steps.append(("remove_servers", Role.SERVER, servers, self._remove_servers))
        if workers < 0:
            steps.append(("remove_workers", Role.WORKER, workers, self._remove_workers))
        if servers > 0:
            steps.append(("add_servers", Role.SERVER, servers, self._add_servers))
        if workers > 0:
            steps.append(("add_workers", Role.WORKER, workers, self._add_workers))
        self._busy = True
        try:
            # The two roles' changes are independent (servers hand over model blocks, workers input
            # splits), so each pair runs concurrently: the removals' transfers and clock-boundary
            # waits overlap, as do the additions' container launches. Removals go first: they free
            # the resources an addition may need.
            removals = await asyncio.gather(*(self._run(op, abs(d), fn) for op, _role, d, fn in steps if d < 0))
            additions = await asyncio.gather(*(self._run(op, d, fn) for op, _role, d, fn in steps if d > 0))
            return list(removals) + list(additions)
        finally:
            self._busy = False

    # -- checks ------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        """Whether a change is under way (the shape report's `changing`)."""
        return self._busy

    changing = running

    def limits(self) -> dict[str, int]:
        """The most workers / servers this job can have: its max_workers / max_servers, and never
        more workers than input splits or servers than model blocks (one would have nothing to
        do), which is the only bound when the job sets no maximum."""
        splits = self._splits_count() if self.training.workers else 0
        workers = min(self.spec.max_workers or splits, splits) if splits else (self.spec.max_workers or self.spec.workers)
        servers = min(self.spec.max_servers or self.spec.num_blocks, self.spec.num_blocks)
        return {"workers": workers, "servers": servers, "min_workers": 1, "min_servers": 1}

    def _check_now(self) -> None:
        if self._busy:
            cur = self.current
            raise ElasticBusy(f"another change is running ({cur.op} {cur.requested})" if cur
                              else "another change is running")
        phase = self.phase()
        if phase is not JobPhase.TRAINING:
            raise ElasticBusy(f"no elastic change in phase {phase.value}: the job must be training")
        if self.spec.sync != "bsp":
            raise ElasticOpError("elastic changes need BSP training; this job runs SSP")

    def _check_shape(self, workers: int, servers: int) -> None:
        lim = self.limits()
        if workers < 1:
            raise ElasticOpError(f"a job keeps at least 1 worker: the change would leave {workers}")
        if servers < 1:
            raise ElasticOpError(f"a job keeps at least 1 server: the change would leave {servers}")
        if workers > lim["workers"]:
            raise ElasticOpError(f"{workers} workers is more than this job's maximum of {lim['workers']} "
                                 f"(max_workers {self.spec.max_workers or 'unset'}, "
                                 f"{self._splits_count()} input splits)")
        if servers > lim["servers"]:
            raise ElasticOpError(f"{servers} servers is more than this job's maximum of {lim['servers']} "
                                 f"(max_servers {self.spec.max_servers or 'unset'}, "
                                 f"{self.spec.num_blocks} model blocks)")

    def _splits_count(self) -> int:
        return sum(len(s) for s in self._splits().active.values())

    async def _one(self, op: str, role: Role, n: int, sign: int,
                   fn: Callable[[ElasticOpRecord, int], Awaitable[None]]) -> ElasticOpRecord:
        if not _is_count(n) or n < 1:
            raise ElasticOpError(f"{op}: n must be a positive integer, got {n!r}")
        delta = sign * n
        self._check_now()
        w, s = len(self.training.workers), len(self.training.servers)
        if role is Role.WORKER:
            w += delta
        else:
            s += delta
        self._check_shape(w, s)
        self._busy = True
        try:
            return await self._run(op, n, fn)
        finally:
            self._busy = False

    async def _run(self, op: str, n: int, fn: Callable[[ElasticOpRecord, int], Awaitable[None]]) -> ElasticOpRecord:
        rec = ElasticOpRecord(op, n, self.wall_clock(), self.training.epochs_done,
                              len(self.training.workers), len(self.training.servers))
        self.current = rec
        if self.on_start is not None:
            self.on_start()
        t0 = time.perf_counter()
        log.info("EPS %s(%d) from %d workers, %d servers", op, n, rec.workers_before, rec.servers_before)
        try:
            await fn(rec, n)
        except TrainingNotRunning as e:
            rec.error = str(e)
            raise ElasticBusy(f"{op}({n}): {e}") from None
        except ElasticOpError as e:
            rec.error = str(e)
            raise
        except Exception as e:  # noqa: BLE001 - named and re-raised as the op's error
            rec.error = f"{type(e).__name__}: {e}"
            log.exception("EPS %s(%d) failed", op, n)
            raise ElasticOpFailed(f"{op}({n}) failed: {rec.error}") from e
        finally:
            rec.duration_s = time.perf_counter() - t0
            rec.workers_after, rec.servers_after = len(self.training.workers), len(self.training.servers)
            self.current = None
            self.history.append(rec)
            del self.history[:-HISTORY_LIMIT]
            if self.on_record is not None:
                self.on_record(rec.to_history())
        log.info("EPS %s(%d) done in %.2fs: now %d workers, %d servers; %d blocks, %d splits moved, "
                 "%d re-activated; training waited %.3fs", op, n, rec.duration_s, rec.workers_after,
                 rec.servers_after, rec.blocks_moved, rec.splits_moved, rec.splits_reactivated,
                 rec.training_time_lost_s)
        return rec

    # -- containers ----------------------------------------------------------------------------
    async def _launch(self, rec: ElasticOpRecord, role: Role, n: int) -> list[ExecutorRecord]:
        """Ask the RM for n containers, start executors in them, bind the app (barrier 1)."""
        before = {e.executor_id for e in self.pool.of_role(role)}
        ready_before = len(self.pool.of_role(role, ExecutorState.READY))
        ask_id = self.am.add_ask(n, self.resource, tag=role.value)
        try:
            await self.pool.wait_ready(role, ready_before + n, self.launch_timeout_s)
            new = sorted((e for e in self.pool.of_role(role, ExecutorState.READY) if e.executor_id not in before),
                         key=_index)[:n]
            rec.executors_added = [e.executor_id for e in new]
            rec.containers_added = [e.container_id for e in new]
            await self.training.call_all(new, self.training.app_setup_request())
            if role is Role.WORKER:
                await asyncio.gather(*(self.training.call(e, {"op": "eps_join"}) for e in new))
            # Dependency update: every executor learns the newcomers' addresses (and they the table).
            ctl = self._controller()
            for e in new:
                ctl.add_executor(e.executor_id, e.address)
            await ctl.broadcast()
            return new
        except BaseException as e:
            try:
                self.am.set_ask_count(ask_id, 0)
            except Exception:  # noqa: BLE001 - the ask may already be fully granted
                pass
            started = [x for x in self.pool.of_role(role) if x.executor_id not in before]
            await self._retire(rec, started, released=False)
            if isinstance(e, asyncio.TimeoutError):
                raise ElasticOpFailed(f"the new {role.value}s did not start: {e}") from None
            raise

    async def _retire(self, rec: ElasticOpRecord, executors: list[ExecutorRecord], released: bool = True) -> None:
        """Stop executors that left the job and give their containers back to the RM (barrier 3)."""
        for e in executors:
            self.retiring.add(e.container_id)
            self.pool.retire(e)
            if self.training.controller is not None:
                self.training.controller.table.addresses.pop(e.executor_id, None)
        await asyncio.gather(*(self.client.request(e.address, {"op": "shutdown"}) for e in executors if e.address),
                             return_exceptions=True)
        await asyncio.gather(*(self.am.stop(e.container) for e in executors), return_exceptions=True)
        if released:
            rec.executors_removed += [e.executor_id for e in executors]
            rec.containers_released += [e.container_id for e in executors]

    def _controller(self) -> Any:
        if self.training.controller is None:
            raise ElasticBusy("the job has no ownership table yet")
        return self.training.controller

    # -- servers -----------------------------------------------------------------------------
    async def _add_servers(self, rec: ElasticOpRecord, n: int) -> None:
        new = await self._launch(rec, Role.SERVER, n)
        table = self._controller().table
        current = [s.executor_id for s in self.training.servers]
        holdings = {s: table.blocks_owned_by(s) for s in current}
        moves = balance_onto(holdings, current, [e.executor_id for e in new])
        # In the server list from now on: they answer the objective (0 until their blocks land).
        self.training.servers = sorted(self.training.servers + new, key=_index)
        try:
            await self._migrate(rec, moves)
        except BaseException:
            # A new server that received nothing leaves again; one that holds blocks serves them.
            idle = [e for e in new if not self._controller().table.blocks_owned_by(e.executor_id)]
            ids = {e.executor_id for e in idle}
            self.training.servers = [s for s in self.training.servers if s.executor_id not in ids]
            await self._retire(rec, idle, released=False)
            raise
        rec.epoch_switched = self.training.epochs_done + 1

    async def _remove_servers(self, rec: ElasticOpRecord, n: int) -> None:
        ctl = self._controller()
        servers = list(self.training.servers)
        leaving = pick_leaving([s.executor_id for s in servers], n)
        remaining = [s.executor_id for s in servers if s.executor_id not in leaving]
        moves = drain({s: ctl.table.blocks_owned_by(s) for s in leaving + remaining}, leaving, remaining)
        gone = [s for s in servers if s.executor_id in leaving]
        await self._migrate(rec, moves, drop=gone)
        for s in gone:
            ctl.remove_executor(s.executor_id)
        await ctl.broadcast()          # dependency update: the servers leave every server list
        rec.epoch_switched = self.training.epochs_done + 1
        # Barrier 3 only at a clock boundary: a worker's request routed by its old table before
        # the broadcast reached it may still be on its way to a leaving server (which answers it
        # with a redirect); stopping that server now would fail the request and the worker's clock.
        await self.training.clock_boundary()
        await self._retire(rec, gone)

    async def _migrate(self, rec: ElasticOpRecord, moves: list[Transfer], drop: list[ExecutorRecord] = ()) -> None:
        """Server-to-server parameter transmission alongside an epoch, which ends once it is done;
        `drop` leave the server list within the same step (they own nothing by then)."""
        ctl = self._controller()
        rec.transfers += [{"kind": "block", **t.to_json()} for t in moves]

        async def step() -> int:
            routes = group_by_route(moves)
            await asyncio.gather(*(ctl.move(blocks, src, dst) for (src, dst), blocks in routes.items()))
            if drop:
                ids = {d.executor_id for d in drop}
                self.training.servers = [s for s in self.training.servers if s.executor_id not in ids]
            for s in self.training.servers:
                s.blocks = ctl.table.blocks_owned_by(s.executor_id)
            return len(moves)

        if not moves and not drop:
            return
        moved, lost = await self.training.overlap_epoch(step)
        rec.blocks_moved += moved
        rec.training_time_lost_s += lost

    # -- workers -----------------------------------------------------------------------------
    def _splits(self) -> SplitLedger:
        """The two-dataset ledger, built from the workers' partitions once training has begun
        (before that the partitions are not generated yet)."""
        if self._ledger is not None:
            return self._ledger
        ledger = SplitLedger()
        for w in self.training.workers:
            ledger.add_worker(w.executor_id, w.blocks)
        if self.phase() is JobPhase.TRAINING:
            self._ledger = ledger
        return ledger

    async def _add_workers(self, rec: ElasticOpRecord, n: int) -> None:
        ledger = self._splits()
        new = await self._launch(rec, Role.WORKER, n)
        for e in new:
            ledger.add_worker(e.executor_id)
        current = [w.executor_id for w in self.training.workers]
        transfers = balance_onto(ledger.holdings(), current, [e.executor_id for e in new])

        async def switch() -> None:
            try:
                await self.splits.commit(rec, transfers, self._splits(), keep_inactive=True)
            finally:
                # The clock list: the new workers that hold splits train from the next clock, in
                # the running epoch (even if some transfer failed: their splits must be trained).
                joined = [e for e in new if ledger.active_of(e.executor_id)]
                self.training.workers = sorted(self.training.workers + joined, key=_index)
                rec.epoch_switched = self.training.epochs_done

        try:
            await self.splits.stage(rec, transfers)
            _, lost = await self.training.at_boundary(switch)
            rec.training_time_lost_s += lost
        except BaseException:
            # Only a new worker that got no split can go again.
            idle = [e for e in new if not ledger.active_of(e.executor_id)]
            for e in idle:
                ledger.remove_worker(e.executor_id)
            await self._retire(rec, idle, released=False)
            await self.splits.discard_staged(transfers)
            raise
        finally:
            self._refresh_worker_records()

    async def _remove_workers(self, rec: ElasticOpRecord, n: int) -> None:
        ledger = self._splits()
        workers = list(self.training.workers)
        leaving = pick_leaving([w.executor_id for w in workers], n)
        remaining = [w.executor_id for w in workers if w.executor_id not in leaving]
        transfers = drain(ledger.holdings(), leaving, remaining, ledger.inactive_holdings())
        gone: list[ExecutorRecord] = []

        async def switch() -> None:
            try:
                await self.splits.commit(rec, transfers, self._splits(), keep_inactive=False)
            finally:
                # Only a worker whose splits all moved leaves the clock list; one that still has
                # some (a failed transfer) keeps training them.
                gone.extend(w for w in workers if w.executor_id in leaving and not ledger.active_of(w.executor_id))
                ids = {w.executor_id for w in gone}
                self.training.workers = [w for w in self.training.workers if w.executor_id not in ids]
                rec.epoch_switched = self.training.epochs_done

        try:
            await self.splits.stage(rec, [t for t in transfers if not t.reactivate])
            _, lost = await self.training.at_boundary(switch)
            rec.training_time_lost_s += lost
        except BaseException:
            await self.splits.discard_staged(transfers)
            raise
        finally:
            for w in gone:
                ledger.remove_worker(w.executor_id)
            self._refresh_worker_records()
            await self._retire(rec, gone)

    def _refresh_worker_records(self) -> None:
        ledger = self._splits()
        for w in self.training.workers:
            if w.executor_id in ledger.active:
                w.blocks = ledger.active_of(w.executor_id)

    # -- status ------------------------------------------------------------------------------
    def status_json(self) -> dict[str, Any]:
        """What the AM's status shows: whether a change runs, the shape history, the datasets."""
        return {"running": self.running, "current": self.current.to_json() if self.current else None,
                "workers": [w.executor_id for w in self.training.workers],
                "servers": [s.executor_id for s in self.training.servers],
                "minibatches_applied": self.training.minibatches_applied,
                "minibatches_run": self.training.minibatches_run,
                "audit_mismatches": list(self.training.audit_mismatches),
                "history": [r.to_json() for r in self.history],
                "limits": self.limits() if self._ledger is not None else None,
                "datasets": self._ledger.to_json() if self._ledger is not None else None}


def _is_count(n: Any) -> bool:
    return isinstance(n, int) and not isinstance(n, bool)


"""Executes a Cruise reconfiguration plan (appmaster.cruise.plan) concurrently.

Every op whose prerequisites are done runs at once as its own asyncio task; as each ends the plan
is told (`done` / `fail`) and newly ready ops start. The plan's own transition table keeps the
bookkeeping honest; this module only does the I/O, through a `PlanRuntime`:

    add(role, n)                    launch n executors (containers asked from the RM)
    delete(executor)                stop an executor that holds nothing any more, release its container
    switch(executor, role)          worker <-> server in place (executor's switch_role op)
    move(kind, blocks, src, dst)    model blocks: the store's two-step migration; input blocks:
                                    worker-to-worker transmission, handed over at a clock boundary

`AmPlanRuntime` is the PS AM's runtime: it launches and retires executors like EPS does, moves
model blocks with the migration controller alongside an epoch, and hands input splits over with
EPS's worker-to-worker transmission (staged alongside an epoch, committed at the next boundary),
sharing EPS's split ledger so both kinds of change see the same datasets.

Failure: the first failed op stops new ops from starting; ops already running finish (each is
atomic on its own: a migration either lands or leaves the block with its source), then
`PlanFailed` carries the run. The job stays consistent -- every block owned exactly once -- and
the caller re-reads the configuration as it is.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol, Sequence

from appmaster.cruise.plan import AddOp, BlockKind, DeleteOp, MoveOp, Op, Plan, SwitchOp
from appmaster.cruise.targets import Role

from .eps_decisions import Transfer
from .eps_records import ElasticOpRecord
from .eps_split_transfers import SplitTransmitter
from .executor_pool import Role as PoolRole

log = logging.getLogger(__name__)


class PlanRuntime(Protocol):
    """The elastic operations a plan is made of (dissertation Table 3.2)."""

    async def add(self, role: Role, n: int) -> list[str]:
        """Launch `n` executors with `role`; their executor ids, in launch order."""
        ...

    async def delete(self, executor: str) -> None:
        """Stop `executor` (it owns no blocks by now) and release its container."""
        ...

    async def switch(self, executor: str, role: Role) -> None:
        """Change `executor` to `role` in place (it owns no blocks of its old role by now)."""
        ...

    async def move(self, kind: BlockKind, blocks: Sequence[int], src: str, dst: str, src_leaving: bool) -> int:
        """Move `blocks` of `kind` from `src` to `dst`; `src_leaving`: the source switches or goes
        afterwards, so it need not keep copies. Returns the bytes moved."""
        ...

    def abort(self) -> None:
        """An op failed: ops waiting on another op's effect give up instead of waiting it out."""
        ...

    def reset(self) -> None:
        """A new plan starts (an earlier plan's abort no longer applies)."""
        ...


class PlanFailed(RuntimeError):
    """An op of the plan failed; `run` says what was done and what failed."""

    def __init__(self, run: "PlanRun") -> None:
        super().__init__(f"plan failed: {run.error}")
        self.run = run


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

    def to_json(self) -> dict[str, Any]:
        return {"id": self.op_id, "op": self.op, "start_s": round(self.start_s, 4),
                "end_s": None if self.end_s is None else round(self.end_s, 4),
                "seconds": None if self.seconds is None else round(self.seconds, 4),
                "bytes": self.bytes_moved, "error": self.error}


@dataclass
class PlanRun:
    """One execution of a plan: per-op timings, total time, bytes moved, the first error."""

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

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "seconds": round(self.seconds, 4), "bytes_moved": self.bytes_moved,
                "max_concurrency": self.max_concurrency, "error": self.error,
                "ops": [self.timings[o].to_json() for o in self.plan.order if o in self.timings],
                "plan": self.plan.to_json()}


def _kind(op: Op) -> str:
    return {AddOp: "add", DeleteOp: "delete", SwitchOp: "switch", MoveOp: "move"}[type(op)]


class PlanExecutor:
    """Runs plans on a `PlanRuntime` (see the module doc)."""

    def __init__(self, runtime: PlanRuntime, clock: Callable[[], float] = time.perf_counter) -> None:
        self.runtime = runtime
        self.clock = clock
        self.current: Optional[PlanRun] = None     # the run under way
        self.last: Optional[PlanRun] = None        # the latest run, finished or not

    async def execute(self, plan: Plan) -> PlanRun:
        """Run `plan` to the end; returns its run, or raises PlanFailed (after running ops ended)."""
        run = PlanRun(plan)
        self.current = self.last = run
        self.runtime.reset()
        t0 = self.clock()
        # Which executors leave their role in this plan: their outgoing moves need not keep copies.
        leaving = {op.executor for op in plan.ops.values() if isinstance(op, (SwitchOp, DeleteOp))}
        running: dict[asyncio.Task[Any], str] = {}
        try:
            while True:
                if not run.error:
                    for op in plan.ready():
                        resolved = plan.start(op.op_id)
                        run.timings[op.op_id] = OpTiming(op.op_id, _kind(op), self.clock() - t0)
                        task = asyncio.ensure_future(self._one(resolved, plan, leaving))
                        running[task] = op.op_id
                run.max_concurrency = max(run.max_concurrency, len(running))
                if not running:
                    break
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    op_id = running.pop(task)
                    timing = run.timings[op_id]
                    timing.end_s = self.clock() - t0
                    err = task.exception()
                    if err is None:
                        ids, nbytes = task.result()
                        timing.bytes_moved = nbytes
                        plan.done(op_id, ids)
                    else:
                        timing.error = f"{type(err).__name__}: {err}"
                        plan.fail(op_id, timing.error)
                        if not run.error:
                            run.error = f"{op_id}: {timing.error}"
                            self.runtime.abort()
                        log.warning("plan op %s failed: %s", op_id, timing.error)
        except BaseException:
            # Cancelled (the job is stopping): let running ops end with the loop's cancellation.
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            raise
        finally:
            run.seconds = self.clock() - t0
            self.current = None
        if run.error or not plan.finished:
            run.error = run.error or "the plan did not finish"
            raise PlanFailed(run)
        return run

    async def _one(self, op: Op, plan: Plan, leaving: set[str]) -> tuple[Optional[list[str]], int]:
        """Run one op; (new executor ids for an add, bytes moved)."""
        if isinstance(op, AddOp):
            ids = await self.runtime.add(op.role, op.n)
            if len(ids) != op.n:
                raise RuntimeError(f"add of {op.n} {op.role.value}s started {len(ids)}")
            return list(ids), 0
        if isinstance(op, DeleteOp):
            await self.runtime.delete(op.executor)
            return None, 0
        if isinstance(op, SwitchOp):
            await self.runtime.switch(op.executor, op.role)
            return None, 0
        assert isinstance(op, MoveOp)
        src_leaving = op.src in leaving or plan.resolve(op.src) in {plan.resolve(x) for x in leaving}
        nbytes = await self.runtime.move(op.kind, op.blocks, op.src, op.dst, src_leaving)
        return None, int(nbytes)


# ---- the PS AM's runtime -------------------------------------------------------------------------

WAIT_POLL_S = 0.05


def _index(executor_id: str) -> tuple[int, str]:
    return int(executor_id.rsplit("-", 1)[1]), executor_id


class AmPlanRuntime:
    """`PlanRuntime` over the PS AM: its executor pool, training controller and EPS machinery.

    Runs while the BSP loop trains (plans start from an epoch-boundary hook, as a background task):
    model moves overlap an epoch (whose end waits for them), input splits are staged alongside an
    epoch and change hands at the next boundary, so no mini-batch is trained twice or skipped.
    """

    def __init__(self, am: Any, spec: Any, pool: Any, training: Any, elastic: Any, client: Any, resource: Any,
                 block_bytes: Callable[[], float], launch_timeout_s: float = 120.0) -> None:
        self.am, self.spec, self.pool, self.training = am, spec, pool, training
        self.elastic, self.client, self.resource = elastic, client, resource
        self.block_bytes = block_bytes            # bytes of one model block (for the bytes moved)
        self.launch_timeout_s = launch_timeout_s
        self.splits = SplitTransmitter(training, pool, client)   # EPS's worker-to-worker transmission
        self._aborted = False
        self._became_worker: dict[str, asyncio.Event] = {}

    # -- helpers -------------------------------------------------------------------------------
    def _record(self, op: str, n: int) -> Any:
        return ElasticOpRecord(op, n, time.time(), self.training.epochs_done, len(self.training.workers),
                               len(self.training.servers))

    def _rec(self, executor: str) -> Any:
        rec = self.pool.executors.get(executor)
        if rec is None:
            raise RuntimeError(f"no executor {executor}")
        return rec

    def _sync_workers(self) -> None:
        """The BSP barrier = workers that hold active splits (ledger order by index)."""
        ledger = self.elastic._splits()
        members = sorted((w for w, s in ledger.active.items() if s), key=_index)
        self.training.workers = [self._rec(w) for w in members]
        for w in ledger.active:
            self._rec(w).blocks = ledger.active_of(w)

    def _sync_servers(self, servers: Sequence[Any]) -> None:
        table = self.training.table
        self.training.servers = sorted(servers, key=lambda r: _index(r.executor_id))
        for s in self.training.servers:
            s.blocks = table.blocks_owned_by(s.executor_id)

    def abort(self) -> None:
        self._aborted = True
        for ev in self._became_worker.values():
            ev.set()

    def reset(self) -> None:
        self._aborted = False
        # Keep only the events of executors that are workers now (set ones that still mean it).
        ledger = self.elastic._splits()
        self._became_worker = {e: ev for e, ev in self._became_worker.items() if e in ledger.active and ev.is_set()}

    async def _wait_new(self, role: Any, before: set[str], n: int) -> list[Any]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.launch_timeout_s
        while True:
            new = [e for i, e in self.pool.executors.items() if i not in before and e.role is role]
            ready = [e for e in new if e.state.value == "READY"]
            if len(ready) >= n:
                return sorted(ready, key=lambda e: _index(e.executor_id))[:n]
            dead = [e.executor_id for e in new if e.state.value == "EXITED"]
            if dead:
                raise RuntimeError(f"new {role.value}s {dead} exited before they started")
            if self._aborted:
                raise RuntimeError("the plan was aborted")
            if loop.time() > deadline:
                raise asyncio.TimeoutError(f"{len(ready)} of {n} new {role.value}s ready after "
                                           f"{self.launch_timeout_s:.0f}s")
            await asyncio.sleep(WAIT_POLL_S)

    # -- the four operations -------------------------------------------------------------------
    async def add(self, role: Role, n: int) -> list[str]:
        prole = PoolRole(role.value)
        before = set(self.pool.executors)
        ask_id = self.am.add_ask(n, self.resource, tag=prole.value)
        try:
            new = await self._wait_new(prole, before, n)
            await self.training.call_all(new, self.training.app_setup_request())
            ctl = self.training.controller
            for e in new:
                ctl.add_executor(e.executor_id, e.address)
            await ctl.broadcast()
            if prole is PoolRole.WORKER:
                await asyncio.gather(*(self.training.call(e, {"op": "eps_join"}) for e in new))
                ledger = self.elastic._splits()
                for e in new:
                    ledger.add_worker(e.executor_id)
                    self._became_worker.setdefault(e.executor_id, asyncio.Event()).set()
            else:
                self._sync_servers(self.training.servers + new)
            return [e.executor_id for e in new]
        except BaseException:
            try:
                self.am.set_ask_count(ask_id, 0)
            except Exception:  # noqa: BLE001 - the ask may already be fully granted
                pass
            started = [e for i, e in self.pool.executors.items() if i not in before]
            await self.elastic._retire(self._record("cruise_add", n), started, released=False)
            raise

    async def delete(self, executor: str) -> None:
        rec = self._rec(executor)
        ledger = self.elastic._splits()
        if executor in ledger.active:
            ledger.remove_worker(executor)           # refuses while it still has active splits
            self._sync_workers()
        self._sync_servers([s for s in self.training.servers if s.executor_id != executor])
        ctl = self.training.controller
        ctl.remove_executor(executor)                # refuses while it still owns model blocks
        await ctl.broadcast()
        await self.training.clock_boundary()         # no worker request in flight to it (see EPS's remove)
        await self.elastic._retire(self._record("cruise_delete", 1), [rec])

    async def switch(self, executor: str, role: Role) -> None:
        rec = self._rec(executor)
        if rec.role.value == role.value:
            return
        if role is Role.SERVER:
            ledger = self.elastic._splits()
            if executor in ledger.active:
                ledger.remove_worker(executor)       # refuses while it still has active splits
            self._sync_workers()
            await self.training.call(rec, {"op": "switch_role", "role": "server"})
            rec.role, rec.blocks = PoolRole.SERVER, []
            self._became_worker.pop(executor, None)
            self._sync_servers(self.training.servers + [rec])
        else:
            owned = self.training.table.blocks_owned_by(executor)
            if owned:
                raise RuntimeError(f"{executor} still owns model blocks {owned[:5]}")
            self._sync_servers([s for s in self.training.servers if s.executor_id != executor])
            await self.training.call(rec, {"op": "switch_role", "role": "worker"})
            rec.role, rec.blocks = PoolRole.WORKER, []
            await self.training.call(rec, {"op": "eps_join"})
            self.elastic._splits().add_worker(executor)
            self._became_worker.setdefault(executor, asyncio.Event()).set()

    async def move(self, kind: BlockKind, blocks: Sequence[int], src: str, dst: str, src_leaving: bool) -> int:
        if kind is BlockKind.MODEL:
            return await self._move_model(list(blocks), src, dst)
        return await self._move_input(list(blocks), src, dst, src_leaving)

    async def _move_model(self, blocks: list[int], src: str, dst: str) -> int:
        ctl = self.training.controller

        async def step() -> int:
            await ctl.move(blocks, src, dst)
            self._sync_servers(self.training.servers)
            return len(blocks)

        await self.training.overlap_epoch(step)
        return int(len(blocks) * self.block_bytes())

    async def _move_input(self, blocks: list[int], src: str, dst: str, src_leaving: bool) -> int:
        ledger = self.elastic._splits()
        rec = self._record("cruise_move", len(blocks))
        # The destination may be a server switching to worker in this plan: the data is staged
        # meanwhile (any executor can hold it), the hand-over waits until it is a worker.
        inactive = set(ledger.inactive.get(dst, ()))
        transfers = [Transfer(b, src, dst, reactivate=b in inactive) for b in blocks]
        await self.splits.stage(rec, [t for t in transfers if not t.reactivate])
        if dst not in ledger.active:
            ev = self._became_worker.setdefault(dst, asyncio.Event())
            await asyncio.wait_for(ev.wait(), self.launch_timeout_s)
            if self._aborted or dst not in ledger.active:
                await self.splits.discard_staged(transfers)
                raise RuntimeError(f"{dst} did not become a worker")

        async def handover() -> None:
            try:
                await self.splits.commit(rec, transfers, ledger, keep_inactive=not src_leaving)
            finally:
                self._sync_workers()

        await self.training.at_boundary(handover)
        return int(rec.bytes_sent)

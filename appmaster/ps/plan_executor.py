"""Executes a Cruise reconfiguration plan (appmaster.cruise.plan) concurrently.

Every op whose prerequisites are done runs at once as its own asyncio task; as each ends the plan
is told (`done` / `fail`) and newly ready ops start. The plan's own transition table keeps the
bookkeeping honest; this module only does the I/O, through a `PlanRuntime`:

    add(role, n)                    launch n executors (containers asked from the RM)
    delete(executor)                stop an executor that holds nothing any more, release its container
    switch(executor, role)          worker <-> server in place (executor's switch_role op)
    move(kind, blocks, src, dst)    model blocks: the store's two-step migration; input blocks:
                                    worker-to-worker transmission, handed over at a clock boundary

`AmPlanRuntime` is the PS AM's runtime: each operation is a composition of the reconfiguration
layer's steps (appmaster.ps.reconfiguration) -- launch / retire executors, move model blocks
alongside an epoch, stage input splits alongside an epoch and commit them at the next boundary,
switch a role -- sharing the job's split ledger with EPS.

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
from protocol.ps_status import OpTimingRecord, PlanRunRecord

from .eps_decisions import Transfer
from .eps_records import ElasticOpRecord
from .executor_pool import Role as PoolRole
from .reconfiguration import Reconfiguration
from protocol.errors import PlanningError

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


class PlanFailed(PlanningError, RuntimeError):
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

    def record(self) -> OpTimingRecord:
        return OpTimingRecord(id=self.op_id, op=self.op, start_s=round(self.start_s, 4),
                              end_s=None if self.end_s is None else round(self.end_s, 4),
                              seconds=None if self.seconds is None else round(self.seconds, 4),
                              bytes=self.bytes_moved, error=self.error)


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

    def record(self) -> PlanRunRecord:
        """The run as the job status serves it (protocol.ps_status)."""
        return PlanRunRecord(ok=bool(self.ok), seconds=round(self.seconds, 4), bytes_moved=self.bytes_moved,
                             max_concurrency=self.max_concurrency, error=self.error,
                             ops=[self.timings[o].record() for o in self.plan.order if o in self.timings],
                             plan=self.plan.to_json())


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

class AmPlanRuntime:
    """`PlanRuntime` over the PS AM's reconfiguration steps (appmaster.ps.reconfiguration).

    Runs while the BSP loop trains (plans start from an epoch-boundary hook, as a background task):
    model moves overlap an epoch (whose end waits for them), input splits are staged alongside an
    epoch and change hands at the next boundary, so no mini-batch is trained twice or skipped. It
    shares the job's split ledger with EPS, so both kinds of change see the same datasets.
    `nodes`: where added executors start (a placement directive's nodes; empty: anywhere).
    """

    def __init__(self, steps: Reconfiguration, block_bytes: Callable[[], float]) -> None:
        self.steps = steps
        self.training = steps.training
        self.block_bytes = block_bytes            # bytes of one model block (for the bytes moved)
        self.nodes: tuple[str, ...] = ()
        self._became_worker: dict[str, asyncio.Event] = {}

    def _record(self, op: str, n: int) -> ElasticOpRecord:
        w, s = self.training.membership.shape()
        return ElasticOpRecord(op, n, time.time(), self.training.loop.epochs_done, w, s)

    def abort(self) -> None:
        self.steps.aborted.set()
        for ev in self._became_worker.values():
            ev.set()

    def reset(self) -> None:
        self.steps.aborted.clear()
        # Keep only the events of executors that are workers now (set ones that still mean it).
        ledger = self.steps.splits()
        self._became_worker = {e: ev for e, ev in self._became_worker.items() if e in ledger.active and ev.is_set()}

    # -- the four operations -------------------------------------------------------------------
    async def add(self, role: Role, n: int) -> list[str]:
        prole = PoolRole(role.value)
        new = await self.steps.launch(prole, n, self._record("cruise_add", n), self.nodes)
        if prole is PoolRole.WORKER:
            ledger = self.steps.splits()
            for e in new:
                ledger.add_worker(e.executor_id)
                self._became_worker.setdefault(e.executor_id, asyncio.Event()).set()
        else:
            self.training.membership.add_servers(new)
            self.training.placement.refresh_server_blocks()
        return [e.executor_id for e in new]

    async def delete(self, executor: str) -> None:
        steps = self.steps
        rec = steps.executor(executor)
        ledger = steps.splits()
        if executor in ledger.active:
            ledger.remove_worker(executor)           # refuses while it still has active splits
            steps.sync_workers_with_ledger()
        self.training.membership.remove_servers([executor])
        await self.training.placement.forget([executor])   # refuses while it still owns model blocks
        await steps.wait_boundary()                  # no worker request in flight to it (see EPS's remove)
        await steps.retire([rec], self._record("cruise_delete", 1))

    async def switch(self, executor: str, role: Role) -> None:
        rec = self.steps.executor(executor)
        await self.steps.switch_role(rec, PoolRole(role.value))
        if role is Role.SERVER:
            self._became_worker.pop(executor, None)
        else:
            self._became_worker.setdefault(executor, asyncio.Event()).set()

    async def move(self, kind: BlockKind, blocks: Sequence[int], src: str, dst: str, src_leaving: bool) -> int:
        if kind is BlockKind.MODEL:
            return await self._move_model(list(blocks), src, dst)
        return await self._move_input(list(blocks), src, dst, src_leaving)

    async def _move_model(self, blocks: list[int], src: str, dst: str) -> int:
        rec = self._record("cruise_move", len(blocks))
        await self.steps.move_model_blocks(rec, [Transfer(b, src, dst) for b in blocks])
        return int(len(blocks) * self.block_bytes())

    async def _move_input(self, blocks: list[int], src: str, dst: str, src_leaving: bool) -> int:
        steps = self.steps
        ledger = steps.splits()
        rec = self._record("cruise_move", len(blocks))
        # The destination may be a server switching to worker in this plan: the data is staged
        # meanwhile (any executor can hold it), the hand-over waits until it is a worker.
        inactive = set(ledger.inactive.get(dst, ()))
        transfers = [Transfer(b, src, dst, reactivate=b in inactive) for b in blocks]
        await steps.stage_splits(rec, transfers)
        if dst not in ledger.active:
            ev = self._became_worker.setdefault(dst, asyncio.Event())
            await asyncio.wait_for(ev.wait(), steps.launch_timeout_s)
            if steps.aborted.is_set() or dst not in ledger.active:
                await steps.discard_staged(transfers)
                raise RuntimeError(f"{dst} did not become a worker")

        async def handover() -> None:
            try:
                await steps.commit_splits(rec, transfers, keep_inactive=not src_leaving)
            finally:
                steps.sync_workers_with_ledger()

        await steps.at_boundary(handover)
        return int(rec.bytes_sent)

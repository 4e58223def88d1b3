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
from functools import partial
from typing import Any, Awaitable, Callable, Iterable, Mapping, Optional, Sequence

from protocol.internal_api import NodePlacement, counts_on_nodes
from protocol.ps_job_spec import PSJobSpec
from protocol.shape_history import EpsChange

from .boundary_scheduler import TrainingNotRunning
from .directives import Shape
from .eps_decisions import Transfer, balance_onto, drain, pick_leaving, pick_leaving_off, placement_moves
from .eps_records import ElasticBusy, ElasticOpError, ElasticOpFailed, ElasticOpRecord
from .executor_pool import ExecutorRecord, Role
from .job import JobPhase
from .reconfiguration import Reconfiguration

log = logging.getLogger(__name__)

HISTORY_LIMIT = 100

__all__ = ["ElasticBusy", "ElasticOpError", "ElasticOpFailed", "ElasticOpRecord", "ElasticOps"]

Step = Callable[[ElasticOpRecord, int], Awaitable[None]]


class ElasticOps:
    """EPS's add / remove of workers and servers for one PS job (see the module doc).

    Reachable as `PSApplicationMaster.elastic`. Every call returns an ElasticOpRecord (also kept in
    `history`) or raises ElasticOpError / ElasticBusy. Built from the job's reconfiguration steps.
    """

    mode = "eps"

    def __init__(self, spec: PSJobSpec, steps: Reconfiguration, phase: Callable[[], JobPhase], *,
                 on_start: Callable[[], None] | None = None,
                 on_record: Callable[[EpsChange], None] | None = None,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.spec = spec
        self.steps = steps
        self.training = steps.training
        self.phase = phase
        self.wall_clock = wall_clock
        # The master's hooks: "a change started" (the shape report says changing) and "a change
        # ended" (its shape history).
        self.on_start = on_start
        self.on_record = on_record
        self.history: list[ElasticOpRecord] = []
        self.current: ElasticOpRecord | None = None

    # -- the four functions ------------------------------------------------------------------
    async def add_workers(self, n: int) -> ElasticOpRecord:
        return await self._one("add_workers", Role.WORKER, n, +1, self._add_workers)

    async def add_servers(self, n: int) -> ElasticOpRecord:
        return await self._one("add_servers", Role.SERVER, n, +1, self._add_servers)

    async def remove_workers(self, n: int) -> ElasticOpRecord:
        return await self._one("remove_workers", Role.WORKER, n, -1, self._remove_workers)

    async def remove_servers(self, n: int) -> ElasticOpRecord:
        return await self._one("remove_servers", Role.SERVER, n, -1, self._remove_servers)

    async def scale(self, workers: int = 0, servers: int = 0, nodes: tuple[str, ...] = ()) -> list[ElasticOpRecord]:
        """A relative change of both roles (POST /scale, `elastane ps scale`): removals first (they
        free resources), then additions, each pair concurrently; validated as a whole before
        anything starts. With `nodes`, added executors start on those nodes only."""
        for name, d in (("workers", workers), ("servers", servers)):
            if not _is_count(d):
                raise ElasticOpError(f"{name} must be a signed integer change, got {d!r}")
        if workers == 0 and servers == 0:
            raise ElasticOpError("nothing to change: give workers and/or servers as +N or -N")
        self._check_now()
        w, s = self.training.membership.shape()
        self._check_shape(w + workers, s + servers)
        plan: list[tuple[str, int, Step]] = []
        # With `nodes` (a directive's placement), the executors removed are those off the nodes
        # first: they would have to move there otherwise (reshape's relocate), needing room first.
        if servers < 0:
            plan.append(("remove_servers", servers, partial(
                self._remove_servers, leaving=self._leaving(self.training.membership.servers, -servers, nodes))))
        if workers < 0:
            plan.append(("remove_workers", workers, partial(
                self._remove_workers, leaving=self._leaving(self.training.membership.workers, -workers, nodes))))
        if servers > 0:
            plan.append(("add_servers", servers, partial(self._add_servers, nodes=nodes)))
        if workers > 0:
            plan.append(("add_workers", workers, partial(self._add_workers, nodes=nodes)))
        async with self.steps.exclusive(f"scale workers {workers:+d}, servers {servers:+d}"):
            # The two roles' changes are independent (servers hand over model blocks, workers input
            # splits), so each pair runs concurrently: the removals' transfers and clock-boundary
            # waits overlap, as do the additions' container launches. Removals go first: they free
            # the resources an addition may need.
            removals = await _all_of(self._run(op, abs(d), fn) for op, d, fn in plan if d < 0)
            additions = await _all_of(self._run(op, d, fn) for op, d, fn in plan if d > 0)
            return list(removals) + list(additions)

    @staticmethod
    def _leaving(members: list[ExecutorRecord], n: int, nodes: tuple[str, ...]) -> list[ExecutorRecord] | None:
        """The executors to remove for a change limited to `nodes` (None: the remover picks)."""
        if not nodes:
            return None
        ids = set(pick_leaving_off([(e.executor_id, e.container.node_id) for e in members], n, nodes))
        return [e for e in members if e.executor_id in ids]

    async def reshape(self, target: Shape, nodes: tuple[str, ...] = (),
                      placement: Sequence[NodePlacement] = ()) -> list[ElasticOpRecord]:
        """Carry the job to `target` workers and servers (an RM directive); `nodes`: where added
        executors go, and the only nodes the job may keep executors on (executors elsewhere move
        there: a replacement starts on an allowed node, takes over their blocks or splits, and
        they leave). `placement` (per node, how many of each role): exactly that, see `place`."""
        if placement:
            return await self.place(target, placement)
        w, s = self.training.membership.shape()
        out: list[ElasticOpRecord] = []
        if (target.workers, target.servers) != (w, s):
            out += await self.scale(target.workers - w, target.servers - s, nodes)
        if nodes:
            out += await self.relocate(nodes)
        return out

    async def place(self, target: Shape, placement: Sequence[NodePlacement]) -> list[ElasticOpRecord]:
        """Carry the job live to a per-node placement: on each node exactly its workers and servers,
        none elsewhere (Harmony's one worker + one server on every node of a group). Per role, the
        executors a node lacks start there (one strict ask per node), then the surplus ones (off the
        placement's nodes, or more than a node's count) leave, their blocks and splits moving to
        the rest as EPS's remove does; both roles' additions run concurrently, then both roles'
        removals. Adding first keeps a job that moves every executor training throughout."""
        by_role = {role: counts_on_nodes(placement, role) for role in Role}
        if (sum(by_role[Role.WORKER].values()), sum(by_role[Role.SERVER].values())) != (target.workers, target.servers):
            raise ElasticOpError(f"the placement {[(p.node, p.workers, p.servers) for p in placement]} does not "
                                 f"add up to {target.workers} workers and {target.servers} servers")
        self._check_now()
        self._check_shape(target.workers, target.servers)
        plan: list[tuple[Role, list[ExecutorRecord], dict[str, int]]] = []
        for role, members in ((Role.SERVER, self.training.membership.servers),
                              (Role.WORKER, self.training.membership.workers)):
            ids, adds = placement_moves([(e.executor_id, e.container.node_id) for e in members], by_role[role])
            leaving = set(ids)
            plan.append((role, [e for e in members if e.executor_id in leaving], adds))
        if not any(leaving or adds for _, leaving, adds in plan):
            return []
        adders = {Role.SERVER: self._add_servers, Role.WORKER: self._add_workers}
        removers = {Role.SERVER: self._remove_servers, Role.WORKER: self._remove_workers}
        async with self.steps.exclusive(f"place {sorted((p.node, p.workers, p.servers) for p in placement)}"):
            additions = await _all_of((
                self._run(f"place_{role.value}s_add", sum(adds.values()), partial(adders[role], per_node=adds))
                for role, _, adds in plan if adds))
            removals = await _all_of((
                self._run(f"place_{role.value}s_remove", len(leaving), partial(removers[role], leaving=leaving))
                for role, leaving, _ in plan if leaving))
        return list(additions) + list(removals)

    async def relocate(self, nodes: tuple[str, ...]) -> list[ElasticOpRecord]:
        """Move every executor that runs outside `nodes` onto them, keeping the shape: per role, add
        as many executors on `nodes` as run elsewhere, then remove those (their blocks and splits
        move to the newcomers, as EPS's remove does)."""
        allowed = set(nodes)
        out: list[ElasticOpRecord] = []
        for role, members in ((Role.SERVER, self.training.membership.servers),
                              (Role.WORKER, self.training.membership.workers)):
            away = [e for e in members if e.container.node_id not in allowed]
            if not away:
                continue
            self._check_now()
            adder, remover = ((self._add_servers, self._remove_servers) if role is Role.SERVER
                              else (self._add_workers, self._remove_workers))
            op = f"relocate_{role.value}s"
            async with self.steps.exclusive(f"{op} to {sorted(allowed)}"):
                out.append(await self._run(f"{op}_add", len(away), partial(adder, nodes=nodes)))
                out.append(await self._run(f"{op}_remove", len(away), partial(remover, leaving=away)))
        return out

    # -- checks ------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        """Whether a change is under way (the shape report's `changing`)."""
        return self.steps.busy

    changing = running

    def limits(self) -> dict[str, int]:
        """The most workers / servers this job can have: its max_workers / max_servers, and never
        more workers than input splits or servers than model blocks (one would have nothing to
        do), which is the only bound when the job sets no maximum."""
        splits = self.steps.split_count() if self.training.membership.workers else 0
        workers = min(self.spec.max_workers or splits, splits) if splits else (self.spec.max_workers or self.spec.workers)
        servers = min(self.spec.max_servers or self.spec.num_blocks, self.spec.num_blocks)
        return {"workers": workers, "servers": servers, "min_workers": 1, "min_servers": 1}

    def _check_now(self) -> None:
        if self.steps.busy:
            cur = self.current
            raise ElasticBusy(f"another change is running ({cur.op} {cur.requested})" if cur
                              else f"another change is running ({self.steps.current})")
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
                                 f"{self.steps.split_count()} input splits)")
        if servers > lim["servers"]:
            raise ElasticOpError(f"{servers} servers is more than this job's maximum of {lim['servers']} "
                                 f"(max_servers {self.spec.max_servers or 'unset'}, "
                                 f"{self.spec.num_blocks} model blocks)")

    async def _one(self, op: str, role: Role, n: int, sign: int, fn: Step) -> ElasticOpRecord:
        if not _is_count(n) or n < 1:
            raise ElasticOpError(f"{op}: n must be a positive integer, got {n!r}")
        delta = sign * n
        self._check_now()
        w, s = self.training.membership.shape()
        if role is Role.WORKER:
            w += delta
        else:
            s += delta
        self._check_shape(w, s)
        async with self.steps.exclusive(f"{op}({n})"):
            return await self._run(op, n, fn)

    async def _run(self, op: str, n: int, fn: Step) -> ElasticOpRecord:
        w, s = self.training.membership.shape()
        rec = ElasticOpRecord(op, n, self.wall_clock(), self.training.loop.epochs_done, w, s)
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
            rec.workers_after, rec.servers_after = self.training.membership.shape()
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

    # -- servers -----------------------------------------------------------------------------
    async def _add_servers(self, rec: ElasticOpRecord, n: int, nodes: tuple[str, ...] = (),
                           per_node: Optional[Mapping[str, int]] = None) -> None:
        steps, membership, placement = self.steps, self.training.membership, self.training.placement
        new = await steps.launch(Role.SERVER, n, rec, nodes, per_node)
        current = membership.server_ids()
        moves = balance_onto({s: placement.blocks_of(s) for s in current}, current, [e.executor_id for e in new])
        # In the server list from now on: they answer the objective (0 until their blocks land).
        membership.add_servers(new)
        try:
            with rec.timed("move_blocks"):
                await steps.move_model_blocks(rec, moves)
        except BaseException:
            # A new server that received nothing leaves again; one that holds blocks serves them.
            idle = [e for e in new if not placement.blocks_of(e.executor_id)]
            membership.remove_servers(e.executor_id for e in idle)
            await steps.retire(idle, rec, released=False)
            raise
        rec.epoch_switched = self.training.loop.epochs_done + 1

    async def _remove_servers(self, rec: ElasticOpRecord, n: int, leaving: list[ExecutorRecord] | None = None) -> None:
        steps, placement = self.steps, self.training.placement
        servers = self.training.membership.servers
        ids = [e.executor_id for e in leaving] if leaving else pick_leaving([s.executor_id for s in servers], n)
        remaining = [s.executor_id for s in servers if s.executor_id not in ids]
        moves = drain({s: placement.blocks_of(s) for s in ids + remaining}, ids, remaining)
        gone = [s for s in servers if s.executor_id in ids]
        with rec.timed("move_blocks"):
            await steps.move_model_blocks(rec, moves, drop=gone)
            await placement.forget(s.executor_id for s in gone)     # dependency update: out of every server list
        rec.epoch_switched = self.training.loop.epochs_done + 1
        # Barrier 3 only at a clock boundary: a worker's request routed by its old table before
        # the broadcast reached it may still be on its way to a leaving server (which answers it
        # with a redirect); stopping that server now would fail the request and the worker's clock.
        with rec.timed("boundary"):
            await steps.wait_boundary()
        with rec.timed("retire"):
            await steps.retire(gone, rec)

    # -- workers -----------------------------------------------------------------------------
    async def _add_workers(self, rec: ElasticOpRecord, n: int, nodes: tuple[str, ...] = (),
                           per_node: Optional[Mapping[str, int]] = None) -> None:
        steps, membership = self.steps, self.training.membership
        ledger = steps.splits()
        new = await steps.launch(Role.WORKER, n, rec, nodes, per_node)
        for e in new:
            ledger.add_worker(e.executor_id)
        current = membership.worker_ids()
        transfers = balance_onto(ledger.holdings(), current, [e.executor_id for e in new])

        async def switch() -> None:
            try:
                await steps.commit_splits(rec, transfers, keep_inactive=True)
            finally:
                # The clock list: the new workers that hold splits train from the next clock, in
                # the running epoch (even if some transfer failed: their splits must be trained).
                membership.add_workers(e for e in new if ledger.active_of(e.executor_id))
                rec.epoch_switched = self.training.loop.epochs_done

        try:
            with rec.timed("stage_splits"):
                await steps.stage_splits(rec, transfers)
            with rec.timed("boundary"):
                _, lost = await steps.at_boundary(switch)
            rec.training_time_lost_s += lost
        except BaseException:
            # Only a new worker that got no split can go again.
            idle = [e for e in new if not ledger.active_of(e.executor_id)]
            for e in idle:
                ledger.remove_worker(e.executor_id)
            await steps.retire(idle, rec, released=False)
            await steps.discard_staged(transfers)
            raise
        finally:
            self._refresh_worker_records()

    async def _remove_workers(self, rec: ElasticOpRecord, n: int, leaving: list[ExecutorRecord] | None = None) -> None:
        steps, membership = self.steps, self.training.membership
        ledger = steps.splits()
        workers = membership.workers
        ids = [e.executor_id for e in leaving] if leaving else pick_leaving([w.executor_id for w in workers], n)
        remaining = [w.executor_id for w in workers if w.executor_id not in ids]
        transfers: list[Transfer] = drain(ledger.holdings(), ids, remaining, ledger.inactive_holdings())
        gone: list[ExecutorRecord] = []

        async def switch() -> None:
            try:
                await steps.commit_splits(rec, transfers, keep_inactive=False)
            finally:
                # Only a worker whose splits all moved leaves the clock list; one that still has
                # some (a failed transfer) keeps training them.
                gone.extend(w for w in workers if w.executor_id in ids and not ledger.active_of(w.executor_id))
                membership.remove_workers(w.executor_id for w in gone)
                rec.epoch_switched = self.training.loop.epochs_done

        try:
            with rec.timed("stage_splits"):
                await steps.stage_splits(rec, transfers)
            with rec.timed("boundary"):
                _, lost = await steps.at_boundary(switch)
            rec.training_time_lost_s += lost
        except BaseException:
            await steps.discard_staged(transfers)
            raise
        finally:
            for w in gone:
                ledger.remove_worker(w.executor_id)
            self._refresh_worker_records()
            with rec.timed("retire"):
                await steps.retire(gone, rec)

    def _refresh_worker_records(self) -> None:
        ledger = self.steps.splits()
        for w in self.training.membership.workers:
            if w.executor_id in ledger.active:
                w.blocks = ledger.active_of(w.executor_id)

    # -- status ------------------------------------------------------------------------------
    def status_json(self) -> dict[str, Any]:
        """What the AM's status shows: whether a change runs, the shape history, the datasets."""
        loop = self.training.loop
        started = self.steps.ledger_ready
        return {"running": self.running, "current": self.current.to_json() if self.current else None,
                "workers": self.training.membership.worker_ids(),
                "servers": self.training.membership.server_ids(),
                "minibatches_applied": loop.minibatches_applied,
                "minibatches_run": loop.minibatches_run,
                "audit_mismatches": list(loop.audit_mismatches),
                "history": [r.to_json() for r in self.history],
                "limits": self.limits() if started else None,
                "datasets": self.steps.splits().to_json() if started else None}


async def _all_of(ops: Iterable[Awaitable[ElasticOpRecord]]) -> list[ElasticOpRecord]:
    """Run `ops` concurrently and wait for every one before raising the first error: a role's
    change that fails must not end the change (freeing its exclusive slot) while the other role's
    still runs unguarded, retiring executors beside a checkpoint or the next change."""
    results = await asyncio.gather(*ops, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return [r for r in results if not isinstance(r, BaseException)]


def _is_count(n: Any) -> bool:
    return isinstance(n, int) and not isinstance(n, bool)

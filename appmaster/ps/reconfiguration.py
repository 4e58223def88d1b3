"""The reconfiguration layer: the steps every reshaping of a running PS job is made of.

The PS-job controller's planners (appmaster.ps.controller.planners: EPS, the kill-based restart,
Cruise plans, recovery, Harmony's suspension) issue step instructions; the AM's interpreter
(appmaster.ps.runtime.interpreter) carries each out with these primitives. They hold the job's
split ledger; which change runs when is the controller's (its one change slot and rule table), so
nothing here guards against two changes at once.

The steps and their contract:

    start_executors(role, n, nodes) / start_placed(role, {node: n})
                                 containers and executors in them, not yet part of the job.
                                 Asks on exactly `nodes` when given (locality is not relaxed). All or
                                 nothing: on failure the ask is withdrawn and what started is retired.
    join(executors, role)        bind new executors to the app (a worker: with no splits yet) and,
                                 meanwhile, register their addresses with every executor (EPS barrier 1).
    retire(executors)            stop executors that left the job and give their containers back
                                 (EPS barrier 3); their exits are expected, not failures. The caller
                                 makes sure no request is still on its way to them (wait_boundary).
    move_model_blocks(moves)     server-to-server migration with the store's two-step protocol,
                                 alongside the running epoch, whose end waits for it.
    stage_splits(transfers)      worker-to-worker input data, alongside the running epoch.
    commit_splits(transfers)     at a clock boundary: the splits' worker-local state follows (with its
                                 place in the epoch) and the ledger records the new holders.
    switch_role(executor, role)  worker <-> server in place (it holds nothing of its old role).
    wait_boundary()              the next clock boundary (every worker flushed).
    at_boundary(fn) / overlap_epoch(fn)   run a composite step at those points (boundary_scheduler).
    checkpoint(epoch, ...)       every server block to the AM's durable dir (appmaster.ps.checkpoints).
    restore(directory, servers)  those blocks back onto (new) servers.
    pause() / resume()           stop training at the next clock boundary / let it run again.

Exactly-once: model blocks move with the store's protocol (every update reaches a block once, at
the source before the snapshot or at the destination after); input splits change hands only at a
clock boundary, while no worker trains, carrying their place in the epoch.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, Mapping, Optional, Sequence, TypeVar

from protocol import executor_ops as ops
from protocol.checkpoint_manifest import JobCheckpoint, JobRecord
from protocol.ps_status import CheckpointInfo
from protocol.records import Resource
from psruntime.apps.base import AnyPSApp, PSApp

from ..am_client import ApplicationMaster
from .checkpoints import Checkpointer
from .eps_datasets import SplitLedger
from .eps_decisions import Transfer, group_by_route
from .eps_records import ElasticOpFailed, ElasticOpRecord
from .eps_split_transfers import SplitTransmitter
from .runtime.executor_pool import ExecutorRecord, ExecutorState, Role, by_index
from .parameter_assignment import checkpoint_block_sizes
from .training import Training

log = logging.getLogger(__name__)

LAUNCH_TIMEOUT_S = 120.0
T = TypeVar("T")


def keeps_worker_state(app: AnyPSApp) -> bool:
    """Whether the app keeps training state on the workers (it initialises per-block local state,
    as NMF and LDA do): checkpoints then hold that state too, and a restart puts it back."""
    return type(app).init_block is not PSApp.init_block


class LaunchFailed(ElasticOpFailed):
    """New executors did not start (no containers in time, or they exited before announcing);
    `started`: those that did, kept (a start that keeps a short start), else none."""

    def __init__(self, message: str, started: Sequence["ExecutorRecord"] = ()) -> None:
        super().__init__(message)
        self.started = list(started)


class Reconfiguration:
    """The reconfiguration steps over one PS job's training parts (see the module doc)."""

    def __init__(self, am: ApplicationMaster, training: Training, checkpointer: Checkpointer, resource: Resource,
                 retiring: set[str], started: Callable[[], bool], launch_timeout_s: float = LAUNCH_TIMEOUT_S) -> None:
        self.am = am
        self.training = training
        self.checkpointer = checkpointer
        self.resource = resource
        # Containers stopped on purpose: the master treats their exits as expected.
        self.retiring = retiring
        self.started = started                      # whether training has begun (partitions exist)
        self.launch_timeout_s = launch_timeout_s
        self.transmitter = SplitTransmitter(training.rpc, training.pool, training.loop.boundaries)
        self._ledger: Optional[SplitLedger] = None

    # -- what the job holds ----------------------------------------------------------------------
    def splits(self) -> SplitLedger:
        """EPS's two-dataset ledger, built from the workers' partitions once training has begun
        (before that the partitions are not generated yet)."""
        if self._ledger is not None:
            return self._ledger
        ledger = SplitLedger()
        for w in self.training.membership.workers:
            ledger.add_worker(w.executor_id, w.blocks)
        if self.started():
            self._ledger = ledger
        return ledger

    def adopt_ledger(self, active: dict[str, list[int]], inactive: dict[str, list[int]]) -> None:
        """The split ledger of executors taken over from a failed attempt (as its record says and
        the workers confirmed; appmaster.ps.attempt_takeover)."""
        self._ledger = SplitLedger(active={w: set(s) for w, s in active.items()},
                                   inactive={w: set(inactive.get(w, [])) for w in active})

    @property
    def ledger_ready(self) -> bool:
        """Whether the split ledger exists (training has begun)."""
        return self._ledger is not None

    def split_count(self) -> int:
        return sum(len(s) for s in self.splits().active.values())

    def executor(self, executor_id: str) -> ExecutorRecord:
        rec = self.training.pool.executors.get(executor_id)
        if rec is None:
            raise ElasticOpFailed(f"no executor {executor_id}")
        return rec

    def sync_workers_with_ledger(self) -> None:
        """The BSP barrier = the workers holding active splits; each record lists its splits."""
        ledger = self.splits()
        self.training.membership.set_workers(self.executor(w) for w, s in ledger.active.items() if s)
        for w in ledger.active:
            self.executor(w).blocks = ledger.active_of(w)

    # -- executors in and out ----------------------------------------------------------------------
    async def start_executors(self, role: Role, n: int, nodes: Sequence[str] = (),
                              keep_short: bool = False) -> list[ExecutorRecord]:
        """Ask for n containers (on `nodes`, strictly, when given) and wait until the executors in
        them announce themselves; nothing bound yet (a restart places them afresh). On failure the
        ask is withdrawn and what started is retired -- or, with `keep_short`, kept and named in
        the LaunchFailed (a restart goes on with what came when that is the job's minimum)."""
        return await self._start(role, [(n, list(nodes))], keep_short)

    async def start_placed(self, role: Role, per_node: dict[str, int], keep_short: bool = False) -> list[ExecutorRecord]:
        """`start_executors` with a count per node (a policy's placement): one strict ask per node,
        all or nothing like the rest (unless `keep_short`)."""
        return await self._start(role, [(n, [node]) for node, n in per_node.items()], keep_short)

    async def _start(self, role: Role, wanted: list[tuple[int, list[str]]],
                     keep_short: bool = False) -> list[ExecutorRecord]:
        pool = self.training.pool
        before = set(pool.executors)
        wanted = [(n, nodes) for n, nodes in wanted if n > 0]
        asks = [self.am.add_ask(n, self.resource, tag=role.value, nodes=nodes or None, relax_locality=not nodes)
                for n, nodes in wanted]
        # Only the executors in this start's own containers (those granted to its asks): two starts
        # of one role may run at once (two lost workers, each replaced by its own step), and each
        # must neither take the other's executors nor retire them when it fails.
        mine = set(asks)
        try:
            return await pool.wait_new(role, before, sum(n for n, _ in wanted), self.launch_timeout_s,
                                       asks=mine)
        except BaseException as e:
            for ask_id in asks:
                try:
                    self.am.set_ask_count(ask_id, 0)
                except Exception:  # noqa: BLE001 - the ask may already be fully granted
                    pass
            new = [x for i, x in pool.executors.items() if i not in before and x.container.ask_id in mine]
            short = isinstance(e, (asyncio.TimeoutError, RuntimeError))
            if keep_short and short:
                # Those that announced themselves are kept (the rest, still launching, go): the
                # controller decides whether the job goes on with them (planners/relaunch.py).
                ready = [x for x in new if x.state is ExecutorState.READY]
                await self.retire([x for x in new if x not in ready], released=False)
                raise LaunchFailed(f"the new {role.value}s did not all start: {e}", ready) from None
            await self.retire(new, released=False)
            if short:
                raise LaunchFailed(f"the new {role.value}s did not start: {e}") from None
            raise

    async def join(self, new: Sequence[ExecutorRecord], role: Role) -> None:
        """Bind started executors to the app (a worker then joins EPS with no splits) and register
        their addresses with every executor (EPS barrier 1). The two go on at once: a newcomer
        takes the ownership table whether or not it is bound yet (its store reads the table it
        has when it first trains or serves), and nothing reaches it before this step ends; the
        step ends when both have (the first failure raised then)."""
        placement = self.training.placement

        async def bind() -> None:
            await placement.bind(list(new))
            if role is Role.WORKER:
                await self.training.rpc.send_all(list(new), ops.EpsJoin())

        outcomes = await asyncio.gather(bind(), placement.register(new), return_exceptions=True)
        for o in outcomes:
            if isinstance(o, BaseException):
                raise o

    async def retire_all(self, timeout_s: float) -> list[ExecutorRecord]:
        """Stop every live executor of the job and wait until their containers are reported gone."""
        old = self.training.pool.live()
        await self.retire(old, released=False)
        await self.training.pool.wait_exited(old, timeout_s)
        return old

    async def retire(self, executors: Sequence[ExecutorRecord], rec: Optional[ElasticOpRecord] = None,
                     released: bool = True) -> None:
        """Stop executors that left the job and give their containers back to the RM."""
        pool = self.training.pool
        for e in executors:
            self.retiring.add(e.container_id)
            pool.retire(e)
            self.training.placement.drop_address(e.executor_id)
        await self.training.rpc.shutdown(executors)
        await asyncio.gather(*(self.am.stop(e.container) for e in executors), return_exceptions=True)
        if released and rec is not None:
            rec.executors_removed += [e.executor_id for e in executors]
            rec.containers_released += [e.container_id for e in executors]

    async def switch_role(self, executor: ExecutorRecord, role: Role) -> None:
        """Switch `executor` to `role` in place; it must hold nothing of its old role."""
        membership = self.training.membership
        if executor.role is role:
            return
        if role is Role.SERVER:
            ledger = self.splits()
            if executor.executor_id in ledger.active:
                ledger.remove_worker(executor.executor_id)   # refuses while it still has active splits
            self.sync_workers_with_ledger()
            await self.training.rpc.send(executor, ops.SwitchRole(role="server"))
            executor.role, executor.blocks = Role.SERVER, []
            membership.add_servers([executor])
            self.training.placement.refresh_server_blocks()
        else:
            owned = self.training.placement.blocks_of(executor.executor_id)
            if owned:
                raise ElasticOpFailed(f"{executor.executor_id} still owns model blocks {owned[:5]}")
            membership.remove_servers([executor.executor_id])
            await self.training.rpc.send(executor, ops.SwitchRole(role="worker"))
            executor.role, executor.blocks = Role.WORKER, []
            await self.training.rpc.send(executor, ops.EpsJoin())
            self.splits().add_worker(executor.executor_id)

    # -- model blocks and input splits -------------------------------------------------------------
    async def move_model_blocks(self, rec: ElasticOpRecord, moves: Sequence[Transfer],
                                drop: Sequence[ExecutorRecord] = ()) -> None:
        """Server-to-server parameter transmission alongside an epoch, which ends once it is done;
        `drop` leave the server list within the same step (they own nothing by then)."""
        if not moves and not drop:
            return
        placement, membership = self.training.placement, self.training.membership
        rec.transfers += [t.record("block") for t in moves]

        async def step() -> int:
            await placement.move_routes(group_by_route(list(moves)))
            if drop:
                membership.remove_servers(d.executor_id for d in drop)
            placement.refresh_server_blocks()
            return len(moves)

        moved, lost = await self.overlap_epoch(step)
        rec.blocks_moved += moved
        rec.training_time_lost_s += lost

    async def stage_splits(self, rec: ElasticOpRecord, transfers: Sequence[Transfer]) -> None:
        """Worker-to-worker transmission of the splits' input data, alongside an epoch."""
        await self.transmitter.stage(rec, [t for t in transfers if not t.reactivate])

    async def discard_staged(self, transfers: Sequence[Transfer]) -> None:
        await self.transmitter.discard_staged(list(transfers))

    async def commit_splits(self, rec: ElasticOpRecord, transfers: Sequence[Transfer], keep_inactive: bool) -> None:
        """Hand the splits over (call at a clock boundary: inside `at_boundary`)."""
        await self.transmitter.commit(rec, list(transfers), self.splits(), keep_inactive)

    # -- clock points ----------------------------------------------------------------------------------
    async def overlap_epoch(self, fn: Callable[[], Awaitable[T]]) -> tuple[T, float]:
        return await self.training.loop.boundaries.overlap_epoch(fn)

    async def at_boundary(self, fn: Callable[[], Awaitable[T]]) -> tuple[T, float]:
        return await self.training.loop.boundaries.at_boundary(fn)

    async def wait_boundary(self) -> None:
        await self.training.loop.boundaries.clock_boundary()

    def pause(self) -> None:
        """Training stops at the next clock boundary (`ClockLoop.train` returns)."""
        self.training.loop.stop()

    def resume(self) -> None:
        self.training.loop.resume()

    # -- durable state -------------------------------------------------------------------------------
    async def checkpoint(self, epoch: int, job: JobRecord, clock: int = 0) -> CheckpointInfo:
        """Every server block of the job to the AM's durable dir -- and the workers' block state
        for an app that keeps training state on its workers (one consistent cut: call at a clock
        boundary)."""
        workers = self.training.membership.workers if keeps_worker_state(self.training.app) else []
        info = await self.checkpointer.write(epoch, self.training.placement.table, self.training.membership.servers,
                                             job, clock=clock, workers=workers)
        if not self.training.spec.push_log:
            return info
        # The workers' push logs start again at this cut (psruntime.push_log). Best effort: a worker
        # that missed it keeps its older start, and refuses a replay from this checkpoint.
        reset = ops.ResetPushLog(clock=self.training.loop.clocks_done)
        missed = [r for r in await asyncio.gather(*(self.training.rpc.send(w, reset)
                                                    for w in self.training.membership.workers),
                                                  return_exceptions=True) if isinstance(r, BaseException)]
        if missed:
            log.warning("%d worker(s) missed the push-log reset of checkpoint %s: %s", len(missed), info.dir,
                        missed[0])
        return info

    async def restore(self, directory: str, servers: Sequence[ExecutorRecord]) -> None:
        """The checkpoint's blocks onto `servers` (which own them in the current table)."""
        await self.checkpointer.restore(directory, by_index(servers), self.training.spec.num_blocks)

    async def continue_from_checkpoint(self, servers: list[ExecutorRecord], workers: list[ExecutorRecord],
                                       directory: str, record: JobCheckpoint, workers_kept: bool = False) -> float:
        """`restart_on` a checkpoint written by the job (`record`, its job.json): the clock
        loop's epoch count and counters go back to the checkpoint's (an older record without
        them keeps the loop's), and every input block to its recorded place in the epoch.
        Returns the restored objective."""
        loop = self.training.loop
        loop.continue_from(record.epoch, loop.iterations if record.iterations is None else record.iterations,
                           loop.clocks_done if record.clocks is None else record.clocks, record.minibatches_run)
        positions = {int(b): (int(p[0]), int(p[1])) for b, p in (record.positions or {}).items()}
        return await self.restart_on(servers, workers, directory, positions, workers_kept)

    async def release_servers(self, workers: list[ExecutorRecord], addresses: Sequence[str] = ()) -> None:
        """ReleaseServers (of `addresses`, else all) on the workers, each answered once its running
        step has ended; a worker that has not within the clock loop's reply deadline (alive but
        stuck) fails the step: the recovery then starts the workers afresh too (planners/recovery.py)."""
        loop = self.training.loop
        deadline_s = loop.reply_deadline.seconds(loop.slowest_clock_s)
        released = asyncio.ensure_future(self.training.rpc.send_all(workers, ops.ReleaseServers(servers=list(addresses))))
        deadline = asyncio.ensure_future(loop.deadline_sleep(deadline_s))
        try:
            await asyncio.wait({released, deadline}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            deadline.cancel()
            # Read before cancelling: a cancelled task is not `cancelled()` until the loop runs it,
            # and its `result()` meanwhile raises InvalidStateError, not the step's failure.
            timed_out = not released.done()
            if timed_out:
                released.cancel()
        if timed_out:
            raise ElasticOpFailed(f"the kept workers did not let go of the old servers within {deadline_s:g}s")
        released.result()

    async def rebuild_servers(self, lost: list[ExecutorRecord], new: list[ExecutorRecord], directory: str,
                              since: int) -> int:
        """Lost servers' blocks on their replacements (joined, owning nothing) without going back:
        the workers let go of the lost servers (the clock they were lost in ends), each lost
        server's blocks go to its replacement in the table, come back from the checkpoint in
        `directory` (its cut after `since` clocks), and every worker pushes its sums since that
        cut for their keys (psruntime.push_log); then every block the workers hold goes back to
        where the clock that was running began (it runs again: the surviving servers drop the
        pushes of it they applied, by push id). Returns the keys replayed."""
        training = self.training
        loop, placement, membership = training.loop, training.placement, training.membership
        workers = membership.workers
        await self.release_servers(workers, [x.address for x in lost])
        moves = {n.executor_id: placement.blocks_of(x.executor_id) for x, n in zip(lost, new)}
        await placement.reassign(moves, gone=[x.executor_id for x in lost])
        membership.remove_servers(x.executor_id for x in lost)
        membership.add_servers(new)
        placement.refresh_server_blocks()
        await self.restore(directory, new)
        blocks = sorted(b for bs in moves.values() for b in bs)
        replies = await training.rpc.call_all(workers, ops.ReplayPushes(blocks=blocks, clocks_done=loop.clocks_done,
                                                                        since=since), ops.ReplayPushesReply)
        await self._send_positions(workers, loop.clock_start_positions([b for w in workers for b in w.blocks]))
        await training.status.refresh()
        return sum(r.keys for r in replies)

    async def _send_positions(self, workers: list[ExecutorRecord], positions: Mapping[int, tuple[int, int]]) -> None:
        """Each worker gets the positions of the blocks it holds (`positions` names them all)."""
        await asyncio.gather(*(self.training.rpc.send(w, ops.SetPositions(
            positions={str(b): positions[b] for b in w.blocks})) for w in workers))

    async def restart_on(self, servers: list[ExecutorRecord], workers: list[ExecutorRecord], directory: str,
                         positions: Optional[dict[int, tuple[int, int]]] = None, workers_kept: bool = False) -> float:
        """Set the job up afresh on new executors with a checkpoint's model instead of the initial
        one: place the blocks, regenerate the workers' partitions, restore the blocks, put every
        input block back at its place in the epoch, and let training run; the epoch count,
        iterations and pacing carry on. Returns the restored objective. (The kill-based restart
        and a new AM attempt resuming the job are this step.)

        `workers_kept`: only the servers are new (a recovery from lost servers). The workers keep
        their input splits, inactive copies and ledger: they let go of the old servers
        (ReleaseServers), learn the new table, and every block they hold goes back to its place
        at the checkpoint (the start of the epoch where the checkpoint names none) -- no input is
        generated again."""
        training = self.training
        if workers_kept:
            await self.release_servers(workers)
            if training.spec.push_log:    # the model goes back to the checkpoint: what their logs hold is void
                await training.rpc.send_all(workers, ops.ResetPushLog(clock=training.loop.clocks_done, restored=True))
        else:
            self._ledger = None   # the partitions are generated afresh: the ledger follows the new workers
        # The barrier's members, in partition order; the checkpoint's block sizes let the parameter
        # assignment balance the servers (Optimus §5.3).
        await training.placement.place(servers, workers, checkpoint_block_sizes(directory, training.spec.num_blocks),
                                       bound=workers if workers_kept else ())
        if workers_kept:
            self.sync_workers_with_ledger()
            await self.restore(directory, servers)
        else:
            # The AM reads the checkpoint and sends each server its blocks over the data plane: the
            # servers may be on other hosts than the AM's dir.
            await asyncio.gather(*(training.placement.setup_worker(w, i, len(workers))
                                   for i, w in enumerate(workers)),
                                 self.restore(directory, servers))
        if keeps_worker_state(training.app):      # NMF's user factors, LDA's assignments: the same cut
            await self.checkpointer.restore_worker_state(directory, workers)
        if workers_kept:    # every held block, also those the checkpoint has at the epoch's start
            await self._send_positions(workers, {b: (positions or {}).get(b, (0, 0)) for w in workers for b in w.blocks})
        elif positions:     # the regenerated blocks continue their pass of the epoch where it stopped
            wire = {str(b): (e, row) for b, (e, row) in positions.items()}
            await training.rpc.send_all(workers, ops.SetPositions(positions=wire))
        training.loop.reset_positions(positions)
        restored = await training.evaluation.objective()
        training.loop.recheck_convergence()
        self.resume()
        await training.status.refresh()
        return restored

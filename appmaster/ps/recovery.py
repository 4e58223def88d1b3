"""A PS job survives lost executors: a lost worker is replaced and training goes on from the clock
it was lost in; after a lost server every executor is replaced and the job goes back to the latest
checkpoint.

Lost worker (BSP, only workers lost): the clock loop lets the other workers finish the running
clock and asks `replace_lost_workers` for replacements, a composition of the reconfiguration
layer's steps:

    start_executors  one new worker container per lost worker, anywhere the RM has room (a LOST
                     node is out of its pool)
    bind + eps_join  bound to the app, with a store client and no splits yet
    load_splits      it generates (or reads) the lost worker's active splits (the split ledger's),
    set_positions    at the positions they had when the lost clock began (the clock loop's)
    register         its address in the ownership broadcast; the ledger and the BSP barrier name
                     it instead of the lost worker

Then the replacement alone runs the lost clock again: the servers acknowledge without applying the
pushes the lost worker had made already (each mini-batch's pushes carry a push id, applied once
per block: psruntime.store.push_ids), so no update is lost or applied twice, and the epoch goes on with
the next clock for everyone; no epoch is redone. A worker lost between clocks (its exit reported,
or a call between clocks failed) is replaced the same way, at the next clock or before training
resumes, from where its splits stood. A replacement that fails (no container in time) falls back
to the checkpoint path below.

Lost server (or a server and workers lost together, a job training SSP, or a loss while a reshape
runs inside the clock): when an executor's container ends while the job trains (its process
died, it was killed for memory, or its node was lost) and it was not retired on purpose, the
master hands the loss here instead of failing the job, as long as the job has losses to spare
(`max_executor_failures`, YARN's max-failures) and a checkpoint to go back to (the master
checkpoints once right after setup, so there always is one). Recovery is a composition of the reconfiguration layer's steps:

    retire_all       every executor of the job stops (the survivors hold model blocks or input
                     positions that are ahead of the checkpoint, so none of them is kept)
    start_executors  as many servers and workers as the job had, anywhere the RM has room (a lost
                     node is out of the pool once the RM declares it LOST; a launch that fails on
                     a dead node is retried)
    restart_on       the checkpoint's model onto the new servers, every worker back at the
                     checkpoint's place in its epoch; epochs after the checkpoint are trained
                     again, so no update is lost or applied twice

The job's objective history is cut back to the checkpoint's epoch and goes on from there; each
recovery is in the shape history with what was lost, the checkpoint, the epochs redone and its
duration. What a user trades: a shorter `checkpoint_every_epochs` redoes less work after a loss
and costs one checkpoint (every server's blocks to the AM) per that many epochs.

Apps that keep training state on their workers (NMF's user factors, LDA's topic assignments) lose
some of it with a lost worker, so they always take the checkpoint path: their checkpoints hold the
workers' block state with the servers' model (the same cut), and restart_on puts both back.
"""
from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any, Callable, Optional

from protocol import executor_ops as ops
from protocol.checkpoint_manifest import decode_job_checkpoint
from protocol.ps_job_spec import PSJobSpec
from protocol.shape_history import (ExecutorCounts, RecoveryChange, ReplaceWorkerChange, ShapeChange,
                                     StragglerChange)
from psruntime.apps.base import AnyPSApp

from .checkpoints import JOB_MANIFEST
from .executor_pool import ExecutorRecord, Role
from .job import JobPhase

from .reconfiguration import LaunchFailed, Reconfiguration, keeps_worker_state

log = logging.getLogger(__name__)

LOSS_REPORT_WAIT_S = 30.0    # a failed call waits this long for its container's exit (a lost node: its expiry)
RELEASE_TIMEOUT_S = 90.0     # the old executors reported gone (a lost node's after the RM's expiry)
LAUNCH_TRIES = 3             # new executors: a launch onto a node that just died fails once


class ExecutorRecovery:
    """Counts a job's executor losses and carries out recoveries (see the module doc)."""

    def __init__(self, spec: PSJobSpec, app: AnyPSApp, steps: Reconfiguration, phase: Callable[[], JobPhase],
                 on_record: Callable[[ShapeChange], None], wall_clock: Callable[[], float] = time.time) -> None:
        self.spec = spec
        self.app = app
        self.steps = steps
        self.training = steps.training
        self.phase = phase
        self.on_record = on_record
        self.wall_clock = wall_clock
        self.losses: list[str] = []          # every executor loss of the job, in order
        self.pending: list[str] = []         # losses not recovered from yet
        self.lost: dict[str, ExecutorRecord] = {}     # description -> the executor it describes
        self.failures = 0                    # loss events: losses reported together count once
        self.recoveries = 0                  # loss events recovered from, either way
        self.replacements = 0                # lost workers replaced with no checkpoint
        self._reported = asyncio.Event()

    @property
    def enabled(self) -> bool:
        """Whether this job can be recovered at all (its app and its limit allow it)."""
        return self.spec.max_executor_failures > 0

    def why_not(self) -> Optional[str]:
        """Why a loss now cannot be recovered from (None: it can)."""
        if self.spec.max_executor_failures == 0:
            return "max_executor_failures is 0"
        if self.phase() is not JobPhase.TRAINING:
            return f"the job is {self.phase().value}, not training"
        if self.steps.checkpointer.last is None:
            return "no checkpoint to go back to yet"
        if self.failures >= self.spec.max_executor_failures:
            return (f"gave up after {self.failures + 1} executor failures "
                    f"(max_executor_failures {self.spec.max_executor_failures})")
        return None

    def on_lost(self, description: str, executor: Optional[ExecutorRecord] = None) -> Optional[str]:
        """An executor was lost (`description` names it and why). Returns None when the job will
        recover from it, else the diagnostics to fail the job with."""
        self.losses.append(description)
        if executor is not None:
            self.lost[description] = executor
        if self.pending:                     # the same event (e.g. a lost node's executors): one recovery
            self.pending.append(description)
            self._reported.set()
            return None
        why = self.why_not()
        if why is not None:
            return f"{why}; the last: {description}" if self.failures else description
        self.failures += 1
        if executor is not None and executor.role is Role.WORKER and not self._in_barrier(executor):
            # A worker that held no splits yet (an EPS addition before its commit) trained nothing:
            # nothing to replace; the change that was adding it fails on its own.
            log.warning("executor lost (failure %d of %d the job survives): %s; it held no input splits",
                        self.failures, self.spec.max_executor_failures, description)
            return None
        self.pending.append(description)
        self._reported.set()
        log.warning("executor lost (failure %d of %d the job survives): %s; %s", self.failures,
                    self.spec.max_executor_failures, description,
                    "going back to the latest checkpoint" if self.rollback_needed else "replacing it")
        return None

    def _in_barrier(self, worker: ExecutorRecord) -> bool:
        return self.training is None or worker.executor_id in self.training.membership.worker_ids()

    def _pending_executors(self) -> list[Optional[ExecutorRecord]]:
        return [self.lost.get(d) for d in self.pending]

    @property
    def rollback_needed(self) -> bool:
        """Whether the pending losses need the checkpoint path: a server (or an executor not known
        to be a worker) among them, or a job training SSP. Otherwise training goes on and the lost
        workers are replaced (module doc)."""
        return bool(self.pending) and not self._replaceable()

    def _replaceable(self) -> bool:
        executors = self._pending_executors()
        # A lost worker's block state (NMF, LDA) is only in the checkpoint: go back to it.
        return (self.spec.sync == "bsp" and bool(executors) and not keeps_worker_state(self.app)
                and all(e is not None and e.role is Role.WORKER for e in executors))

    async def _until_reported(self, done: Callable[[], bool], timeout_s: float) -> bool:
        """Wait up to `timeout_s`, re-checking `done` after every reported loss; its last answer."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not done():
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return False
            self._reported.clear()
            try:
                await asyncio.wait_for(self._reported.wait(), remaining)
            except asyncio.TimeoutError:
                pass
        return True

    async def _workers_reported(self, ids: set[str], timeout_s: float) -> bool:
        """Wait up to `timeout_s` until every worker in `ids` is reported lost; False if that does
        not happen, or a loss that needs the checkpoint path is reported meanwhile."""
        def settled() -> bool:
            pending = {e.executor_id for e in self._pending_executors() if e is not None}
            return self.rollback_needed or ids <= pending
        return await self._until_reported(settled, timeout_s) and not self.rollback_needed

    async def replace_lost_workers(self, lost: list[ExecutorRecord]) -> Optional[list[ExecutorRecord]]:
        """The clock loop's hook (appmaster.ps.clock_loop): `lost` workers' run_clock failed. Once
        their exits are reported, put a replacement in each one's place, its splits where they
        stood when the clock began; the loop then runs the clock again on them. None (the loop
        raises the failure and the master takes the checkpoint path) when the failure was not
        those workers' loss alone, a reshape holds the job's change slot, or the replacement
        failed."""
        if not await self._workers_reported({w.executor_id for w in lost}, LOSS_REPORT_WAIT_S):
            return None
        if self.steps.busy:
            log.warning("a worker was lost while %s runs: going back to the latest checkpoint", self.steps.current)
            return None
        try:
            async with self.steps.exclusive("recovery"):
                return await self._replace(lost, redo=True)
        except Exception as e:  # noqa: BLE001 - the checkpoint path is the fallback
            log.warning("replacing %s failed (%s): the job goes back to the latest checkpoint",
                        ", ".join(w.executor_id for w in lost), e)
            return None

    def _pending_workers(self) -> list[ExecutorRecord]:
        return [e for e in self._pending_executors() if e is not None]

    async def replace_straggler(self, worker: ExecutorRecord, why: str) -> Optional[ExecutorRecord]:
        """Optimus §5.2 (appmaster.ps.stragglers): put a new worker in a slow, live worker's place
        the way a lost worker is replaced between clocks (its splits where they stand), then retire
        the slow one. Called at an epoch end, while no clock runs. None, with nothing changed,
        where a lost worker would not be replaced either (SSP, an app keeping state on its workers,
        not training), while a reshape holds the job's change slot or a loss is pending; a
        replacement that fails leaves the straggler in place."""
        if (self.spec.sync != "bsp" or keeps_worker_state(self.app) or self.steps.busy or self.pending
                or self.phase() is not JobPhase.TRAINING):
            return None
        try:
            async with self.steps.exclusive("straggler"):
                new = await self._replace([worker], redo=False, mode="straggler", why=why)
                await self.steps.retire([worker])
        except Exception as e:  # noqa: BLE001 - a straggler is slow, not fatal: keep it
            log.warning("replacing straggler %s failed (%s); it stays", worker.executor_id, e)
            return None
        return new[0]

    async def _replace(self, lost: list[ExecutorRecord], redo: bool, mode: str = "replace_worker",
                       why: str = "") -> list[ExecutorRecord]:
        """Replace the lost workers (module doc); returns the replacements, in `lost`'s order.
        Their losses leave `pending` (another pending worker is replaced when its own clock fails).
        `mode` "straggler": the workers are slow, not lost (`replace_straggler`), `why` says how."""
        steps, training = self.steps, self.training
        loop = training.loop
        t0 = time.perf_counter()
        ids = {w.executor_id for w in lost}
        descriptions = [d for d in self.pending if (e := self.lost.get(d)) is not None and e.executor_id in ids]
        self.pending = [d for d in self.pending if d not in descriptions]
        workers, servers = training.membership.shape()
        kind = StragglerChange if mode == "straggler" else ReplaceWorkerChange
        record = kind(op="replace", time=self.wall_clock(), lost=descriptions if mode != "straggler" else [why],
                      workers=workers, servers=servers, epoch=loop.epochs_done, clock=loop.clocks_done,
                      clock_redone=redo, epochs_redone=0, before=ExecutorCounts(workers, servers),
                      after=ExecutorCounts(workers, servers), changed=False, error="")
        try:
            ledger = steps.splits()
            splits = [ledger.active_of(w.executor_id) for w in lost]
            new = await self._start(Role.WORKER, len(lost))
            try:
                for w in lost:          # no broadcast may wait on a dead address
                    training.placement.drop_address(w.executor_id)
                await training.placement.bind(new)
                await training.rpc.send_all(new, ops.EpsJoin())
                await asyncio.gather(*(self._take_over(old, rep, s) for old, rep, s in zip(lost, new, splits)))
                await training.placement.register(new)
            except BaseException:
                await steps.retire(new, released=False)
                raise
            for old, rep in zip(lost, new):
                ledger.replace_worker(old.executor_id, rep.executor_id)
            steps.sync_workers_with_ledger()
            record.replacements = {old.executor_id: rep.executor_id for old, rep in zip(lost, new)}
            record.nodes = [rep.container.node_id for rep in new]
            record.changed = True
        except BaseException as e:
            self.pending = descriptions + self.pending     # still to recover from (the checkpoint path)
            record.error = f"{type(e).__name__}: {e}"
            raise
        finally:
            record.seconds = record.duration_s = record.lost_s = round(time.perf_counter() - t0, 4)
            self.on_record(record)
        if mode == "straggler":
            log.info("replaced a straggler in %.2fs: %s", record.seconds, why)
            return new
        self.recoveries += 1
        self.replacements += len(new)
        log.info("replaced %s in %.2fs (%s)", "; ".join(descriptions), record.seconds,
                 "the lost clock runs again on the replacement" if redo else "training goes on where it stood")
        return new

    async def _take_over(self, old: ExecutorRecord, new: ExecutorRecord, splits: list[int]) -> None:
        """`new` generates `old`'s splits and puts them where they stood when the clock began."""
        rpc = self.training.rpc
        r = await rpc.call(new, ops.LoadSplits(blocks=splits), ops.WorkerSetupReply)
        new.data_bytes, new.partition = r.data_bytes, old.partition
        positions = self.training.loop.clock_start_positions(splits)
        await rpc.send(new, ops.SetPositions(positions={str(b): p for b, p in positions.items()}))

    async def loss_reported(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for a loss to be reported (a failed call to an executor usually
        comes before its container's exit reaches the AM); True if one is pending."""
        return await self._until_reported(lambda: bool(self.pending), timeout_s)

    async def recover(self) -> None:
        """Recover from the pending losses while training does not run: replace lost workers
        where they stood, or else replace every executor and continue from the latest checkpoint
        (module doc)."""
        async with self.steps.exclusive_when_free("recovery"):
            if self._replaceable():
                try:
                    await self._replace(self._pending_workers(), redo=False)
                    return
                except Exception as e:  # noqa: BLE001 - the checkpoint path is the fallback
                    log.warning("replacing lost workers failed (%s): going back to the latest checkpoint", e)
            await self._recover()

    async def _recover(self) -> RecoveryChange:
        steps, loop, metrics = self.steps, self.training.loop, self.training.metrics
        t0 = time.perf_counter()
        lost, self.pending = list(self.pending), []
        workers, servers = self.training.membership.shape()
        last = steps.checkpointer.last
        assert last is not None        # why_not() refused the loss otherwise
        manifest = decode_job_checkpoint((Path(last["dir"]) / JOB_MANIFEST).read_bytes())
        epoch_before = loop.epochs_done
        record = RecoveryChange(op="recover", time=self.wall_clock(), lost=lost, workers=workers, servers=servers,
                                checkpoint=last["dir"], epoch=manifest.epoch,
                                epochs_redone=epoch_before - manifest.epoch,
                                checkpoint_time=manifest.time, before=ExecutorCounts(workers, servers),
                                after=ExecutorCounts(workers, servers), changed=False, error="")
        try:
            await steps.retire_all(RELEASE_TIMEOUT_S)
            new_servers, new_workers = await asyncio.gather(self._start(Role.SERVER, servers),
                                                            self._start(Role.WORKER, workers))
            metrics.truncate_epochs(manifest.epoch)
            record.objective_restored = await steps.continue_from_checkpoint(new_servers, new_workers,
                                                                                last["dir"], manifest)
            self.lost.clear()
            record.changed = True
        except BaseException as e:
            record.error = f"{type(e).__name__}: {e}"
            raise
        finally:
            record.seconds = record.duration_s = record.lost_s = round(time.perf_counter() - t0, 4)
            self.on_record(record)
        self.recoveries += 1
        log.info("recovered from %s in %.2fs: %d workers, %d servers from the checkpoint of epoch %d "
                 "(%d epochs to redo)", "; ".join(lost), record.seconds, workers, servers, record.epoch,
                 record.epochs_redone)
        return record

    async def _start(self, role: Role, n: int) -> list[ExecutorRecord]:
        for attempt in range(1, LAUNCH_TRIES + 1):
            try:
                return await self.steps.start_executors(role, n)
            except LaunchFailed as e:
                if attempt == LAUNCH_TRIES:
                    raise
                log.warning("recovery: %s; trying again", e)
        raise AssertionError("unreachable")

    def status_json(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "max_executor_failures": self.spec.max_executor_failures,
                "failures": self.failures, "losses": list(self.losses), "recoveries": self.recoveries,
                "replacements": self.replacements}

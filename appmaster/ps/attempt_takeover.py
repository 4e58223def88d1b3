"""A new AM attempt takes over the executors of the attempt that failed: YARN's work-preserving AM
restart for a PS job (docs/internals.md, "AM recovery").

With keep-containers-across-application-attempts (on for PS jobs, rm/submission.py) the RM leaves
a failed attempt's executor containers running and hands them to the next attempt in its register
reply. The executors keep what training needs: the servers the model, the workers their input
splits, their worker state and each block's place in the epoch. What only the AM knew -- who
takes part in what order, the ownership table, the split ledger, the epochs done, the histories
and counters -- every attempt writes to the job's durable AM dir whenever it changes
(`HandoverWriter`: after the start, after every change, at every epoch's end) as an
`AttemptHandover` (protocol/attempt_handover.py).

`take_over` is the new attempt's side. It trusts the record only once the executors agree with
it: every recorded executor is among the containers handed over and answers; every executor
holds the recorded table version; servers own exactly the recorded blocks with no migration half
done; workers hold exactly the recorded splits with nothing staged. A change that was in flight
when the AM died leaves some executor disagreeing, and the take-over is refused
(`TakeOverRefused`): the master then stops every container handed over and the job resumes from
its latest checkpoint on new executors, as it did before take-overs existed
(appmaster.ps.job_resume). Once they agree, the clock the dead AM started is cut (EndClock) and
waited out, each input block's place is read from its worker, and with the exactly-once audit
on, the servers' count of applied mini-batches becomes the run count. Training goes on from
there: nothing is restored, regenerated or redone.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from protocol import executor_ops as ops
from protocol.attempt_handover import (HANDOVER_FILE, AttemptHandover, HandoverExecutor, decode_handover,
                                       encode_handover)
from protocol.checkpoint_manifest import JobRecord
from protocol.durable_storage import DurableDir
from protocol.errors import StateError
from psruntime.store.ownership_table import OwnershipTable
from psruntime.store.store_client import StoreClient, StoreClientError

from ..container_book import AmContainer
from .clock_loop import AUDIT_KEY
from .job_resume import restore_metrics
from .reconfiguration import Reconfiguration
from .runtime.executor_pool import ExecutorRecord, ExecutorState, Role
from .runtime.executor_rpc import ExecutorCallError
from .training import Training

log = logging.getLogger(__name__)

TAKEOVER_TIMEOUT_S = 15.0     # every executor answers (and the dead AM's last clock ends) within it


class TakeOverRefused(StateError, RuntimeError):
    """The executors handed over do not match the failed attempt's record (module doc)."""


@dataclass(frozen=True)
class TakenOver:
    """What a take-over found: the job's servers and workers (membership order), the handed-over
    containers no recorded executor runs in (the master releases them), each input block's place."""

    servers: list[ExecutorRecord]
    workers: list[ExecutorRecord]
    unused: list[AmContainer]
    positions: dict[int, tuple[int, int]]
    epochs_done: int


def handover_record(attempt_id: str, training: Training, steps: Reconfiguration,
                    job: JobRecord) -> Optional[AttemptHandover]:
    """The record of this attempt's job as it stands (None before its model is placed)."""
    placement = training.placement
    if not placement.placed:
        return None
    table = placement.table
    ledger = steps.splits()

    def entry(rec: ExecutorRecord, blocks: Iterable[int], inactive: Iterable[int] = ()) -> HandoverExecutor:
        return HandoverExecutor(executor_id=rec.executor_id, role="server" if rec.role is Role.SERVER else "worker",
                                container_id=rec.container_id, node=rec.container.node_id, address=rec.address,
                                blocks=sorted(blocks), inactive=sorted(inactive), partition=rec.partition)

    return AttemptHandover(
        attempt_id=attempt_id, written_at=time.time(),
        servers=[entry(s, table.blocks_owned_by(s.executor_id)) for s in training.membership.servers],
        workers=[entry(w, ledger.active.get(w.executor_id, ()), ledger.inactive.get(w.executor_id, ()))
                 for w in training.membership.workers],
        owners=list(table.owners), addresses=dict(table.addresses), table_version=table.version,
        epochs_done=training.loop.epochs_done, job=job)


class HandoverWriter:
    """Writes the latest record to the AM dir, one write at a time and off the event loop (the dir
    may be an object store). A record that comes while one is being written replaces any other
    waiting: the latest wins."""

    def __init__(self, am_dir: DurableDir) -> None:
        self.am_dir = am_dir
        self.written = 0
        self._pending: Optional[bytes] = None
        self._task: Optional[asyncio.Task[None]] = None

    def write(self, record: AttemptHandover) -> None:
        self._pending = encode_handover(record)
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        while self._pending is not None:
            data, self._pending = self._pending, None
            try:
                await asyncio.to_thread(self.am_dir.write_bytes, HANDOVER_FILE, data)
                self.written += 1
            except OSError as e:
                log.warning("could not write the attempt handover record: %s", e)

    async def close(self) -> None:
        """Wait for the writes under way (the last record reaches the dir)."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)


def read_handover(am_dir: DurableDir) -> Optional[AttemptHandover]:
    """The record an earlier attempt left, None when there is none or it does not decode."""
    try:
        return decode_handover(am_dir.read_bytes(HANDOVER_FILE))
    except OSError:
        return None
    except ValueError as e:      # msgspec's DecodeError / ValidationError are ValueErrors
        log.warning("the attempt handover record in %s is unusable: %s", am_dir, e)
        return None


async def take_over(record: AttemptHandover, handed: Sequence[AmContainer], training: Training,
                    steps: Reconfiguration, timeout_s: float = TAKEOVER_TIMEOUT_S) -> TakenOver:
    """Check the handed-over executors against `record` and make them this attempt's (module doc);
    TakeOverRefused when they do not match or do not answer within `timeout_s`."""
    by_container = {c.container_id: c for c in handed}
    members = [*record.servers, *record.workers]
    gone = [x for x in members if x.container_id not in by_container]
    if gone:
        raise TakeOverRefused("not handed over (ended with the attempt): " + ", ".join(
            f"{x.executor_id} in {x.container_id}" for x in gone))
    if len(record.owners) != training.spec.num_blocks:
        raise TakeOverRefused(f"the record's table has {len(record.owners)} blocks, the job {training.spec.num_blocks}")
    pool = training.pool
    recs: dict[str, ExecutorRecord] = {}
    for x in members:
        rec = pool.adopt(x.executor_id, Role(x.role), by_container[x.container_id], x.address)
        rec.blocks, rec.partition = list(x.blocks), x.partition
        recs[x.executor_id] = rec
    servers = [recs[x.executor_id] for x in record.servers]
    workers = [recs[x.executor_id] for x in record.workers]
    try:
        async with asyncio.timeout(timeout_s):
            positions = await _examine(record, servers, workers, training)
    except asyncio.TimeoutError:
        raise TakeOverRefused(f"the executors did not all answer within {timeout_s:g}s") from None
    except ExecutorCallError as e:
        raise TakeOverRefused(f"an executor did not answer: {e}") from None
    table = OwnershipTable(training.spec.num_blocks, list(record.owners),
                           {x.executor_id: x.address for x in members}, version=record.table_version)
    applied = None
    if training.spec.audit_updates:     # what the servers applied is what ran: nothing is in flight now
        try:
            async with asyncio.timeout(timeout_s):
                got = await StoreClient(table, training.placement.client).pull([AUDIT_KEY])
        except (asyncio.TimeoutError, ExecutorCallError, StoreClientError) as e:
            raise TakeOverRefused(f"the servers' audit count could not be read: {e}") from None
        applied = int(got[AUDIT_KEY][0]) if AUDIT_KEY in got else 0
    ended = [r.executor_id for r in recs.values() if r.state is not ExecutorState.READY]
    if ended:       # its container's completion came meanwhile
        raise TakeOverRefused(f"{', '.join(ended)} ended while being taken over")
    # From here on nothing can fail: the job is this attempt's.
    training.membership.set(servers, workers)
    training.placement.adopt(table)
    steps.adopt_ledger({x.executor_id: list(x.blocks) for x in record.workers},
                       {x.executor_id: list(x.inactive) for x in record.workers})
    loop = training.loop
    job = record.job
    restore_metrics(training.metrics, job)
    loop.continue_from(record.epochs_done, job.iterations or 0, job.clocks or 0,
                       applied if applied is not None else job.minibatches_run)
    loop.reset_positions(positions)
    loop.recheck_convergence()
    used = {x.container_id for x in members}
    log.info("took over %d servers and %d workers of %s at epoch %d (table version %d)", len(servers),
             len(workers), record.attempt_id, record.epochs_done, record.table_version)
    return TakenOver(servers, workers, [c for c in handed if c.container_id not in used], positions,
                     record.epochs_done)


async def _examine(record: AttemptHandover, servers: list[ExecutorRecord], workers: list[ExecutorRecord],
                   training: Training) -> dict[int, tuple[int, int]]:
    """The executors against the record (TakeOverRefused on any difference); then the dead AM's
    last clock cut and waited out, and every input block's place."""
    rpc = training.rpc
    statuses = await rpc.call_all([*servers, *workers], ops.Status(), ops.StatusReply)
    wrong: list[str] = []
    for rec, st in zip([*servers, *workers], statuses):
        if st.executor_id != rec.executor_id or st.role != rec.role.value:
            wrong.append(f"{rec.executor_id} at {rec.address} is {st.executor_id} ({st.role})")
        elif st.table_version != record.table_version:
            wrong.append(f"{rec.executor_id} holds table version {st.table_version}, the record {record.table_version}")
        elif st.incoming:
            wrong.append(f"{rec.executor_id} has blocks {st.incoming} half migrated")
    owned = {x.executor_id: x.blocks for x in record.servers}
    for rec, st in zip(servers, statuses):
        if sorted(st.blocks) != sorted(owned[rec.executor_id]):
            wrong.append(f"{rec.executor_id} owns blocks {sorted(st.blocks)}, the record {owned[rec.executor_id]}")
    await rpc.send_all(workers, ops.EndClock())
    datasets = await rpc.call_all(workers, ops.EpsDatasets(), ops.EpsDatasetsReply)
    held = {x.executor_id: x for x in record.workers}
    for rec, ds in zip(workers, datasets):
        x = held[rec.executor_id]
        if sorted(ds.active) != sorted(x.blocks) or ds.staged:
            wrong.append(f"{rec.executor_id} holds splits {sorted(ds.active)} (staged {ds.staged}), "
                         f"the record {x.blocks}")
    if wrong:
        raise TakeOverRefused("; ".join(wrong))
    replies = await rpc.call_all(workers, ops.Positions(settled=True), ops.PositionsReply)
    return {int(b): (int(e), int(row)) for r in replies for b, (e, row) in r.positions.items()}


__all__ = ["HandoverWriter", "TakeOverRefused", "TakenOver", "handover_record", "read_handover", "take_over"]

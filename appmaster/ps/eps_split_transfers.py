"""EPS's worker-to-worker data transmission as the AM drives it (EPS §3.1.2, §3.2, §3.3): the
senders stage their splits' input data at the destinations alongside an epoch, then at an epoch
boundary commit them -- the splits' worker-local state follows, the senders drop them from their
active datasets (keeping inactive copies when asked) and the ledger records what was done.

The executors' side is psruntime.eps.eps_worker_ops; the decisions are appmaster.ps.eps_decisions.
"""
from __future__ import annotations

import asyncio

from protocol import executor_ops as ops

from .boundary_scheduler import BoundaryScheduler
from .eps_datasets import SplitLedger
from .eps_decisions import Transfer, group_by_route
from .eps_records import ElasticOpFailed, ElasticOpRecord
from .runtime.executor_pool import ExecutorPool, ExecutorRecord
from .runtime.executor_rpc import ExecutorRpc


class SplitTransmitter:
    """Moves input splits between the job's workers over their control channel."""

    def __init__(self, rpc: ExecutorRpc, pool: ExecutorPool, boundaries: BoundaryScheduler) -> None:
        self.rpc = rpc
        self.pool = pool
        self.boundaries = boundaries

    def _worker(self, executor_id: str) -> ExecutorRecord:
        return self.pool.executors[executor_id]

    async def stage(self, rec: ElasticOpRecord, transfers: list[Transfer]) -> None:
        """Worker-to-worker transmission of the splits' input data, alongside an epoch."""
        if not transfers:
            return

        async def step() -> int:
            replies = await asyncio.gather(*(
                self.rpc.call(self._worker(src), ops.EpsSendData(splits=splits, dst_address=self._worker(dst).address),
                              ops.EpsSendDataReply)
                for (src, dst), splits in group_by_route(transfers).items()))
            return sum(r.bytes for r in replies)

        sent, lost = await self.boundaries.overlap_epoch(step)
        rec.bytes_sent += sent
        rec.training_time_lost_s += lost

    async def discard_staged(self, transfers: list[Transfer]) -> None:
        """Drop data staged for transfers that were abandoned (best effort: memory only)."""
        by_dst: dict[str, list[int]] = {}
        for t in transfers:
            if not t.reactivate:
                by_dst.setdefault(t.dst, []).append(t.item)
        await asyncio.gather(*(self.rpc.send(self._worker(d), ops.EpsDiscardStaged(splits=s))
                               for d, s in by_dst.items() if self._worker(d).address), return_exceptions=True)

    async def commit(self, rec: ElasticOpRecord, transfers: list[Transfer], ledger: SplitLedger,
                     keep_inactive: bool) -> None:
        """At the boundary: each sender sends its splits' state (the data is staged or inactive at
        the destination), drops them from its active dataset and keeps them inactive or not."""
        ledger.check(transfers)
        by_src: dict[str, list[Transfer]] = {}
        for t in transfers:
            by_src.setdefault(t.src, []).append(t)
        rec.transfers += [t.record("split") for t in transfers]

        async def one(src: str, ts: list[Transfer]) -> list[str]:
            reply = await self.rpc.call(self._worker(src), ops.EpsCommit(
                keep_inactive=keep_inactive,
                transfers=[ops.SplitHandover(split=t.item, dst_address=self._worker(t.dst).address,
                                             source="inactive" if t.reactivate else "staged") for t in ts]),
                ops.EpsCommitReply)
            done = set(reply.done)
            rec.bytes_sent += reply.bytes
            for t in ts:
                if t.item in done:
                    ledger.apply(t, keep_inactive and str(t.item) not in reply.not_kept)
                    if t.reactivate:
                        rec.splits_reactivated += 1
                    else:
                        rec.splits_moved += 1
            return [f"split {k}: {v}" for k, v in reply.failed.items()]

        failures = sum(await asyncio.gather(*(one(src, ts) for src, ts in by_src.items())), [])
        if failures:
            raise ElasticOpFailed("worker-to-worker transmission failed: " + "; ".join(failures))

"""Polls a PS job's executors for what they report about themselves: RSS, model bytes and blocks
(servers), the data plane's service counters (the optimizers' server measurements), and a
spilling worker's alpha and spilled bytes (Harmony)."""
from __future__ import annotations

import asyncio
from typing import Any, Iterable, Optional

from protocol import executor_ops as ops
from protocol.ps_status import SpillStatus

from .runtime.executor_pool import ExecutorPool, ExecutorRecord, ExecutorState, Role
from .runtime.executor_rpc import ExecutorRpc
from .metrics import JobMetrics


class StatusPoller:
    """One status round over every READY executor updates their records and the job's metrics."""

    def __init__(self, pool: ExecutorPool, rpc: ExecutorRpc, metrics: JobMetrics) -> None:
        self.pool = pool
        self.rpc = rpc
        self.metrics = metrics

    async def refresh(self) -> None:
        recs = self.pool.of_role(Role.SERVER, ExecutorState.READY) + self.pool.of_role(Role.WORKER, ExecutorState.READY)
        replies = await asyncio.gather(*(self.rpc.call(r, ops.Status(), ops.StatusReply) for r in recs),
                                       return_exceptions=True)
        for r, st in zip(recs, replies):
            if isinstance(st, BaseException):
                continue          # a dead executor is reported by its container's completion
            r.rss_bytes = st.rss_bytes
            if st.spill is not None:
                r.spill_alpha, r.spilled_bytes, r.spill_stall_s = st.spill.alpha, st.spill.spilled_bytes, st.spill.stall_s
            if r.role is Role.SERVER:
                r.model_bytes = st.store_bytes
                r.blocks = list(st.blocks)
                if st.busy_s is not None:
                    self.metrics.record_server(r.executor_id, st.data_requests, st.busy_s)


def spill_status(executors: Iterable[ExecutorRecord]) -> Optional[SpillStatus]:
    """The job's spill from the executors' last status: `alpha`, the mean over the spilling
    workers, and `spilled_mb`, the spill files of all executors (workers' input, servers' model
    blocks); None if none spills."""
    executors = list(executors)
    spilling = [e.spill_alpha for e in executors if e.spill_alpha is not None]
    if not spilling:
        return None
    return SpillStatus(alpha=sum(spilling) / len(spilling), spilled_mb=sum(e.spilled_bytes for e in executors) / 2**20)


def spill_report(executors: Iterable[ExecutorRecord]) -> dict[str, Any]:
    """The job report's `alpha` and `spilled_mb` (`spill_status`; neither when no worker spills)."""
    spill = spill_status(executors)
    return {} if spill is None else {"alpha": spill.alpha, "spilled_mb": spill.spilled_mb}

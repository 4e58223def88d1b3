"""Polls a PS job's executors for what they report about themselves: RSS, model bytes and blocks
(servers), and the data plane's service counters (the optimizers' server measurements)."""
from __future__ import annotations

import asyncio

from protocol import executor_ops as ops

from .executor_pool import ExecutorPool, ExecutorState, Role
from .executor_rpc import ExecutorRpc
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
            if r.role is Role.SERVER:
                r.model_bytes = st.store_bytes
                r.blocks = list(st.blocks)
                if st.busy_s is not None:
                    self.metrics.record_server(r.executor_id, st.data_requests, st.busy_s)

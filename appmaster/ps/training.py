"""The parts that train one PS job, built together: the executors' control client, the job's
members, its model placement, evaluation, the clock loop and the status poller -- each owns its
own state (see their modules); `setup` runs the job's first placement and initialisation.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Callable, Optional

from protocol import executor_ops as ops
from protocol.ps_job_spec import PSJobSpec
from psruntime.apps.base import AnyPSApp
from psruntime.wire.dataplane import DataPlaneClient

from .clock_loop import ClockLoop
from .evaluation import Evaluation
from .runtime.executor_pool import ExecutorPool, ExecutorRecord
from .runtime.executor_rpc import ExecutorRpc
from .executor_status import StatusPoller
from .membership import Membership
from .metrics import JobMetrics
from .model_placement import ModelPlacement

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Training:
    """One PS job's training parts (see the module doc)."""

    spec: PSJobSpec
    app: AnyPSApp
    pool: ExecutorPool
    metrics: JobMetrics
    rpc: ExecutorRpc
    membership: Membership
    placement: ModelPlacement
    evaluation: Evaluation
    loop: ClockLoop
    status: StatusPoller

    @classmethod
    def build(cls, spec: PSJobSpec, app: AnyPSApp, pool: ExecutorPool, metrics: JobMetrics, client: DataPlaneClient,
              wall_clock: Callable[[], float] = time.time, on_clock: Optional[Callable[[], None]] = None) -> "Training":
        rpc = ExecutorRpc(client)
        membership = Membership(pool)
        placement = ModelPlacement(spec, rpc, client, membership)
        evaluation = Evaluation(app, rpc, client, membership, placement)
        loop = ClockLoop(spec, app, rpc, client, membership, placement, evaluation, metrics,
                         wall_clock=wall_clock, on_clock=on_clock)
        return cls(spec, app, pool, metrics, rpc, membership, placement, evaluation, loop,
                   StatusPoller(pool, rpc, metrics))

    async def setup(self, servers: list[ExecutorRecord], workers: list[ExecutorRecord]) -> float:
        """Place the model, bind the app, generate and initialise data; returns the initial objective."""
        await self.placement.place(servers, workers)
        await asyncio.gather(*(self.placement.setup_worker(w, i, len(workers)) for i, w in enumerate(workers)))
        await self.rpc.send(workers[0], ops.InitModel())
        await self.rpc.send_all(workers, ops.InitBlocks())
        initial = await self.evaluation.objective()
        self.metrics.initial_objective = initial
        await self.status.refresh()
        log.info("set up %d servers, %d workers, %d blocks; initial objective %.6g",
                 len(servers), len(workers), self.spec.num_blocks, initial)
        return initial

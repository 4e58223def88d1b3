"""A PS job's AM parts over real in-process executors (localhost sockets, no RM): `InProcessAM`
stands in for the AM's RM client (an ask starts executors in this event loop, which announce
themselves to the pool as launched containers do; a stop stops them), and `Job` holds the
training parts, the reconfiguration steps and the recovery over them, as the PS AM builds them.
Shared by the worker replacement and the checkpoint-during-reshape tests."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Optional

from appmaster.container_book import AmContainer
from protocol.checkpoint_manifest import JobRecord
from appmaster.ps.checkpoints import Checkpointer
from appmaster.ps.executor_pool import ExecutorPool, Role
from appmaster.ps.job import JobPhase
from appmaster.ps.metrics import EpochRecord, JobMetrics
from appmaster.ps.reconfiguration import Reconfiguration
from appmaster.ps.recovery import ExecutorRecovery
from appmaster.ps.training import Training
from protocol.ps_job_spec import validate
from protocol.records import Resource
from protocol.shape_history import ShapeChange
from psruntime.apps.registry import create_app
from psruntime.wire.dataplane import DataPlaneClient
from psruntime.executor import Executor
from psruntime.wire.frame_codec import Frame

SPEC: dict[str, Any] = {"app": "mlr", "workers": 2, "servers": 2, "max_epochs": 3, "convergence_threshold": 1e-12,
        "audit_updates": True, "clock_batches": 4}


class InProcessAM:
    """Stands in for the AM's RM client: an ask starts in-process executors that announce
    themselves to the pool, as launched containers do."""

    def __init__(self, pool: ExecutorPool, num_blocks: int) -> None:
        self.pool = pool
        self.num_blocks = num_blocks
        self.executors: dict[str, Executor] = {}
        self.asks: list[tuple[str, int]] = []
        self._seq = 0
        self._tasks: set[asyncio.Task[None]] = set()

    def add_ask(self, n: int, resource: Resource, tag: str, nodes: Any = None, relax_locality: bool = True) -> int:
        self.asks.append((tag, n))
        t = asyncio.ensure_future(self.start(Role(tag), n))
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return len(self.asks)

    def set_ask_count(self, ask_id: int, n: int) -> None:
        pass

    async def stop(self, container: AmContainer) -> None:
        rec = self.pool.by_container(container.container_id)
        if rec is not None and rec.executor_id in self.executors:
            await self.executors[rec.executor_id].stop()

    async def start(self, role: Role, n: int) -> None:
        for _ in range(n):
            self._seq += 1
            c = AmContainer(container_id=f"container_1_0001_01_{self._seq:06d}", node_id="n1:1",
                            node_http_address="n1:1", resource=Resource(256, 1), token="t", tag=role.value)
            rec = self.pool.add(role, c)
            ex = Executor(rec.executor_id, self.num_blocks, role=role.value)
            self.executors[rec.executor_id] = ex
            address = await ex.start()
            self.pool.handle_frame(Frame({"op": "executor_ready", "executor_id": rec.executor_id,
                                          "address": address, "pid": 1}))

    async def close(self) -> None:
        for ex in self.executors.values():
            await ex.stop()


class Job:
    """The AM's training parts, reconfiguration steps and recovery over in-process executors."""

    def __init__(self, tmp_path: Path, spec: Optional[dict[str, Any]] = None) -> None:
        self.spec = validate(spec or SPEC)
        self.app = create_app(self.spec.app, self.spec.app_data(), self.spec.app_hparams())
        self.pool = ExecutorPool(self.spec.num_blocks, am_address="127.0.0.1:1")
        self.client = DataPlaneClient()
        self.metrics = JobMetrics()
        self.am = InProcessAM(self.pool, self.spec.num_blocks)
        self.training = Training.build(self.spec, self.app, self.pool, self.metrics, self.client)
        self.steps = Reconfiguration(self.am, self.training, Checkpointer(tmp_path / "ckpt", self.client),  # type: ignore[arg-type]
                                     Resource(256, 1), set(), started=lambda: True, launch_timeout_s=10)
        self.records: list[ShapeChange] = []
        self.recovery = ExecutorRecovery(self.spec, self.app, self.steps, lambda: JobPhase.TRAINING,
                                         on_record=self.records.append)
        self.training.loop.replace_lost_workers = self.recovery.replace_lost_workers
        self.epochs: list[EpochRecord] = []

    async def setup(self) -> None:
        await self.am.start(Role.SERVER, self.spec.servers)
        await self.am.start(Role.WORKER, self.spec.workers)
        await self.training.setup(self.pool.ready(Role.SERVER), self.pool.ready(Role.WORKER))
        await self.steps.checkpoint(0, JobRecord())          # what the checkpoint path would go back to

    def report_lost(self, executor_id: str) -> None:
        """What the master does when the RM reports the container's exit."""
        rec = self.pool.executors[executor_id]
        c = rec.container
        self.pool.mark_exited(AmContainer(c.container_id, c.node_id, c.node_http_address, c.resource, c.token,
                                          tag=c.tag, exit_status=-100))
        assert self.recovery.on_lost(rec.describe_exit(256), rec) is None

    async def train(self) -> None:
        async def on_epoch(rec: EpochRecord) -> None:
            self.epochs.append(rec)
        await self.training.loop.train(on_epoch)

    async def close(self) -> None:
        if self.training.placement.placed:
            await self.training.placement.controller.close()
        await self.client.close()
        await self.am.close()

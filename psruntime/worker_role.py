"""The executor's WORKER role: starts, tracks and stops a WorkerLoop for the AM's control ops.

    start_worker {worker_id, app, preset?, spec?, hparams?, partition, num_partitions, epochs,
                  table, clock_address?, start_clock?}   (the AM puts the initial model first:
                                                           worker_loop.init_model)
    stop_worker                     finish the ongoing mini-batch, flush pushes, leave the clock
    worker_status                   state, epochs done with objective parts and timings

Each finished epoch is also announced to the AM ("epoch_report" frame) when the executor has one.
"""
from __future__ import annotations

import asyncio
import enum
import logging
from dataclasses import asdict
from typing import Any, Awaitable, Callable

from psruntime.apps.base import AppConfigError
from psruntime.apps.registry import create_app
from psruntime.clock_client import RemoteClock
from psruntime.dataplane import DataPlaneClient, RequestError
from psruntime.ownership_table import OwnershipTable
from psruntime.store_client import StoreClient
from psruntime.worker_loop import BatchReport, EpochReport, WorkerLoop

log = logging.getLogger(__name__)


class WorkerState(enum.Enum):
    IDLE = "idle"
    RUNNING = "running"
    STOPPING = "stopping"
    FINISHED = "finished"
    FAILED = "failed"


def _req(h: dict[str, Any], name: str, typ: type, optional: bool = False) -> Any:
    v = h.get(name)
    if v is None and optional:
        return None
    if not isinstance(v, typ) or isinstance(v, bool) and typ is not bool:
        raise RequestError(f"field {name!r} must be a {typ.__name__}")
    return v


class WorkerRole:
    """At most one training loop per executor, driven by control ops."""

    def __init__(self, client: DataPlaneClient, report: Callable[[dict[str, Any]], Awaitable[None]] | None = None) -> None:
        self._client = client
        self._report = report
        self.state = WorkerState.IDLE
        self.error = ""
        self.worker_id = ""
        self.epochs: list[EpochReport] = []
        self.batches = 0
        self.compute_s = 0.0
        self.comm_s = 0.0
        self.store: StoreClient | None = None
        self._clock: RemoteClock | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def active(self) -> bool:
        return self.state in (WorkerState.RUNNING, WorkerState.STOPPING)

    def start(self, h: dict[str, Any]) -> None:
        """Validate a start_worker request and launch the loop; raises RequestError, changing nothing."""
        if self.active:
            raise RequestError(f"worker {self.worker_id} is already running")
        worker_id = _req(h, "worker_id", str)
        try:
            app = create_app(_req(h, "app", str), _req(h, "spec", dict, True), _req(h, "hparams", dict, True),
                             _req(h, "preset", str, True))
        except AppConfigError as e:
            raise RequestError(str(e)) from None
        partition, parts, epochs = _req(h, "partition", int), _req(h, "num_partitions", int), _req(h, "epochs", int)
        if not 0 <= partition < parts:
            raise RequestError(f"field 'partition' must be in 0..{parts - 1}")
        if epochs <= 0:
            raise RequestError("field 'epochs' must be positive")
        table = OwnershipTable.from_wire(h.get("table"))
        if table.num_blocks <= 0 or not all(table.owners):
            raise RequestError("field 'table' must give every block an owner")
        clock_address = _req(h, "clock_address", str, True)
        start_clock = _req(h, "start_clock", int, True)
        self.worker_id, self.epochs, self.error = worker_id, [], ""
        self.batches, self.compute_s, self.comm_s = 0, 0.0, 0.0
        self.store = StoreClient(table, self._client)
        self._clock = RemoteClock(clock_address, worker_id, self._client) if clock_address else None
        self._stop = asyncio.Event()
        self.state = WorkerState.RUNNING
        self._task = asyncio.ensure_future(self._run(app, partition, parts, epochs, start_clock))

    def _on_batch(self, r: BatchReport) -> None:
        self.batches += 1
        self.compute_s += r.compute_s
        self.comm_s += r.pull_s + r.push_s

    async def _run(self, app: Any, partition: int, parts: int, epochs: int, start_clock: int | None) -> None:
        assert self.store is not None
        try:
            blocks = app.generate_partition(partition, parts).blocks
            if self._clock is not None:
                await self._clock.join(start_clock)
            loop = WorkerLoop(app, blocks, self.store, self._clock, num_workers=parts, on_batch=self._on_batch)
            await loop.initialise()
            for epoch in range(epochs):
                if self._stop.is_set():
                    break
                report = await loop.run_epoch(epoch, self._stop)
                self.epochs.append(report)
                if self._report is not None:
                    try:
                        await self._report({"op": "epoch_report", "worker_id": self.worker_id, **asdict(report)})
                    except Exception as e:  # noqa: BLE001 - the AM can still poll worker_status
                        log.warning("epoch report to the AM failed: %s", e)
            await self.store.flush()
            self.state = WorkerState.FINISHED
        except asyncio.CancelledError:
            self.state = WorkerState.FAILED
            self.error = "cancelled"
        except Exception as e:  # noqa: BLE001 - reported through worker_status
            log.exception("worker %s failed", self.worker_id)
            self.state = WorkerState.FAILED
            self.error = f"{type(e).__name__}: {e}"
        finally:
            if self._clock is not None:
                try:
                    await self._clock.leave()  # never hold the other workers at a barrier
                except Exception:  # noqa: BLE001
                    pass

    async def stop(self) -> None:
        """Finish the ongoing mini-batch, flush pushes to servers and leave the clock."""
        if self._task is None or self._task.done():
            return
        self.state = WorkerState.STOPPING
        self._stop.set()
        await asyncio.shield(self._task)

    async def cancel(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def set_table(self, table: OwnershipTable) -> None:
        if self.store is not None:
            self.store.set_table(table)

    def status(self) -> dict[str, Any]:
        return {"state": self.state.value, "worker_id": self.worker_id, "error": self.error,
                "epochs": [asdict(e) for e in self.epochs], "batches": self.batches,
                "compute_s": self.compute_s, "comm_s": self.comm_s}

"""A PS job's objective and held-out evaluation, gathered from its executors.

The objective is the app's combination of every worker's part (over its input data) and every
server's part (over the keys it owns): exact under BSP when no epoch runs, as no push is in flight.
The held-out evaluation pulls the whole model from the servers and scores it off the event loop.
"""
from __future__ import annotations

import asyncio

import numpy as np

from protocol import executor_ops as ops
from psruntime.apps.base import AnyPSApp, ObjectivePart
from psruntime.wire.dataplane import DataPlaneClient
from psruntime.store.store_client import StoreClient

from .runtime.executor_pool import ExecutorRecord
from .runtime.executor_rpc import ExecutorRpc
from .membership import Membership
from .model_placement import ModelPlacement


class Evaluation:
    """Objective and held-out metrics of the job's current model."""

    def __init__(self, app: AnyPSApp, rpc: ExecutorRpc, client: DataPlaneClient, membership: Membership,
                 placement: ModelPlacement) -> None:
        self.app = app
        self.rpc = rpc
        self.client = client
        self.membership = membership
        self.placement = placement

    async def worker_part(self, worker: ExecutorRecord) -> ObjectivePart:
        r = await self.rpc.call(worker, ops.Objective(), ops.ObjectiveReply)
        return ObjectivePart(r.value, r.count)

    async def server_parts(self) -> list[float]:
        replies = await self.rpc.call_all(self.membership.servers, ops.ServerObjective(), ops.ServerObjectiveReply)
        return [r.value for r in replies]

    async def objective(self) -> float:
        """The exact objective of the current model (call only with no epoch running)."""
        workers = self.membership.workers
        parts, server_parts = await asyncio.gather(asyncio.gather(*(self.worker_part(w) for w in workers)),
                                                   self.server_parts())
        return float(self.app.combine(list(parts), server_parts))

    async def model(self) -> np.ndarray:
        """The whole model (num_keys, key_length), pulled from the servers as arrays."""
        app = self.app
        store = StoreClient(self.placement.table, self.client)
        values, _found = await store.pull_array(app.model_keys(), (app.key_length,), np.float32)
        return np.asarray(values, np.float32).reshape(app.num_keys, app.key_length)

    async def evaluate(self) -> dict[str, float]:
        """Held-out metrics of the current model (the app's generator's held-out data)."""
        model = await self.model()
        return await asyncio.to_thread(lambda: self.app.evaluate(model, self.app.generate_heldout()))

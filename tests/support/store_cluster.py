"""In-process executors on real localhost sockets, with a migration controller that has
broadcast a round-robin ownership table: the fixture shared by the store tests, and the AM's
record of such an executor as a server (what the Checkpointer reads from), putting and
pulling a model's values through a store client, and a tiny MLR job's model and first worker's
blocks on such executors (the training pipeline's tests)."""
from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Mapping, Sequence

import numpy as np

from psruntime.apps.base import PSApp
from psruntime.apps.blocks import DataBlock
from psruntime.apps.registry import create_app
from psruntime.training_pipeline import init_model

from appmaster.container_book import AmContainer
from appmaster.ps.runtime.executor_pool import ExecutorRecord, ExecutorState, Role
from protocol.records import Resource
from psruntime.store.store_client import StoreClient

from psruntime.wire.dataplane import DataPlaneClient, DataPlaneServer
from psruntime.executor import Executor
from psruntime.store.migration_controller import MigrationController
from psruntime.store.ownership_table import OwnershipTable


@asynccontextmanager
async def executor_cluster(num_executors: int, num_blocks: int, max_body_bytes: int | None = None
                           ) -> AsyncIterator[tuple[list[Executor], MigrationController, DataPlaneClient]]:
    """`max_body_bytes`: the frame body limit of every executor's server and of the client (None =
    the data plane's default)."""
    executors = [Executor(f"e{i}", num_blocks) for i in range(num_executors)]
    if max_body_bytes is not None:
        for e in executors:
            e.server = DataPlaneServer(e.handle, "127.0.0.1", 0, max_body_bytes)
    addrs = {e.executor_id: await e.start() for e in executors}
    ctl = MigrationController(OwnershipTable.round_robin(num_blocks, list(addrs), addrs))
    await ctl.broadcast()
    dp = DataPlaneClient(max_body_bytes) if max_body_bytes is not None else DataPlaneClient()
    try:
        yield executors, ctl, dp
    finally:
        await dp.close()
        await ctl.close()
        for e in executors:
            await e.stop()


def server_record(e: Executor, seq: int) -> ExecutorRecord:
    """The AM's record of executor `e` as a READY server in container number `seq`."""
    c = AmContainer(container_id=f"container_1_0001_01_{seq:06d}", node_id="n1:1", node_http_address="n1:1",
                    resource=Resource(512, 1), token="t")
    return ExecutorRecord(e.executor_id, Role.SERVER, c, ExecutorState.READY, e.address,
                          blocks=e.service.owned_blocks())


async def put_values(ctl: MigrationController, model: Mapping[Any, np.ndarray]) -> None:
    """Set every key of `model` to its value in the executors (a store client's put)."""
    c = StoreClient(ctl.table)
    try:
        await c.put(list(model), list(model.values()))
    finally:
        await c.close()


async def pull_values(ctl: MigrationController, keys: Sequence[Any]) -> dict[Any, np.ndarray]:
    """The executors' values of `keys`."""
    c = StoreClient(ctl.table)
    try:
        return await c.pull(list(keys))
    finally:
        await c.close()



async def mlr_half(cluster: tuple[list[Executor], MigrationController, DataPlaneClient]
                   ) -> tuple[PSApp, StoreClient, list[DataBlock]]:
    """Tiny MLR with its model put on the servers, and the first of two workers' input blocks."""
    _, ctl, dp = cluster
    app = create_app("mlr", preset="tiny")
    store = StoreClient(ctl.table, dp)
    await init_model(store, app)
    return app, store, app.generate_partition(0, 2).blocks

"""In-process executors on real localhost sockets, with a migration controller that has
broadcast a round-robin ownership table: the fixture shared by the store tests."""
from __future__ import annotations

from contextlib import asynccontextmanager
from typing import AsyncIterator

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

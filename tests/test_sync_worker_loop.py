"""The worker loop on the elastic store: two BSP workers train MLR (tiny) against two server
executors, while a block of the model is migrated between epochs' mini-batches."""
from __future__ import annotations

import asyncio

import numpy as np

from psruntime.apps.registry import create_app
from psruntime.clock_client import RemoteClock
from psruntime.executor import Executor
from psruntime.frame_codec import Frame
from psruntime.migration_controller import MigrationController
from psruntime.ownership_table import OwnershipTable
from psruntime.store_client import StoreClient
from psruntime.worker_loop import BatchReport, WorkerLoop, init_model

NUM_BLOCKS = 8


async def test_bsp_workers_train_through_a_migration() -> None:
    app = create_app("mlr", preset="tiny")
    servers = [Executor(f"s{i}", NUM_BLOCKS) for i in range(2)]
    addrs = {s.executor_id: await s.start() for s in servers}
    ctl = MigrationController(OwnershipTable.round_robin(NUM_BLOCKS, list(addrs), addrs))
    await ctl.broadcast()
    stores = [StoreClient(ctl.table) for _ in range(2)]
    try:
        await init_model(stores[0], app)
        reports: list[BatchReport] = []
        loops = []
        for i in range(2):
            clock = RemoteClock(addrs["s0"], f"w{i}", servers[0].client)
            await clock.join(0)
            blocks = app.generate_partition(i, 2).blocks
            loops.append(WorkerLoop(app, blocks, stores[i], clock, num_workers=2, on_batch=reports.append))
        for loop in loops:
            await loop.initialise()

        async def mover() -> None:
            for _ in range(6):
                await asyncio.sleep(0.01)
                b = 3
                src = ctl.table.owner_of_block(b)
                await ctl.move([b], src, "s1" if src == "s0" else "s0")

        results = await asyncio.gather(*(loop.run(3) for loop in loops), mover())
        per_worker = results[:2]
        objectives = [app.combine([w[e].objective for w in per_worker], [0.0]) for e in range(3)]
        assert all(b < a for a, b in zip(objectives, objectives[1:])), objectives
        assert objectives[-1] < np.log(5)  # better than the untrained model's cross-entropy
        # BSP: both workers' clocks are equal at every epoch boundary.
        assert [r.clock for r in per_worker[0]] == [r.clock for r in per_worker[1]] == [1, 2, 3]
        assert reports and all(r.compute_s >= 0 and r.pull_s >= 0 for r in reports)
        status = servers[0].handle(Frame({"op": "clock_status"}))
        assert status[0]["min_clock"] == 3
    finally:
        for s in stores:
            await s.close()
        await ctl.close()
        for s in servers:
            await s.stop()

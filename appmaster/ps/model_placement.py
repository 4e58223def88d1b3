"""Where a PS job's model lives: the ownership table of its blocks, and binding executors to it.

`place` spreads the blocks round-robin over the servers, broadcasts the table to every executor and
binds each to the app (`app_setup`); `setup_worker` has a worker generate (or load) its input
partition. Afterwards the table changes only through here: executors join (`register`, the EPS
dependency update), leave (`forget`), and blocks move server to server with the elastic store's
two-step protocol (`move`, psruntime.store.migration_controller), each change broadcast.
"""
from __future__ import annotations

import asyncio
from typing import Iterable, Mapping, Optional, Sequence

from protocol import executor_ops as ops
from protocol.ps_job_spec import PSJobSpec
from psruntime.wire.dataplane import DataPlaneClient
from psruntime.store.migration_controller import MigrationController
from psruntime.store.ownership_table import OwnershipTable

from .runtime.executor_pool import ExecutorRecord
from .runtime.executor_rpc import ExecutorRpc
from .membership import Membership
from .parameter_assignment import owners


class ModelPlacement:
    """The job's ownership table and the calls that set executors up around it."""

    def __init__(self, spec: PSJobSpec, rpc: ExecutorRpc, client: DataPlaneClient, membership: Membership) -> None:
        self.spec = spec
        self.rpc = rpc
        self.client = client
        self.membership = membership
        self._controller: Optional[MigrationController] = None

    @property
    def placed(self) -> bool:
        return self._controller is not None

    @property
    def controller(self) -> MigrationController:
        if self._controller is None:
            raise RuntimeError("the model is not placed yet (ModelPlacement.place)")
        return self._controller

    @property
    def table(self) -> OwnershipTable:
        return self.controller.table

    @property
    def version(self) -> Optional[int]:
        return self._controller.table.version if self._controller is not None else None

    def app_setup_request(self) -> ops.AppSetup:
        """The `app_setup` op that binds an executor to this job's app, data spec and hparams."""
        # A built-in app's data and hparams come with the preset applied; a user app's class applies its own.
        return ops.AppSetup(app=self.spec.app, data=self.spec.app_data(), hparams=self.spec.app_hparams(),
                            preset=self.spec.preset if self.spec.is_user_app else None,
                            spill_alpha=self.spec.spill_alpha, comp_threads=self.spec.comp_threads or 0,
                            sync_batches=self.spec.sync_batches)

    async def place(self, servers: list[ExecutorRecord], workers: list[ExecutorRecord],
                    block_sizes: Optional[Mapping[int, float]] = None, bound: Sequence[ExecutorRecord] = ()) -> None:
        """Make `servers` and `workers` the job's executors: the blocks over the servers (broadcast
        to everyone), and every executor bound to the app but those `bound` to it already (workers
        kept through a recovery from lost servers). With the blocks' sizes known (a restart
        on a checkpoint) Optimus's parameter assignment balances size and requests per server
        (appmaster.ps.parameter_assignment); otherwise (equal, empty blocks) round-robin."""
        self.membership.set(servers, workers)
        everyone = servers + workers
        addresses = {e.executor_id: e.address for e in everyone}
        ids = [s.executor_id for s in servers]
        if block_sizes:
            table = OwnershipTable(self.spec.num_blocks, owners(self.spec.num_blocks, block_sizes, ids), addresses)
        else:
            table = OwnershipTable.round_robin(self.spec.num_blocks, ids, addresses)
        if self._controller is not None:
            # Above the table the executors kept from before hold: they adopt only a newer one.
            table.version = self._controller.table.version + 1
        self._controller = MigrationController(table, self.client)
        await self._controller.broadcast()
        for s in servers:
            s.blocks = table.blocks_owned_by(s.executor_id)
        kept = {e.executor_id for e in bound}
        await self.rpc.send_all([e for e in everyone if e.executor_id not in kept], self.app_setup_request())

    def adopt(self, table: OwnershipTable) -> None:
        """The table a failed attempt left, which its executors (taken over) hold already: nothing
        is broadcast or moved (appmaster.ps.attempt_takeover)."""
        self._controller = MigrationController(table, self.client)
        for s in self.membership.servers:
            s.blocks = table.blocks_owned_by(s.executor_id)

    async def setup_worker(self, worker: ExecutorRecord, partition: int, num_partitions: int) -> None:
        """Have `worker` generate (or load) input partition `partition` of `num_partitions`."""
        r = await self.rpc.call(worker, ops.WorkerSetup(partition=partition, num_partitions=num_partitions),
                                ops.WorkerSetupReply)
        worker.partition = partition
        worker.data_bytes = r.data_bytes
        worker.blocks = list(r.blocks)

    async def bind(self, executors: list[ExecutorRecord]) -> None:
        """Bind newly started executors to the app (EPS barrier 1)."""
        await self.rpc.send_all(executors, self.app_setup_request())

    async def register(self, executors: Iterable[ExecutorRecord]) -> None:
        """Dependency update: every executor learns the newcomers' addresses (and they the table)."""
        for e in executors:
            self.controller.add_executor(e.executor_id, e.address)
        await self.controller.broadcast()

    async def forget(self, executor_ids: Iterable[str]) -> None:
        """Executors leave every server list (they must own no blocks any more); broadcast."""
        for e in executor_ids:
            self.controller.remove_executor(e)
        await self.controller.broadcast()

    def drop_address(self, executor_id: str) -> None:
        """Forget a gone executor's address without a broadcast (it never owned blocks, or is lost)."""
        if self._controller is not None:
            self._controller.table.addresses.pop(executor_id, None)

    async def reassign(self, blocks_to: Mapping[str, list[int]], gone: Iterable[str] = ()) -> None:
        """Give blocks straight to new owners, no migration (a lost server's, whose data comes back
        from a checkpoint): the new owners hold them empty until restored. `gone` leave the table's
        addresses (they own nothing then); broadcast."""
        for owner, blocks in blocks_to.items():
            if blocks:
                self.controller.table.assign(blocks, owner)
        for executor_id in gone:
            self.controller.remove_executor(executor_id)
        await self.controller.broadcast()

    def blocks_of(self, executor_id: str) -> list[int]:
        return self.table.blocks_owned_by(executor_id)

    async def move(self, blocks: list[int], src: str, dst: str) -> int:
        """Move model `blocks` from `src` to `dst` (two-step migration + broadcast); the new version."""
        return await self.controller.move(blocks, src, dst)

    async def move_routes(self, routes: dict[tuple[str, str], list[int]]) -> None:
        """Several moves at once, one per (src, dst) route."""
        await asyncio.gather(*(self.move(blocks, src, dst) for (src, dst), blocks in routes.items()))

    def refresh_server_blocks(self) -> None:
        """Each serving executor's record shows the blocks it owns now."""
        for s in self.membership.servers:
            s.blocks = self.table.blocks_owned_by(s.executor_id)

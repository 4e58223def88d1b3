"""Worker-side client of the BSP/SSP clock service that an executor hosts (psruntime.clocks)."""
from __future__ import annotations

from psruntime.dataplane import DataPlaneClient


class RemoteClock:
    """One worker's handle on the clock service at `address` (an executor's data-plane address)."""

    def __init__(self, address: str, worker_id: str, client: DataPlaneClient) -> None:
        self.address = address
        self.worker_id = worker_id
        self._client = client

    async def join(self, start_clock: int | None = None) -> int:
        """Register this worker; without `start_clock` it joins at the current minimum clock."""
        header = {"op": "clock_add_worker", "worker": self.worker_id}
        if start_clock is not None:
            header["start_clock"] = start_clock
        return int((await self._client.request(self.address, header)).header["clock"])

    async def tick(self) -> int:
        """Finish a clock and wait until the staleness bound lets this worker start the next."""
        reply = await self._client.request(self.address, {"op": "clock_tick", "worker": self.worker_id})
        return int(reply.header["clock"])

    async def leave(self) -> None:
        await self._client.request(self.address, {"op": "clock_remove_worker", "worker": self.worker_id})

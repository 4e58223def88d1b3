"""The PS AM's client of its executors' control channel: typed requests out, typed replies back.

Every request is a record of protocol.executor_ops sent as one data-plane frame; a failure (the
executor died, or answered with an error) comes back as `ExecutorCallError` naming the executor,
its role, container and the op, which is what the job's diagnostics need.
"""
from __future__ import annotations

import asyncio
from typing import Sequence, TypeVar

import numpy as np

from protocol import executor_ops as ops
from psruntime.dataplane import DataPlaneClient, RemoteError
from psruntime.frame_codec import Frame

from .executor_pool import ExecutorRecord

R = TypeVar("R", bound=ops.ControlReply)


class ExecutorCallError(RuntimeError):
    """A control op on an executor failed (it died, or answered with an error)."""

    def __init__(self, executor: ExecutorRecord, op: str, cause: BaseException) -> None:
        super().__init__(f"{op} on {executor.executor_id} ({executor.role.value}, {executor.container_id}) "
                         f"failed: {cause}")
        self.executor = executor
        self.op = op
        # The executor answered with an error: it is alive (a dead one answers nothing).
        self.answered = isinstance(cause, RemoteError)


class ExecutorRpc:
    """Sends control requests to the job's executors over one shared data-plane client."""

    def __init__(self, client: DataPlaneClient) -> None:
        self.client = client

    async def frame(self, rec: ExecutorRecord, request: ops.ControlRequest,
                    arrays: Sequence[np.ndarray] = ()) -> Frame:
        """Send `request` (with `arrays`) to `rec`; the reply frame as it came."""
        header = ops.to_header(request)
        try:
            return await self.client.request(rec.address, header, list(arrays))
        except Exception as e:  # noqa: BLE001 - any failure is that executor's, named as such
            raise ExecutorCallError(rec, str(header["op"]), e) from e

    async def call(self, rec: ExecutorRecord, request: ops.ControlRequest, reply: type[R]) -> R:
        """Send `request` to `rec` and read its reply as `reply`."""
        frame = await self.frame(rec, request)
        try:
            return ops.decode_reply(frame.header, reply)
        except ops.ControlMessageError as e:
            raise ExecutorCallError(rec, type(request).__name__, e) from e

    async def send(self, rec: ExecutorRecord, request: ops.ControlRequest) -> None:
        """Send `request` to `rec`, reading nothing back but success."""
        await self.frame(rec, request)

    async def send_all(self, recs: Sequence[ExecutorRecord], request: ops.ControlRequest) -> None:
        await asyncio.gather(*(self.send(r, request) for r in recs))

    async def call_all(self, recs: Sequence[ExecutorRecord], request: ops.ControlRequest,
                       reply: type[R]) -> list[R]:
        return list(await asyncio.gather(*(self.call(r, request, reply) for r in recs)))

    async def frames_all(self, recs: Sequence[ExecutorRecord], request: ops.ControlRequest) -> list[Frame]:
        return list(await asyncio.gather(*(self.frame(r, request) for r in recs)))

    async def shutdown(self, recs: Sequence[ExecutorRecord]) -> None:
        """Ask each executor with an address to stop; best effort (it may be gone already)."""
        await asyncio.gather(*(self.client.request(r.address, ops.to_header(ops.Shutdown()))
                               for r in recs if r.address), return_exceptions=True)

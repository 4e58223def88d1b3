"""The PS AM's client of its executors' control channel: typed requests out, typed replies back.

Every request is a record of protocol.executor_ops sent as one data-plane frame; its reply is
decoded here, once, as the record the caller names (protocol.executor_replies), and comes back as
that record (with the frame's arrays, `Answered`): no caller reads a header. A failure (the
executor died, or answered with an error) comes back as `ExecutorCallError` naming the executor,
its role, container and the op, which is what the job's diagnostics need. A request to an executor
the AM knows is gone fails with `ExecutorLost` -- at once, also while it waits for the reply: the
pool marks a lost executor's address lost on the shared client (appmaster.ps.runtime.executor_pool), which
fails what is in flight to it; a host that vanished never answers, so nothing else would end the wait.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Generic, Sequence, TypeVar

import numpy as np

from protocol import executor_ops as ops
from psruntime.wire.dataplane import DataPlaneClient, PeerLost, RemoteError

from .executor_pool import ExecutorRecord, ExecutorState
from protocol.errors import ProtocolError

R = TypeVar("R", bound=ops.ControlReply)
USER_CODE_ERROR = "UserCodeError"   # the error kind an executor answers user-code failures with


class ExecutorCallError(ProtocolError, RuntimeError):
    """A control op on an executor failed (it died, or answered with an error)."""

    def __init__(self, executor: ExecutorRecord, op: str, cause: BaseException) -> None:
        super().__init__(f"{op} on {executor.executor_id} ({executor.role.value}, {executor.container_id}) "
                         f"failed: {cause}")
        self.executor = executor
        self.op = op
        # The executor answered with an error: it is alive (a dead one answers nothing).
        self.answered = isinstance(cause, RemoteError)
        # A user app's code raised there (psruntime.apps.registry.UserCodeError): its message with
        # the traceback. The job fails with it at once: no loss to wait for, nothing to replace.
        self.user_error: str | None = (cause.message if isinstance(cause, RemoteError) and cause.kind == USER_CODE_ERROR
                                       else None)


class ExecutorLost(ExecutorCallError):
    """A control op on an executor the AM knows is gone: its container ended (the RM's report: it
    died, was killed, its node was lost) or the AM gave up waiting for it. Never `answered`."""


@dataclass(frozen=True)
class Answered(Generic[R]):
    """A decoded reply and the arrays that came with it."""

    reply: R
    arrays: list[np.ndarray]


class ExecutorRpc:
    """Sends control requests to the job's executors over one shared data-plane client."""

    def __init__(self, client: DataPlaneClient) -> None:
        self.client = client

    async def exchange(self, rec: ExecutorRecord, request: ops.ExecutorRequest, reply: type[R],
                       arrays: Sequence[np.ndarray] = ()) -> Answered[R]:
        """Send `request` (with `arrays`) to `rec`; its reply read as `reply`, with the reply's arrays."""
        header = ops.to_header(request)
        op = str(header["op"])
        if _exited(rec):
            raise ExecutorLost(rec, op, PeerLost(rec.address, "its container has ended"))
        try:
            frame = await self.client.request(rec.address, header, list(arrays))
        except Exception as e:  # noqa: BLE001 - any failure is that executor's, named as such
            # Lost, however the failure surfaced (a write blocked towards the peer when it was
            # dropped fails as a plain ConnectionError).
            if isinstance(e, PeerLost) or _exited(rec) or self.client.lost(rec.address):
                raise ExecutorLost(rec, op, e) from e
            raise ExecutorCallError(rec, op, e) from e
        try:
            return Answered(ops.decode_reply(frame.header, reply), list(frame.arrays))
        except ops.ControlMessageError as e:
            raise ExecutorCallError(rec, op, e) from e

    async def call(self, rec: ExecutorRecord, request: ops.ExecutorRequest, reply: type[R]) -> R:
        """Send `request` to `rec` and read its reply as `reply`."""
        return (await self.exchange(rec, request, reply)).reply

    async def send(self, rec: ExecutorRecord, request: ops.ExecutorRequest,
                   arrays: Sequence[np.ndarray] = ()) -> None:
        """Send `request` (with `arrays`) to `rec`, reading nothing back but success."""
        await self.exchange(rec, request, ops.Ok, arrays)

    async def send_all(self, recs: Sequence[ExecutorRecord], request: ops.ExecutorRequest) -> None:
        await asyncio.gather(*(self.send(r, request) for r in recs))

    async def call_all(self, recs: Sequence[ExecutorRecord], request: ops.ExecutorRequest,
                       reply: type[R]) -> list[R]:
        return list(await asyncio.gather(*(self.call(r, request, reply) for r in recs)))

    async def shutdown(self, recs: Sequence[ExecutorRecord]) -> None:
        """Ask each executor with an address to stop; best effort (it may be gone already: one whose
        container ended is not asked)."""
        await asyncio.gather(*(self.client.request(r.address, ops.to_header(ops.Shutdown()))
                               for r in recs if r.address and not _exited(r)),
                             return_exceptions=True)


def _exited(rec: ExecutorRecord) -> bool:
    """Whether `rec`'s container has ended (read afresh: it changes while a request waits)."""
    return rec.state is ExecutorState.EXITED

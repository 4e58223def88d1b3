"""An executor's connection to its node's Harmony arbiter (`nodemanager.arbiter_server`).

One unix-socket connection per executor; requests are pipelined (every frame carries its request
id, replies are matched by it), so several subtasks may wait for slots at once. `acquire` returns a
`Grant` once the arbiter hands the slot over; `release` (and `set_busy`) only write a frame. A
network grant that is the secondary follows the arbiter's YIELD / PROMOTE notices:
`Grant.wait_turn()` returns at once unless it is told to yield.
"""
from __future__ import annotations

import asyncio
import itertools
from typing import Optional

from protocol.arbiter_wire import FRAME, FRAME_SIZE, MAX_THREADS, YIELDING, Frame, Op, Role, SlotKind, name_hash
from protocol.errors import ProtocolError


class ArbiterUnavailable(ProtocolError, ConnectionError):
    """The arbiter's socket closed (or could not be reached): no slot can be had."""


class ArbiterRefused(ProtocolError, RuntimeError):
    """The arbiter answered a request with ERROR."""


class Grant:
    """A slot held: its request id, its role, and (for a secondary) whether it must yield now."""

    def __init__(self, request_id: int, kind: SlotKind, role: Role, yielding: bool, threads: int = 1) -> None:
        self.request_id = request_id
        self.kind = kind
        self.role = role
        self.threads = threads          # cores of the node's pool a CPU grant holds
        self._go = asyncio.Event()
        self.set_yielding(yielding)

    @property
    def yielding(self) -> bool:
        return not self._go.is_set()

    def set_yielding(self, yielding: bool) -> None:
        if yielding:
            self._go.clear()
        else:
            self._go.set()

    async def wait_turn(self) -> None:
        """Return when this grant may use its resource (at once unless a yielding secondary)."""
        await self._go.wait()


class _Protocol(asyncio.Protocol):
    def __init__(self, client: "ArbiterClient") -> None:
        self.client = client
        self.buf = bytearray()

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        n = len(buf) - len(buf) % FRAME_SIZE
        for off in range(0, n, FRAME_SIZE):
            self.client._received(Frame(*FRAME.unpack_from(buf, off)))
        del buf[:n]

    def connection_lost(self, exc: Optional[Exception]) -> None:
        if self.client._protocol is self:     # not an older connection's late goodbye
            self.client._lost(exc)


class ArbiterClient:
    """A connection to the arbiter at `path`, speaking for executor `executor` of job `job`."""

    def __init__(self, path: str, job: str, executor: str) -> None:
        self.path = path
        self.job = name_hash(job)
        self.executor = name_hash(executor)
        self._ids = itertools.count(1)
        self._transport: Optional[asyncio.Transport] = None
        self._waiting: dict[int, tuple[SlotKind, asyncio.Future[Grant]]] = {}
        self._pings: dict[int, asyncio.Future[None]] = {}
        self._held: dict[int, Grant] = {}
        self._closed: Optional[BaseException] = None
        self._protocol: Optional[_Protocol] = None

    async def connect(self) -> None:
        """Open the connection (again, after the arbiter closed it: e.g. its NM restarted)."""
        loop = asyncio.get_running_loop()
        try:
            transport, protocol = await loop.create_unix_connection(lambda: _Protocol(self), self.path)
        except OSError as e:
            raise ArbiterUnavailable(f"arbiter at {self.path}: {e}") from e
        self._transport, self._protocol = transport, protocol
        self._closed = None

    @property
    def connected(self) -> bool:
        return self._transport is not None and self._closed is None

    async def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None

    def _send(self, op: Op, kind: int, request_id: int, flags: int = 0) -> None:
        if self._transport is None or self._closed is not None:
            raise ArbiterUnavailable(f"arbiter at {self.path} is not connected")
        self._transport.write(FRAME.pack(op, kind, flags, request_id, self.job, self.executor))

    def _next_id(self) -> int:
        return next(self._ids) & 0xFFFFFFFF

    async def acquire(self, kind: SlotKind, threads: int = 1) -> Grant:
        """Wait for a slot of `kind` (CPU: `threads` cores of the node's pool); a cancelled wait
        withdraws the request."""
        if not 1 <= threads <= MAX_THREADS:
            raise ValueError(f"threads must be 1..{MAX_THREADS}, got {threads}")
        rid = self._next_id()
        fut: asyncio.Future[Grant] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = (kind, fut)
        self._send(Op.ACQUIRE, kind, rid, threads if kind is SlotKind.CPU else 0)
        try:
            return await fut
        except asyncio.CancelledError:
            self._waiting.pop(rid, None)
            self._held.pop(rid, None)
            if self._closed is None and self._transport is not None:
                self._send(Op.RELEASE, 0, rid)     # withdrawn if queued, given back if granted
            raise

    def release(self, grant: Grant) -> None:
        if self._held.pop(grant.request_id, None) is not None and self._closed is None:
            self._send(Op.RELEASE, 0, grant.request_id)

    def set_busy(self, grant: Grant, busy: bool) -> None:
        """Tell the arbiter whether a network grant is transferring (the secondary yields to a busy
        primary) or only waiting on servers."""
        if grant.request_id in self._held and self._closed is None:
            self._send(Op.BUSY if busy else Op.IDLE, 0, grant.request_id)

    async def ping(self) -> None:
        """One bare round trip over the channel (no arbiter rule involved)."""
        rid = self._next_id()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pings[rid] = fut
        self._send(Op.PING, 0, rid)
        await fut

    # -- from the protocol -------------------------------------------------------------------
    def _received(self, f: Frame) -> None:
        if f.op == Op.GRANT:
            kind, fut = self._waiting.pop(f.request_id, (None, None))
            if fut is None or kind is None or fut.done():
                return
            role = Role(f.kind)
            if role is Role.CPU:
                grant = Grant(f.request_id, kind, role, False, max(1, f.flags))
            else:
                grant = Grant(f.request_id, kind, role, bool(f.flags & YIELDING))
            self._held[f.request_id] = grant
            fut.set_result(grant)
        elif f.op == Op.YIELD:
            g = self._held.get(f.request_id)
            if g is not None:
                g.set_yielding(bool(f.flags & YIELDING))
        elif f.op == Op.PROMOTE:
            g = self._held.get(f.request_id)
            if g is not None:
                g.role = Role.PRIMARY
                g.set_yielding(False)
        elif f.op == Op.PONG:
            p = self._pings.pop(f.request_id, None)
            if p is not None and not p.done():
                p.set_result(None)
        elif f.op == Op.ERROR:
            _, fut = self._waiting.pop(f.request_id, (None, None))
            if fut is not None and not fut.done():
                fut.set_exception(ArbiterRefused(f"arbiter refused request {f.request_id} (op {f.kind})"))

    def _lost(self, exc: Optional[Exception]) -> None:
        self._closed = exc or ArbiterUnavailable(f"arbiter at {self.path} closed the connection")
        err = ArbiterUnavailable(f"arbiter at {self.path} closed the connection")
        for _, fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(err)
        for p in self._pings.values():
            if not p.done():
                p.set_exception(err)
        self._waiting.clear()
        self._pings.clear()
        for g in self._held.values():
            g.set_yielding(False)     # nobody is left to say go on
        self._held.clear()

"""The arbiter as an NM auxiliary service: `nodemanager.arbiter`'s rules behind a unix socket.

Started and stopped with the NM (like YARN's aux services). Each executor of a Harmony job keeps one
connection (the socket path is in its launch environment, `protocol.container_env.ARBITER_SOCKET`)
and pipelines fixed-size frames on it (`protocol.arbiter_wire`); an asyncio.Protocol per
connection decodes them straight from the receive buffer, so a grant costs one event-loop turn and
no allocation beyond the reply's 24 bytes. A connection that closes -- its executor exited or
crashed -- has its slots reclaimed. A refused request is answered with an ERROR frame; the
connection stays usable.
"""
from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import os
import tempfile
import time
from typing import Callable, Mapping, Optional, cast

from protocol.arbiter_wire import FRAME, FRAME_SIZE, Frame, Op, SlotKind

from .arbiter import Arbiter, ArbiterError, Notice

log = logging.getLogger(__name__)
MAX_UNIX_PATH = 100        # sun_path is 108 bytes on Linux; stay clear of it


def socket_path(local_dir: str, configured: str = "") -> str:
    """Where the NM's arbiter listens: `configured`, else <local_dir>/arbiter.sock, or a short path
    under the temp dir when that is too long for a unix socket."""
    if configured:
        return configured
    path = os.path.join(os.path.abspath(local_dir), "arbiter.sock")
    if len(path.encode()) <= MAX_UNIX_PATH:
        return path
    digest = hashlib.blake2b(path.encode(), digest_size=6).hexdigest()
    return os.path.join(tempfile.gettempdir(), f"elastane-arbiter-{digest}.sock")


class _Connection(asyncio.Protocol):
    def __init__(self, server: "ArbiterServer", conn: int) -> None:
        self.server = server
        self.conn = conn
        self.transport: Optional[asyncio.Transport] = None
        self.buf = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)   # uvloop's is no asyncio.Transport subclass
        self.server.connections[self.conn] = self

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        n = len(buf) - len(buf) % FRAME_SIZE
        for off in range(0, n, FRAME_SIZE):
            self.server.handle(self.conn, Frame(*FRAME.unpack_from(buf, off)))
        del buf[:n]

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.server.connections.pop(self.conn, None)
        self.server.closed(self.conn)

    def send(self, frame: Frame) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(frame.pack())


class ArbiterServer:
    """The NM's arbiter service: `start()` listens on `path`, `stop()` closes every connection."""

    def __init__(self, path: str, clock: Callable[[], float] = time.time, cpu_pool: int = 1) -> None:
        self.path = path
        self.arbiter = Arbiter(clock=clock, cpu_pool=cpu_pool)
        self.connections: dict[int, _Connection] = {}
        self._ids = itertools.count(1)
        self._server: Optional[asyncio.AbstractServer] = None

    async def start(self) -> None:
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        try:
            os.unlink(self.path)        # a stale socket of an earlier NM run
        except FileNotFoundError:
            pass
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: _Connection(self, next(self._ids)), self.path)
        # The NM's user only: containers run as that user (README "Security"), and another local
        # user's process must not hold this node's CPU or network slots. Were containers to run as
        # their submitters (YARN's LinuxContainerExecutor), the socket would need the group of
        # those users and a peer check (SO_PEERCRED) instead.
        os.chmod(self.path, 0o600)
        log.info("arbiter listening on %s", self.path)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for c in list(self.connections.values()):
                if c.transport is not None:
                    c.transport.close()
            await self._server.wait_closed()
            self._server = None
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def handle(self, conn: int, f: Frame) -> None:
        """One frame from connection `conn`."""
        a = self.arbiter
        try:
            if f.op == Op.ACQUIRE:
                out = a.acquire(conn, f.request_id, SlotKind(f.kind), f.job, f.executor, f.flags)
            elif f.op == Op.RELEASE:
                out = a.release(conn, f.request_id)
            elif f.op in (Op.BUSY, Op.IDLE):
                out = a.set_busy(conn, f.request_id, f.op == Op.BUSY)
            elif f.op == Op.PING:
                out = [Notice(conn, Frame(Op.PONG, 0, 0, f.request_id, f.job, f.executor))]
            else:
                raise ArbiterError(f"unknown op {f.op}")
        except (ArbiterError, ValueError) as e:
            log.warning("arbiter: connection %d: %s", conn, e)
            out = [Notice(conn, Frame(Op.ERROR, f.op, 0, f.request_id, f.job, f.executor))]
        self._send(out)

    def closed(self, conn: int) -> None:
        self._send(self.arbiter.disconnect(conn))

    def _send(self, notices: list[Notice]) -> None:
        for n in notices:
            c = self.connections.get(n.conn)
            if c is not None:
                c.send(n.frame)

    def view(self, limit: int = 1000, names: Optional[Mapping[int, str]] = None) -> dict[str, object]:
        """The arbiter's state and its latest `limit` grants (the NM web API's /ws/v1/node/arbiter);
        `names` (name_hash -> app / container id, from the NM's containers) names the job and the
        executor of a grant where it can."""
        records = self.arbiter.records()
        log = [r.to_json() for r in records[-limit:]] if limit > 0 else []
        if names:
            for g in log:
                g["app_id"] = names.get(int(str(g["job"]), 16), "")
                g["container_id"] = names.get(int(str(g["executor"]), 16), "")
        state = self.arbiter.state()
        if names:
            by_job = self.arbiter.cpu_grants_by_job
            state["cpu_grants_by_app"] = {names[j]: n for j, n in by_job.items() if j in names}
        return {"socket": self.path, "connections": len(self.connections), **state, "grantLog": log}

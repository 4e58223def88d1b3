"""The PS data plane: an asyncio frame server and a multiplexing client (one connection per peer).

Every request frame carries an "id"; the reply frame carries the same id, so many requests can be in
flight on one connection and replies are matched by id. The server handles the frames of one
connection in arrival order (a handler that returns a plain reply answers before the next frame is
read), which gives each client read-my-writes ordering on a connection.

With a job secret (`secret=`, the key from psruntime.dataplane_auth.secret_key) every connection
first runs psruntime.dataplane_auth's handshake: the server serves no frame, and takes no frame
with a body, before the client proved the secret, and drops the connection (logging the peer and
the reason) on a bad or missing proof or after HANDSHAKE_TIMEOUT_S; the client's `open` returns
once the server proved it too. `secret=None` is today's unauthenticated data plane (in-process
tests, tools); the PS AM and the executors it launches always pass the job's secret.
"""
from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
from typing import Any, Awaitable, Callable, Sequence, Union

import numpy as np

from psruntime.dataplane_auth import HANDSHAKE_TIMEOUT_S, AuthError, ClientHandshake, ServerHandshake
from psruntime.frame_codec import DEFAULT_MAX_BODY_BYTES, Frame, FrameError
from psruntime.frame_protocol import FrameProtocol

log = logging.getLogger(__name__)

Reply = tuple[dict[str, Any], Sequence[np.ndarray]]
Handler = Callable[[Frame], Union[Reply, Awaitable[Reply]]]


class RemoteError(RuntimeError):
    """The peer answered a request with an error frame; `kind` is the peer's error class name."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


class RequestError(ValueError):
    """Raised by a handler for a request that is malformed; answered as an error frame."""


def parse_address(address: str) -> tuple[str, int]:
    """Split "host:port" (the data-plane address form used everywhere) into its parts."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"bad data-plane address {address!r}: expected host:port")
    return host, int(port)


def error_reply(exc: BaseException) -> Reply:
    return {"op": "error", "kind": type(exc).__name__, "error": str(exc)}, ()


class DataPlaneServer:
    """Serves frames on a TCP port; `handler(frame)` returns the reply (or an awaitable of it).
    With `secret`, only to connections that proved it (see the module doc)."""

    def __init__(self, handler: Handler, host: str = "127.0.0.1", port: int = 0,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, secret: bytes | None = None) -> None:
        self._handler = handler
        self._secret = secret
        self.refused = 0           # connections refused by the handshake (for tests and status)
        self._host = host
        self._port = port
        self._max_body = max_body_bytes
        self._server: asyncio.Server | None = None
        self._conns: set[_ServerConnection] = set()

    @property
    def address(self) -> str:
        assert self._server is not None, "server not started"
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    async def start(self) -> str:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _ServerConnection(self).protocol, self._host, self._port)
        return self.address

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for c in list(self._conns):
            c.close()
        await self._server.wait_closed()
        self._server = None


class _ServerConnection:
    """One accepted connection: frames are handled in arrival order, replies tagged with their id."""

    def __init__(self, server: DataPlaneServer) -> None:
        self._server = server
        self._pending: set[asyncio.Task[None]] = set()
        self._auth = ServerHandshake(server._secret) if server._secret is not None else None
        self._refused = False
        self._auth_timer: asyncio.TimerHandle | None = None
        # Until the peer proved the secret it may send header-only frames, nothing to allocate for.
        self.protocol = FrameProtocol(self._on_frame, self._on_lost, 0 if self._auth else server._max_body,
                                      self._on_error, stop_reading_while_blocked=True,
                                      on_connected=self._on_connected if self._auth else None)
        server._conns.add(self)

    def _peer(self) -> str:
        tr = self.protocol.transport
        peer = tr.get_extra_info("peername") if tr is not None else None
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer)

    def _on_connected(self) -> None:
        assert self._auth is not None
        self._auth_timer = asyncio.get_running_loop().call_later(
            HANDSHAKE_TIMEOUT_S, self._refuse, f"no answer to the challenge within {HANDSHAKE_TIMEOUT_S:.0f}s")
        self.protocol.write_frame(self._auth.challenge())

    def _authenticate(self, frame: Frame) -> None:
        assert self._auth is not None
        try:
            ok = self._auth.check(frame)
        except AuthError as e:
            self._refuse(str(e))
            return
        self._auth = None
        if self._auth_timer is not None:
            self._auth_timer.cancel()
        self.protocol.set_max_body_bytes(self._server._max_body)
        self.protocol.write_frame(ok)

    def _refuse(self, reason: str) -> None:
        """Drop a connection that did not prove the secret: nothing of it is served, ever."""
        if self._refused:
            return
        self._refused = True
        self._server.refused += 1
        log.warning("refused data-plane connection from %s: %s", self._peer(), reason)
        self._send(None, error_reply(AuthError("authentication failed")))
        self.protocol.close()

    def _on_frame(self, frame: Frame) -> None:
        if self._refused:
            return   # frames that were already buffered behind a refused handshake
        if self._auth is not None:
            self._authenticate(frame)
            return
        rid = frame.header.get("id")
        try:
            result = self._server._handler(frame)
        except Exception as e:  # noqa: BLE001 - any handler failure is answered, never fatal
            result = error_reply(e)
        if inspect.isawaitable(result):
            t = asyncio.ensure_future(self._finish(rid, result))
            self._pending.add(t)
            t.add_done_callback(self._pending.discard)
        else:
            self._send(rid, result)

    def _on_error(self, e: FrameError) -> None:
        if self._auth is not None:   # e.g. a body sent before the handshake
            self._refuse(f"bad frame before the handshake: {e}")
            return
        # The stream is out of step after a bad frame: say why, then the protocol drops the connection.
        log.warning("closing data-plane connection: %s", e)
        self._send(None, error_reply(e))

    def _on_lost(self, exc: BaseException | None) -> None:
        if self._auth_timer is not None:
            self._auth_timer.cancel()
        for t in self._pending:
            t.cancel()
        self._server._conns.discard(self)

    def close(self) -> None:
        self.protocol.close()

    async def _finish(self, rid: Any, aw: Awaitable[Reply]) -> None:
        try:
            result = await aw
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001
            result = error_reply(e)
        self._send(rid, result)

    def _send(self, rid: Any, result: Reply) -> None:
        header, arrays = result
        try:
            try:
                self.protocol.write_frame({**header, "id": rid}, arrays)
            except FrameError as e:
                self.protocol.write_frame({**error_reply(e)[0], "id": rid})
        except ConnectionError:
            pass  # the client went away; nobody to answer


class DataPlaneConnection:
    """One client connection to a peer, with many requests in flight matched by id; with `secret`,
    `open` authenticates it (both ways) before returning it."""

    def __init__(self, address: str, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 secret: bytes | None = None) -> None:
        self.address = address
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Frame]] = {}
        self._closed_error: BaseException | None = None
        loop = asyncio.get_running_loop()
        self._lost = loop.create_future()
        self._auth = ClientHandshake(secret) if secret is not None else None
        self._authenticated: asyncio.Future[None] = loop.create_future()
        self.protocol = FrameProtocol(self._on_frame, self._on_lost, max_body_bytes, self._on_error)

    @classmethod
    async def open(cls, address: str, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                   secret: bytes | None = None) -> "DataPlaneConnection":
        host, port = parse_address(address)
        conn = cls(address, max_body_bytes, secret)
        await asyncio.get_running_loop().create_connection(lambda: conn.protocol, host, port)
        if conn._auth is not None:
            try:
                await asyncio.wait_for(asyncio.shield(conn._authenticated), HANDSHAKE_TIMEOUT_S)
            except BaseException as e:
                await conn.close()
                if isinstance(e, asyncio.TimeoutError):
                    raise AuthError(f"no handshake from {address} within {HANDSHAKE_TIMEOUT_S:.0f}s") from None
                raise
        return conn

    @property
    def closed(self) -> bool:
        return self._closed_error is not None

    def submit(self, header: dict[str, Any], arrays: Sequence[np.ndarray] = ()) -> asyncio.Future[Frame]:
        """Write a request now (so requests on one connection keep their order); return its reply future.

        The future resolves to the reply frame, or fails with RemoteError / ConnectionError.
        """
        if self._closed_error is not None:
            raise ConnectionError(f"connection to {self.address} is closed: {self._closed_error}")
        rid = next(self._ids)
        fut: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self.protocol.write_frame({**header, "id": rid}, arrays)
        self._waiting[rid] = fut
        return fut

    async def drain(self) -> None:
        """Wait until the socket's write buffer is below its high-water mark (backpressure)."""
        await self.protocol.drain()

    async def request(self, header: dict[str, Any], arrays: Sequence[np.ndarray] = ()) -> Frame:
        fut = self.submit(header, arrays)
        await self.protocol.drain()
        return await fut

    def _handshake(self, frame: Frame) -> None:
        assert self._auth is not None
        try:
            if frame.header.get("op") == "auth_challenge":
                self.protocol.write_frame(self._auth.answer(frame))
                return
            self._auth.confirm(frame)
        except (AuthError, ConnectionError) as e:
            self._closed_error = e
            if not self._authenticated.done():
                self._authenticated.set_exception(e)
            self.protocol.close()
            return
        self._auth = None
        self._authenticated.set_result(None)

    def _on_frame(self, frame: Frame) -> None:
        if self._auth is not None:
            self._handshake(frame)
            return
        rid = frame.header.get("id")
        fut = self._waiting.pop(rid, None) if isinstance(rid, int) else None
        if fut is None:
            if frame.header.get("op") == "auth_challenge":   # the peer needs a job secret we lack
                self._closed_error = AuthError(f"{self.address} requires the job's secret; this client has none")
                self.protocol.close()
            elif frame.header.get("op") == "error":  # the peer refused our stream as a whole
                self._closed_error = RemoteError(str(frame.header.get("kind", "Error")),
                                                 str(frame.header.get("error", "")))
                self.protocol.close()
            else:
                log.warning("reply for unknown request id %r from %s", rid, self.address)
            return
        if fut.done():
            return
        if frame.header.get("op") == "error":
            fut.set_exception(RemoteError(str(frame.header.get("kind", "Error")), str(frame.header.get("error", ""))))
        else:
            fut.set_result(frame)

    def _on_error(self, e: FrameError) -> None:
        self._closed_error = ConnectionError(f"protocol error from {self.address}: {e}")

    def _on_lost(self, exc: BaseException | None) -> None:
        err = ConnectionError(f"connection to {self.address} lost: {self._closed_error or exc or 'closed'}")
        self._closed_error = err
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(err)
                fut.exception()  # a fire-and-forget caller may never look at it: no "never retrieved" noise
        self._waiting.clear()
        if self._auth is not None and not self._authenticated.done():
            self._authenticated.set_exception(AuthError(f"{self.address} closed the connection during the "
                                                        f"handshake: {exc or 'closed'}"))
            self._authenticated.exception()
        if not self._lost.done():
            self._lost.set_result(None)

    async def close(self) -> None:
        self.protocol.close()
        if self.protocol.transport is not None:
            await asyncio.shield(self._lost)


class DataPlaneClient:
    """Keeps one connection per peer address and reopens it after a failure; with `secret`, every
    connection is authenticated when it opens."""

    def __init__(self, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, secret: bytes | None = None) -> None:
        self._conns: dict[str, DataPlaneConnection] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._max_body = max_body_bytes
        self._secret = secret

    def cached(self, address: str) -> DataPlaneConnection | None:
        """The open connection to `address`, if there is one (lets callers submit without awaiting)."""
        conn = self._conns.get(address)
        return conn if conn is not None and not conn.closed else None

    async def connection(self, address: str) -> DataPlaneConnection:
        conn = self.cached(address)
        if conn is not None:
            return conn
        lock = self._locks.setdefault(address, asyncio.Lock())
        async with lock:
            conn = self.cached(address)
            if conn is None:
                old = self._conns.pop(address, None)
                if old is not None:
                    await old.close()
                conn = await DataPlaneConnection.open(address, self._max_body, self._secret)
                self._conns[address] = conn
            return conn

    async def request(self, address: str, header: dict[str, Any], arrays: Sequence[np.ndarray] = ()) -> Frame:
        return await (await self.connection(address)).request(header, arrays)

    async def close(self) -> None:
        conns = list(self._conns.values())
        self._conns.clear()
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)

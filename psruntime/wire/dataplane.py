"""The PS data plane: an asyncio frame server and a multiplexing client (one connection per peer).

Every request frame carries an "id"; the reply frame carries the same id, so many requests can be in
flight on one connection and replies are matched by id. The server handles the frames of one
connection in arrival order (a handler that returns a plain reply answers before the next frame is
read), which gives each client read-my-writes ordering on a connection.

With a job secret (`secret=`, the key from psruntime.wire.dataplane_auth.secret_key) every connection
first runs psruntime.wire.dataplane_auth's handshake: the server serves no frame, and takes no frame
with a body or a header over PREAUTH_MAX_HEADER_BYTES (4 KiB), before the client proved the secret
(the client likewise until the server proved it), and drops the connection (logging the peer and
the reason) on a bad or missing proof or after HANDSHAKE_TIMEOUT_S; the client's `open` returns
once the server proved it too. `secret=None` is today's unauthenticated data plane (in-process
tests, tools); the PS AM and the executors it launches always pass the job's secret.

A peer can vanish without a word: its host powered off or its link cut sends no RST and no FIN,
so a request to it, or a connect to its address (SYNs retried for about two minutes), would wait
for as long as the kernel's defaults allow. Every connection therefore has a connect timeout,
TCP keepalive and TCP_USER_TIMEOUT (`LinkLiveness`), which end it within tens of seconds of its
peer going silent, on both ends. Faster still, whoever learns that a peer is gone (the PS AM,
from the RM's loss report) calls `DataPlaneClient.mark_lost`: every request in flight to that
address, and an open under way, fails at once with `PeerLost`, as does every later one until
`clear_lost` (a new executor announced that address).
"""
from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import socket
from typing import Annotated, Awaitable, Callable, Sequence, Union

import msgspec
import numpy as np

from psruntime.wire.dataplane_auth import HANDSHAKE_TIMEOUT_S, AuthError, ClientHandshake, ServerHandshake
from psruntime.wire.frame_codec import DEFAULT_MAX_BODY_BYTES, MAX_HEADER_BYTES, Frame, FrameError
from psruntime.wire.frame_protocol import PREAUTH_MAX_HEADER_BYTES, FrameProtocol
from protocol.errors import ProtocolError
from protocol.json_types import JsonInObject, JsonValue

log = logging.getLogger(__name__)

# A handler's answer: the reply header (JSON; the server adds the request's "id") and its arrays.
Reply = tuple[JsonInObject, Sequence[np.ndarray]]
Handler = Callable[[Frame], Union[Reply, Awaitable[Reply]]]


class RemoteError(ProtocolError, RuntimeError):
    """The peer answered a request with an error frame; `kind` is the peer's error class name."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


class RequestError(ProtocolError, ValueError):
    """Raised by a handler for a request that is malformed; answered as an error frame."""


class PeerLost(ProtocolError, ConnectionError):
    """The peer at `address` was declared gone (`DataPlaneClient.mark_lost`: its executor's container
    ended, or it stopped answering); `reason` says how that was learnt."""

    def __init__(self, address: str, reason: str) -> None:
        super().__init__(f"{address} is lost: {reason}")
        self.address = address
        self.reason = reason


class ConnectTimeout(ProtocolError, ConnectionError):
    """No connection to a peer within `LinkLiveness.connect_timeout_s` (its host is down or cut off:
    a dead host's address drops SYNs instead of refusing them)."""


Seconds = Annotated[float, msgspec.Meta(gt=0)]


class LinkLiveness(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How long a data-plane connection trusts a silent peer (see the module doc).

    A connect gives up after `connect_timeout_s`. Once connected, TCP keepalive probes an idle
    connection after `keepalive_idle_s`, every `keepalive_interval_s`, and drops it after
    `keepalive_probes` unanswered ones; TCP_USER_TIMEOUT drops it when data it sent stays
    unacknowledged for `user_timeout_s`. Only the peer's kernel answers these, so a busy or slow
    executor never meets them (a long clock, a large transfer on a capped link: its ACKs come);
    a host that is gone does within about 30 s by default. Keepalive times are whole seconds
    (the kernel's unit), at least 1."""

    connect_timeout_s: Seconds = 15.0
    keepalive_idle_s: Seconds = 10.0
    keepalive_interval_s: Seconds = 5.0
    keepalive_probes: Annotated[int, msgspec.Meta(ge=1)] = 3
    user_timeout_s: Seconds = 30.0


DEFAULT_LIVENESS = LinkLiveness()


def apply_liveness(transport: asyncio.BaseTransport | None, liveness: LinkLiveness) -> None:
    """Set keepalive and TCP_USER_TIMEOUT on a TCP transport's socket (options this platform lacks
    are skipped: the connect timeout and the AM's loss reports still hold)."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (("TCP_KEEPIDLE", liveness.keepalive_idle_s), ("TCP_KEEPINTVL", liveness.keepalive_interval_s),
                        ("TCP_KEEPCNT", liveness.keepalive_probes)):
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), max(1, round(value))))
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        options.append((socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, max(1, round(liveness.user_timeout_s * 1000))))
    for level, option, value in options:
        try:
            sock.setsockopt(level, option, value)
        except OSError as e:
            log.debug("data plane: socket option %s not set: %s", option, e)


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
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, secret: bytes | None = None,
                 liveness: LinkLiveness = DEFAULT_LIVENESS) -> None:
        self._handler = handler
        self._secret = secret
        self.liveness = liveness   # a client that vanished is dropped too (its replies go nowhere)
        self.refused = 0           # connections refused by the handshake (for tests and status)
        self._host = host
        self._port = port
        self._max_body = max_body_bytes
        self._server: asyncio.Server | None = None
        self._conns: set[_ServerConnection] = set()

    @property
    def connections(self) -> int:
        """Client connections open now (one whose loss was seen is no longer counted)."""
        return len(self._conns)

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
        # Until the peer proved the secret it may send small header-only frames (the handshake),
        # nothing to allocate for: a prefix declaring more is refused before any buffer grows.
        self.protocol = FrameProtocol(self._on_frame, self._on_lost, 0 if self._auth else server._max_body,
                                      self._on_error, stop_reading_while_blocked=True,
                                      on_connected=self._on_connected,
                                      max_header_bytes=PREAUTH_MAX_HEADER_BYTES if self._auth else MAX_HEADER_BYTES)
        server._conns.add(self)

    def _peer(self) -> str:
        tr = self.protocol.transport
        peer = tr.get_extra_info("peername") if tr is not None else None
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer)

    def _on_connected(self) -> None:
        apply_liveness(self.protocol.transport, self._server.liveness)
        if self._auth is None:
            return
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
        self.protocol.set_max_header_bytes(MAX_HEADER_BYTES)
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

    async def _finish(self, rid: JsonValue, aw: Awaitable[Reply]) -> None:
        try:
            result = await aw
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001
            result = error_reply(e)
        self._send(rid, result)

    def _send(self, rid: JsonValue, result: Reply) -> None:
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
        self._max_body = max_body_bytes
        # Likewise towards a server that has not proved the secret yet: small header-only frames.
        self.protocol = FrameProtocol(self._on_frame, self._on_lost, 0 if self._auth else max_body_bytes,
                                      self._on_error, coalesce_writes=True,
                                      max_header_bytes=PREAUTH_MAX_HEADER_BYTES if self._auth else MAX_HEADER_BYTES)

    @classmethod
    async def open(cls, address: str, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                   secret: bytes | None = None, liveness: LinkLiveness = DEFAULT_LIVENESS) -> "DataPlaneConnection":
        """Connect (ConnectTimeout after `liveness.connect_timeout_s`) and, with `secret`, authenticate."""
        host, port = parse_address(address)
        conn = cls(address, max_body_bytes, secret)
        try:
            # asyncio.timeout, not wait_for: no task in between, so a request written right after
            # the open goes out in the same turn of the loop as before.
            async with asyncio.timeout(liveness.connect_timeout_s):
                await asyncio.get_running_loop().create_connection(lambda: conn.protocol, host, port)
        except TimeoutError:
            raise ConnectTimeout(f"no connection to {address} within {liveness.connect_timeout_s:g}s") from None
        apply_liveness(conn.protocol.transport, liveness)
        if conn._auth is not None:
            try:
                async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
                    await asyncio.shield(conn._authenticated)
            except BaseException as e:
                await conn.close()
                if isinstance(e, asyncio.TimeoutError):
                    raise AuthError(f"no handshake from {address} within {HANDSHAKE_TIMEOUT_S:.0f}s") from None
                raise
        return conn

    @property
    def closed(self) -> bool:
        return self._closed_error is not None

    def submit(self, header: JsonInObject, arrays: Sequence[np.ndarray] = ()) -> asyncio.Future[Frame]:
        """Write a request now (so requests on one connection keep their order); return its reply future.

        The future resolves to the reply frame, or fails with RemoteError / ConnectionError.
        """
        if self._closed_error is not None:
            if isinstance(self._closed_error, PeerLost):
                raise PeerLost(self.address, self._closed_error.reason)
            raise ConnectionError(f"connection to {self.address} is closed: {self._closed_error}")
        rid = next(self._ids)
        fut: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self.protocol.write_frame({**header, "id": rid}, arrays)
        self._waiting[rid] = fut
        return fut

    async def drain(self) -> None:
        """Wait until the socket's write buffer is below its high-water mark (backpressure)."""
        await self.protocol.drain()

    async def request(self, header: JsonInObject, arrays: Sequence[np.ndarray] = ()) -> Frame:
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
        self.protocol.set_max_body_bytes(self._max_body)
        self.protocol.set_max_header_bytes(MAX_HEADER_BYTES)
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
        err = self._closed_error if isinstance(self._closed_error, PeerLost) else \
            ConnectionError(f"connection to {self.address} lost: {self._closed_error or exc or 'closed'}")
        self._fail_all(err, AuthError(f"{self.address} closed the connection during the handshake: {exc or 'closed'}"))
        if not self._lost.done():
            self._lost.set_result(None)

    def _fail_all(self, err: ConnectionError, handshake_err: ConnectionError) -> None:
        self._closed_error = err
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(err)
                fut.exception()  # a fire-and-forget caller may never look at it: no "never retrieved" noise
        self._waiting.clear()
        if self._auth is not None and not self._authenticated.done():
            self._authenticated.set_exception(handshake_err)
            self._authenticated.exception()

    def abort(self, error: PeerLost) -> None:
        """The peer is gone: fail every request in flight with `error` now and drop the connection
        without the closing handshake (a vanished peer would never answer it, and unsent data
        to it would hold a graceful close open)."""
        self._fail_all(error, error)
        tr = self.protocol.transport
        if tr is not None:
            tr.abort()

    def when_lost(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the connection is gone (closed by either side, or failed)."""
        self._lost.add_done_callback(lambda _: callback())

    async def close(self) -> None:
        self.protocol.close()
        if self.protocol.transport is not None:
            await asyncio.shield(self._lost)


class DataPlaneClient:
    """Keeps one connection per peer address and reopens it after a failure; with `secret`, every
    connection is authenticated when it opens. An address marked lost fails every request at once
    (`mark_lost`, module doc)."""

    def __init__(self, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, secret: bytes | None = None,
                 liveness: LinkLiveness = DEFAULT_LIVENESS) -> None:
        self._conns: dict[str, DataPlaneConnection] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._max_body = max_body_bytes
        self._secret = secret
        self.liveness = liveness
        self._lost: dict[str, str] = {}        # address -> why it was declared lost
        self._opening: dict[str, asyncio.Task[object]] = {}     # address -> the (caller's) task opening it
        self._open_aborts: dict[asyncio.Task[object], str] = {}  # opens cancelled by mark_lost -> why
        # Told the address of a peer whose connection dropped without this client closing it (the
        # AM: the executor's process probably ended; its container's end is worth asking for now).
        self.peer_closed: Callable[[str], None] | None = None

    def lost(self, address: str) -> str | None:
        """Why `address` was marked lost, or None."""
        return self._lost.get(address)

    def mark_lost(self, address: str, reason: str) -> None:
        """The peer at `address` is gone: every request in flight to it and an open under way fail
        now with PeerLost, and so does every request to it until `clear_lost(address)`."""
        self._lost[address] = reason
        error = PeerLost(address, reason)
        conn = self._conns.pop(address, None)
        if conn is not None:
            conn.abort(error)
        opening = self._opening.get(address)
        if opening is not None and opening not in self._open_aborts:
            self._open_aborts[opening] = reason
            opening.cancel()

    def clear_lost(self, address: str) -> None:
        """`address` may be served again (a new peer announced it)."""
        self._lost.pop(address, None)

    def _check_lost(self, address: str) -> None:
        reason = self._lost.get(address)
        if reason is not None:
            raise PeerLost(address, reason)

    def cached(self, address: str) -> DataPlaneConnection | None:
        """The open connection to `address`, if there is one (lets callers submit without awaiting)."""
        conn = self._conns.get(address)
        return conn if conn is not None and not conn.closed else None

    async def connection(self, address: str) -> DataPlaneConnection:
        conn = self.cached(address)
        if conn is not None:
            return conn
        self._check_lost(address)
        lock = self._locks.setdefault(address, asyncio.Lock())
        async with lock:
            self._check_lost(address)         # marked lost while this waited for the lock
            conn = self.cached(address)
            if conn is None:
                old = self._conns.pop(address, None)
                if old is not None:
                    await old.close()
                conn = await self._open(address)
                self._conns[address] = conn
                if self.peer_closed is not None:
                    conn.when_lost(lambda: self._dropped(address, conn))
            return conn

    async def _open(self, address: str) -> DataPlaneConnection:
        """Open a connection to `address`; PeerLost as soon as it is marked lost meanwhile (a
        connect to a vanished host would wait for its timeout). `mark_lost` cancels this task and
        says why; the open runs in the caller's task, so it costs no extra turn of the loop."""
        task = asyncio.current_task()
        assert task is not None
        self._opening[address] = task
        try:
            return await DataPlaneConnection.open(address, self._max_body, self._secret, self.liveness)
        except asyncio.CancelledError:
            reason = self._open_aborts.pop(task, None)
            if reason is None or task.uncancel() > 0:
                raise                     # cancelled by its caller (too)
            raise PeerLost(address, reason) from None
        finally:
            if self._opening.get(address) is task:
                del self._opening[address]
            self._open_aborts.pop(task, None)

    def _dropped(self, address: str, conn: DataPlaneConnection) -> None:
        # Still ours: neither mark_lost nor close() took it out before it went.
        if self._conns.get(address) is conn and self.peer_closed is not None:
            self.peer_closed(address)

    async def request(self, address: str, header: JsonInObject, arrays: Sequence[np.ndarray] = ()) -> Frame:
        return await (await self.connection(address)).request(header, arrays)

    async def close(self) -> None:
        conns = list(self._conns.values())
        self._conns.clear()
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)


"""An asyncio BufferedProtocol that cuts a byte stream into frames (psruntime.frame_codec layout).

Why not StreamReader.readexactly: it appends every received chunk to one growing bytearray, then
copies the frame out and shifts the rest, so an 8 MiB body is copied about three times. Here the
transport receives a large body straight into the frame's own buffer (`get_buffer` hands out a
view of it): the kernel-to-user copy is the only one. Small frames and headers go through a
scratch buffer, several per recv.

Also does write-side flow control: `drain()` lets writers wait while the transport's write buffer
is above its high-water mark, and a server-side protocol (`stop_reading_while_blocked`) stops
reading requests meanwhile, so a client that never reads its replies cannot make the server buffer
without bound. Clients always keep reading: if both sides stopped, two peers with full buffers
towards each other would wait forever.
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable, Sequence

import numpy as np

from psruntime.frame_codec import PREFIX, Frame, FrameError, decode_frame, encode_frame, parse_prefix

SCRATCH_BYTES = 256 << 10
DIRECT_MIN_BYTES = 64 << 10  # bodies with at least this much left are received in place
WRITE_HIGH_WATER = 16 << 20
JOIN_BELOW_BYTES = 64 << 10


class FrameProtocol(asyncio.BufferedProtocol):
    """Calls `on_frame(frame)` for each complete frame, `on_error(exc)` for a malformed one (then
    closes), and `on_lost(exc|None)` when the connection ends."""

    def __init__(self, on_frame: Callable[[Frame], None], on_lost: Callable[[BaseException | None], None],
                 max_body_bytes: int, on_error: Callable[[FrameError], None] | None = None,
                 stop_reading_while_blocked: bool = False) -> None:
        self._on_frame = on_frame
        self._on_lost = on_lost
        self._on_error = on_error
        self._stop_reading_while_blocked = stop_reading_while_blocked
        self._max_body = max_body_bytes
        self._scratch = bytearray(SCRATCH_BYTES)
        self._start = 0
        self._end = 0
        self._header: bytes | None = None
        self._body: np.ndarray | None = None
        self._body_got = 0
        self._direct = False
        self.transport: asyncio.Transport | None = None
        self._paused_writing = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._closed = False

    # -- connection --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        # The default 64 KiB high-water mark would pause reading on every multi-MiB reply.
        self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._wake_drainers(exc or ConnectionError("connection closed"))
        self._on_lost(exc)

    def pause_writing(self) -> None:
        self._paused_writing = True
        if self._stop_reading_while_blocked and self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._paused_writing = False
        if self._stop_reading_while_blocked and self.transport is not None and not self._closed:
            self.transport.resume_reading()
        self._wake_drainers(None)

    def _wake_drainers(self, exc: BaseException | None) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for w in waiters:
            if not w.done():
                if exc is None:
                    w.set_result(None)
                else:
                    w.set_exception(exc)
                    w.exception()  # retrieved: nobody may be waiting any more

    async def drain(self) -> None:
        if self._closed:
            raise ConnectionError("connection closed")
        if not self._paused_writing:
            return
        fut = asyncio.get_running_loop().create_future()
        self._drain_waiters.append(fut)
        await fut

    def write_frame(self, header: dict[str, Any], arrays: Sequence[np.ndarray] = ()) -> None:
        """Queue a frame (synchronous, so frames from different tasks never interleave)."""
        if self._closed or self.transport is None:
            raise ConnectionError("connection closed")
        pieces = encode_frame(header, arrays)
        head = pieces[0] + pieces[1]
        if len(pieces) == 2:
            self.transport.write(head)
        elif sum(len(p) for p in pieces[2:]) < JOIN_BELOW_BYTES:
            # One write call per small frame: each piece would otherwise be its own send syscall
            # (and, with TCP_NODELAY, its own packet); copying a few KiB is far cheaper.
            self.transport.write(b"".join([head, *pieces[2:]]))
        else:
            self.transport.writelines([head, *pieces[2:]])  # large buffers go out from their own memory

    def close(self) -> None:
        if self.transport is not None and not self._closed:
            self.transport.close()

    # -- reading -----------------------------------------------------------------------------
    def get_buffer(self, sizehint: int) -> memoryview:
        body = self._body
        if body is not None and self._start == self._end and len(body) - self._body_got >= DIRECT_MIN_BYTES:
            self._direct = True
            return memoryview(body[self._body_got:])
        self._direct = False
        if self._start == self._end:
            self._start = self._end = 0
        elif len(self._scratch) - self._end < 4096:
            # Compact: move the unparsed tail to the front (it is at most one partial header).
            n = self._end - self._start
            self._scratch[:n] = self._scratch[self._start:self._end]
            self._start, self._end = 0, n
            if len(self._scratch) - n < 4096:
                self._scratch.extend(bytes(len(self._scratch)))  # a header larger than the scratch
        return memoryview(self._scratch)[self._end:]

    def buffer_updated(self, nbytes: int) -> None:
        if self._direct:
            self._body_got += nbytes
            if self._body_got == len(self._body):  # type: ignore[arg-type]
                self._emit()
            return
        self._end += nbytes
        try:
            self._parse()
        except FrameError as e:
            self._fail(e)

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost reports it

    def _parse(self) -> None:
        while not self._closed:
            avail = self._end - self._start
            if self._body is not None:
                take = min(len(self._body) - self._body_got, avail)
                if take:
                    self._body[self._body_got:self._body_got + take] = \
                        np.frombuffer(self._scratch, np.uint8, take, self._start)
                    self._body_got += take
                    self._start += take
                if self._body_got < len(self._body):
                    return
                self._emit()
                continue
            if avail < PREFIX.size:
                return
            hlen, blen = parse_prefix(bytes(self._scratch[self._start:self._start + PREFIX.size]), self._max_body)
            if avail < PREFIX.size + hlen:
                if PREFIX.size + hlen > len(self._scratch):
                    self._scratch.extend(bytes(PREFIX.size + hlen))
                return
            hstart = self._start + PREFIX.size
            self._header = bytes(self._scratch[hstart:hstart + hlen])
            self._start = hstart + hlen
            # np.empty, not bytearray: no zero-fill pass over a body that recv overwrites anyway.
            self._body = np.empty(blen, np.uint8)
            self._body_got = 0
            if blen == 0:
                self._emit()

    def _emit(self) -> None:
        header, body = self._header, self._body
        self._header, self._body, self._body_got, self._direct = None, None, 0, False
        try:
            frame = decode_frame(header or b"", memoryview(body) if body is not None else b"")
        except FrameError as e:
            self._fail(e)
            return
        self._on_frame(frame)

    def _fail(self, e: FrameError) -> None:
        if self._on_error is not None:
            self._on_error(e)
        self._closed = True
        if self.transport is not None:
            self.transport.close()

"""An asyncio BufferedProtocol that cuts a byte stream into frames (psruntime.wire.frame_codec layout).

Why not StreamReader.readexactly: it appends every received chunk to one growing bytearray, then
copies the frame out and shifts the rest, so an 8 MiB body is copied about three times. Here the
transport receives a large body straight into the frame's own buffer (`get_buffer` hands out a
view of it): the kernel-to-user copy is the only one. Small frames and headers go through a
scratch buffer, several per recv.

Large bodies are received into buffers the connection reuses (psruntime.wire.buffer_pool) once no view
of them is alive (the server's push applied, the client's pulled values dropped): a fresh
multi-MiB buffer cost as much in page faults as receiving the bytes into it. Replies written while
one read is handled go out in one send (`write_frame`).

Also does write-side flow control: `drain()` lets writers wait while the transport's write buffer
is above its high-water mark, and a server-side protocol (`stop_reading_while_blocked`) stops
reading requests meanwhile, so a client that never reads its replies cannot make the server buffer
without bound. Clients always keep reading: if both sides stopped, two peers with full buffers
towards each other would wait forever.

Bandwidth emulation: with a `pacer` (by default the process's, psruntime.wire.bandwidth.process_pacer,
set when the NM passes ELASTANE_NODE_BANDWIDTH_BPS) frames go out through a FIFO queue of chunks,
each released when the shared token bucket allows it. `write_frame` stays synchronous (frames
never interleave) and copies what it queues, since the caller may reuse its arrays at once; the
queue counts towards the high-water mark, so `drain()` and the server's read pause also apply.
Frames under PACE_MIN_BYTES are charged to the bucket but not delayed while the queue is empty,
so control traffic is not held behind the pacing granularity.
"""
from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Callable, Sequence, cast

import numpy as np

from psruntime.wire import bandwidth
from psruntime.wire.buffer_pool import BufferPool
from psruntime.wire.frame_codec import (
    MAX_HEADER_BYTES, PREFIX, Frame, FrameError, decode_frame, encode_frame, parse_prefix,
)
from protocol.json_types import JsonInObject

SCRATCH_BYTES = 256 << 10
DIRECT_MIN_BYTES = 64 << 10  # bodies with at least this much left are received in place
# One recv into the scratch takes at most this much: more would bring the start of a large body
# in through the scratch (an extra copy) instead of into the body's own buffer.
SCRATCH_READ_BYTES = 64 << 10
WRITE_HIGH_WATER = 16 << 20
JOIN_BELOW_BYTES = 64 << 10
PACE_MIN_BYTES = 16 << 10    # smaller frames are charged to the bucket but not delayed
# The largest header a peer that has not proved the job secret may send (the handshake frames and
# an error reply are a few hundred bytes): a declared length is refused before any buffer grows
# for it, so an unauthenticated connection costs no more than its scratch (set_max_header_bytes).
PREAUTH_MAX_HEADER_BYTES = 4 << 10
_PROCESS_PACER: Any = object()  # sentinel: use bandwidth.process_pacer()


class FrameProtocol(asyncio.BufferedProtocol):
    """Calls `on_frame(frame)` for each complete frame, `on_error(exc)` for a malformed one (then
    closes), `on_connected()` once the connection is made and `on_lost(exc|None)` when it ends."""

    def __init__(self, on_frame: Callable[[Frame], None], on_lost: Callable[[BaseException | None], None],
                 max_body_bytes: int, on_error: Callable[[FrameError], None] | None = None,
                 stop_reading_while_blocked: bool = False,
                 pacer: "bandwidth.Pacer | None" = _PROCESS_PACER,
                 on_connected: Callable[[], None] | None = None, coalesce_writes: bool = False,
                 max_header_bytes: int = MAX_HEADER_BYTES) -> None:
        self._on_frame = on_frame
        self._on_connected = on_connected
        self._on_lost = on_lost
        self._on_error = on_error
        self._stop_reading_while_blocked = stop_reading_while_blocked
        self._max_body = max_body_bytes
        self._max_header = min(max_header_bytes, MAX_HEADER_BYTES)
        self._scratch = bytearray(SCRATCH_BYTES)
        self._start = 0
        self._end = 0
        self._header: bytes | None = None
        self._body: np.ndarray | None = None
        self._body_got = 0
        self._direct = False
        self._body_buffers = BufferPool()
        self.transport: asyncio.Transport | None = None
        self._paused_writing = False      # blocked: transport paused or pacing queue over high water
        self._transport_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._closed = False
        self._pacer = bandwidth.process_pacer() if pacer is _PROCESS_PACER else pacer
        self._outq: deque[memoryview] = deque()
        self._queued = 0
        self._pump: asyncio.Task[None] | None = None
        self._pump_resume: asyncio.Future[None] | None = None
        self._close_when_flushed = False
        self._cork: list[bytes | memoryview] | None = None     # frames kept while a read is handled (write_frame)
        self._cork_bytes = 0
        self._coalesce = coalesce_writes      # also keep frames written outside a read (write_frame)

    # -- connection --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream connection's transport is a Transport; BufferedProtocol types it as the base.
        self.transport = tr = cast(asyncio.Transport, transport)
        # The default 64 KiB high-water mark would pause reading on every multi-MiB reply.
        tr.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        if self._on_connected is not None:
            self._on_connected()

    def set_max_body_bytes(self, max_body_bytes: int) -> None:
        """Change the largest frame body accepted from the next frame on (an authenticating
        server takes header-only frames until the peer proved the secret)."""
        self._max_body = max_body_bytes

    def set_max_header_bytes(self, max_header_bytes: int) -> None:
        """Change the largest frame header accepted from the next frame on (at most the codec's
        MAX_HEADER_BYTES): an authenticating side takes only small headers until the peer proved
        the secret, so a prefix declaring a huge header costs nothing before that."""
        self._max_header = min(max_header_bytes, MAX_HEADER_BYTES)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._cork, self._cork_bytes = None, 0
        self._outq.clear()
        self._queued = 0
        self._body_buffers.clear()
        if self._pump is not None:
            self._pump.cancel()
        self._wake_drainers(exc or ConnectionError("connection closed"))
        self._on_lost(exc)

    def pause_writing(self) -> None:
        self._transport_paused = True
        self._flow_changed()

    def resume_writing(self) -> None:
        self._transport_paused = False
        if self._pump_resume is not None and not self._pump_resume.done():
            self._pump_resume.set_result(None)
        self._flow_changed()

    def _flow_changed(self) -> None:
        """Recompute "blocked" and, on a change, pause / resume reading and wake drainers."""
        blocked = self._transport_paused or self._queued > WRITE_HIGH_WATER
        if blocked == self._paused_writing:
            return
        self._paused_writing = blocked
        if self._stop_reading_while_blocked and self.transport is not None and not self._closed:
            if blocked:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()
        if not blocked:
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

    def write_frame(self, header: JsonInObject, arrays: Sequence[np.ndarray] = ()) -> None:
        """Queue a frame (synchronous, so frames from different tasks never interleave)."""
        if self._closed or self.transport is None:
            raise ConnectionError("connection closed")
        pieces = encode_frame(header, arrays)
        head = b"".join(pieces[:2])    # prefix and header
        if self._pacer is not None:
            self._write_paced(head, pieces[2:])
            return
        nbytes = len(head) + sum(len(p) for p in pieces[2:])
        if self._cork is None:
            if not self._coalesce:
                self._send([head, *pieces[2:]], nbytes)
                return
            # A coalescing (client) connection keeps what is written until the running callback
            # ends: a worker writes a mini-batch's push and the next one's pull in one turn of
            # the loop, and one send carries both (the server then reads them in one recv and
            # answers both in one send), not a syscall and a wake-up of the server each.
            self._cork = []
            asyncio.get_running_loop().call_soon(self._end_cork)
        # Written while handling a read: kept until that read is handled, so the replies to
        # the requests it brought go out in one send syscall (a push's ack with the next pull's
        # reply). A large frame goes out at once, with what was kept before it.
        self._cork += [head, *pieces[2:]]
        self._cork_bytes += nbytes
        if nbytes >= JOIN_BELOW_BYTES:
            self._flush_cork()

    def _send(self, pieces: list[bytes | memoryview], nbytes: int) -> None:
        assert self.transport is not None
        if nbytes < JOIN_BELOW_BYTES:
            # One write call for small frames: each piece would otherwise be its own send syscall
            # (and, with TCP_NODELAY, its own packet); copying a few KiB is far cheaper.
            self.transport.write(pieces[0] if len(pieces) == 1 else b"".join(pieces))
        else:
            self.transport.writelines(pieces)  # large buffers go out from their own memory

    def _flush_cork(self) -> None:
        pieces, nbytes = self._cork, self._cork_bytes
        if pieces:
            self._cork, self._cork_bytes = [], 0
            if not self._closed and self.transport is not None:
                self._send(pieces, nbytes)

    def _end_cork(self) -> None:
        self._flush_cork()
        self._cork = None

    def close(self) -> None:
        if self.transport is not None and not self._closed:
            self._flush_cork()
            if self._outq:
                self._close_when_flushed = True  # like a TCP close: what was written still goes out
                return
            self.transport.close()

    # -- paced writing (bandwidth emulation) ------------------------------------------------
    def _write_paced(self, head: bytes, bufs: Sequence[bytes | memoryview]) -> None:
        assert self._pacer is not None and self.transport is not None
        total = len(head) + sum(len(b) for b in bufs)
        if not self._outq and total < PACE_MIN_BYTES:
            self._pacer.delay_for(total)  # charged: the next large write pays for it
            self.transport.write(b"".join([head, *bufs]))
            return
        data = memoryview(b"".join([head, *bufs]))  # the one copy: the caller may reuse its arrays
        step = self._pacer.bucket.burst
        for off in range(0, total, step):
            self._outq.append(data[off:off + step])
        self._queued += total
        self._flow_changed()
        if self._pump is None:
            self._pump = asyncio.get_running_loop().create_task(self._run_pump())

    async def _run_pump(self) -> None:
        assert self._pacer is not None
        try:
            while self._outq and not self._closed:
                chunk = self._outq[0]
                delay = self._pacer.delay_for(len(chunk))
                if delay > 0:
                    await self._pacer.sleep(delay)
                if self._closed or self.transport is None:
                    return
                self._outq.popleft()
                self._queued -= len(chunk)
                self.transport.write(chunk)
                self._flow_changed()
                if self._transport_paused:
                    # The real link is slower than the cap: wait rather than pile up in the transport.
                    self._pump_resume = asyncio.get_running_loop().create_future()
                    await self._pump_resume
        finally:
            self._pump = None
            self._pump_resume = None
            if self._close_when_flushed and not self._closed and self.transport is not None:
                self.transport.close()

    # -- reading -----------------------------------------------------------------------------
    def get_buffer(self, sizehint: int) -> memoryview:
        body = self._body
        if body is not None and self._start == self._end and len(body) - self._body_got >= DIRECT_MIN_BYTES:
            self._direct = True
            return body[self._body_got:].data
        self._direct = False
        if self._start == self._end:
            self._start = self._end = 0
        elif len(self._scratch) - self._end < 4096:
            # Compact: move the unparsed tail to the front (it is at most one partial header).
            n = self._end - self._start
            self._scratch[:n] = self._scratch[self._start:self._end]
            self._start, self._end = 0, n
            if len(self._scratch) - n < 4096:
                # A header larger than the scratch: a new buffer (no view of the old one is alive
                # here, but one way of growing it is simpler to trust; see _parse).
                self._scratch = self._scratch + bytes(len(self._scratch))
        return memoryview(self._scratch)[self._end:self._end + SCRATCH_READ_BYTES]

    def buffer_updated(self, nbytes: int) -> None:
        if self._cork is None:
            self._cork = []     # see write_frame (frames a coalescing connection kept stay first)
        try:
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
        finally:
            self._flush_cork()
            self._cork = None

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
            if hlen > self._max_header:
                # Refused before the scratch grows for it (a peer that has not authenticated could
                # otherwise make each connection allocate up to MAX_HEADER_BYTES with 16 bytes).
                raise FrameError(f"frame header of {hlen} bytes exceeds the limit of {self._max_header}")
            if avail < PREFIX.size + hlen:
                if PREFIX.size + hlen > len(self._scratch):
                    # A new, larger buffer, not an in-place extend: the transport still holds the
                    # view get_buffer gave it while buffer_updated runs, and resizing a bytearray
                    # with a view raises BufferError, which closed the connection on any header
                    # over the scratch's size (a big ownership table, a checkpoint's descriptors).
                    self._scratch = self._scratch + bytes(PREFIX.size + hlen)
                return
            hstart = self._start + PREFIX.size
            self._header = bytes(self._scratch[hstart:hstart + hlen])
            self._start = hstart + hlen
            self._body = self._body_buffers.take(blen)
            self._body_got = 0
            if blen == 0:
                self._emit()

    def _emit(self) -> None:
        header, body = self._header, self._body
        self._header, self._body, self._body_got, self._direct = None, None, 0, False
        try:
            frame = decode_frame(header or b"", body.data if body is not None else b"")
        except FrameError as e:
            self._fail(e)
            return
        self._on_frame(frame)

    def _fail(self, e: FrameError) -> None:
        if self._on_error is not None:
            self._on_error(e)
        self._flush_cork()   # the error reply _on_error wrote goes out before the close
        self._closed = True
        if self.transport is not None:
            self.transport.close()

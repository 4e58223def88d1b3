"""FrameProtocol's parser fed by hand: any chunking of the byte stream yields the same frames,
large bodies are received in place, and a corrupt frame is reported and closes the connection."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from psruntime.wire.frame_codec import MAGIC, MAX_HEADER_BYTES, PREFIX, Frame, FrameError, encode_frame
from psruntime.wire.frame_protocol import DIRECT_MIN_BYTES, PREAUTH_MAX_HEADER_BYTES, FrameProtocol


class FakeTransport:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def set_write_buffer_limits(self, high: int) -> None:
        pass


def make() -> tuple[FrameProtocol, list[Frame], list[FrameError], FakeTransport]:
    frames: list[Frame] = []
    errors: list[FrameError] = []
    proto = FrameProtocol(frames.append, lambda exc: None, 1 << 30, errors.append)
    transport = FakeTransport()
    proto.connection_made(transport)  # type: ignore[arg-type]
    return proto, frames, errors, transport


def feed(proto: FrameProtocol, data: bytes, chunks: list[int]) -> int:
    """Deliver `data` as the transport would: into get_buffer()'s view, at most `chunk` at a time."""
    pos, direct = 0, 0
    i = 0
    while pos < len(data):
        buf = proto.get_buffer(-1)
        n = min(len(buf), chunks[i % len(chunks)], len(data) - pos)
        buf[:n] = data[pos:pos + n]
        direct += proto._direct
        proto.buffer_updated(n)
        pos += n
        i += 1
    return direct


STREAM = [({"op": "a", "id": 1}, []),
          ({"op": "b", "id": 2}, [np.arange(10, dtype=np.int16), np.zeros((0, 3))]),
          ({"op": "big", "id": 3}, [np.arange(DIRECT_MIN_BYTES, dtype=np.float64).reshape(-1, 8)]),
          ({"op": "c", "id": 4, "keys": list(range(3000))}, [np.ones(5)])]


def stream_bytes() -> bytes:
    return b"".join(bytes(p) for h, a in STREAM for p in encode_frame(h, a))


@pytest.mark.parametrize("chunks", [[1, 2, 3, 5000], [7, 3, 1000], [65536], [1 << 30], [13, 200_000]])
def test_any_chunking_gives_the_same_frames(chunks: list[int]) -> None:
    proto, frames, errors, _ = make()
    direct = feed(proto, stream_bytes(), chunks)
    assert not errors
    assert [f.header for f in frames] == [h for h, _ in STREAM]
    for f, (_, arrays) in zip(frames, STREAM):
        for got, want in zip(f.arrays, arrays):
            assert got.shape == want.shape and got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)
    if max(chunks) >= 65536:
        assert direct > 0  # the big body was received straight into its own buffer


def test_corrupt_frame_reports_and_closes() -> None:
    proto, frames, errors, transport = make()
    good = b"".join(bytes(p) for p in encode_frame({"op": "ok"}))
    feed(proto, good + PREFIX.pack(0xDEADBEEF, 0, 0), [1 << 20])
    assert [f.header for f in frames] == [{"op": "ok"}]
    assert len(errors) == 1 and "magic" in str(errors[0]) and transport.closed


def test_a_header_over_the_limit_is_refused_before_the_scratch_grows() -> None:
    frames: list[Frame] = []
    errors: list[FrameError] = []
    proto = FrameProtocol(frames.append, lambda exc: None, 0, errors.append, max_header_bytes=PREAUTH_MAX_HEADER_BYTES)
    transport = FakeTransport()
    proto.connection_made(transport)  # type: ignore[arg-type]
    scratch = len(proto._scratch)
    # A small header still passes (the handshake frames are a few hundred bytes).
    feed(proto, b"".join(bytes(p) for p in encode_frame({"op": "auth_answer", "proof": "0" * 64, "nonce": "0" * 64})),
         [1 << 20])
    assert [f.header["op"] for f in frames] == ["auth_answer"] and not errors
    # Only the 16-byte prefix of a 16 MiB header: refused at once, with no buffer grown for it.
    feed(proto, PREFIX.pack(MAGIC, MAX_HEADER_BYTES, 0), [1 << 20])
    assert len(errors) == 1 and f"limit of {PREAUTH_MAX_HEADER_BYTES}" in str(errors[0]) and transport.closed
    assert len(proto._scratch) == scratch


def test_raising_the_header_limit_takes_large_headers_again() -> None:
    frames: list[Frame] = []
    errors: list[FrameError] = []
    proto = FrameProtocol(frames.append, lambda exc: None, 1 << 20, errors.append, max_header_bytes=1024)
    proto.connection_made(FakeTransport())  # type: ignore[arg-type]
    proto.set_max_header_bytes(MAX_HEADER_BYTES)
    big = {"op": "big", "keys": list(range(100_000))}      # a header of about 600 KiB (over the scratch too)
    feed(proto, b"".join(bytes(p) for p in encode_frame(big)), [65536])
    assert not errors and [f.header for f in frames] == [big]


def big_frame(fill: float) -> bytes:
    return b"".join(bytes(p) for p in encode_frame({"op": "big"}, [np.full(DIRECT_MIN_BYTES, fill)]))


def test_a_held_frame_keeps_its_values_while_later_frames_arrive() -> None:
    proto, frames, errors, _ = make()
    feed(proto, big_frame(1.0), [1 << 20])
    held = frames[0].arrays[0]
    frames.clear()
    for fill in (2.0, 3.0, 4.0):      # more frames than the connection keeps buffers
        feed(proto, big_frame(fill), [1 << 20])
    assert not errors
    assert (held == 1.0).all()                                   # never received into while held
    assert [float(f.arrays[0][0]) for f in frames] == [2.0, 3.0, 4.0]
    assert all((f.arrays[0] == f.arrays[0][0]).all() for f in frames)


def test_a_dropped_frames_buffer_receives_the_next_frame() -> None:
    proto, frames, _, _ = make()
    feed(proto, big_frame(1.0), [1 << 20])
    address = frames[0].arrays[0].ctypes.data
    frames.clear()
    feed(proto, big_frame(2.0), [1 << 20])
    assert frames[0].arrays[0].ctypes.data == address and (frames[0].arrays[0] == 2.0).all()


class WritingTransport(FakeTransport):
    def __init__(self) -> None:
        super().__init__()
        self.sends: list[bytes] = []      # one entry per write call: what one send syscall carries

    def write(self, data: bytes) -> None:
        self.sends.append(bytes(data))

    def writelines(self, pieces: list[bytes]) -> None:
        self.sends.append(b"".join(bytes(p) for p in pieces))


def replying(reply_arrays: dict[str, list[np.ndarray]]) -> tuple[FrameProtocol, WritingTransport, list[int]]:
    """A protocol that answers each frame with the arrays named by its op, noting how many
    sends had gone out when each frame arrived."""
    transport = WritingTransport()
    seen: list[int] = []

    def on_frame(frame: Frame) -> None:
        seen.append(len(transport.sends))
        proto.write_frame({"op": "ok", "id": frame.header["id"]}, reply_arrays[frame.header["op"]])

    proto = FrameProtocol(on_frame, lambda exc: None, 1 << 30, pacer=None)
    proto.connection_made(transport)  # type: ignore[arg-type]
    return proto, transport, seen


def test_replies_to_the_requests_of_one_read_go_out_in_one_send() -> None:
    proto, transport, _ = replying({"small": [np.arange(4.0)]})
    data = b"".join(bytes(p) for i in range(3) for p in encode_frame({"op": "small", "id": i}))
    feed(proto, data, [len(data)])
    assert len(transport.sends) == 1
    replies = b"".join(bytes(p) for i in range(3) for p in encode_frame({"op": "ok", "id": i}, [np.arange(4.0)]))
    assert transport.sends[0] == replies


def test_a_large_reply_goes_out_before_the_next_request_is_handled() -> None:
    proto, transport, seen = replying({"small": [], "big": [np.ones(DIRECT_MIN_BYTES)]})
    data = b"".join(bytes(p) for op, i in (("small", 0), ("big", 1), ("small", 2))
                    for p in encode_frame({"op": op, "id": i}))
    feed(proto, data, [len(data)])
    assert seen == [0, 0, 1]                 # the small reply waited for the big one, then both went
    assert len(transport.sends) == 2


async def test_a_coalescing_connection_sends_what_one_callback_wrote_in_one_send() -> None:
    transport = WritingTransport()
    proto = FrameProtocol(lambda f: None, lambda exc: None, 1 << 30, pacer=None, coalesce_writes=True)
    proto.connection_made(transport)  # type: ignore[arg-type]
    proto.write_frame({"op": "update", "id": 1}, [np.ones(8, np.float32)])
    proto.write_frame({"op": "get", "id": 2}, [np.arange(3)])
    assert transport.sends == []                 # kept until the writing callback is over
    await asyncio.sleep(0)
    expected = b"".join(bytes(p) for h, a in (({"op": "update", "id": 1}, [np.ones(8, np.float32)]),
                                              ({"op": "get", "id": 2}, [np.arange(3)]))
                        for p in encode_frame(h, a))
    assert transport.sends == [expected]         # in order, one send
    # A large frame goes out at once, behind what was kept before it.
    proto.write_frame({"op": "get", "id": 3})
    proto.write_frame({"op": "update", "id": 4}, [np.ones(DIRECT_MIN_BYTES)])
    assert len(transport.sends) == 2 and transport.sends[1].startswith(b"".join(encode_frame({"op": "get", "id": 3})))
    await asyncio.sleep(0)
    assert len(transport.sends) == 2


async def test_a_header_larger_than_the_scratch_buffer_arrives_over_a_real_socket() -> None:
    """A header beyond the 256 KiB scratch (a big ownership table, a checkpoint's descriptors)
    grows the buffer while the transport holds a view of it: it must arrive, both ways, and the
    connection serve on."""
    from psruntime.wire.dataplane import DataPlaneConnection, DataPlaneServer
    server = DataPlaneServer(lambda f: ({"op": "ok", "keys": f.header["keys"]}, ()))
    address = await server.start()
    conn = await DataPlaneConnection.open(address)
    try:
        for n in (1000, 60_000, 300_000):       # headers of ~6 KiB, ~0.4 MiB and ~2 MiB
            reply = await asyncio.wait_for(conn.request({"op": "echo", "keys": list(range(n))}), 30)
            assert reply.header["keys"] == list(range(n))
    finally:
        await conn.close()
        await server.stop()

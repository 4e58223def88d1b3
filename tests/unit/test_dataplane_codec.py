"""Frame codec: round trips over a real stream pair, and clear errors for corrupt frames."""
from __future__ import annotations

import asyncio

import numpy as np
import orjson
import pytest

from psruntime.wire.frame_codec import (MAGIC, PREFIX, FrameError, decode_frame, encode_frame, parse_prefix,
                                   read_frame)


def feed(pieces: list) -> asyncio.StreamReader:
    reader = asyncio.StreamReader(limit=1 << 26)
    reader.feed_data(b"".join(bytes(p) for p in pieces))
    reader.feed_eof()
    return reader


@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "uint16", "int64", "bool", "complex64", ">f4"])
async def test_round_trip_dtypes_and_shapes(dtype: str) -> None:
    rng = np.random.default_rng(0)
    arrays = [(rng.standard_normal(s) * 10).astype(dtype) for s in [(3,), (2, 5), (4, 1, 3), ()]]
    frame = await read_frame(feed(encode_frame({"op": "put", "keys": [1, "a"]}, arrays)))
    assert frame.header == {"op": "put", "keys": [1, "a"]}
    assert len(frame.arrays) == len(arrays)
    for got, want in zip(frame.arrays, arrays):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


async def test_zero_length_many_buffers_and_non_contiguous() -> None:
    arrays = [np.zeros(0, np.float32), np.zeros((0, 7), np.int32)]
    arrays += [np.full(i, i, np.float32) for i in range(200)]
    arrays.append(np.arange(20.0).reshape(4, 5)[:, 1])  # strided view: sent as a contiguous copy
    reader = feed(encode_frame({"op": "x"}, arrays) + encode_frame({"op": "second"}))
    frame = await read_frame(reader)
    for got, want in zip(frame.arrays, arrays):
        np.testing.assert_array_equal(got, want)
        assert got.shape == want.shape
    assert (await read_frame(reader)).header == {"op": "second"}
    with pytest.raises(asyncio.IncompleteReadError):
        await read_frame(reader)


def test_encoded_frame_does_not_copy_buffers() -> None:
    a = np.arange(1 << 16, dtype=np.float32)
    pieces = encode_frame({"op": "put"}, [a])
    assert isinstance(pieces[2], memoryview)
    assert np.shares_memory(np.frombuffer(pieces[2], dtype=np.float32), a)


def test_decoded_arrays_are_views_of_the_body() -> None:
    pieces = encode_frame({}, [np.arange(10, dtype=np.int32), np.ones(3)])
    body = b"".join(bytes(p) for p in pieces[2:])
    frame = decode_frame(pieces[1], body)
    assert all(not a.flags.owndata for a in frame.arrays)


def test_encode_rejects_object_arrays_and_reserved_header() -> None:
    with pytest.raises(FrameError, match="dtype object"):
        encode_frame({}, [np.array([object()])])
    with pytest.raises(FrameError, match="not a numpy array"):
        encode_frame({}, [b"raw"])  # type: ignore[list-item]
    with pytest.raises(FrameError, match="reserved"):
        encode_frame({"bufs": 1})
    with pytest.raises(FrameError, match="JSON-encodable"):
        encode_frame({"x": object()})


def test_bad_prefix() -> None:
    with pytest.raises(FrameError, match="magic"):
        parse_prefix(PREFIX.pack(0x12345678, 2, 0))
    with pytest.raises(FrameError, match="header of"):
        parse_prefix(PREFIX.pack(MAGIC, 1 << 30, 0))
    with pytest.raises(FrameError, match="exceeds the limit"):
        parse_prefix(PREFIX.pack(MAGIC, 2, 1 << 20), max_body_bytes=1 << 10)


@pytest.mark.parametrize("header,body,msg", [
    (b"{not json", b"", "not valid JSON"),
    (b"[1,2]", b"", "JSON object"),
    (orjson.dumps({"bufs": "x"}), b"", "must be a list"),
    (orjson.dumps({"bufs": [["<f4", [2]]]}), b"\0" * 4, "declare 8 bytes"),
    (orjson.dumps({"bufs": [["<f4", [-1]]]}), b"", "bad shape"),
    (orjson.dumps({"bufs": [["nonsense", [1]]]}), b"\0", "unknown dtype"),
    (orjson.dumps({"bufs": [["|O", [1]]]}), b"\0" * 8, "not allowed"),
    (orjson.dumps({"bufs": [["<f4"]]}), b"", r"\[dtype, shape\]"),
])
def test_corrupt_frames_raise_clear_errors(header: bytes, body: bytes, msg: str) -> None:
    with pytest.raises(FrameError, match=msg):
        decode_frame(header, body)


async def test_truncated_frame_is_incomplete_read() -> None:
    pieces = encode_frame({"op": "x"}, [np.ones(100)])
    raw = b"".join(bytes(p) for p in pieces)
    with pytest.raises(asyncio.IncompleteReadError):
        await read_frame(feed([raw[:-10]]))

"""Binary frames of the PS data plane: a fixed prefix, an orjson header, then raw numpy buffers.

Wire layout of one frame (little endian)::

    prefix  struct '<IIQ'  magic, header length, total bytes of all buffers
    header  orjson object  {"op": ..., "id": ..., ..., "bufs": [[dtype, [shape...]], ...]}
    body    the buffers back to back, each exactly dtype.itemsize * prod(shape) bytes

No pickle: only plain numeric dtypes travel, and the receiver rebuilds each array as a
`np.frombuffer` view into the one buffer the frame's body was read into.
"""
from __future__ import annotations

import asyncio
import math
import struct
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import orjson
from protocol.errors import ProtocolError
from protocol.json_types import JsonInObject, JsonObject, JsonValue

MAGIC = 0x454C5346  # "ELSF": rejects a peer that is not speaking this protocol at all
PREFIX = struct.Struct("<IIQ")
MAX_HEADER_BYTES = 16 << 20
DEFAULT_MAX_BODY_BYTES = 4 << 30
# Numeric kinds only: bool, signed/unsigned int, float, complex. Object or void dtypes would
# need pickle or carry pointers, so they are refused on both sides.
_ALLOWED_KINDS = frozenset("biufc")


class FrameError(ProtocolError, ValueError):
    """A frame that cannot be encoded or decoded; the message says which part is wrong."""


@dataclass(slots=True)
class Frame:
    """One decoded frame: the JSON header (without "bufs") and its arrays in order."""

    header: JsonObject
    arrays: list[np.ndarray] = field(default_factory=list)


def _check_dtype(dtype: np.dtype) -> None:
    if dtype.kind not in _ALLOWED_KINDS or dtype.hasobject:
        raise FrameError(f"dtype {dtype} is not allowed on the data plane (numeric dtypes only)")


def check_wire_dtype(name: str) -> np.dtype:
    """The dtype named `name` (numpy's str form, e.g. "<f4") if it may travel; FrameError otherwise."""
    try:
        dtype = np.dtype(name)
    except TypeError:
        raise FrameError(f"unknown dtype {name!r}") from None
    _check_dtype(dtype)
    return dtype


def encode_frame(header: JsonInObject, arrays: Sequence[np.ndarray] = ()) -> list[bytes | memoryview]:
    """Return the pieces of a frame for `writer.writelines` (prefix, header, one memoryview per array).

    Arrays are sent from their own memory when C-contiguous (no copy); others are made contiguous.
    """
    descs: list[tuple[str, tuple[int, ...]]] = []
    views: list[memoryview] = []
    total = 0
    for i, arr in enumerate(arrays):
        if isinstance(arr, np.generic):  # a numpy scalar travels as a 0-d array
            arr = np.asarray(arr)
        if not isinstance(arr, np.ndarray):
            raise FrameError(f"buffer {i} is a {type(arr).__name__}, not a numpy array")
        _check_dtype(arr.dtype)
        if not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr)
        descs.append((arr.dtype.str, arr.shape))
        total += arr.nbytes
        if arr.nbytes:
            views.append(arr.reshape(-1).data.cast("B"))
    if "bufs" in header:
        raise FrameError("header key 'bufs' is reserved for the codec")
    try:
        raw_header = orjson.dumps({**header, "bufs": descs})
    except TypeError as e:
        raise FrameError(f"header is not JSON-encodable: {e}") from None
    if len(raw_header) > MAX_HEADER_BYTES:
        raise FrameError(f"header of {len(raw_header)} bytes exceeds {MAX_HEADER_BYTES}")
    return [PREFIX.pack(MAGIC, len(raw_header), total), raw_header, *views]


def _parse_descs(bufs: JsonValue, body_len: int) -> list[tuple[np.dtype, tuple[int, ...], int]]:
    if not isinstance(bufs, list):
        raise FrameError("header 'bufs' must be a list of [dtype, shape]")
    out = []
    total = 0
    for i, d in enumerate(bufs):
        if not (isinstance(d, list) and len(d) == 2 and isinstance(d[0], str) and isinstance(d[1], list)):
            raise FrameError(f"header 'bufs'[{i}] must be [dtype, shape]")
        try:
            dtype = np.dtype(d[0])
        except TypeError:
            raise FrameError(f"header 'bufs'[{i}] has unknown dtype {d[0]!r}") from None
        _check_dtype(dtype)
        shape = [s for s in d[1] if isinstance(s, int) and not isinstance(s, bool) and s >= 0]
        if len(shape) != len(d[1]):
            raise FrameError(f"header 'bufs'[{i}] has a bad shape {d[1]!r}")
        nbytes = dtype.itemsize * math.prod(shape)
        total += nbytes
        out.append((dtype, tuple(shape), nbytes))
    if total != body_len:
        raise FrameError(f"buffers declare {total} bytes but the frame body has {body_len}")
    return out


def decode_frame(raw_header: bytes, body: bytearray | bytes | memoryview) -> Frame:
    """Decode a header and body (as read off the wire) into a Frame of zero-copy array views."""
    try:
        header = orjson.loads(raw_header)
    except orjson.JSONDecodeError as e:
        raise FrameError(f"frame header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise FrameError("frame header must be a JSON object")
    descs = _parse_descs(header.pop("bufs", []), len(body))
    arrays = []
    off = 0
    for dtype, shape, nbytes in descs:
        arrays.append(np.frombuffer(body, dtype=dtype, count=nbytes // dtype.itemsize, offset=off).reshape(shape))
        off += nbytes
    return Frame(header, arrays)


def parse_prefix(raw: bytes, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> tuple[int, int]:
    """Validate a frame prefix; return (header length, body length)."""
    magic, hlen, blen = PREFIX.unpack(raw)
    if magic != MAGIC:
        raise FrameError(f"bad frame magic 0x{magic:08x} (peer is not an Elastane data-plane endpoint)")
    if hlen > MAX_HEADER_BYTES:
        raise FrameError(f"frame header of {hlen} bytes exceeds {MAX_HEADER_BYTES}")
    if blen > max_body_bytes:
        raise FrameError(f"frame body of {blen} bytes exceeds the limit of {max_body_bytes}")
    return hlen, blen


async def read_frame(reader: asyncio.StreamReader, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> Frame:
    """Read one frame. Raises asyncio.IncompleteReadError at EOF, FrameError on a malformed frame."""
    hlen, blen = parse_prefix(await reader.readexactly(PREFIX.size), max_body_bytes)
    raw_header = await reader.readexactly(hlen)
    # One buffer per frame; the arrays are read-only views into it (the store copies what it keeps).
    body = await reader.readexactly(blen) if blen else b""
    return decode_frame(raw_header, body)

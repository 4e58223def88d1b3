"""The one "typed header + raw buffers" file format of the PS runtime: checkpoint block files
(psruntime.store.checkpoint), spilled blocks (psruntime.spill.spill_store), a worker's inactive
splits (psruntime.eps.eps_inactive_store) and the AM's worker-state files all are such a file.

Layout (little endian)::

    prefix   b"ELBUF001"  u32 header length
    header   msgspec JSON of `BufferFileHeader`: the caller's `content` (any JSON object) and one
             `BufferDesc` per buffer (dtype, shape, offset from the body start, bytes stored,
             whether those bytes are an lz4 frame)
    padding  zeros up to a multiple of ALIGN bytes: the body starts aligned
    body     the buffers, each starting at a multiple of ALIGN; raw, or one lz4 frame each

Only plain numeric dtypes are stored (no pickle). A raw buffer reads back as a read-only
`np.frombuffer` view of the file's bytes (no copy), a compressed one as a view of its own
decompressed bytes. `write` is atomic (protocol.durable_storage.write_atomic): durable=True also
fsyncs, durable=False (spills) only renames.
"""
from __future__ import annotations

import math
import os
import struct
from typing import Sequence

import lz4.frame  # type: ignore[import-untyped]  # lz4 ships no type information
import msgspec
import numpy as np

from protocol.durable_storage import write_atomic
from protocol.errors import AppError
from protocol.json_types import JsonObject

MAGIC = b"ELBUF001"
PREFIX = struct.Struct("<8sI")
ALIGN = 64
_NUMERIC = frozenset("biufc")
_PAD = bytes(ALIGN)


class BufferFileError(AppError, ValueError):
    """A buffer file that cannot be written or read back; the message says what is wrong."""


class BufferDesc(msgspec.Struct, array_like=True):
    """One buffer: numpy dtype string, shape, offset from the body start, bytes stored, lz4 or raw."""

    dtype: str
    shape: list[int]
    offset: int
    stored: int
    lz4: bool = False


class BufferFileHeader(msgspec.Struct, forbid_unknown_fields=False):
    content: JsonObject
    buffers: list[BufferDesc] = []


_decoder = msgspec.json.Decoder(BufferFileHeader)


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def encode(content: JsonObject, arrays: Sequence[np.ndarray], *, compress: bool = False) -> list[bytes | memoryview]:
    """The file's bytes as pieces to write one after another (raw buffers are views of the arrays'
    own memory, not copies). `compress`: each non-empty buffer as one lz4 frame."""
    descs: list[BufferDesc] = []
    bodies: list[bytes | memoryview] = []
    offset = 0
    for i, a in enumerate(arrays):
        if offset % ALIGN:                       # pad the previous buffer: this one starts aligned
            bodies.append(_PAD[:_aligned(offset) - offset])
            offset = _aligned(offset)
        a = np.asarray(a)
        if not a.flags.c_contiguous:            # (np.ascontiguousarray would make a 0-d array 1-d)
            a = np.ascontiguousarray(a)
        if a.dtype.kind not in _NUMERIC or a.dtype.hasobject:
            raise BufferFileError(f"buffer {i}: cannot store an array of non-numeric dtype {a.dtype}")
        raw: bytes | memoryview = a.reshape(-1).data.cast("B") if a.nbytes else b""
        data = lz4.frame.compress(raw) if compress and a.nbytes else raw
        descs.append(BufferDesc(a.dtype.str, list(a.shape), offset, len(data), bool(compress and a.nbytes)))
        bodies.append(data)
        offset += len(data)
    try:
        header = msgspec.json.encode(BufferFileHeader(content, descs))
    except (TypeError, msgspec.EncodeError) as e:
        raise BufferFileError(f"header is not JSON-encodable: {e}") from None
    head = PREFIX.pack(MAGIC, len(header)) + header
    head += _PAD[:_aligned(len(head)) - len(head)]
    return [head, *bodies]


def decode(raw: bytes | bytearray | memoryview, what: str = "buffer file") -> tuple[JsonObject, list[np.ndarray]]:
    """(content, arrays) of a file's bytes; BufferFileError naming `what` when it does not add up."""
    view = memoryview(raw).cast("B")
    if len(view) < PREFIX.size:
        raise BufferFileError(f"{what}: truncated ({len(view)} bytes)")
    magic, n = PREFIX.unpack_from(view, 0)
    if magic != MAGIC:
        raise BufferFileError(f"{what}: not a buffer file (bad magic)")
    if PREFIX.size + n > len(view):
        raise BufferFileError(f"{what}: truncated header")
    try:
        header = _decoder.decode(view[PREFIX.size:PREFIX.size + n])
    except msgspec.DecodeError as e:
        raise BufferFileError(f"{what}: corrupt header: {e}") from None
    start = _aligned(PREFIX.size + n)
    arrays: list[np.ndarray] = []
    for i, d in enumerate(header.buffers):
        try:
            dtype = np.dtype(d.dtype)
        except TypeError:
            raise BufferFileError(f"{what}: buffer {i} has unknown dtype {d.dtype!r}") from None
        if dtype.kind not in _NUMERIC or dtype.hasobject:
            raise BufferFileError(f"{what}: buffer {i} of non-numeric dtype {dtype}")
        if any(s < 0 for s in d.shape) or d.offset < 0 or d.stored < 0:
            raise BufferFileError(f"{what}: buffer {i} has a bad shape or extent")
        size = dtype.itemsize * math.prod(d.shape)
        lo = start + d.offset
        if lo + d.stored > len(view):
            raise BufferFileError(f"{what}: truncated ({len(view)} bytes, buffer {i} needs {lo + d.stored})")
        data: bytes | memoryview = view[lo:lo + d.stored]
        if d.lz4:
            try:
                data = lz4.frame.decompress(data)
            except RuntimeError as e:
                raise BufferFileError(f"{what}: buffer {i} is not an lz4 frame: {e}") from None
        if len(data) != size:
            raise BufferFileError(f"{what}: buffer {i} holds {len(data)} bytes, its dtype and shape need {size}")
        arrays.append(np.frombuffer(data, dtype).reshape(tuple(d.shape)))
    return header.content, arrays


def write(path: str | os.PathLike[str], content: JsonObject, arrays: Sequence[np.ndarray], *,
          compress: bool = False, durable: bool = True) -> int:
    """Write `path` atomically (durable: fsynced too); returns the bytes written."""
    pieces = encode(content, arrays, compress=compress)
    write_atomic(path, pieces, durable=durable)
    return sum(len(p) if isinstance(p, bytes) else p.nbytes for p in pieces)


def read(path: str | os.PathLike[str]) -> tuple[JsonObject, list[np.ndarray]]:
    """(content, arrays) of the file at `path`; OSError when it cannot be read, BufferFileError when
    it is not a buffer file."""
    with open(path, "rb") as f:
        raw = f.read()
    return decode(raw, os.fspath(path))

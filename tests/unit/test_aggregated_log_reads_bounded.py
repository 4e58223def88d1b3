"""Reads of aggregated logs on an object store fetch what they need (protocol/aggregated_logs.py):
an index's bytes for an index, a tail's for a tail -- not an fsspec read-ahead block (s3fs's is
50 MiB) nor the whole chunk. The store here is an fsspec filesystem with s3fs's read defaults that
counts the bytes it serves, its file virtual (a 50 MiB log costs no disk)."""
from __future__ import annotations

import struct
import zlib
from typing import Any, Iterator

import fsspec  # type: ignore[import-untyped]  # no stubs
import msgspec
import pytest
from fsspec.spec import AbstractBufferedFile, AbstractFileSystem  # type: ignore[import-untyped]

from protocol.aggregated_logs import (MAGIC, READ_PIECE_BYTES, TRAILER_MAGIC, AggregatedLogError,
                                      AggregatedLogIndex, LogChunk, RemoteLogDir, app_node_logs, iter_log,
                                      node_file_name, read_log)

APP = "application_1700000000000_0007"
CID = "container_1700000000000_0007_01_000001"
NODE = "10.0.0.3:8042"
PROTOCOL = "elastanecounting"
PATTERN = bytes(range(251))         # a prime period: a byte read from the wrong offset shows
LOG_BYTES = 50 << 20


def log_bytes(lo: int, hi: int) -> bytes:
    """Bytes [lo, hi) of the virtual log."""
    at = lo % len(PATTERN)
    return (PATTERN * ((hi - lo) // len(PATTERN) + 2))[at:at + hi - lo]


class VirtualAggregatedFile:
    """An aggregated file of one LOG_BYTES-long chunk whose data is made as it is read."""

    def __init__(self, crc_offset: int = 0) -> None:
        crc = 0
        for lo in range(0, LOG_BYTES, 1 << 20):
            crc = zlib.crc32(log_bytes(lo, min(LOG_BYTES, lo + (1 << 20))), crc)
        index = AggregatedLogIndex(app_id=APP, node_id=NODE, kind="final", seq=0, written_ms=0, user="alice",
                                   chunks=[LogChunk(CID, "stdout", len(MAGIC), LOG_BYTES, 0, crc ^ crc_offset)])
        raw = msgspec.json.encode(index)
        self.data_end = len(MAGIC) + LOG_BYTES
        self.tail = raw + struct.pack(">QQI8s", self.data_end, len(raw), zlib.crc32(raw), TRAILER_MAGIC)
        self.size = self.data_end + len(self.tail)

    def read(self, start: int, end: int) -> bytes:
        end = min(end, self.size)
        out = b""
        if start < len(MAGIC):
            out += MAGIC[start:min(end, len(MAGIC))]
        if start < self.data_end and end > len(MAGIC):
            out += log_bytes(max(start, len(MAGIC)) - len(MAGIC), min(end, self.data_end) - len(MAGIC))
        if end > self.data_end:
            out += self.tail[max(start, self.data_end) - self.data_end:end - self.data_end]
        return out


class CountingFile(AbstractBufferedFile):  # type: ignore[misc]
    def _fetch_range(self, start: int, end: int) -> bytes:
        data: bytes = self.fs.files[self.path].read(start, end)
        self.fs.fetched += len(data)
        return data


class CountingFileSystem(AbstractFileSystem):  # type: ignore[misc]
    """Read-only files served from memory, with s3fs's read defaults: a 50 MiB block, read-ahead."""

    protocol = PROTOCOL
    cachable = False
    blocksize = 50 << 20

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.files: dict[str, VirtualAggregatedFile] = {}
        self.fetched = 0

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        path = self._strip_protocol(path).rstrip("/")
        entries = [self.info(p) for p in sorted(self.files) if p.rsplit("/", 1)[0] == path]
        if not entries:
            raise FileNotFoundError(path)
        return entries if detail else [e["name"] for e in entries]

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        path = self._strip_protocol(path)
        if path not in self.files:
            raise FileNotFoundError(path)
        return {"name": path, "size": self.files[path].size, "type": "file"}

    def _open(self, path: str, mode: str = "rb", block_size: Any = None, autocommit: bool = True,
              cache_options: Any = None, cache_type: str = "readahead", **kwargs: Any) -> CountingFile:
        assert mode == "rb", mode
        # As s3fs's _open: its default_block_size where none is given.
        return CountingFile(self, self._strip_protocol(path), mode, block_size or self.blocksize,
                            cache_type=cache_type, cache_options=cache_options, **kwargs)


@pytest.fixture
def store() -> Iterator[RemoteLogDir]:
    fsspec.register_implementation(PROTOCOL, CountingFileSystem, clobber=True)
    s = RemoteLogDir(f"{PROTOCOL}://bucket/app-logs")
    s.fs.files[s.fs._strip_protocol(s.path(APP, node_file_name(NODE)))] = VirtualAggregatedFile()
    yield s


def test_reading_an_index_on_an_object_store_fetches_the_index_not_a_read_ahead_block(store: RemoteLogDir) -> None:
    """The RM's logs page reads every node's index, the NMs' log calls too: 8 bytes of header, a
    trailer and the index, not s3fs's 50 MiB block from the file's start."""
    [node] = app_node_logs(store, APP)
    assert not node.errors and node.final and node.containers() == {CID: {"stdout": LOG_BYTES}}
    assert store.fs.fetched < 1 << 20, f"reading an index fetched {store.fs.fetched} bytes"


def test_a_tail_of_a_big_chunk_fetches_the_tail_not_the_chunk(store: RemoteLogDir) -> None:
    """`start=-4096` of a log aggregated as one 50 MiB chunk (a final file's): the last 4 KiB,
    fetched alone -- not the chunk read through for its CRC first; so is an offset near the end.
    A read from the chunk's start is still checked against its CRC."""
    [node] = app_node_logs(store, APP)
    for start, want in ((-4096, log_bytes(LOG_BYTES - 4096, LOG_BYTES)), (LOG_BYTES - 3, log_bytes(LOG_BYTES - 3, LOG_BYTES)),
                        (LOG_BYTES + 5, b"")):
        store.fs.fetched = 0
        assert read_log(store, APP, node, CID, "stdout", start) == want, start
        assert store.fs.fetched < 2 << 20, f"start={start} fetched {store.fs.fetched} bytes"
    # A tail that skips at most a piece is read from the chunk's start, so a bad CRC is refused.
    name = store.fs._strip_protocol(store.path(APP, node_file_name(NODE)))
    store.fs.files[name] = VirtualAggregatedFile(crc_offset=1)
    [node] = app_node_logs(store, APP)
    with pytest.raises(AggregatedLogError, match="checksum"):
        b"".join(iter_log(store, APP, node, CID, "stdout", READ_PIECE_BYTES))

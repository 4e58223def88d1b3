"""Aggregated container logs: the file format NMs upload and the reader every client shares.

When an app finishes, each NM that ran its containers writes the containers' log files into one
file per node per app under the cluster's `remote_app_log_dir` (YARN's log aggregation); while the
app runs, it also uploads what is new every roll interval (YARN's rolling aggregation). Layout:

    <remote_app_log_dir>/<app_id>/<node file>             the final file, written at app end
    <remote_app_log_dir>/<app_id>/<node file>.roll<seq>   rolled uploads (seq 000001, 000002, ...)

where <node file> is the node id with ':' as '_' ("10.0.0.3_8042", YARN's naming). A rolled file
holds the bytes each log file gained since the node's previous roll; the final file holds every
log file whole, and once it is written the node's rolled files are deleted. A reader takes the
final file when there is one, else the rolls in order (a node that died mid-app leaves only those).

YARN puts the user in the path (<dir>/<user>/logs/<app>); Elastane does not, because its readers
often know only a container id (the NM's log REST calls after the container is forgotten); the
user is in the index instead.

The file (a TFile / IndexedFormat in spirit: data first, so the writer streams; the index last):

    "ELAGLOG1"                               8 bytes, the header magic
    data                                     the chunks' bytes, back to back
    index                                    JSON of `AggregatedLogIndex`
    trailer (28 bytes, big-endian)           u64 index offset, u64 index length, u32 CRC-32 of the
                                             index, "ELAGEND1"

Each `LogChunk` of the index names a container, a log file, where its bytes are in this file
(`offset`, `length`), where they began in the container's local file (`start`: 0 in a final
file; the previous roll's end in a rolled one) and their CRC-32. A file that is cut short (an
upload that died), has a bad index or a chunk whose bytes do not match their CRC (checked when a
chunk is read from its start; a tail of one is read alone, unchecked: `iter_chunk`) is refused
with an `AggregatedLogError` naming the file and what is wrong; nothing partial is shown as a log.
"""
from __future__ import annotations

import asyncio
import datetime
import logging
import os
import posixpath
import re
import shutil
import struct
import zlib
from dataclasses import dataclass, field
from typing import IO, Any, Iterable, Iterator, Literal, Optional, Sequence

import msgspec
from aiohttp import web

from .durable_storage import DurableStorageError, local_path, validate, write_atomic
from .errors import ProtocolError
from .ids import ContainerId, is_application_id

MAGIC = b"ELAGLOG1"
TRAILER_MAGIC = b"ELAGEND1"
_TRAILER = struct.Struct(">QQI8s")
TRAILER_SIZE = _TRAILER.size          # 28
FORMAT_VERSION = 1
_READ_PIECE = 1 << 20                 # bytes read from a local log file at a time
_ROLL = re.compile(r"^(?P<node>.+)\.roll(?P<seq>\d{6,})$")

log = logging.getLogger(__name__)


class AggregatedLogError(ProtocolError, ValueError):
    """An aggregated log file that is cut short, corrupt, or not one; or an unusable log dir."""


class LogChunk(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Bytes [start, start + length) of one container's log file, at `offset` in this file."""

    container_id: str
    file_name: str
    offset: int
    length: int
    start: int
    crc32: int


class AggregatedLogIndex(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What one aggregated file holds: the app, the node, a final or rolled upload, the chunks."""

    app_id: str
    node_id: str
    kind: Literal["final", "roll"]
    seq: int                          # a roll's number (1, 2, ...); 0 in a final file
    written_ms: int
    chunks: list[LogChunk]
    user: str = ""
    version: int = FORMAT_VERSION


@dataclass(frozen=True)
class ChunkSource:
    """What a writer copies: `length` bytes from `start` of the local file `path`."""

    container_id: str
    file_name: str
    path: str
    start: int
    length: int


# ===== names ======================================================================================

def node_file_name(node_id: str) -> str:
    """The node's file name in an app's dir: its id with ':' as '_' (YARN's naming)."""
    name = node_id.replace(":", "_").replace("/", "_")
    if not name or name in (".", ".."):
        raise AggregatedLogError(f"node id {node_id!r} gives no usable file name")
    return name


def roll_file_name(node_id: str, seq: int) -> str:
    return f"{node_file_name(node_id)}.roll{seq:06d}"


def parse_file_name(name: str) -> tuple[str, int]:
    """(node file, roll seq) of a name in an app's dir; seq 0 for a final file."""
    m = _ROLL.match(name)
    return (m.group("node"), int(m.group("seq"))) if m else (name, 0)


# ===== writing ====================================================================================

class LogFileWriter:
    """Streams one aggregated file: iterate `pieces()` and write each piece in order; `index` is
    complete once the iteration ends. Local files are read in 1 MiB pieces, never whole."""

    def __init__(self, app_id: str, node_id: str, kind: Literal["final", "roll"], seq: int, written_ms: int,
                 sources: Sequence[ChunkSource], user: str = ""):
        self.app_id, self.node_id, self.kind, self.seq = app_id, node_id, kind, seq
        self.written_ms, self.user = written_ms, user
        self.sources = list(sources)
        self.index: Optional[AggregatedLogIndex] = None

    def pieces(self) -> Iterator[bytes]:
        yield MAGIC
        pos = len(MAGIC)
        chunks = []
        for src in self.sources:
            crc, n = 0, 0
            # O_NOFOLLOW: listed as a regular file, it may have been swapped for a link since.
            with os.fdopen(os.open(src.path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
                f.seek(src.start)
                while n < src.length:
                    buf = f.read(min(_READ_PIECE, src.length - n))
                    if not buf:
                        # Log files only grow; a shorter one was cut by something else under us.
                        raise AggregatedLogError(f"{src.path} ended at {src.start + n} bytes, before the "
                                                 f"{src.start + src.length} this upload took from it")
                    crc = zlib.crc32(buf, crc)
                    n += len(buf)
                    yield buf
            chunks.append(LogChunk(src.container_id, src.file_name, pos, n, src.start, crc))
            pos += n
        self.index = AggregatedLogIndex(app_id=self.app_id, node_id=self.node_id, kind=self.kind, seq=self.seq,
                                        written_ms=self.written_ms, chunks=chunks, user=self.user)
        raw = msgspec.json.encode(self.index)
        yield raw
        yield _TRAILER.pack(pos, len(raw), zlib.crc32(raw), TRAILER_MAGIC)


# ===== reading ====================================================================================

def read_index(f: IO[bytes], size: int, name: str) -> AggregatedLogIndex:
    """The index of the aggregated file open as `f` (`size` bytes long); AggregatedLogError naming
    `name` if it is cut short, corrupt or not an aggregated log."""
    if size < len(MAGIC) + TRAILER_SIZE:
        raise AggregatedLogError(f"{name}: {size} bytes, too short for an aggregated log file "
                                 "(an upload cut short?)")
    f.seek(0)
    if f.read(len(MAGIC)) != MAGIC:
        raise AggregatedLogError(f"{name}: not an aggregated log file (bad header magic)")
    f.seek(size - TRAILER_SIZE)
    offset, length, crc, magic = _TRAILER.unpack(f.read(TRAILER_SIZE))
    if magic != TRAILER_MAGIC:
        raise AggregatedLogError(f"{name}: no trailer at the end (an upload cut short?)")
    if offset < len(MAGIC) or offset + length + TRAILER_SIZE != size:
        raise AggregatedLogError(f"{name}: the trailer puts the index at {offset}+{length}, which does not "
                                 f"end where the {size}-byte file's trailer begins")
    f.seek(offset)
    raw = f.read(length)
    if len(raw) != length or zlib.crc32(raw) != crc:
        raise AggregatedLogError(f"{name}: the index does not match its checksum (corrupt file)")
    try:
        index = msgspec.json.decode(raw, type=AggregatedLogIndex)
    except msgspec.DecodeError as e:
        raise AggregatedLogError(f"{name}: bad index: {e}") from None
    if index.version != FORMAT_VERSION:
        raise AggregatedLogError(f"{name}: format version {index.version}, this reader knows {FORMAT_VERSION}")
    for c in index.chunks:
        if c.offset < len(MAGIC) or c.length < 0 or c.start < 0 or c.offset + c.length > offset:
            raise AggregatedLogError(f"{name}: chunk {c.container_id}/{c.file_name} lies outside the data")
    return index


READ_PIECE_BYTES = 1 << 20       # a chunk is read (and its CRC checked) this much at a time


def iter_chunk(f: IO[bytes], chunk: LogChunk, name: str, keep_from: int = 0) -> Iterator[bytes]:
    """A chunk's bytes from `keep_from` on (none when past its end), in pieces of at most
    READ_PIECE_BYTES. Read from the chunk's start, the whole chunk is checked against its CRC-32: a
    piece goes out once the next one is read, the last only once the CRC matched, so a chunk that
    fits one piece is never yielded unchecked; a longer one that does not match ends in
    AggregatedLogError after all but its last piece went out (a streaming reader then cuts its
    answer short: nothing is papered over).

    A suffix that begins more than READ_PIECE_BYTES into the chunk (a tail of a big log) is read
    alone and is not CRC-checked: the CRC covers the whole chunk, and checking it would cost the
    whole chunk -- 10 GB read for a 4 KiB tail of a final file (docs/internals.md, "Aggregated
    logs"). Skipping at most a piece, the chunk is read from its start and checked."""
    if keep_from > READ_PIECE_BYTES:
        yield from _iter_suffix(f, chunk, name, keep_from)
        return
    f.seek(chunk.offset)
    held = b""
    crc, got = 0, 0
    while got < chunk.length:
        piece = f.read(min(READ_PIECE_BYTES, chunk.length - got))
        if not piece:
            break
        crc = zlib.crc32(piece, crc)
        if got + len(piece) > keep_from:
            if held:
                yield held
            held = piece[max(0, keep_from - got):]
        got += len(piece)
    if got != chunk.length or crc != chunk.crc32:
        raise AggregatedLogError(f"{name}: the bytes of {chunk.container_id}/{chunk.file_name} do not match "
                                 "their checksum (corrupt file)")
    if held:
        yield held


def _iter_suffix(f: IO[bytes], chunk: LogChunk, name: str, keep_from: int) -> Iterator[bytes]:
    """The chunk's bytes from `keep_from` on, read alone in pieces (unchecked: see `iter_chunk`)."""
    got = keep_from
    f.seek(chunk.offset + got)
    while got < chunk.length:
        piece = f.read(min(READ_PIECE_BYTES, chunk.length - got))
        if not piece:
            raise AggregatedLogError(f"{name}: the bytes of {chunk.container_id}/{chunk.file_name} end at "
                                     f"{got} of their {chunk.length} (a file cut short)")
        got += len(piece)
        yield piece


def read_chunk(f: IO[bytes], chunk: LogChunk, name: str, keep_from: int = 0) -> bytes:
    """A chunk's bytes from `keep_from` on (none when past its end): `iter_chunk`'s, joined (the
    whole chunk checked against its CRC-32 before any is returned, unless more than a piece of it
    is skipped)."""
    return b"".join(iter_chunk(f, chunk, name, keep_from))


# ===== the remote dir =============================================================================

class RemoteLogDir:
    """`remote_app_log_dir`: a local path (a shared mount) through os calls, any other URL (s3://...)
    through fsspec. Writes are atomic: a local file is renamed into place; an object store
    publishes an object only when its upload completes, so a writer that dies leaves nothing."""

    def __init__(self, url: str):
        try:
            validate(url)
        except DurableStorageError as e:
            raise AggregatedLogError(f"remote_app_log_dir: {e}") from None
        self.url = url.rstrip("/") or url
        self.local = local_path(self.url)
        self.fs: Any = None
        self.root = self.local or ""
        if self.local is None:
            import fsspec  # type: ignore[import-untyped]  # noqa: PLC0415  # only for URLs; no stubs
            try:
                self.fs, self.root = fsspec.core.url_to_fs(self.url)
            except (ImportError, ValueError) as e:
                raise AggregatedLogError(f"remote_app_log_dir {url!r}: {e}") from None

    def path(self, app_id: str, name: str = "") -> str:
        parts = [self.root, app_id] + ([name] if name else [])
        return os.path.join(*parts) if self.local is not None else posixpath.join(*parts)

    def where(self, app_id: str, name: str) -> str:
        """The file's URL, for messages."""
        return f"{self.url}/{app_id}/{name}"

    def names(self, app_id: str) -> list[str]:
        """The file names in the app's dir, sorted; [] when it has none."""
        d = self.path(app_id)
        if self.local is not None:
            try:
                return sorted(n for n in os.listdir(d) if not n.startswith("."))
            except FileNotFoundError:
                return []
        # Listed afresh: s3fs keeps listings for the process's life, and the files here are
        # written by other processes (the NMs), so a long-lived reader (the RM's log pages) would
        # go on seeing a running app's rolls after its final file replaced them.
        self.fs.invalidate_cache(d)
        try:
            entries = self.fs.ls(d, detail=False)
        except FileNotFoundError:
            return []
        return sorted(posixpath.basename(str(e).rstrip("/")) for e in entries if not str(e).endswith("/"))

    def write(self, app_id: str, name: str, pieces: Iterable[bytes]) -> None:
        """Write the file from `pieces`, atomically (see the class doc)."""
        if self.local is not None:
            os.makedirs(self.path(app_id), exist_ok=True)
            write_atomic(self.path(app_id, name), pieces)
            return
        path = self.path(app_id, name)
        try:
            with self.fs.open(path, "wb") as f:
                for p in pieces:
                    f.write(p)
        except BaseException:
            # An fsspec file commits what was written when its block is left, on an error too (s3fs
            # completes the upload): the half-written object would stand as the file, refused by
            # every reader (an NM recovering its rolls among them). It goes.
            try:
                self.fs.rm_file(path)
            except Exception:  # noqa: BLE001 - nothing was committed, or the store is gone too
                pass
            raise

    def remove(self, app_id: str, name: str) -> None:
        p = self.path(app_id, name)
        try:
            if self.local is not None:
                os.unlink(p)
            else:
                self.fs.rm_file(p)
        except FileNotFoundError:
            pass

    def app_ages(self) -> list[tuple[str, float]]:
        """Every app dir here and when its newest file was written (seconds since the epoch; the
        dir's own time when it holds no file), in app id order. Only dirs named for an app count:
        anything else under the root (an operator's checkpoint or staging dir on the same share)
        is not the logs' to age, let alone delete."""
        out: list[tuple[str, float]] = []
        if self.local is not None:
            try:
                dirs = [e for e in os.scandir(self.root) if e.is_dir() and is_application_id(e.name)]
            except FileNotFoundError:
                return []
            for d in dirs:
                try:
                    times = [f.stat().st_mtime for f in os.scandir(d.path) if f.is_file()]
                    out.append((d.name, max(times, default=d.stat().st_mtime)))
                except FileNotFoundError:
                    continue        # removed meanwhile
            return sorted(out)
        self.fs.invalidate_cache(self.root)     # s3fs keeps listings: a later pass must see new apps
        try:
            entries = self.fs.ls(self.root, detail=True)
        except FileNotFoundError:
            return []
        for e in entries:
            app_id = posixpath.basename(str(e["name"]).rstrip("/"))
            if e.get("type") != "directory" or not is_application_id(app_id):
                continue
            # Each app's listing afresh too: invalidating the root leaves its children's cached
            # listings (s3fs walks up from a path, never down), and a pass that saw a running app's
            # rolls would date it by them after its final file came, deleting that file with it.
            self.fs.invalidate_cache(e["name"])
            try:
                # Not a store's own dir marker ("<app>/", SeaweedFS's): only the files written.
                files = [f for f in self.fs.ls(e["name"], detail=True)
                         if f.get("type") == "file" and not str(f["name"]).endswith("/")]
            except FileNotFoundError:
                continue
            times = [t for t in (_written(f) for f in files) if t is not None]
            if times:        # an object store has no empty dirs: one with no dated file is left be
                out.append((app_id, max(times)))
        return sorted(out)

    def remove_app(self, app_id: str) -> None:
        """Delete the app's dir and every file in it (gone already: nothing to do)."""
        p = self.path(app_id)
        if self.local is not None:
            try:
                shutil.rmtree(p)
            except FileNotFoundError:
                pass
            return
        try:
            self.fs.rm(p, recursive=True)
        except FileNotFoundError:
            pass
        try:
            self.fs.rm_file(p + "/")    # a store's dir marker (SeaweedFS's), which rm leaves
        except FileNotFoundError:
            pass
        self.fs.invalidate_cache(p)

    def open(self, app_id: str, name: str) -> tuple[IO[bytes], int]:
        """The file open for reading and its size; FileNotFoundError if it is not there."""
        p = self.path(app_id, name)
        if self.local is not None:
            f = open(p, "rb")
            return f, os.fstat(f.fileno()).st_size
        size = int(self.fs.size(p))
        # Each read fetches what it asks for, no more: fsspec's default cache (s3fs's: a 50 MiB
        # read-ahead block) fetches 50 MiB for an index's 8-byte header and holds them for as long
        # as a log stream is open. Reads come a piece (READ_PIECE_BYTES) at a time, a request each.
        return self.fs.open(p, "rb", block_size=READ_PIECE_BYTES, cache_type="none"), size

    def index(self, app_id: str, name: str) -> AggregatedLogIndex:
        f, size = self.open(app_id, name)
        with f:
            return read_index(f, size, self.where(app_id, name))


def _written(info: dict[str, Any]) -> Optional[float]:
    """When an fsspec file entry was written, in seconds since the epoch: `mtime` (the local
    filesystem: a number), `LastModified` (s3fs: a datetime), `created` (the memory filesystem: a
    number); None if none of them."""
    t = info.get("mtime", info.get("LastModified", info.get("created")))
    if isinstance(t, (int, float)):
        return float(t)
    if isinstance(t, datetime.datetime):
        return (t if t.tzinfo is not None else t.replace(tzinfo=datetime.timezone.utc)).timestamp()
    return None


@dataclass
class NodeLogs:
    """One node's aggregated logs of an app: its final file, else its rolled files in order."""

    node_file: str
    files: list[tuple[str, AggregatedLogIndex]] = field(default_factory=list)   # (name, index)
    errors: list[str] = field(default_factory=list)                               # files refused

    @property
    def node_id(self) -> str:
        return self.files[0][1].node_id if self.files else self.node_file

    @property
    def user(self) -> Optional[str]:
        """The app's user its files name (None: none does, e.g. files of an older format)."""
        return next((ix.user for _, ix in self.files if ix.user), None)

    @property
    def final(self) -> bool:
        return any(ix.kind == "final" for _, ix in self.files)

    def containers(self) -> dict[str, dict[str, int]]:
        """container id -> log file name -> the bytes aggregated (the end of its last chunk)."""
        out: dict[str, dict[str, int]] = {}
        for _, ix in self.files:
            for c in ix.chunks:
                files = out.setdefault(c.container_id, {})
                files[c.file_name] = max(files.get(c.file_name, 0), c.start + c.length)
        return out


def app_node_logs(store: RemoteLogDir, app_id: str) -> list[NodeLogs]:
    """Every node's aggregated logs of `app_id`, by node file name. A refused file (cut short,
    corrupt) is kept out and named in the node's `errors`."""
    by_node: dict[str, list[tuple[int, str]]] = {}
    for name in store.names(app_id):
        node, seq = parse_file_name(name)
        by_node.setdefault(node, []).append((seq, name))
    out = []
    for node, named in sorted(by_node.items()):
        logs = NodeLogs(node)
        finals = [n for s, n in named if s == 0]
        # The final file holds everything; rolls beside it are left from before it was written.
        for name in finals or [n for _, n in sorted(named)]:
            try:
                logs.files.append((name, store.index(app_id, name)))
            except FileNotFoundError:
                continue        # removed since the listing (the rolls, once the final file is up)
            except AggregatedLogError as e:
                logs.errors.append(str(e))
        if finals and not logs.files:
            # The final file was refused: fall back on the rolls, if any are left.
            for _, name in sorted(n for n in named if n[0] > 0):
                try:
                    logs.files.append((name, store.index(app_id, name)))
                except (FileNotFoundError, AggregatedLogError):
                    continue
        out.append(logs)
    return out


def iter_log(store: RemoteLogDir, app_id: str, node: NodeLogs, container_id: str, file_name: str,
             start: int = 0) -> Iterator[bytes]:
    """A container's log file as aggregated from `node`, in pieces of at most READ_PIECE_BYTES: its
    chunks in order, from byte `start` (YARN's: the last -start bytes when negative). A gap between
    two chunks (a roll that was refused or lost) is marked in the text, not papered over. A chunk
    read from its start is checked against its CRC-32; a tail that skips more than a piece of it is
    read alone, unchecked (`iter_chunk`). Only a piece or two is held at a time, so a reader of a
    log of many GB holds a few MiB; the RM's and NMs' log calls stream it (`LogStream`). An
    aggregated file stays open until the iterator is exhausted or closed."""
    files = [(name, [c for c in ix.chunks if c.container_id == container_id and c.file_name == file_name])
             for name, ix in node.files]
    files = [(name, chunks) for name, chunks in files if chunks]
    total = max((c.start + c.length for _, chunks in files for c in chunks), default=0)
    lo = start if start >= 0 else max(0, total + start)
    end = 0
    for name, chunks in files:
        f, _ = store.open(app_id, name)
        with f:
            for c in chunks:
                if c.start > end and c.start > lo:
                    yield (f"\n[elastane: bytes {max(end, lo)}..{c.start} of this log are missing from the "
                           f"aggregated files]\n").encode()
                # Bytes read already (from an overlapping upload) are not repeated.
                keep = max(end, lo) - c.start
                yield from iter_chunk(f, c, store.where(app_id, name), keep_from=max(0, keep))
                end = max(end, c.start + c.length)


def read_log(store: RemoteLogDir, app_id: str, node: NodeLogs, container_id: str, file_name: str,
             start: int = 0) -> bytes:
    """`iter_log`'s bytes in one: for a caller that needs them whole (the CLI prints a log; a tail
    with a negative `start` costs its size). An HTTP handler streams `iter_log` instead."""
    return b"".join(iter_log(store, app_id, node, container_id, file_name, start))


def find_container(store: RemoteLogDir, container_id: str) -> Optional[tuple[NodeLogs, dict[str, int]]]:
    """The node whose aggregated files hold `container_id`'s logs and their files (name -> bytes);
    None if none does. The container id names its app, so only that app's dir is read."""
    try:
        app_id = str(ContainerId.parse(container_id).app)
    except ValueError:
        return None
    for node in app_node_logs(store, app_id):
        files = node.containers().get(container_id)
        if files is not None:
            return node, files
    return None


# ===== serving ====================================================================================

WRITE_BYTES = 256 << 10     # a log is written to the client this much at a time


class LogStream:
    """A log's pieces (`iter_log`'s, or a local log file's) answered over HTTP in bounded memory:
    each piece is read in a worker thread (a file or an object store must not hold the event loop)
    and written out before the next is read, so a reader costs a piece or two, not the log.

    `start()` reads the first piece: an error there (a file gone, a corrupt chunk) is the caller's
    to answer with its own status, nothing being sent yet. `respond()` then sends 200, text/plain,
    and the pieces, and closes the source whatever happens. An error once the answer has begun
    cannot change its status, so the answer is cut short instead -- a line saying why (where no
    length was announced), then the connection closed before the body's end -- and no client takes
    it for the whole log."""

    def __init__(self, pieces: Iterator[bytes], length: Optional[int] = None):
        self._pieces = pieces
        self._length = length            # the body's length when known up front (Content-Length)
        self._first: Optional[bytes] = None

    async def _next(self) -> Optional[bytes]:
        return await asyncio.to_thread(next, self._pieces, None)

    async def start(self) -> None:
        """Read the first piece (closing the source on any error, which is raised)."""
        try:
            self._first = await self._next()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        close = getattr(self._pieces, "close", None)
        if close is None:
            return
        try:
            await asyncio.to_thread(close)
        except ValueError:
            pass     # a cancelled read still runs in its thread: the source closes when it is collected

    async def respond(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.content_type = "text/plain"
        resp.charset = "utf-8"
        if self._length is not None:
            resp.content_length = self._length
        try:
            await resp.prepare(request)
            if request.method == "HEAD":
                return resp
            piece, self._first = self._first, None
            while piece is not None:
                with memoryview(piece) as view:
                    for at in range(0, len(view), WRITE_BYTES):
                        await resp.write(view[at:at + WRITE_BYTES])
                piece = None                 # not held while the next one is read
                try:
                    piece = await self._next()
                except Exception as e:   # noqa: BLE001  # any: the status is sent, the answer is cut short
                    log.warning("%s %s: the log could not be read to its end, answer cut short: %s",
                                request.method, request.path, e, exc_info=not isinstance(e, (AggregatedLogError, OSError)))
                    if self._length is None:
                        await resp.write(f"\n[elastane: the log could not be read to its end: {e}]\n".encode())
                    if request.transport is not None:
                        request.transport.close()
                    return resp
            await resp.write_eof()
        except ConnectionError:
            pass                         # the client went away
        finally:
            await self.close()
        return resp

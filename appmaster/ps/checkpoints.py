"""Model checkpoints of a PS job: every server's blocks travel to the AM over the data plane and the
AM writes them into one directory per cut; a restore reads them there and sends them back.

Layout under the AM's durable dir (ELASTANE_AM_DIR)::

    checkpoints/epoch-<N>/manifest-<server>.json, block_<b>.buf   (psruntime.store.checkpoint's format)
    checkpoints/epoch-<N>/worker_state_<b>.buf   an input block's worker-local state (NMF, LDA): a
                                          psruntime.store.buffer_file, the block header as content
                                          (older checkpoints' worker_state_<b>.npz still read)
    checkpoints/epoch-<N>/job.json   epoch, objective, the ownership table and the job spec: a
                                          protocol.checkpoint_manifest.JobCheckpoint
    checkpoints/epoch-<N>-clock-<C>/...   a cut inside epoch N, after the job's C-th clock (a
                                          kill-based reshape pauses at the next clock boundary)

`job.json` is written last (atomically, after every other file is durable), so a directory without
it is an incomplete checkpoint. Each server takes its blocks in one synchronous step
(`checkpoint_blocks`, a consistent cut even if updates arrived meanwhile) and sends them in batches
of at most `BATCH_BYTES`; the AM writes each batch while the next one travels. The AM only
checkpoints at clock boundaries, when no push is in flight, so the servers' cuts together are a
consistent cut of the model. Only the AM touches the directory, so servers on other hosts need no
shared file system.

The durable dir is a `protocol.durable_storage` location (rm.toml `checkpoint_dir`), which every
host can read so that a new attempt on another host resumes from the latest checkpoint. A local one
(a path or file://: one host's disk, or a shared mount) is written in place, each file fsynced
before job.json commits the checkpoint. Any other URL (s3://...) goes through fsspec: the AM writes
the checkpoint into a local staging dir exactly as above (minus the fsyncs), then puts every file
and job.json last; a checkpoint an earlier attempt left there is fetched into the staging dir
before it is restored (`fetch`). Either way `dir` in the checkpoint records is a local directory
(what restores, recovery and the parameter assignment read) and `url` its durable location.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import re
import shutil
import tempfile
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, TypeVar

import msgspec
import numpy as np

from protocol import container_env
from protocol import executor_ops as ops
from protocol.checkpoint_manifest import (JOB_CHECKPOINT_FILE, JobCheckpoint, JobRecord, OwnershipTableRecord,
                                          decode_job_checkpoint, encode_job_checkpoint, job_checkpoint)
from protocol.durable_storage import DurableDir, fsync_dir, fsync_file, write_atomic
from psruntime.store.checkpoint import (BlockEntry, CheckpointError, block_wire_bytes, checkpoint_entries,
                                  load_manifests, pack_blocks, read_block, unpack_blocks, write_block,
                                  write_manifest)
from psruntime.store import buffer_file
from psruntime.store.block_store import BlockArrays
from psruntime.wire.dataplane import DataPlaneClient
from psruntime.store.ownership_table import OwnershipTable

from .runtime.executor_pool import ExecutorRecord
from .runtime.executor_rpc import Answered, ExecutorRpc
from protocol.errors import AppError
from protocol.json_types import JsonObject, json_int, json_list
from protocol.ps_status import CheckpointInfo

log = logging.getLogger(__name__)
T = TypeVar("T")

JOB_MANIFEST = JOB_CHECKPOINT_FILE


def read_job_checkpoint(directory: str | os.PathLike[str]) -> JobCheckpoint:
    """The job record (job.json) of the local checkpoint in `directory`."""
    return decode_job_checkpoint((Path(directory) / JOB_MANIFEST).read_bytes())
WORKER_STATE_PREFIX = "worker_state_"    # + <input block>.buf: a worker-local block state (NMF, LDA)
# Bytes of block buffers per frame, both ways, and servers served at once: the AM (a small
# container, 512 MB by default) holds at most two batches per server in transfer -- one being
# written or read, one on the wire -- so at most 2 * PARALLEL_SERVERS * BATCH_BYTES (or a larger
# block) at a time, far below a frame's limit.
BATCH_BYTES = 8 << 20
PARALLEL_SERVERS = 4
RELEASE_CUT_TIMEOUT_S = 5.0   # telling a server to let go of an abandoned cut
# Checkpoints kept (durable, and staged copies): the newest, and the one before in case the newest
# turns out unreadable.
KEEP_CHECKPOINTS = 2
_CHECKPOINT_NAME = re.compile(r"epoch-(\d+)(?:-clock-(\d+))?")


def checkpoint_position(name: str) -> tuple[int, int] | None:
    """(epoch, clock) of a checkpoint directory named as `Checkpointer.directory` names them."""
    m = _CHECKPOINT_NAME.fullmatch(name)
    return (int(m[1]), int(m[2] or 0)) if m else None


@dataclass(frozen=True)
class StoredCheckpoint:
    """A complete checkpoint in the durable dir: its job.json record, `dir` (local once fetched)
    and `url` (its durable location)."""

    record: JobCheckpoint
    dir: str
    url: str


class CheckpointIncomplete(AppError, RuntimeError):
    """The servers' manifests do not cover every model block."""


class Checkpointer:
    """Writes checkpoints of all server blocks under `root` (a path or a durable-storage URL),
    remembers them, and restores them. `self.root` is the local directory the files are written
    in: `root` itself when it is local, else `staging` (default: a temporary directory, removed
    with the checkpointer; in a container, under its work dir)."""

    def __init__(self, root: str | os.PathLike[str] | DurableDir, client: DataPlaneClient,
                 batch_bytes: int = BATCH_BYTES, staging: str | os.PathLike[str] | None = None) -> None:
        if batch_bytes <= 0:
            raise ValueError(f"batch_bytes must be positive, got {batch_bytes}")
        self.durable = root if isinstance(root, DurableDir) else DurableDir(root)
        self.staged = self.durable.local is None
        if self.durable.local is not None:
            self.root = self.durable.local
        elif staging is not None:
            self.root = Path(staging)
        else:   # in a container, its work dir: the NM deletes it with the container, even after a SIGKILL
            in_container = bool(os.environ.get(container_env.CONTAINER_ID))
            self.root = Path(tempfile.mkdtemp(prefix="elastane-checkpoints-", dir=os.getcwd() if in_container else None))
            weakref.finalize(self, shutil.rmtree, self.root, True)
        self.client = client
        self._rpc = ExecutorRpc(client)
        self.batch_bytes = batch_bytes
        self.written: list[CheckpointInfo] = []
        self._lock = asyncio.Lock()
        self._transfers = asyncio.Semaphore(PARALLEL_SERVERS)

    def directory(self, epoch: int, clock: int = 0) -> Path:
        return self.root / (f"epoch-{epoch}-clock-{clock}" if clock else f"epoch-{epoch}")

    async def write(self, epoch: int, table: OwnershipTable, servers: Sequence[ExecutorRecord],
                    job: JobRecord, clock: int = 0, workers: Sequence[ExecutorRecord] = ()) -> CheckpointInfo:
        """Checkpoint every block at the start of `epoch` (clock 0) or inside it, after the job's
        `clock`-th clock, from those of `servers` that own blocks in `table`, with `job`'s record
        (its spec, histories, counters) -- and with `workers`,
        the worker-local state of their input blocks (apps that keep training state on the
        workers); returns its protocol.ps_status.CheckpointInfo (epoch, clock, dir, url, blocks,
        seconds, bytes, time)."""
        async with self._lock:
            # Only the servers that own blocks in `table` are asked. One that owns none has nothing
            # to give, and it is exactly the kind the AM may be stopping meanwhile: one an EPS
            # addition started that its failed change retires before any block reached it, or one
            # an EPS removal drained (it leaves the server list, then its container goes). Either
            # can still be in a server list taken a moment earlier, and the checkpoint then failed
            # with "connection lost" on it, failing the job for an executor the AM retired on
            # purpose (docs/internals.md, "PS jobs"). Every block's owner must still be among
            # `servers`: the coverage check below names any block that is not.
            owners = [s for s in servers if table.blocks_owned_by(s.executor_id)]
            d = self.directory(epoch, clock)
            d.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            fetches = [asyncio.ensure_future(self._fetch(s, d, table.num_blocks)) for s in owners]
            fetches += [asyncio.ensure_future(self._fetch_worker_state(w, d)) for w in workers]
            try:
                sizes = await asyncio.gather(*fetches)
            except BaseException:
                # One failed (or the write was cancelled): the others stop too, and are waited for,
                # so none goes on writing into the directory after the lock is let go (a retry of
                # the same checkpoint would meet it there) and each lets its server's cut go.
                for f in fetches:
                    f.cancel()
                await asyncio.gather(*fetches, return_exceptions=True)
                raise
            covered = load_manifests(d, table.num_blocks)
            missing = sorted(set(range(table.num_blocks)) - set(covered))
            if missing:
                raise CheckpointIncomplete(f"checkpoint {d} lacks blocks {missing}")
            record = job_checkpoint(job, epoch=epoch, clock=clock, time=time.time(), num_blocks=table.num_blocks,
                                    table=OwnershipTableRecord(num_blocks=table.num_blocks, owners=list(table.owners),
                                                               addresses=dict(table.addresses), version=table.version),
                                    servers=[s.executor_id for s in owners], worker_state=bool(workers))
            await asyncio.to_thread(self._commit, d, encode_job_checkpoint(record))
            info = CheckpointInfo(epoch=epoch, clock=clock, dir=str(d), url=self.durable.child(d.name).url,
                                  blocks=table.num_blocks, seconds=round(time.perf_counter() - t0, 4),
                                  bytes=sum(sizes), time=record.time)
            self.written.append(info)
            log.info("checkpoint %s: %d blocks, %.1f MiB from %d servers in %.3fs", d, table.num_blocks,
                     info.bytes / 2**20, len(owners), info.seconds)
            await asyncio.to_thread(self._prune, (epoch, clock))
            return info

    def _prune(self, newest: tuple[int, int]) -> None:
        """Remove the durable checkpoints older than the KEEP_CHECKPOINTS newest, `newest` (just
        committed) among them: a restore reads only the newest complete one (`latest`), the one
        before is kept in case that turns out unreadable, and a job checkpointing every epoch for
        days would otherwise fill the store with a model copy an epoch. A directory left by an
        interrupted write is removed the same way once it is old."""
        dirs, _ = self.durable.entries()
        ordered = sorted(((pos, name) for name in dirs if (pos := checkpoint_position(name)) is not None
                          and pos <= newest), reverse=True)
        kept = 0
        for _, name in ordered:
            if kept < KEEP_CHECKPOINTS and JOB_MANIFEST in self.durable.child(name).entries()[1]:
                kept += 1               # complete (job.json commits it): one of the newest kept
                continue
            try:
                self.durable.remove_child(name)
            except OSError as e:        # a store that refuses: left, and named
                log.warning("could not remove the old checkpoint %s: %s", name, e)

    def _commit(self, d: Path, manifest: bytes) -> None:
        """Make the checkpoint in `d` durable, job.json last: in place (fsync the directory, then
        job.json atomically), or staged (put every file, then job.json, to the durable dir)."""
        if not self.staged:
            fsync_dir(d)                  # the files' renames; each file was fsynced once written
            write_atomic(d / JOB_MANIFEST, manifest)
            fsync_dir(self.root)          # the checkpoint directory's own entry
            if not self.written:          # and, once, the entry of the root, made with the first
                fsync_dir(self.root.parent)
            return
        (d / JOB_MANIFEST).write_bytes(manifest)
        target = self.durable.child(d.name)
        target.makedirs()
        target.put_files([p for p in sorted(d.iterdir()) if p.is_file() and p.name != JOB_MANIFEST])
        target.write_bytes(JOB_MANIFEST, manifest)
        # Keep the staged copies of the newest checkpoints, this one among them (restores read the last).
        keep = {d.name} | {Path(w.dir).name for w in self.written[-(KEEP_CHECKPOINTS - 1):]}
        for old in self.root.iterdir():
            if old.is_dir() and old.name not in keep:
                shutil.rmtree(old, ignore_errors=True)

    async def _fetch(self, server: ExecutorRecord, d: Path, num_blocks: int) -> int:
        """Receive every block `server` owns and write it under `d`, then its manifest; returns bytes."""
        async with self._transfers:
            return await self._fetch_now(server, d, num_blocks)

    async def _fetch_now(self, server: ExecutorRecord, d: Path, num_blocks: int) -> int:
        entries: dict[int, dict[str, Any]] = {}
        nbytes = 0
        first = ops.CheckpointBlocks(max_bytes=self.batch_bytes)
        pending: asyncio.Future[Answered[ops.CheckpointBlocksReply]] | None = asyncio.ensure_future(
            self._rpc.exchange(server, first, ops.CheckpointBlocksReply))
        open_cut: Optional[int] = None      # a cut the server still holds for us (batches to come)
        try:
            while pending is not None:
                answered = await pending
                pending = None
                h = answered.reply
                open_cut = h.cut if h.remaining else None
                if h.num_blocks != num_blocks:
                    raise CheckpointError(f"{server.executor_id} has {h.num_blocks} blocks, the job {num_blocks}")
                items = unpack_blocks(h.blocks, answered.arrays, num_blocks)
                if h.remaining:      # the next batch travels while this one is written
                    pending = asyncio.ensure_future(self._rpc.exchange(
                        server, ops.CheckpointBlocks(cut=h.cut, max_bytes=self.batch_bytes), ops.CheckpointBlocksReply))
                entries.update(await _to_thread_to_its_end(_write_blocks, d, items, not self.staged))
                nbytes += sum(block_wire_bytes(data) for _, data in items)
            await _to_thread_to_its_end(_write_manifest, d, server.executor_id, num_blocks, h.table_version, entries,
                                    not self.staged)
        finally:
            _discard(pending)
            if open_cut is not None:
                await self._release_cut(server, open_cut)
        return nbytes

    async def _release_cut(self, server: ExecutorRecord, cut: int) -> None:
        """Tell `server` to let go of a cut this checkpoint abandoned (best effort, briefly: the
        checkpoint has failed already, and a newer cut replaces it anyway)."""
        try:
            async with asyncio.timeout(RELEASE_CUT_TIMEOUT_S):
                await self._rpc.exchange(server, ops.CheckpointBlocks(cut=cut, release=True), ops.CheckpointBlocksReply)
        except Exception as e:  # noqa: BLE001 - the failure being reported is the checkpoint's
            log.info("could not release checkpoint cut %d on %s: %s", cut, server.executor_id, e)

    async def _fetch_worker_state(self, worker: ExecutorRecord, d: Path) -> int:
        """Receive the state of every input block `worker` holds and write one file per block
        (`worker_state_<b>.buf`, its block header as the content); returns bytes."""
        answered = await self._rpc.exchange(worker, ops.BlockStates(), ops.BlockStatesReply)
        at, nbytes = 0, 0
        for h in answered.reply.blocks:
            n = len(json_list(h.get("arrays")))
            arrays = answered.arrays[at:at + n]
            at += n
            b = json_int(h["block_index"])
            await _to_thread_to_its_end(_write_worker_state, d, b, h, arrays, not self.staged)
            nbytes += sum(int(a.nbytes) for a in arrays)
        return nbytes

    async def restore_worker_state(self, directory: str | os.PathLike[str], workers: Sequence[ExecutorRecord]) -> int:
        """Send each worker the checkpointed state of the input blocks it holds now
        (`ExecutorRecord.blocks`, after it regenerated them); returns the bytes sent."""
        d = Path(directory)

        async def one(worker: ExecutorRecord) -> int:
            headers: list[JsonObject] = []
            arrays: list[np.ndarray] = []
            for b in worker.blocks:
                h, state = _read_worker_state(d, b)
                headers.append(h)
                arrays.extend(state)
            await self._rpc.send(worker, ops.SetBlockStates(blocks=headers), arrays)
            return sum(int(a.nbytes) for a in arrays)

        return sum(await asyncio.gather(*(one(w) for w in workers)))

    async def restore(self, directory: str | os.PathLike[str], servers: Sequence[ExecutorRecord],
                      num_blocks: int) -> int:
        """Send each server the blocks it is assigned (`ExecutorRecord.blocks`, already in the
        ownership table it holds) from the checkpoint in `directory`; returns the bytes sent."""
        t0 = time.perf_counter()
        entries = checkpoint_entries(directory, num_blocks, [b for s in servers for b in s.blocks])
        sent = sum(await asyncio.gather(*(self._send(s, Path(directory), {b: entries[b] for b in s.blocks})
                                          for s in servers)))
        log.info("restored %s: %d blocks, %.1f MiB to %d servers in %.3fs", directory, len(entries), sent / 2**20,
                 len(servers), time.perf_counter() - t0)
        return sent

    async def _send(self, server: ExecutorRecord, d: Path, entries: dict[int, BlockEntry]) -> int:
        """Read `entries` batch by batch and send each to `server` while the next one is read."""
        async with self._transfers:
            return await self._send_now(server, d, entries)

    async def _send_now(self, server: ExecutorRecord, d: Path, entries: dict[int, BlockEntry]) -> int:
        nbytes = 0
        batch: list[tuple[int, BlockArrays]] = []
        batch_size = 0
        inflight: asyncio.Future[None] | None = None

        async def flush() -> None:
            nonlocal inflight, batch, batch_size
            if inflight is not None:
                await inflight
            descs, arrays = pack_blocks(batch)
            inflight = asyncio.ensure_future(self._rpc.send(server, ops.RestoreBlocksData(blocks=descs), arrays))
            batch, batch_size = [], 0

        try:
            for b, entry in entries.items():
                data = await asyncio.to_thread(read_block, d, b, entry)
                size = block_wire_bytes(data)
                if batch and batch_size + size > self.batch_bytes:
                    await flush()
                batch.append((b, data))
                batch_size += size
                nbytes += size
            if batch:
                await flush()
            if inflight is not None:
                await inflight
                inflight = None
        finally:
            _discard(inflight)
        return nbytes

    @property
    def last(self) -> CheckpointInfo | None:
        return self.written[-1] if self.written else None

    def latest(self) -> StoredCheckpoint | None:
        """The newest complete checkpoint in the durable dir (by epoch, then clock) -- e.g. one an
        earlier AM attempt of the job wrote, on another host -- or None. Directories without a
        readable job.json are incomplete and skipped. For a staged durable dir `dir` is the
        durable location until `fetch` brings the checkpoint here."""
        best: StoredCheckpoint | None = None
        dirs, _ = self.durable.entries()
        for name in dirs:
            d = self.durable.child(name)
            try:
                record = decode_job_checkpoint(d.read_bytes(JOB_MANIFEST))
            except (OSError, msgspec.DecodeError):
                continue
            if best is None or (record.epoch, record.clock) > (best.record.epoch, best.record.clock):
                best = StoredCheckpoint(record, str(d.local) if d.local is not None else d.url, d.url)
        return best

    async def fetch(self, checkpoint: StoredCheckpoint) -> StoredCheckpoint:
        """`checkpoint` (from `latest`) with `dir` a local directory holding its files: itself for
        a local durable dir, else a copy fetched into the staging dir."""
        if not self.staged:
            return checkpoint
        name = checkpoint.url.rstrip("/").rsplit("/", 1)[-1]
        source, local = self.durable.child(name), self.root / name

        def get() -> None:
            local.mkdir(parents=True, exist_ok=True)
            source.get_files(source.entries()[1], local)

        t0 = time.perf_counter()
        await asyncio.to_thread(get)
        log.info("fetched checkpoint %s into %s in %.3fs", source.url, local, time.perf_counter() - t0)
        return dataclasses.replace(checkpoint, dir=str(local))


async def _to_thread_to_its_end(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` in a thread. A thread cannot be stopped: cancelled, this still waits for it to
    end before giving way, so no file of an abandoned checkpoint is written after its failure is
    reported (a retry of the same checkpoint writes the same names)."""
    fut = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        await asyncio.wait({fut})
        raise


def _discard(fut: "asyncio.Future[Any] | None") -> None:
    """Drop a request left behind by a failure (its own error, if any, is not the one to report)."""
    if fut is None:
        return
    if fut.done():
        if not fut.cancelled():
            fut.exception()
    else:
        fut.cancel()


def _write_blocks(d: Path, items: list[tuple[int, BlockArrays]], sync: bool) -> dict[int, dict[str, Any]]:
    """psruntime.store.checkpoint's block files, each fsynced with `sync` (in the thread that overlaps
    the next batch's transfer, so the wait is mostly hidden)."""
    entries = {}
    for b, data in items:
        entries[b] = write_block(d, b, data)
        if sync:
            fsync_file(d / entries[b]["file"])
    return entries


def _write_manifest(d: Path, executor_id: str, num_blocks: int, table_version: int,
                    entries: dict[int, dict[str, Any]], sync: bool) -> None:
    path = write_manifest(d, executor_id, num_blocks, table_version, entries)
    if sync:
        fsync_file(path)


def _write_worker_state(d: Path, block: int, header: JsonObject, arrays: list[np.ndarray], sync: bool) -> None:
    """One input block's worker-local state as `worker_state_<b>.buf` (atomically; fsynced with
    `sync`): a buffer file with its header as the content."""
    buffer_file.write(d / f"{WORKER_STATE_PREFIX}{block}.buf", header, arrays, durable=sync)


def _read_worker_state(d: Path, block: int) -> tuple[JsonObject, list[np.ndarray]]:
    """(header, arrays) of an input block's checkpointed state; a checkpoint written before the
    buffer files holds `worker_state_<b>.npz` (the header as uint8 JSON beside arrays a0, a1...)."""
    path = d / f"{WORKER_STATE_PREFIX}{block}.buf"
    if path.exists():
        return buffer_file.read(path)
    with np.load(d / f"{WORKER_STATE_PREFIX}{block}.npz") as f:
        h = json.loads(bytes(f["header"]).decode())
        return h, [f[f"a{i}"] for i in range(len(h.get("arrays", [])))]

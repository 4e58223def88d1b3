"""Model checkpoints of a PS job: every server's blocks travel to the AM over the data plane and the
AM writes them into one directory per cut; a restore reads them there and sends them back.

Layout under the AM's durable dir (ELASTANE_AM_DIR)::

    checkpoints/epoch-<N>/manifest-<server>.json, block_<b>.npz   (psruntime.checkpoint's format)
    checkpoints/epoch-<N>/job.json   epoch, objective, the ownership table and the job spec
    checkpoints/epoch-<N>-clock-<C>/...   a cut inside epoch N, after the job's C-th clock (a
                                          kill-based reshape pauses at the next clock boundary)

`job.json` is written last (atomically), so a directory without it is an incomplete checkpoint.
Each server takes its blocks in one synchronous step (`checkpoint_blocks`, a consistent cut even if
updates arrived meanwhile) and sends them in batches of at most `BATCH_BYTES`; the AM writes each
batch while the next one travels. The AM only checkpoints at clock boundaries, when no push is in
flight, so the servers' cuts together are a consistent cut of the model. Only the AM touches the
directory, so servers on other hosts need no shared file system.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from protocol import executor_ops as ops
from psruntime.checkpoint import (BlockEntry, CheckpointError, block_wire_bytes, checkpoint_entries,
                                  load_manifests, pack_blocks, read_block, unpack_blocks, write_block,
                                  write_manifest)
from psruntime.block_store import BlockArrays
from psruntime.dataplane import DataPlaneClient
from psruntime.frame_codec import Frame
from psruntime.ownership_table import OwnershipTable

from .executor_pool import ExecutorRecord
from .executor_rpc import ExecutorCallError, ExecutorRpc

log = logging.getLogger(__name__)

JOB_MANIFEST = "job.json"
WORKER_STATE_PREFIX = "worker_state_"    # + <input block>.npz: a worker-local block state (NMF, LDA)
# Bytes of block buffers per frame, both ways, and servers served at once: the AM (a small
# container, 512 MB by default) holds at most two batches per server in transfer -- one being
# written or read, one on the wire -- so at most 2 * PARALLEL_SERVERS * BATCH_BYTES (or a larger
# block) at a time, far below a frame's limit.
BATCH_BYTES = 8 << 20
PARALLEL_SERVERS = 4


class CheckpointIncomplete(RuntimeError):
    """The servers' manifests do not cover every model block."""


class Checkpointer:
    """Writes checkpoints of all server blocks under `root`, remembers them, and restores them."""

    def __init__(self, root: str | os.PathLike[str], client: DataPlaneClient,
                 batch_bytes: int = BATCH_BYTES) -> None:
        if batch_bytes <= 0:
            raise ValueError(f"batch_bytes must be positive, got {batch_bytes}")
        self.root = Path(root)
        self.client = client
        self._rpc = ExecutorRpc(client)
        self.batch_bytes = batch_bytes
        self.written: list[dict[str, Any]] = []
        self._lock = asyncio.Lock()
        self._transfers = asyncio.Semaphore(PARALLEL_SERVERS)

    def directory(self, epoch: int, clock: int = 0) -> Path:
        return self.root / (f"epoch-{epoch}-clock-{clock}" if clock else f"epoch-{epoch}")

    async def write(self, epoch: int, table: OwnershipTable, servers: Sequence[ExecutorRecord],
                    job: dict[str, Any], clock: int = 0, workers: Sequence[ExecutorRecord] = ()) -> dict[str, Any]:
        """Checkpoint every block at the start of `epoch` (clock 0) or inside it, after the job's
        `clock`-th clock -- and with `workers`, the worker-local state of their input blocks (apps
        that keep training state on the workers); returns {"epoch", "clock", "dir", "blocks",
        "seconds", "bytes", "time"}."""
        async with self._lock:
            d = self.directory(epoch, clock)
            d.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            sizes = await asyncio.gather(*(self._fetch(s, d, table.num_blocks) for s in servers),
                                         *(self._fetch_worker_state(w, d) for w in workers))
            covered = load_manifests(d, table.num_blocks)
            missing = sorted(set(range(table.num_blocks)) - set(covered))
            if missing:
                raise CheckpointIncomplete(f"checkpoint {d} lacks blocks {missing}")
            manifest = {"epoch": epoch, "clock": clock, "time": time.time(), "num_blocks": table.num_blocks,
                        "table": table.to_wire(), "servers": [s.executor_id for s in servers],
                        "worker_state": bool(workers), **job}
            tmp = d / (JOB_MANIFEST + ".tmp")
            tmp.write_text(json.dumps(manifest))
            os.replace(tmp, d / JOB_MANIFEST)
            info = {"epoch": epoch, "clock": clock, "dir": str(d), "blocks": table.num_blocks,
                    "seconds": round(time.perf_counter() - t0, 4), "bytes": sum(sizes), "time": manifest["time"]}
            self.written.append(info)
            log.info("checkpoint %s: %d blocks, %.1f MiB from %d servers in %.3fs", d, table.num_blocks,
                     info["bytes"] / 2**20, len(servers), info["seconds"])
            return info

    async def _fetch(self, server: ExecutorRecord, d: Path, num_blocks: int) -> int:
        """Receive every block `server` owns and write it under `d`, then its manifest; returns bytes."""
        async with self._transfers:
            return await self._fetch_now(server, d, num_blocks)

    async def _fetch_now(self, server: ExecutorRecord, d: Path, num_blocks: int) -> int:
        entries: dict[int, dict[str, Any]] = {}
        nbytes = 0
        first = ops.CheckpointBlocks(max_bytes=self.batch_bytes)
        pending: asyncio.Future[Frame] | None = asyncio.ensure_future(self._rpc.frame(server, first))
        try:
            while pending is not None:
                frame = await pending
                pending = None
                try:
                    h = ops.decode_reply(frame.header, ops.CheckpointBlocksReply)
                except ops.ControlMessageError as e:
                    raise ExecutorCallError(server, "checkpoint_blocks", e) from e
                if h.num_blocks != num_blocks:
                    raise CheckpointError(f"{server.executor_id} has {h.num_blocks} blocks, the job {num_blocks}")
                items = unpack_blocks(h.blocks, frame.arrays, num_blocks)
                if h.remaining:      # the next batch travels while this one is written
                    pending = asyncio.ensure_future(self._rpc.frame(
                        server, ops.CheckpointBlocks(cut=h.cut, max_bytes=self.batch_bytes)))
                entries.update(await asyncio.to_thread(_write_blocks, d, items))
                nbytes += sum(block_wire_bytes(data) for _, data in items)
            await asyncio.to_thread(write_manifest, d, server.executor_id, num_blocks, h.table_version, entries)
        finally:
            _discard(pending)
        return nbytes

    async def _fetch_worker_state(self, worker: ExecutorRecord, d: Path) -> int:
        """Receive the state of every input block `worker` holds and write one file per block
        (`worker_state_<b>.npz` with its block header beside the arrays); returns bytes."""
        frame = await self._rpc.frame(worker, ops.BlockStates())
        reply = ops.decode_reply(frame.header, ops.BlockStatesReply)
        at, nbytes = 0, 0
        for h in reply.blocks:
            n = len(h.get("arrays", []))
            arrays = frame.arrays[at:at + n]
            at += n
            b = int(h["block_index"])
            tmp = d / f"{WORKER_STATE_PREFIX}{b}.tmp.npz"
            np.savez(tmp, header=np.frombuffer(json.dumps(h).encode(), np.uint8),
                     **{f"a{i}": a for i, a in enumerate(arrays)})  # type: ignore[arg-type]  # see psruntime/checkpoint.py
            os.replace(tmp, d / f"{WORKER_STATE_PREFIX}{b}.npz")
            nbytes += sum(int(a.nbytes) for a in arrays)
        return nbytes

    async def restore_worker_state(self, directory: str | os.PathLike[str], workers: Sequence[ExecutorRecord]) -> int:
        """Send each worker the checkpointed state of the input blocks it holds now
        (`ExecutorRecord.blocks`, after it regenerated them); returns the bytes sent."""
        d = Path(directory)

        async def one(worker: ExecutorRecord) -> int:
            headers: list[dict[str, Any]] = []
            arrays: list[np.ndarray] = []
            for b in worker.blocks:
                with np.load(d / f"{WORKER_STATE_PREFIX}{b}.npz") as f:
                    h = json.loads(bytes(f["header"]).decode())
                    headers.append(h)
                    arrays.extend(f[f"a{i}"] for i in range(len(h.get("arrays", []))))
            await self._rpc.frame(worker, ops.SetBlockStates(blocks=headers), arrays)
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
        inflight: asyncio.Future[Frame] | None = None

        async def flush() -> None:
            nonlocal inflight, batch, batch_size
            if inflight is not None:
                await inflight
            descs, arrays = pack_blocks(batch)
            inflight = asyncio.ensure_future(self._rpc.frame(server, ops.RestoreBlocksData(blocks=descs), arrays))
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
    def last(self) -> dict[str, Any] | None:
        return self.written[-1] if self.written else None

    def latest(self) -> dict[str, Any] | None:
        """The newest complete checkpoint under the root (by epoch, then clock), as its job manifest
        plus `dir` -- e.g. one an earlier AM attempt of the job wrote -- or None. Directories
        without a readable job manifest are incomplete and skipped."""
        best: tuple[tuple[int, int], dict[str, Any]] | None = None
        if not self.root.is_dir():
            return None
        for d in self.root.iterdir():
            try:
                manifest = json.loads((d / JOB_MANIFEST).read_text())
                key = (int(manifest["epoch"]), int(manifest.get("clock", 0)))
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if best is None or key > best[0]:
                best = (key, {**manifest, "dir": str(d)})
        return None if best is None else best[1]


def _discard(fut: "asyncio.Future[Frame] | None") -> None:
    """Drop a request left behind by a failure (its own error, if any, is not the one to report)."""
    if fut is None:
        return
    if fut.done():
        if not fut.cancelled():
            fut.exception()
    else:
        fut.cancel()


def _write_blocks(d: Path, items: list[tuple[int, BlockArrays]]) -> dict[int, dict[str, Any]]:
    return {b: write_block(d, b, data) for b, data in items}

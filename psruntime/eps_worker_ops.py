"""EPS's worker-to-worker data transmission (§3.1.2, §3.2, §3.3) on the executor's control channel.

The AM decides which input splits move (appmaster.ps.eps_decisions); workers move them directly:

    eps_join {}                               a new worker: a store client and no splits yet
    eps_send_data {splits, dst_address}       sender: stage the splits' input data (immutable) at
                                              the destination; overlaps the running epoch
    eps_stage {split, block}  (+ data buffers) destination: keep the staged data in memory
    eps_commit {transfers: [{split, dst_address, source}], keep_inactive}
                                              sender, at an epoch boundary: send each split's
                                              worker-local state (and its data when `source` is
                                              "message"), drop it from the active dataset and,
                                              with keep_inactive, keep it in the inactive one
    eps_activate {split, block, source} (+ buffers) destination: build the split from its data
                                              (in the message, staged, or its own inactive copy)
                                              and the state that came with it; train on it from
                                              the next epoch on
    eps_discard_staged {splits}               drop staged data of a transfer that was abandoned
    eps_datasets {}                           active, inactive and staged splits of this worker

A commit or activation waits for the executor's running epoch step to end (AppRole.step_lock),
so the splits a worker trains on never change under an epoch.
"""
from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import numpy as np

from psruntime.apps.blocks import BlockFormatError, DataBlock
from psruntime.dataplane import Reply, RequestError
from psruntime.eps_inactive_store import InactiveSplits, InactiveStoreError
from psruntime.frame_codec import Frame
from psruntime.store_client import StoreClient

if TYPE_CHECKING:
    from psruntime.app_role import AppRole

Op = Callable[[Frame], "Reply | Awaitable[Reply]"]
SOURCES = ("message", "staged", "inactive")
INACTIVE_DIR = "eps-inactive"


def _split_list(h: dict[str, Any], name: str) -> list[int]:
    v = h.get(name)
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
        raise RequestError(f"field {name!r} must be a list of split indices")
    return v


def _address(h: dict[str, Any], name: str) -> str:
    v = h.get(name)
    if not isinstance(v, str) or ":" not in v:
        raise RequestError(f"field {name!r} must be a host:port address, got {v!r}")
    return v


def part_buffers(block: DataBlock, part: str) -> tuple[dict[str, Any], list[np.ndarray]]:
    """`block` serialised with only its "data", only its "state", or "all" of its arrays."""
    data = block.data if part in ("data", "all") else {}
    state = block.state if part in ("state", "all") else {}
    return DataBlock(block.app, block.block_index, block.row_start, block.num_rows, data, state).to_buffers()


def default_inactive_dir() -> Path:
    """The container's working dir (the NM's local disk for this container)."""
    return Path(os.environ.get("PWD") or os.getcwd()) / INACTIVE_DIR


class EpsWorkerOps:
    """A worker's side of EPS data transmission, over its AppRole's active splits."""

    def __init__(self, app_role: "AppRole", inactive_dir: str | Path | None = None) -> None:
        self.role = app_role
        self.inactive = InactiveSplits(inactive_dir or default_inactive_dir())
        self.staged: dict[int, DataBlock] = {}
        self.sent_bytes = 0
        self.received_bytes = 0

    def ops(self) -> dict[str, Op]:
        return {"eps_join": self.join, "eps_send_data": self.send_data, "eps_stage": self.stage,
                "eps_commit": self.commit, "eps_activate": self.activate,
                "eps_discard_staged": self.discard_staged, "eps_datasets": self.datasets}

    def _active(self, split: int) -> DataBlock:
        for b in self.role.blocks:
            if b.block_index == split:
                return b
        raise RequestError(f"split {split} is not in the active dataset of {self.role.executor.executor_id}")

    # -- a worker joins ---------------------------------------------------------------------
    def join(self, frame: Frame) -> Reply:
        if self.role.app is None:
            raise RequestError("no app set up on this executor (send app_setup first)")
        if self.role.store is None:
            self.role.store = StoreClient(self.role.executor.service.table, self.role.executor.client)
        return {"op": "ok", "splits": [b.block_index for b in self.role.blocks]}, ()

    # -- sender ------------------------------------------------------------------------------
    async def send_data(self, frame: Frame) -> Reply:
        splits = _split_list(frame.header, "splits")
        dst = _address(frame.header, "dst_address")
        blocks = [self._active(s) for s in splits]          # validate all before sending any
        client = self.role.executor.client
        sent = 0
        for b in blocks:
            self.role.materialize(b)                     # a spilled split's data comes back first
            # Input data never changes, so it can travel while the epoch trains on it.
            header, arrays = part_buffers(b, "data")
            await client.request(dst, {"op": "eps_stage", "split": b.block_index, "block": header}, arrays)
            sent += sum(a.nbytes for a in arrays)
        self.sent_bytes += sent
        return {"op": "ok", "splits": splits, "bytes": sent}, ()

    async def commit(self, frame: Frame) -> Reply:
        h = frame.header
        items = h.get("transfers")
        if not isinstance(items, list) or not items:
            raise RequestError("field 'transfers' must be a non-empty list")
        plan: list[tuple[int, str, str]] = []
        for t in items:
            if not isinstance(t, dict):
                raise RequestError("each transfer must be an object {split, dst_address, source}")
            split = t.get("split")
            if not isinstance(split, int) or isinstance(split, bool):
                raise RequestError("transfer field 'split' must be an int")
            source = t.get("source")
            if source not in SOURCES:
                raise RequestError(f"transfer field 'source' must be one of {SOURCES}, got {source!r}")
            plan.append((split, _address(t, "dst_address"), source))
        keep = bool(h.get("keep_inactive", False))
        async with self.role.step_lock:               # an epoch boundary on this worker
            blocks = {s: self._active(s) for s, _, _ in plan}
            client = self.role.executor.client

            async def one(split: int, dst: str, source: str) -> int:
                if source == "message":
                    self.role.materialize(blocks[split])
                header, arrays = part_buffers(blocks[split], "all" if source == "message" else "state")
                await client.request(dst, {"op": "eps_activate", "split": split, "block": header,
                                           "source": source}, arrays)
                return sum(a.nbytes for a in arrays)

            results = await asyncio.gather(*(one(*p) for p in plan), return_exceptions=True)
            done: list[int] = []
            failed: dict[str, str] = {}
            sent = 0
            for (split, _, _), r in zip(plan, results):
                if isinstance(r, BaseException):
                    failed[str(split)] = str(r)
                    continue
                done.append(split)
                sent += r
                b = blocks[split]
                self.role.blocks.remove(b)
                if keep:
                    self.role.materialize(b)
                    self.inactive.put(b)
            self.sent_bytes += sent
        return {"op": "ok", "done": done, "failed": failed, "bytes": sent,
                "active": [b.block_index for b in self.role.blocks]}, ()

    # -- receiver ----------------------------------------------------------------------------
    def stage(self, frame: Frame) -> Reply:
        split = frame.header.get("split")
        if not isinstance(split, int) or isinstance(split, bool):
            raise RequestError("field 'split' must be an int")
        block = self._decode(frame, split)
        self.staged[split] = block
        self.received_bytes += sum(a.nbytes for a in frame.arrays)
        return {"op": "ok", "split": split}, ()

    def _decode(self, frame: Frame, split: int) -> DataBlock:
        header = frame.header.get("block")
        if not isinstance(header, dict):
            raise RequestError("field 'block' must be a block header")
        try:
            block = DataBlock.from_buffers(header, frame.arrays)
        except BlockFormatError as e:
            raise RequestError(f"split {split}: {e}") from None
        if block.block_index != split:
            raise RequestError(f"split {split} carries block {block.block_index}")
        return block

    async def activate(self, frame: Frame) -> Reply:
        h = frame.header
        split = h.get("split")
        if not isinstance(split, int) or isinstance(split, bool):
            raise RequestError("field 'split' must be an int")
        source = h.get("source")
        if source not in SOURCES:
            raise RequestError(f"field 'source' must be one of {SOURCES}, got {source!r}")
        if self.role.app is None or self.role.store is None:
            raise RequestError("this executor is not a worker yet (send eps_join first)")
        incoming = self._decode(frame, split)
        if source == "message":
            data = incoming.data
        elif source == "staged":
            if split not in self.staged:
                raise RequestError(f"split {split} was not staged here")
            data = self.staged[split].data
        else:
            try:
                data = self.inactive.get(split).data
            except InactiveStoreError as e:
                raise RequestError(str(e)) from None
        block = DataBlock(incoming.app, split, incoming.row_start, incoming.num_rows, data, incoming.state)
        async with self.role.step_lock:
            if any(b.block_index == split for b in self.role.blocks):
                raise RequestError(f"split {split} is already active here")
            self.role.blocks.append(block)
            # Trained in global split order, as a worker that generated them would.
            self.role.blocks.sort(key=lambda b: b.block_index)
            self.staged.pop(split, None)
            if source == "inactive":
                self.inactive.discard(split)
        self.received_bytes += sum(a.nbytes for a in frame.arrays)
        return {"op": "ok", "split": split, "rows": block.num_rows}, ()

    def discard_staged(self, frame: Frame) -> Reply:
        for s in _split_list(frame.header, "splits"):
            self.staged.pop(s, None)
        return {"op": "ok"}, ()

    def datasets(self, frame: Frame) -> Reply:
        return {"op": "ok", "active": [b.block_index for b in self.role.blocks],
                "inactive": self.inactive.splits(), "staged": sorted(self.staged),
                "inactive_bytes": self.inactive.nbytes(), "sent_bytes": self.sent_bytes,
                "received_bytes": self.received_bytes}, ()

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
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from protocol import executor_ops as ctl
from psruntime.apps.blocks import BlockFormatError, DataBlock
from psruntime.control_ops import Answer, Arrays, OpTable, bind, table
from psruntime.wire.dataplane import RequestError
from psruntime.eps.eps_inactive_store import InactiveSplits, InactiveStoreError
from psruntime.store.store_client import StoreClient
from protocol.json_types import JsonObject

if TYPE_CHECKING:
    from psruntime.app_role import AppRole

log = logging.getLogger(__name__)
INACTIVE_DIR = "eps-inactive"


def _address(value: str, name: str) -> str:
    if ":" not in value:
        raise RequestError(f"field {name!r} must be a host:port address, got {value!r}")
    return value


def part_buffers(block: DataBlock, part: str) -> tuple[JsonObject, list[np.ndarray]]:
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

    def ops(self) -> OpTable:
        return table(bind(ctl.EpsJoin, self.join), bind(ctl.EpsSendData, self.send_data),
                     bind(ctl.EpsStage, self.stage), bind(ctl.EpsCommit, self.commit),
                     bind(ctl.EpsActivate, self.activate), bind(ctl.EpsDiscardStaged, self.discard_staged),
                     bind(ctl.EpsDatasets, self.datasets))

    def _active(self, split: int) -> DataBlock:
        for b in self.role.blocks:
            if b.block_index == split:
                return b
        raise RequestError(f"split {split} is not in the active dataset of {self.role.executor.executor_id}")

    # -- a worker joins ---------------------------------------------------------------------
    def join(self, req: ctl.EpsJoin, arrays: Arrays) -> Answer:
        if self.role.app is None:
            raise RequestError("no app set up on this executor (send app_setup first)")
        if self.role.store is None:
            self.role.store = StoreClient(self.role.executor.service.table, self.role.executor.client)
        return ctl.EpsJoinReply(splits=[b.block_index for b in self.role.blocks]), ()

    # -- sender ------------------------------------------------------------------------------
    async def send_data(self, req: ctl.EpsSendData, arrays: Arrays) -> Answer:
        splits = req.splits
        dst = _address(req.dst_address, "dst_address")
        blocks = [self._active(s) for s in splits]          # validate all before sending any
        client = self.role.executor.client
        sent = 0
        for b in blocks:
            self.role.materialize(b)                     # a spilled split's data comes back first
            # Input data never changes, so it can travel while the epoch trains on it.
            header, data = part_buffers(b, "data")
            await client.request(dst, ctl.to_header(ctl.EpsStage(split=b.block_index, block=header)), data)
            sent += sum(a.nbytes for a in data)
        self.sent_bytes += sent
        return ctl.EpsSendDataReply(splits=splits, bytes=sent), ()

    async def commit(self, req: ctl.EpsCommit, arrays: Arrays) -> Answer:
        if not req.transfers:
            raise RequestError("field 'transfers' must be a non-empty list")
        plan = [(t.split, _address(t.dst_address, "dst_address"), t.source) for t in req.transfers]
        keep = req.keep_inactive
        async with self.role.step_lock:               # an epoch boundary on this worker
            blocks = {s: self._active(s) for s, _, _ in plan}
            client = self.role.executor.client

            async def one(split: int, dst: str, source: ctl.SplitSource) -> int:
                if source == "message":
                    self.role.materialize(blocks[split])
                header, data = part_buffers(blocks[split], "all" if source == "message" else "state")
                await client.request(dst, ctl.to_header(ctl.EpsActivate(split=split, block=header, source=source)),
                                     data)
                return sum(a.nbytes for a in data)

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
            # Every split active at its destination leaves this worker's dataset first: one trained
            # here too would be trained twice an epoch. Keeping an inactive copy comes after, split
            # by split, and one that fails (a full disk) is reported, not raised: raising here left
            # the later splits active on both workers and the AM's ledger without any of them.
            for split in done:
                self.role.blocks.remove(blocks[split])
            self._blocks_changed()
            not_kept: dict[str, str] = {}
            for split in done if keep else ():
                try:
                    self.role.materialize(blocks[split])
                    self.inactive.put(blocks[split])
                except Exception as e:  # noqa: BLE001 - the copy is optional; the move happened
                    log.warning("split %d moved, but its inactive copy could not be kept: %s", split, e)
                    not_kept[str(split)] = str(e)
            self.sent_bytes += sent
        return ctl.EpsCommitReply(done=done, failed=failed, bytes=sent, not_kept=not_kept,
                                  active=[b.block_index for b in self.role.blocks]), ()

    # -- receiver ----------------------------------------------------------------------------
    def stage(self, req: ctl.EpsStage, arrays: Arrays) -> Answer:
        split = req.split
        block = self._decode(req.block, arrays, split)
        self.staged[split] = block
        self.received_bytes += sum(a.nbytes for a in arrays)
        return ctl.EpsStageReply(split=split), ()

    def _decode(self, header: JsonObject, arrays: Arrays, split: int) -> DataBlock:
        try:
            block = DataBlock.from_buffers(header, arrays)
        except BlockFormatError as e:
            raise RequestError(f"split {split}: {e}") from None
        if block.block_index != split:
            raise RequestError(f"split {split} carries block {block.block_index}")
        return block

    async def activate(self, req: ctl.EpsActivate, arrays: Arrays) -> Answer:
        split, source = req.split, req.source
        if self.role.app is None or self.role.store is None:
            raise RequestError("this executor is not a worker yet (send eps_join first)")
        incoming = self._decode(req.block, arrays, split)
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
            self._blocks_changed()
        self.received_bytes += sum(a.nbytes for a in arrays)
        return ctl.EpsActivateReply(split=split, rows=block.num_rows), ()

    def _blocks_changed(self) -> None:
        """With spill on, a fraction alpha of the (new) active dataset goes to disk again."""
        if self.role.spill is not None:
            self.role.spill.reloader.rebalance(self.role.blocks)

    def discard_staged(self, req: ctl.EpsDiscardStaged, arrays: Arrays) -> Answer:
        for s in req.splits:
            self.staged.pop(s, None)
        return ctl.Ok(), ()

    def datasets(self, req: ctl.EpsDatasets, arrays: Arrays) -> Answer:
        return ctl.EpsDatasetsReply(active=[b.block_index for b in self.role.blocks],
                                    inactive=self.inactive.splits(), staged=sorted(self.staged),
                                    inactive_bytes=self.inactive.nbytes(), sent_bytes=self.sent_bytes,
                                    received_bytes=self.received_bytes), ()

"""The executor's checkpoint ops: its model blocks out to the AM and back in (psruntime.store.checkpoint's
format), registered on the executor's control channel like psruntime.app_role's ops.

    checkpoint_blocks {blocks?, max_bytes?} / {cut, max_bytes?}
        a consistent cut of owned blocks, taken in one synchronous step and sent back over the
        data plane in batches of at most max_bytes (the AM writes the files)
    restore_blocks_data {blocks} + arrays   install blocks (assigned to this executor) sent by the AM
    checkpoint {dir, blocks?}               write owned blocks into a local dir (a buffer file per block + manifest)
    restore {dir, blocks}                   load blocks (which the table gives this executor) from a local dir
"""
from __future__ import annotations

from protocol import executor_ops as ctl
from psruntime.store.checkpoint import (CheckpointCut, CheckpointError, install_blocks, pack_blocks, restore_blocks,
                                  save_blocks, unpack_blocks)
from psruntime.control_ops import Answer, Arrays, OpTable, bind, table
from psruntime.wire.dataplane import RequestError
from psruntime.wire.frame_codec import DEFAULT_MAX_BODY_BYTES
from psruntime.store.store_service import StoreService

CHECKPOINT_BATCH_BYTES = 64 << 20    # default size of one checkpoint_blocks reply's buffers


class CheckpointOps:
    """Checkpoint and restore of one executor's store blocks; keeps the cut being sent, if any."""

    def __init__(self, executor_id: str, service: StoreService) -> None:
        self.executor_id = executor_id
        self.service = service
        self._cut: CheckpointCut | None = None
        self._cut_ids = 0

    def ops(self) -> OpTable:
        return table(bind(ctl.CheckpointBlocks, self.checkpoint_blocks),
                     bind(ctl.RestoreBlocksData, self.restore_blocks_data),
                     bind(ctl.Checkpoint, self.checkpoint), bind(ctl.Restore, self.restore))

    def _check_owned(self, blocks: list[int], refusal: str) -> None:
        not_owned = sorted(set(blocks) - set(self.service.owned_blocks()))
        if not_owned:
            raise RequestError(f"blocks {not_owned} {refusal}")

    def checkpoint_blocks(self, req: ctl.CheckpointBlocks, arrays: Arrays) -> Answer:
        max_bytes = req.max_bytes if req.max_bytes is not None else CHECKPOINT_BATCH_BYTES
        if req.release:
            # The AM gave this cut up: its views pinned a copy of every block it had not sent
            # (copy-on-write on the next update), up to a model's worth, until the next checkpoint.
            if req.cut is None:
                raise RequestError("release names no cut")
            if self._cut is not None and self._cut.cut_id == req.cut:
                self._cut = None
            return ctl.CheckpointBlocksReply(cut=req.cut, blocks=[], remaining=[],
                                             table_version=self.service.table.version,
                                             num_blocks=self.service.store.num_blocks), ()
        if req.cut is not None:          # the next batch of a cut this executor is sending
            cut = self._cut
            if cut is None or req.cut != cut.cut_id:
                raise RequestError(f"no checkpoint cut {req.cut!r} in progress on {self.executor_id} "
                                   f"(it was sent completely or a newer one replaced it)")
        else:
            blocks = req.blocks if req.blocks is not None else self.service.owned_blocks()
            self._check_owned(blocks, f"are not owned by {self.executor_id}")
            # Synchronous on purpose: all blocks are taken in one step, so the cut is consistent;
            # the store's copy-on-write keeps the views intact while later batches are sent.
            self._cut_ids += 1
            cut = self._cut = CheckpointCut.take(self.service.store, sorted(set(blocks)), self._cut_ids,
                                                 self.service.table.version)
        try:
            batch = cut.next_batch(max_bytes, DEFAULT_MAX_BODY_BYTES)
        except CheckpointError as e:
            self._cut = None
            raise RequestError(str(e)) from None
        if not cut.pending:
            self._cut = None     # sent completely: let go of the snapshot's views
        descs, out = pack_blocks(batch)
        return ctl.CheckpointBlocksReply(cut=cut.cut_id, blocks=descs, remaining=cut.remaining,
                                         table_version=cut.table_version,
                                         num_blocks=self.service.store.num_blocks), out

    def restore_blocks_data(self, req: ctl.RestoreBlocksData, arrays: Arrays) -> Answer:
        try:
            items = unpack_blocks(req.blocks, arrays, self.service.store.num_blocks)
        except CheckpointError as e:
            raise RequestError(str(e)) from None
        blocks = [b for b, _ in items]
        self._check_owned(blocks, f"are not assigned to {self.executor_id}; set ownership first")
        install_blocks(self.service.store, items)     # all or nothing
        self.service.applied_pushes.forget(blocks)    # their epochs after the checkpoint are trained again
        return ctl.BlocksReply(blocks=blocks), ()

    def checkpoint(self, req: ctl.Checkpoint, arrays: Arrays) -> Answer:
        directory = req.dir
        blocks = req.blocks if req.blocks is not None else self.service.owned_blocks()
        self._check_owned(blocks, f"are not owned by {self.executor_id}")
        # Synchronous on purpose: no update interleaves, so the checkpoint is a consistent cut.
        path = save_blocks(self.service.store, blocks, directory, self.executor_id, self.service.table.version)
        return ctl.CheckpointReply(manifest=str(path), blocks=blocks), ()

    def restore(self, req: ctl.Restore, arrays: Arrays) -> Answer:
        directory, blocks = req.dir, req.blocks
        self._check_owned(blocks, f"are not assigned to {self.executor_id}; set ownership first")
        restore_blocks(self.service.store, blocks, directory)
        self.service.applied_pushes.forget(blocks)
        return ctl.BlocksReply(blocks=blocks), ()

"""Elasticity Controller side of block migration (dissertation §3.3.2), used by the AM.

`MigrationController` holds the authoritative ownership table. `move(blocks, src, dst)` asks the
source executor to migrate the blocks (it hands over ownership to the destination, which queues
requests, then sends the data and waits for the destination's ack), then bumps the table version
and broadcasts the new table to every executor. Moves of disjoint blocks run concurrently; a block
already being moved is refused.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Iterable

from protocol.executor_ops import MoveBlocks, MoveBlocksReply, SetOwnership, decode_reply, to_header
from psruntime.wire.dataplane import DataPlaneClient
from psruntime.wire.frame_codec import Frame
from psruntime.store.ownership_table import OwnershipError, OwnershipTable
from protocol.errors import StateError

log = logging.getLogger(__name__)

CANCELLED_MOVE_WAIT_S = 60.0    # how long a cancelled move still waits for the source's answer


class MigrationControllerError(StateError, RuntimeError):
    """A move that cannot start (bad blocks, wrong source, block already moving) or that failed."""


class MigrationController:
    """Drives moves over the data plane and keeps every executor's ownership table current."""

    def __init__(self, table: OwnershipTable, client: DataPlaneClient | None = None) -> None:
        self.table = table.copy()
        self._client = client or DataPlaneClient()
        self._own_client = client is None
        self._moving: set[int] = set()

    async def close(self) -> None:
        if self._own_client:
            await self._client.close()

    def add_executor(self, executor_id: str, address: str) -> None:
        """Make a new executor known (its address travels with the next broadcast)."""
        self.table.addresses[executor_id] = address

    def remove_executor(self, executor_id: str) -> None:
        owned = self.table.blocks_owned_by(executor_id)
        if owned:
            raise MigrationControllerError(f"executor {executor_id} still owns blocks {owned}; move them first")
        self.table.addresses.pop(executor_id, None)

    async def broadcast(self, executors: Iterable[str] | None = None) -> None:
        """Send the current table to `executors` (default: every executor with an address)."""
        targets = list(executors) if executors is not None else list(self.table.addresses)
        header = to_header(SetOwnership(table=self.table.to_wire()))
        results = await asyncio.gather(
            *(self._client.request(self.table.address_of(e), header) for e in targets), return_exceptions=True)
        failed = [f"{e}: {r}" for e, r in zip(targets, results) if isinstance(r, BaseException)]
        if failed:
            # A missed broadcast only costs redirects: executors and clients still converge.
            log.warning("ownership broadcast v%d missed %s", self.table.version, "; ".join(failed))

    async def _record_late(self, request: "asyncio.Future[Frame]", blocks: list[int], dst: str) -> None:
        """The answer of a move whose caller was cancelled, recorded if it comes within
        CANCELLED_MOVE_WAIT_S (asyncio.wait: no timeout scope inside a cancelled task)."""
        done, _ = await asyncio.wait({request}, timeout=CANCELLED_MOVE_WAIT_S)
        if not done or request.cancelled() or request.exception() is not None:
            if not done:
                request.cancel()
                log.warning("move of blocks %s -> %s: no answer %gs after it was cancelled; the table may "
                            "not say where they are", blocks, dst, CANCELLED_MOVE_WAIT_S)
            return
        try:
            reply = decode_reply(request.result().header, MoveBlocksReply)
        except Exception as e:  # noqa: BLE001 - logged: the caller's cancellation is what propagates
            log.warning("move of blocks %s -> %s: its answer after the cancel is unreadable: %s", blocks, dst, e)
            return
        if self._record(reply, blocks, dst):
            await asyncio.wait({asyncio.ensure_future(self.broadcast())}, timeout=CANCELLED_MOVE_WAIT_S)

    def _record(self, reply: MoveBlocksReply, blocks: list[int], dst: str) -> list[int]:
        """Give `dst` the blocks it acknowledged, even when others did not go (a table that kept
        them at the source would send their requests and checkpoints there); those blocks."""
        moved = sorted(set(reply.moved) & set(blocks))
        if moved:
            self.table.assign(moved, dst)
        return moved

    async def move(self, blocks: Iterable[int], src: str, dst: str) -> int:
        """Move `blocks` from `src` to `dst`; returns the table version that records the move."""
        blocks = sorted(set(blocks))
        if not blocks:
            raise MigrationControllerError("no blocks to move")
        try:
            wrong = [b for b in blocks if self.table.owner_of_block(b) != src]
            dst_address = self.table.address_of(dst)
            src_address = self.table.address_of(src)
        except OwnershipError as e:
            raise MigrationControllerError(str(e)) from None
        if wrong:
            raise MigrationControllerError(f"blocks {wrong} are not owned by {src}")
        if src == dst:
            raise MigrationControllerError(f"source and destination are both {src}")
        busy = sorted(self._moving.intersection(blocks))
        if busy:
            raise MigrationControllerError(f"blocks {busy} are already being moved")
        self._moving.update(blocks)
        try:
            request = asyncio.ensure_future(self._client.request(
                src_address, to_header(MoveBlocks(blocks=blocks, dst=dst, dst_address=dst_address))))
            try:
                frame = await asyncio.shield(request)
                reply = decode_reply(frame.header, MoveBlocksReply)
            except asyncio.CancelledError:
                # The caller gave up, but the source carries the move on whatever happens here:
                # wait (bounded) for its answer and record it, so the table says where the blocks
                # are before whoever cancelled acts on it (a rollback reading the old table
                # retired the destination with the blocks that had gone to it).
                await self._record_late(request, blocks, dst)
                raise
            except Exception as e:
                raise MigrationControllerError(f"move of blocks {blocks} {src} -> {dst} failed: {e}") from e
            moved = self._record(reply, blocks, dst)
            version = self.table.version
        finally:
            self._moving.difference_update(blocks)
        if moved:
            await self.broadcast()
        if reply.failed or len(moved) < len(blocks):
            raise MigrationControllerError(f"move of blocks {blocks} {src} -> {dst} failed for "
                                           f"{'; '.join(reply.failed) or 'blocks not acknowledged'} (moved: {moved})")
        return version

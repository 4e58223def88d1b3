"""The server side of the elastic store on one executor: data ops and the migration protocol.

Data ops (batched, many keys per frame): "get" (pull), "put", "update" (push with func "add"), in
the array or the list wire form (psruntime.store.store_requests). Each block's part of a request is
served, queued (block INCOMING) or redirected (block MOVED / not ours) as the pure state machine in
psruntime.store.migration says; the reply's `redirect` lists [block, owner, address] for the parts not
applied here, which the client re-sends to the new owner. A redirected part is never applied here,
so a retry applies it exactly once. An update that carries a push id (psruntime.store.push_ids: a
worker's mini-batch) is applied once per block: a block's part whose id it was applied with
before (a redone clock) is acknowledged and not applied.

Migration ops, typed records of protocol.executor_ops (decoded by the executor, psruntime.executor):
MoveBlocks (controller -> source), TakeOwnership, BlockData and CancelIncoming (source ->
destination). A block travels as its dense key and value arrays (block_data_message), so moving a
block costs a few buffers, not one per key.

The data ops keep their compact headers (psruntime.store.store_requests): they are the hot path, carry
their keys as buffers and are decoded once there into a typed DataRequest.
"""
from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from typing import Callable, Sequence

import numpy as np

from protocol.executor_ops import BlockData, CancelIncoming, CancelIncomingReply, TakeOwnership, decode_reply, to_header
from protocol.json_types import JsonObject
from psruntime.store.block_store import BlockArrays, BlockStore
from psruntime.wire.buffer_pool import BufferPool
from psruntime.wire.dataplane import DataPlaneClient, Reply, RequestError
from psruntime.wire.frame_codec import Frame
from psruntime.store.migration import BlockState, BlockStates, Disposition, MigrationEvent
from psruntime.store.ownership_table import Key, OwnershipTable
from psruntime.store.push_ids import PUSH_ID_FIELD, AppliedPushes
from psruntime.store.store_requests import BlockPart, DataRequest, Groupings, parse_request

log = logging.getLogger(__name__)
DATA_OPS = frozenset({"get", "put", "update"})
CANCEL_INCOMING_TIMEOUT_S = 5.0     # a source asking a destination to stop queueing for a block
CANCEL_INCOMING_BACKOFF_S = (0.2, 1.0)   # the pauses before asking again when no answer came
_STAT = {Disposition.SERVE: "served", Disposition.QUEUE: "queued", Disposition.REDIRECT: "redirected"}


class StoreService:
    """Serves the blocks this executor owns and takes part in block migrations."""

    def __init__(self, executor_id: str, table: OwnershipTable, client: DataPlaneClient,
                 clock: Callable[[], float] | None = None) -> None:
        self.executor_id = executor_id
        self.table = table
        self.store = BlockStore(table.num_blocks)
        self.states = BlockStates(table.num_blocks, clock) if clock else BlockStates(table.num_blocks)
        self._client = client
        # Parts on INCOMING blocks, with their push ids (judged when served: the block's ids come with it).
        self._queues: dict[int, list[tuple[DataRequest, BlockPart, int | None]]] = defaultdict(list)
        # Per block received here: from which source, at which of its transitions (a resend of that
        # delivery, its answer lost with the connection, is recognised while the block stays so).
        self._received: dict[int, tuple[str, int]] = {}
        self.address = ""  # set by the executor once its server listens
        self.handover_timeout_s = 30.0
        self.stats = {"served": 0, "queued": 0, "redirected": 0}  # request parts, for status and tests
        self.applied_pushes = AppliedPushes()
        self._reply_buffers = BufferPool()   # array-form get replies, reused once sent
        self._groupings = Groupings()        # the last request's keys by block, for the next equal one
        self._moves: set[asyncio.Future[list[None | BaseException]]] = set()   # move_blocks under way
        self.apply_table(table, force=True)

    # -- ownership ---------------------------------------------------------------------------
    def apply_table(self, table: OwnershipTable, force: bool = False) -> bool:
        """Adopt a newer table; blocks it gives us that we never had become OWNED (empty)."""
        if table.num_blocks != self.table.num_blocks:
            raise RequestError(f"table has {table.num_blocks} blocks, this job has {self.table.num_blocks}")
        if not force and not self.table.replace_if_newer(table):
            return False
        if force:
            self.table = table.copy()
        for b, owner in enumerate(self.table.owners):
            # Only initial placement: blocks mid-migration or moved are driven by the protocol alone,
            # so a late broadcast can never resurrect a block we handed over.
            if owner == self.executor_id and self.states.state(b) is BlockState.ABSENT:
                self.states.apply(b, MigrationEvent.ASSIGN)
                self.store.create_block(b)
        return True

    def owned_blocks(self) -> list[int]:
        return [b for b in range(self.table.num_blocks)
                if self.states.state(b) in (BlockState.OWNED, BlockState.HANDING_OVER)]

    def _redirect_target(self, block: int) -> tuple[str, str]:
        peer = self.states.peer(block) if self.states.state(block) is BlockState.MOVED else None
        owner = peer or self.table.owners[block]
        if not owner:
            raise RequestError(f"block {block} has no owner yet (no ownership table from the AM)")
        if owner == self.executor_id:
            raise RequestError(f"block {block} is not held here and the table names this executor")
        return owner, self.table.addresses.get(owner, "")

    # -- data ops ----------------------------------------------------------------------------
    def handle_data(self, frame: Frame) -> Reply | asyncio.Future[Reply]:
        """Serve, queue or redirect each block's part of a data request (psruntime.store.store_requests)."""
        req = parse_request(frame.header, frame.arrays, self._reply_buffers, self._groupings)
        pid = frame.header.get(PUSH_ID_FIELD) if req.op == "update" else None
        if pid is not None and (not isinstance(pid, int) or isinstance(pid, bool) or pid < 0):
            raise RequestError(f"field {PUSH_ID_FIELD!r} must be a non-negative int")
        plan = []
        store, serve = self.store, Disposition.SERVE
        # Validate everything that is served now before applying anything: a bad request changes nothing.
        for b, part in req.parts(self.table.num_blocks):
            disp = self.states.disposition(b)
            if disp is serve:
                req.check(store, b, part)
            elif disp is Disposition.REDIRECT:
                self._redirect_target(b)
            plan.append((b, part, disp))
        served = 0
        for b, part, disp in plan:
            if disp is serve:
                if pid is not None and not self.applied_pushes.first_time(pid, b):
                    continue    # applied before (a redone clock's push): acknowledged, not applied again
                served += 1
                req.apply(store, b, part)
            else:
                self.stats[_STAT[disp]] += 1
                if disp is Disposition.REDIRECT:
                    req.redirect(b, part, self._redirect_target(b))
                else:
                    req.part_queued()
                    self._queues[b].append((req, part, pid))
        self.stats["served"] += served
        if req.done is None:
            return self._reply(req, frame.header)
        return asyncio.ensure_future(self._reply_later(req, frame.header))

    async def _reply_later(self, req: DataRequest, h: JsonObject) -> Reply:
        assert req.done is not None
        await req.done
        return self._reply(req, h)

    def _reply(self, req: DataRequest, h: JsonObject) -> Reply:
        header, arrays = req.reply()
        if req.redirects:
            header["redirect"] = [[b, o, a] for b, (o, a) in req.redirects.items()]
            v = h.get("v")
            if isinstance(v, int) and v < self.table.version:
                header["table"] = self.table.to_wire()
        return header, arrays

    def _drain(self, block: int) -> None:
        """Serve (or redirect, if the move was cancelled) a block's queue in arrival order."""
        for req, part, pid in self._queues.pop(block, []):
            try:
                if self.states.disposition(block) is Disposition.SERVE:
                    # Checked before its id is recorded: a part refused here applied nothing, so
                    # the same push sent again must not be taken for a repeat.
                    req.check(self.store, block, part)
                    if pid is None or self.applied_pushes.first_time(pid, block):
                        req.apply(self.store, block, part)
                else:
                    req.redirect(block, part, self._redirect_target(block))
            except Exception as e:  # noqa: BLE001 - a bad queued part fails its own request only
                req.part_finished(e)
                continue
            req.part_finished()

    # -- migration: destination side ---------------------------------------------------------
    def take_ownership(self, blocks: list[int], src: str) -> None:
        bad = [b for b in blocks if not self.states.can(b, MigrationEvent.TAKE_OWNERSHIP)]
        if bad:
            raise RequestError(f"cannot take ownership of blocks {bad}: states "
                               f"{[self.states.state(b).value for b in bad]}")
        for b in blocks:
            self.states.apply(b, MigrationEvent.TAKE_OWNERSHIP, peer=src)

    def receive_block(self, block: int, keys: Sequence[Key], arrays: Sequence[np.ndarray],
                      applied: Sequence[int] = (), src: str = "") -> None:
        """Install a block's data (a "block_data" frame's `keys` and buffers, `applied` the push
        ids it was applied with at its source) and drain its queue.

        Two forms: one buffer per key (len(arrays) == len(keys)), or what `block_data_message`
        sends: the keys and buffers of the block's non-dense keys, then its dense int64 keys and
        their values as two more buffers (len(arrays) == len(keys) + 2).
        """
        state = self.states.state(block)
        if src and state is BlockState.OWNED and self._received.get(block) == (src, self.states.transitions(block)):
            # The source sends again what it sent last when the connection broke before the ack:
            # installed already (and maybe updated since), so answered as done, not applied twice.
            return
        if state is not BlockState.INCOMING:
            raise RequestError(f"block {block} is {state.value}, not incoming")
        # Before its queue drains: a queued part whose id the block was applied with at its source
        # is acknowledged, not applied again.
        self.applied_pushes.import_ids(block, applied)
        if len(arrays) == len(keys) + 2:
            n = len(keys)
            self.store.import_arrays(block, BlockArrays(arrays[n], arrays[n + 1], list(keys), list(arrays[:n])))
        else:
            self.store.import_block(block, keys, arrays)
        self.states.apply(block, MigrationEvent.DATA_RECEIVED)
        if src:
            self._received[block] = (src, self.states.transitions(block))
        self._drain(block)

    def cancel_incoming(self, blocks: list[int], src: str = "") -> tuple[list[int], list[int]]:
        """Stop queueing for `blocks` (their queues go back by redirect); (those no longer incoming
        here, those whose data from `src` landed after all: the move happened)."""
        cancelled, owned = [], []
        for b in blocks:
            state = self.states.state(b)
            if state is BlockState.INCOMING:
                self.states.apply(b, MigrationEvent.CANCEL)
                self._drain(b)
                cancelled.append(b)
            elif state is BlockState.OWNED and src and self._received.get(b, ("", -1))[0] == src:
                owned.append(b)
            elif state is not BlockState.OWNED:
                cancelled.append(b)
        return cancelled, owned

    # -- migration: source side --------------------------------------------------------------
    async def move_blocks(self, blocks: list[int], dst: str, dst_address: str) -> tuple[list[int], list[str]]:
        """Move `blocks` to `dst`, each concurrently; the blocks acked by the destination (they are
        its now, whatever became of the others) and, per block that did not move, why.

        Once begun, the moves run to their end even if this call is cancelled -- as the data plane
        cancels a request's handler when its connection (the AM's) drops: a move cut short would
        leave the block HANDING_OVER here (no later move can take it) or MOVED with its data
        undelivered while the destination queues the requests redirected to it, for ever. Each
        move settles the block's state itself (delivered, reverted, or MOVED with the data kept),
        so a caller that is gone loses only the answer; the clients' redirects and the AM's next
        table follow the outcome."""
        if dst == self.executor_id:
            raise RequestError("cannot move blocks to the executor that owns them")
        bad = [b for b in blocks if not self.states.can(b, MigrationEvent.BEGIN_HANDOVER)]
        if bad:
            raise RequestError(f"blocks {bad} are not owned here (states "
                               f"{[self.states.state(b).value for b in bad]})")
        self.table.addresses[dst] = dst_address
        for b in blocks:
            self.states.apply(b, MigrationEvent.BEGIN_HANDOVER, peer=dst)
        moves = asyncio.gather(*(self._move_one(b, dst, dst_address) for b in blocks), return_exceptions=True)
        self._moves.add(moves)      # held while it runs, whether or not its caller waits for it
        moves.add_done_callback(self._moves.discard)
        results = await asyncio.shield(moves)
        done, errors = [], []
        for b, r in zip(blocks, results):
            if isinstance(r, BaseException):
                errors.append(f"block {b}: {r}")
            else:
                done.append(b)
        return done, errors

    async def _move_one(self, block: int, dst: str, dst_address: str) -> None:
        try:
            async with asyncio.timeout(self.handover_timeout_s):
                await self._client.request(dst_address, to_header(TakeOwnership(blocks=[block],
                                                                                src=self.executor_id)))
        except Exception:
            self.states.apply(block, MigrationEvent.ABORT)  # nothing was redirected yet: safe to keep
            # Best effort: if the destination did start queueing, it stops (its queue is empty, as
            # nobody was redirected to it) and can take the block in a later move.
            try:
                await self._cancel_incoming_at(dst_address, block)
            except Exception:  # noqa: BLE001
                log.warning("could not cancel the incoming block %d at %s", block, dst)
            raise
        # Same event-loop step: snapshot and start redirecting, so each op is in exactly one of them.
        self.states.apply(block, MigrationEvent.HANDOVER_ACKED)
        header, arrays = block_data_message(block, self.executor_id, self.store.export_arrays(block),
                                            self.applied_pushes.export(block))
        last: Exception | None = None
        for _attempt in range(3):
            try:
                await self._client.request(dst_address, header, arrays)
                self.store.drop_block(block)
                return
            except ConnectionError as e:  # resend: a copy that landed is acknowledged, not installed twice
                last = e
            except Exception as e:   # noqa: BLE001 - refused (its import failed, say): not worth a resend
                last = e
                break
        # Not delivered: ask the destination to stop queueing and say whether a copy landed after all.
        try:
            reply = await self._cancel_incoming_at(dst_address, block)
        except Exception as e:  # noqa: BLE001 - unknown at the destination: stay MOVED (below)
            log.warning("block %d: data not delivered to %s and its state there is unknown: %s", block, dst, e)
            reply = CancelIncomingReply()
        if block in reply.owned:     # it landed: the move happened
            self.store.drop_block(block)
            return
        if block in reply.cancelled:
            # Nothing of it was applied there and the queued requests come back by redirect: the
            # block, still held here, is served here again (the AM's table keeps it here too).
            self.states.apply(block, MigrationEvent.REVERT)
            raise RuntimeError(f"block {block} data not delivered to {dst} ({last}); the move was undone, "
                               f"the block stays on {self.executor_id}")
        # The snapshot stays here (block MOVED, data kept) so an operator can recover it.
        raise RuntimeError(f"block {block} data not delivered to {dst}: {last}")

    async def _cancel_incoming_at(self, dst_address: str, block: int) -> CancelIncomingReply:
        """Ask the destination to stop queueing for `block`: what it says of it. Asked again after
        each pause of CANCEL_INCOMING_BACKOFF_S when no answer comes (the last try's failure is
        raised): the request is idempotent -- a block cancelled by an earlier one whose answer was
        lost is reported cancelled again -- and without an answer a source whose delivery failed
        stays MOVED, redirecting the block's requests to a destination that, having cancelled,
        redirects them back: a ping-pong until every client gives up."""
        for pause in CANCEL_INCOMING_BACKOFF_S:
            try:
                return await self._ask_cancel_incoming(dst_address, block)
            except Exception:  # noqa: BLE001 - no answer (or a failed one): asked again
                await asyncio.sleep(pause)
        return await self._ask_cancel_incoming(dst_address, block)

    async def _ask_cancel_incoming(self, dst_address: str, block: int) -> CancelIncomingReply:
        async with asyncio.timeout(CANCEL_INCOMING_TIMEOUT_S):
            frame = await self._client.request(
                dst_address, to_header(CancelIncoming(blocks=[block], src=self.executor_id)))
        return decode_reply(frame.header, CancelIncomingReply)


def block_data_message(block: int, src: str, data: BlockArrays,
                       applied: Sequence[int] = ()) -> tuple[JsonObject, list[np.ndarray]]:
    """The "block_data" frame of a block: JSON keys only for its non-dense keys, the dense rows as two
    buffers (keys, values) after their buffers, and the push ids the block was applied with (only
    when there are some); see StoreService.receive_block."""
    values = data.values if data.values is not None else np.zeros(0, np.float32)
    request = BlockData(block=block, keys=list(data.other_keys), src=src, applied=list(applied))
    return to_header(request), [*data.other_arrays, data.keys, values]

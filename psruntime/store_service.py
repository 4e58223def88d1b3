"""The server side of the elastic store on one executor: data ops and the migration protocol.

Data ops (batched, many keys per frame): "get" (pull), "put", "update" (push with func "add").
Each key's block is served, queued (block INCOMING) or redirected (block MOVED / not ours) as the
pure state machine in psruntime.migration says. A reply lists the keys applied/returned, the keys
that were missing (get), and `redirect`: [[block, owner, address], ...] for keys not applied here,
which the client re-sends to the new owner. A redirected key is never applied here, so a retry
applies it exactly once.

Migration ops: "move_blocks" (controller -> source), "take_ownership", "block_data" and
"cancel_incoming" (source -> destination).
"""
from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from psruntime.block_store import BlockStore
from psruntime.dataplane import DataPlaneClient, Reply, RequestError
from psruntime.frame_codec import Frame
from psruntime.migration import BlockState, BlockStates, Disposition, MigrationEvent
from psruntime.ownership_table import Key, OwnershipTable, block_of

log = logging.getLogger(__name__)
DATA_OPS = frozenset({"get", "put", "update"})
_STAT = {Disposition.SERVE: "served", Disposition.QUEUE: "queued", Disposition.REDIRECT: "redirected"}


@dataclass
class _Result:
    keys: list[Key] = field(default_factory=list)
    arrays: list[np.ndarray] = field(default_factory=list)
    missing: list[Key] = field(default_factory=list)
    redirect: dict[int, tuple[str, str]] = field(default_factory=dict)
    redirect_keys: list[Key] = field(default_factory=list)

    def merge(self, other: "_Result") -> None:
        self.keys += other.keys
        self.arrays += other.arrays
        self.missing += other.missing
        self.redirect.update(other.redirect)
        self.redirect_keys += other.redirect_keys


@dataclass
class _Queued:
    """A part of a request parked on an INCOMING block until its data lands."""

    op: str
    func: str | None
    keys: list[Key]
    arrays: list[np.ndarray]
    fut: asyncio.Future[_Result]


def _parse_keys(header: dict[str, Any], n_arrays: int, with_values: bool) -> list[Key]:
    keys = header.get("keys")
    if not isinstance(keys, list) or not keys:
        raise RequestError("field 'keys' must be a non-empty list of int or str keys")
    for k in keys:
        if isinstance(k, bool) or not isinstance(k, (int, str)):
            raise RequestError(f"field 'keys' has {k!r}: keys must be ints or strs")
    if with_values and n_arrays != len(keys):
        raise RequestError(f"{len(keys)} keys but {n_arrays} value buffers")
    if not with_values and n_arrays:
        raise RequestError("a get carries no value buffers")
    return keys


class StoreService:
    """Serves the blocks this executor owns and takes part in block migrations."""

    def __init__(self, executor_id: str, table: OwnershipTable, client: DataPlaneClient,
                 clock: Callable[[], float] | None = None) -> None:
        self.executor_id = executor_id
        self.table = table
        self.store = BlockStore(table.num_blocks)
        self.states = BlockStates(table.num_blocks, clock) if clock else BlockStates(table.num_blocks)
        self._client = client
        self._queues: dict[int, list[_Queued]] = defaultdict(list)
        self.address = ""  # set by the executor once its server listens
        self.handover_timeout_s = 30.0
        self.stats = {"served": 0, "queued": 0, "redirected": 0}  # request parts, for status and tests
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
        h = frame.header
        op = h["op"]
        func = h.get("func") if op == "update" else None
        if op == "update" and not isinstance(func, str):
            raise RequestError("an update needs field 'func' (e.g. \"add\")")
        keys = _parse_keys(h, len(frame.arrays), with_values=op != "get")
        arrays = frame.arrays
        by_block: dict[int, list[int]] = defaultdict(list)
        for i, k in enumerate(keys):
            by_block[block_of(k, self.table.num_blocks)].append(i)
        # Validate everything that is served now before applying anything: a bad request changes nothing.
        plan = []
        for b, idx in by_block.items():
            disp = self.states.disposition(b)
            if disp is Disposition.SERVE and op == "update":
                for i in idx:
                    self.store.check_update(keys[i], func, arrays[i], b)  # type: ignore[arg-type]
            elif disp is Disposition.REDIRECT:
                self._redirect_target(b)
            plan.append((b, idx, disp))
        result = _Result()
        waits: list[asyncio.Future[_Result]] = []
        for b, idx, disp in plan:
            bkeys = [keys[i] for i in idx]
            barrs = [arrays[i] for i in idx] if op != "get" else []
            self.stats[_STAT[disp]] += 1
            if disp is Disposition.SERVE:
                self._apply(op, func, b, bkeys, barrs, result)
            elif disp is Disposition.REDIRECT:
                result.redirect[b] = self._redirect_target(b)
                result.redirect_keys += bkeys
            else:
                fut: asyncio.Future[_Result] = asyncio.get_running_loop().create_future()
                self._queues[b].append(_Queued(op, func, bkeys, barrs, fut))
                waits.append(fut)
        if not waits:
            return self._reply(result, h)
        return asyncio.ensure_future(self._reply_later(result, waits, h))

    async def _reply_later(self, result: _Result, waits: list[asyncio.Future[_Result]], h: dict[str, Any]) -> Reply:
        for part in await asyncio.gather(*waits):
            result.merge(part)
        return self._reply(result, h)

    def _reply(self, r: _Result, h: dict[str, Any]) -> Reply:
        header: dict[str, Any] = {"op": "ok", "keys": r.keys}
        if r.missing:
            header["missing"] = r.missing
        if r.redirect:
            header["redirect"] = [[b, o, a] for b, (o, a) in r.redirect.items()]
            header["redirect_keys"] = r.redirect_keys
            v = h.get("v")
            if isinstance(v, int) and v < self.table.version:
                header["table"] = self.table.to_wire()
        return header, r.arrays

    def _apply(self, op: str, func: str | None, block: int, keys: list[Key], arrays: Sequence[np.ndarray],
               result: _Result) -> None:
        if op == "get":
            for k in keys:
                v = self.store.get(k, block)
                if v is None:
                    result.missing.append(k)
                else:
                    result.keys.append(k)
                    result.arrays.append(v)
        elif op == "put":
            for k, a in zip(keys, arrays):
                self.store.put(k, a, block)
            result.keys += keys
        else:
            for k, a in zip(keys, arrays):
                self.store.update(k, func, a, block)  # type: ignore[arg-type]
            result.keys += keys

    def _drain(self, block: int) -> None:
        """Serve (or redirect, if the move was cancelled) a block's queue in arrival order."""
        for q in self._queues.pop(block, []):
            part = _Result()
            try:
                if self.states.disposition(block) is Disposition.SERVE:
                    if q.op == "update":
                        for k, a in zip(q.keys, q.arrays):
                            self.store.check_update(k, q.func, a, block)  # type: ignore[arg-type]
                    self._apply(q.op, q.func, block, q.keys, q.arrays, part)
                else:
                    part.redirect[block] = self._redirect_target(block)
                    part.redirect_keys += q.keys
            except Exception as e:  # noqa: BLE001 - a bad queued part fails its own request only
                if not q.fut.done():
                    q.fut.set_exception(e)
                continue
            if not q.fut.done():
                q.fut.set_result(part)

    # -- migration: destination side ---------------------------------------------------------
    def take_ownership(self, blocks: list[int], src: str) -> None:
        bad = [b for b in blocks if not self.states.can(b, MigrationEvent.TAKE_OWNERSHIP)]
        if bad:
            raise RequestError(f"cannot take ownership of blocks {bad}: states "
                               f"{[self.states.state(b).value for b in bad]}")
        for b in blocks:
            self.states.apply(b, MigrationEvent.TAKE_OWNERSHIP, peer=src)

    def receive_block(self, block: int, keys: list[Any], arrays: Sequence[np.ndarray]) -> None:
        if self.states.state(block) is not BlockState.INCOMING:
            raise RequestError(f"block {block} is {self.states.state(block).value}, not incoming")
        self.store.import_block(block, keys, arrays)
        self.states.apply(block, MigrationEvent.DATA_RECEIVED)
        self._drain(block)

    def cancel_incoming(self, blocks: list[int]) -> None:
        for b in blocks:
            if self.states.state(b) is BlockState.INCOMING:
                self.states.apply(b, MigrationEvent.CANCEL)
                self._drain(b)

    # -- migration: source side --------------------------------------------------------------
    async def move_blocks(self, blocks: list[int], dst: str, dst_address: str) -> list[int]:
        """Move `blocks` to `dst`, each concurrently; returns the blocks acked by the destination."""
        if dst == self.executor_id:
            raise RequestError("cannot move blocks to the executor that owns them")
        bad = [b for b in blocks if not self.states.can(b, MigrationEvent.BEGIN_HANDOVER)]
        if bad:
            raise RequestError(f"blocks {bad} are not owned here (states "
                               f"{[self.states.state(b).value for b in bad]})")
        self.table.addresses[dst] = dst_address
        for b in blocks:
            self.states.apply(b, MigrationEvent.BEGIN_HANDOVER, peer=dst)
        results = await asyncio.gather(*(self._move_one(b, dst, dst_address) for b in blocks),
                                       return_exceptions=True)
        done, errors = [], []
        for b, r in zip(blocks, results):
            if isinstance(r, BaseException):
                errors.append(f"block {b}: {r}")
            else:
                done.append(b)
        if errors:
            raise RuntimeError("move failed for " + "; ".join(errors) + f" (moved: {done})")
        return done

    async def _move_one(self, block: int, dst: str, dst_address: str) -> None:
        try:
            await asyncio.wait_for(self._client.request(dst_address, {"op": "take_ownership", "blocks": [block],
                                                                      "src": self.executor_id}),
                                   self.handover_timeout_s)
        except Exception:
            self.states.apply(block, MigrationEvent.ABORT)  # nothing was redirected yet: safe to keep
            # Best effort: if the destination did start queueing, it stops (its queue is empty, as
            # nobody was redirected to it) and can take the block in a later move.
            try:
                await asyncio.wait_for(self._client.request(dst_address, {"op": "cancel_incoming",
                                                                          "blocks": [block]}), 5.0)
            except Exception:  # noqa: BLE001
                log.warning("could not cancel the incoming block %d at %s", block, dst)
            raise
        # Same event-loop step: snapshot and start redirecting, so each op is in exactly one of them.
        self.states.apply(block, MigrationEvent.HANDOVER_ACKED)
        keys, arrays = self.store.export_block(block)
        last: Exception | None = None
        for _attempt in range(3):
            try:
                await self._client.request(dst_address, {"op": "block_data", "block": block, "keys": keys,
                                                         "src": self.executor_id}, arrays)
                self.store.drop_block(block)
                return
            except ConnectionError as e:  # resend: the destination ignores nothing, it is still INCOMING
                last = e
        # The snapshot stays here (block MOVED, data kept) so an operator can recover it.
        raise RuntimeError(f"block {block} data not delivered to {dst}: {last}")

"""StoreClient: what workers and the AM use to reach the elastic store over the data plane.

Routes every key by the local ownership table (one batched frame per owner), follows redirects
(learning the new owner, and the whole table when the server's is newer) and re-sends only the
redirected keys, so a request that meets a migration completes transparently and exactly once.

Two APIs over the two wire forms of psruntime.store.store_requests:
- arrays (`pull_array`, `put_array`, `update_array`, `push_array`): int64 key arrays and one
  values array, routed with a vectorised hash and the table's cached block -> owner index; what
  the worker loop uses, with no Python work per key;
- per key (`pull`, `put`, `update`, `push`): any int or str keys, a value array each.

`push` is asynchronous: it writes the frames at once (so a later pull on the same connection is
served after it) and returns; its replies, redirects and errors are handled in the background and
an error is raised by the next call or by `flush()`. A push may carry a push id
(psruntime.store.push_ids), which goes with every frame of it, re-sends included: each server applies
it once per block.
"""
from __future__ import annotations

import asyncio
import functools
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable

import numpy as np
import numpy.typing as npt

from psruntime.wire.dataplane import DataPlaneClient, DataPlaneConnection
from psruntime.wire.frame_codec import Frame
from psruntime.store.ownership_table import Key, OwnershipTable, as_int_keys, blocks_of_int_keys
from psruntime.store.push_ids import PUSH_ID_FIELD
from psruntime.store.store_requests import MISSING, REDIRECTED
from protocol.errors import ProtocolError
from protocol.json_types import JsonIn, JsonObject, JsonValue

MAX_ROUNDS = 200          # a key redirected this often means ownership never converged
FAST_ROUNDS = 3           # redirects re-sent at once; later rounds back off


class StoreClientError(ProtocolError, RuntimeError):
    """A store request that could not be completed (no route, too many redirects, remote error)."""


# Per owner: its connection, the indices of the keys sent there (None = all) and the reply to come.
Sent = list[tuple[DataPlaneConnection, "np.ndarray | None", "asyncio.Future[Frame]"]]
# The fields an array-form request adds to its header: a get's "dtype" and row "shape", an
# update's "func" and push id.
RequestFields = dict[str, "str | int | list[int]"]


@dataclass
class _ArrayOutcome:
    """What an array-form request gathers: pulled rows (get) and which keys had a value."""

    out: np.ndarray | None = None
    found: np.ndarray | None = None


@dataclass
class PreparedArray:
    """An array-form request routed and cut per owner, not sent yet (see the module doc)."""

    op: str
    func: str | None
    keys: np.ndarray
    values: np.ndarray | None
    extra: RequestFields
    parts: list[tuple[str, np.ndarray | None, list[np.ndarray]]]   # (address, indices, arrays)
    row_shape: tuple[int, ...] = ()
    dtype: np.dtype | None = None


@runtime_checkable
class TransferGate(Protocol):
    """Paces a transfer's per-owner pieces (Harmony: a secondary network slot yields)."""

    async def wait_turn(self) -> None: ...

    def sent(self) -> None: ...


@dataclass
class _Outcome:
    values: dict[Key, np.ndarray] = field(default_factory=dict)
    missing: list[Key] = field(default_factory=list)


class StoreClient:
    """Client of the elastic store; holds a local copy of the ownership table."""

    def __init__(self, table: OwnershipTable, client: DataPlaneClient | None = None) -> None:
        self.table = table.copy()
        self._client = client or DataPlaneClient()
        self._own_client = client is None
        self._pending: set[asyncio.Task[None]] = set()
        self._pending_replies: set[asyncio.Future[Frame]] = set()   # array pushes' replies to come
        self._errors: list[BaseException] = []
        self.redirects_followed = 0

    async def close(self) -> None:
        await self.flush()
        if self._own_client:
            await self._client.close()

    def set_table(self, table: OwnershipTable) -> bool:
        """Adopt a newer table (e.g. from the AM's broadcast); returns whether it was newer."""
        return self.table.replace_if_newer(table)

    # -- public API (Table 3.2 + PS pull/push) ----------------------------------------------
    async def pull(self, keys: Sequence[Key]) -> dict[Key, np.ndarray]:
        """Values of `keys` (one round trip per owner); keys never written are left out."""
        self._raise_pending_error()
        return (await self._run("get", None, list(keys), [])).values

    async def get(self, key: Key) -> np.ndarray | None:
        return (await self.pull([key])).get(key)

    async def put(self, keys: Sequence[Key], values: Sequence[np.ndarray]) -> None:
        self._raise_pending_error()
        await self._run("put", None, list(keys), list(values))

    async def update(self, keys: Sequence[Key], func: str, deltas: Sequence[np.ndarray]) -> None:
        """Apply func(value, delta) at the owners and wait until applied."""
        self._raise_pending_error()
        await self._run("update", func, list(keys), list(deltas))

    async def push(self, keys: Sequence[Key], deltas: Sequence[np.ndarray], func: str = "add",
                   push_id: int | None = None) -> None:
        """Send updates without waiting for them to be applied (awaits only socket backpressure);
        with `push_id`, a server that applied that id to a block before ignores it there.

        Large deltas are sent from the caller's memory, not copied: do not modify them in place
        before flush() (computing fresh arrays, as the apps do, is always safe).
        """
        self._raise_pending_error()
        keys, deltas = list(keys), list(deltas)
        self._check_lengths(keys, deltas)
        first = await self._submit("update", func, keys, deltas, list(range(len(keys))), push_id)
        task = asyncio.ensure_future(self._complete("update", func, keys, deltas, first, _Outcome(), push_id))
        self._pending.add(task)
        task.add_done_callback(self._push_done)
        for conn in {c for c, _, _ in first}:
            await conn.drain()  # returns at once unless the socket's write buffer is over its mark

    async def flush(self) -> None:
        """Wait for every push to be applied; raise the first error any of them met."""
        # A reply's callback (run before gather's) may start a task for a redirected part: loop.
        while self._pending or self._pending_replies:
            await asyncio.gather(*self._pending, *self._pending_replies, return_exceptions=True)
        self._raise_pending_error()

    # -- array API (int64 key arrays, one values array) -------------------------------------
    async def pull_array(self, keys: np.ndarray, row_shape: Sequence[int] = (),
                         dtype: npt.DTypeLike = np.float32) -> tuple[np.ndarray, np.ndarray]:
        """(values, found) of int `keys`: values has shape (len(keys), *row_shape), in key order,
        zeros for keys never written; found[i] says whether keys[i] had a value."""
        prepared = self.prepare_pull(keys, row_shape, dtype)
        return await self.finish_pull(prepared, await self.send_pull(prepared))

    def prepare_pull(self, keys: np.ndarray, row_shape: Sequence[int] = (),
                     dtype: npt.DTypeLike = np.float32) -> PreparedArray:
        """pull_array's encode: route `keys` and cut them per owner."""
        self._raise_pending_error()
        keys = self._keys_array(keys)
        dt = np.dtype(dtype)
        shape = tuple(int(s) for s in row_shape)
        extra: RequestFields = {"dtype": dt.str, "shape": list(shape)}
        parts = self._split_array(keys, None, None) if len(keys) else []
        return PreparedArray("get", None, keys, None, extra, parts, shape, dt)

    async def send_pull(self, prepared: PreparedArray, gate: TransferGate | None = None) -> list[Frame]:
        """pull_array's transfer: write the per-owner requests and wait for their replies."""
        sent = await self._send_parts(prepared, gate)
        if gate is not None:
            gate.sent()
        n = len(prepared.keys)
        return [await self._await_reply(item, "get", n if item[1] is None else len(item[1])) for item in sent]

    async def finish_pull(self, prepared: PreparedArray, replies: list[Frame]) -> tuple[np.ndarray, np.ndarray]:
        """pull_array's decode: gather the replies (re-sending what a migration redirected)."""
        keys, shape, dt = prepared.keys, prepared.row_shape, prepared.dtype
        assert dt is not None
        found = np.ones(len(keys), bool)
        if not len(keys):
            return np.zeros((0, *shape), dt), found
        if len(replies) == 1 and prepared.parts[0][1] is None and not replies[0].header.get("status"):
            # One owner (the usual case): the reply's array is the result, no gather copy.
            self._check_rows(replies[0], len(keys), shape, dt)
            return replies[0].arrays[0], found
        out = _ArrayOutcome(np.zeros((len(keys), *shape), dt), found)
        retry = [r for reply, (_, idx, _) in zip(replies, prepared.parts)
                 if (r := self._absorb_array(reply, keys, idx, out)) is not None and len(r)]
        if retry:
            await self._complete_array("get", None, keys, None, [], out, prepared.extra,
                                       np.concatenate(retry) if len(retry) > 1 else retry[0])
        return out.out, found  # type: ignore[return-value]

    async def put_array(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Set the values of int `keys` (values[i] for keys[i]) and wait until stored."""
        self._raise_pending_error()
        keys, values = self._keys_values(keys, values)
        if len(keys):
            sent = await self._submit_array("put", None, keys, values, None, {})
            await self._complete_array("put", None, keys, values, sent, _ArrayOutcome(), {})

    async def update_array(self, keys: np.ndarray, values: np.ndarray, func: str = "add") -> None:
        """Apply func(value, values[i]) to every key at its owner and wait until applied."""
        self._raise_pending_error()
        keys, values = self._keys_values(keys, values)
        if len(keys):
            sent = await self._submit_array("update", func, keys, values, None, {"func": func})
            await self._complete_array("update", func, keys, values, sent, _ArrayOutcome(), {"func": func})

    async def push_array(self, keys: np.ndarray, values: np.ndarray, func: str = "add",
                         push_id: int | None = None) -> None:
        """update_array without waiting for it to be applied (awaits only socket backpressure);
        `push_id` as in push().

        Like push(): large values are sent from the caller's memory; do not modify them in place
        before flush().
        """
        await self.send_push(self.prepare_push(keys, values, func, push_id))

    def prepare_push(self, keys: np.ndarray, values: np.ndarray, func: str = "add",
                     push_id: int | None = None) -> PreparedArray:
        """push_array's encode: route the keys and cut keys and values per owner."""
        self._raise_pending_error()
        keys, values = self._keys_values(keys, values)
        extra: RequestFields = {"func": func} if push_id is None else {"func": func, PUSH_ID_FIELD: push_id}
        parts = self._split_array(keys, values, None) if len(keys) else []
        return PreparedArray("update", func, keys, values, extra, parts)

    async def send_push(self, prepared: PreparedArray, gate: TransferGate | None = None) -> None:
        """push_array's transfer: write the per-owner frames; their replies are awaited in the
        background (flush() waits for them)."""
        if not prepared.parts:
            return
        sent = await self._send_parts(prepared, gate)
        # The replies are checked as they come, by a callback on each: a push costs no task of
        # its own. Only a redirected part or a failure starts one (_complete_array: re-send or raise).
        left = [len(sent)]
        for item in sent:
            self._pending_replies.add(item[2])
            item[2].add_done_callback(functools.partial(self._push_replied, prepared, sent, left))
        for conn in {c for c, _, _ in sent}:
            await conn.drain()
        if gate is not None:
            gate.sent()

    def _push_replied(self, p: PreparedArray, sent: Sent, left: list[int], fut: "asyncio.Future[Frame]") -> None:
        """One reply of a push came: once all did, start the slow path if any was not a plain ack."""
        self._pending_replies.discard(fut)
        left[0] -= 1
        if left[0]:
            return
        if all(not f.cancelled() and f.exception() is None and not f.result().header.get("status")
               for _, _, f in sent):
            return      # applied at every owner
        task = asyncio.ensure_future(self._complete_array(p.op, p.func, p.keys, p.values, sent, _ArrayOutcome(), p.extra))
        self._pending.add(task)
        task.add_done_callback(self._push_done)

    # -- array internals ---------------------------------------------------------------------
    @staticmethod
    def _keys_array(keys: npt.ArrayLike) -> np.ndarray:
        try:
            return as_int_keys(keys)
        except ValueError as e:
            raise StoreClientError(str(e)) from None

    def _keys_values(self, keys: npt.ArrayLike, values: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        keys = self._keys_array(keys)
        values = np.asarray(values)
        if values.ndim < 1 or len(values) != len(keys):
            raise ValueError(f"{len(keys)} keys but values of shape {values.shape}")
        return keys, values

    def _route_array(self, keys: np.ndarray, sub: np.ndarray | None) -> list[tuple[str, np.ndarray | None]]:
        """[(address, indices into keys)] for keys[sub] (all keys when sub is None); indices None = all."""
        names, block_owner = self.table.owner_index()
        part = keys if sub is None else keys[sub]
        blocks = blocks_of_int_keys(part, self.table.num_blocks)
        if len(names) == 1:
            groups: list[tuple[str, np.ndarray | None]] = [(names[0], sub)]
            owners = None
        else:
            owners = block_owner[blocks]
            groups = []
            for pos in np.flatnonzero(np.bincount(owners, minlength=len(names))):
                idx = np.flatnonzero(owners == pos)
                groups.append((names[pos], idx if sub is None else sub[idx]))
        out: list[tuple[str, np.ndarray | None]] = []
        for owner, sel in groups:
            if not owner:
                first = 0 if owners is None else int(np.flatnonzero(owners == names.index(""))[0])
                raise StoreClientError(f"no owner known for key {int(part[first])} (block {int(blocks[first])})")
            out.append((self.table.address_of(owner), sel))
        return out

    def _split_array(self, keys: np.ndarray, values: np.ndarray | None,
                     sub: np.ndarray | None) -> list[tuple[str, np.ndarray | None, list[np.ndarray]]]:
        """[(address, indices into keys, [keys part, values part])] for keys[sub] (all when None)."""
        parts = []
        for address, idx in self._route_array(keys, sub):
            k = keys if idx is None else keys[idx]
            parts.append((address, idx, [k] if values is None else [k, values if idx is None else values[idx]]))
        return parts

    async def _send_parts(self, p: PreparedArray, gate: TransferGate | None = None) -> Sent:
        sent: Sent = []
        for address, idx, arrays in p.parts:
            if gate is not None:
                await gate.wait_turn()
            conn = self._client.cached(address) or await self._connect(address, p.op)
            header: dict[str, JsonIn] = {"op": p.op, "key_array": True, "v": self.table.version, **p.extra}
            sent.append((conn, idx, conn.submit(header, arrays)))
        return sent

    async def _submit_array(self, op: str, func: str | None, keys: np.ndarray, values: np.ndarray | None,
                            sub: np.ndarray | None, extra: RequestFields) -> Sent:
        parts = self._split_array(keys, values, sub)
        return await self._send_parts(PreparedArray(op, func, keys, values, extra, parts))

    async def _connect(self, address: str, op: str) -> DataPlaneConnection:
        """The connection to an owner; a failure to reach it (refused, timed out, marked lost) is
        this request's failure, as one on the connection is."""
        try:
            return await self._client.connection(address)
        except OSError as e:        # ConnectionError and the data plane's PeerLost among them
            raise StoreClientError(f"{op} at {address} failed: {e}") from e

    @staticmethod
    async def _await_reply(item: tuple[DataPlaneConnection, np.ndarray | None, "asyncio.Future[Frame]"], op: str,
                           n: int) -> Frame:
        conn, _, fut = item
        try:
            return await fut
        except Exception as e:
            raise StoreClientError(f"{op} of {n} keys at {conn.address} failed: {e}") from e

    @staticmethod
    def _check_rows(reply: Frame, n: int, shape: tuple[int, ...], dtype: np.dtype) -> None:
        a = reply.arrays[0] if reply.arrays else None
        if a is None or a.shape != (n, *shape) or a.dtype != dtype:
            got = None if a is None else (a.shape, a.dtype)
            raise StoreClientError(f"get reply has values {got}, expected {((n, *shape), dtype)}")

    async def _complete_array(self, op: str, func: str | None, keys: np.ndarray, values: np.ndarray | None,
                              sent: Sent, out: _ArrayOutcome, extra: RequestFields,
                              retry: np.ndarray | None = None) -> None:
        for rnd in range(MAX_ROUNDS):
            if retry is None:
                parts = []
                for item in sent:
                    n = len(keys) if item[1] is None else len(item[1])
                    r = self._absorb_array(await self._await_reply(item, op, n), keys, item[1], out)
                    if r is not None and len(r):
                        parts.append(r)
                if not parts:
                    return
                retry = np.concatenate(parts) if len(parts) > 1 else parts[0]
            self.redirects_followed += 1
            if rnd >= FAST_ROUNDS:
                await asyncio.sleep(min(0.001 * 2 ** (rnd - FAST_ROUNDS), 0.05))
            sent = await self._submit_array(op, func, keys, values, retry, extra)
            retry = None
        raise StoreClientError(f"{op}: keys still redirected after {MAX_ROUNDS} rounds")

    def _absorb_array(self, reply: Frame, keys: np.ndarray, idx: np.ndarray | None,
                      out: _ArrayOutcome) -> np.ndarray | None:
        """Record an array-form reply; return the indices (into keys) to re-send after a redirect."""
        h = reply.header
        n = len(keys) if idx is None else len(idx)
        status = reply.arrays[-1] if h.get("status") else None
        if status is not None and (status.shape != (n,) or status.dtype != np.uint8):
            raise StoreClientError(f"reply status buffer has shape {status.shape}, expected ({n},)")
        if out.out is not None:
            self._check_rows(reply, n, out.out.shape[1:], out.out.dtype)
            if idx is None:
                out.out[:] = reply.arrays[0]
            else:
                out.out[idx] = reply.arrays[0]
            if status is not None and out.found is not None:
                miss = np.flatnonzero(status == MISSING)
                out.found[miss if idx is None else idx[miss]] = False
        if status is None:
            return None
        self._learn_redirects(h)
        redirected = np.flatnonzero(status == REDIRECTED)
        return redirected if idx is None else idx[redirected]

    def _learn_redirects(self, h: JsonObject) -> None:
        if "table" in h:
            self.table.replace_if_newer(OwnershipTable.from_wire(h["table"]))
        for entry in _json_list(h.get("redirect")):      # [block, owner, address]
            match entry:
                case [int(block), str(owner), address] if address is None or isinstance(address, str):
                    self.table.note_owner(block, owner, address or None)
                case _:
                    raise StoreClientError(f"reply has a bad redirect entry {entry!r}")

    # -- internals ---------------------------------------------------------------------------
    def _push_done(self, task: asyncio.Task[None]) -> None:
        self._pending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._errors.append(task.exception())  # type: ignore[arg-type]

    def _raise_pending_error(self) -> None:
        if self._errors:
            err, self._errors = self._errors[0], []
            raise StoreClientError(f"an earlier push failed: {err}") from err

    @staticmethod
    def _check_lengths(keys: list[Key], values: list[np.ndarray]) -> None:
        if len(keys) != len(values):
            raise ValueError(f"{len(keys)} keys but {len(values)} values")

    def _route(self, keys: list[Key], idx: list[int]) -> dict[str, list[int]]:
        groups: dict[str, list[int]] = defaultdict(list)
        for i in idx:
            owner = self.table.owner_of(keys[i])
            if not owner:
                raise StoreClientError(f"no owner known for key {keys[i]!r} (block {self.table.block_of(keys[i])})")
            groups[self.table.address_of(owner)].append(i)
        return groups

    async def _submit(self, op: str, func: str | None, keys: list[Key], values: list[np.ndarray],
                      idx: list[int], push_id: int | None = None
                      ) -> list[tuple[DataPlaneConnection, list[int], asyncio.Future[Frame]]]:
        sent = []
        for address, group in self._route(keys, idx).items():
            conn = self._client.cached(address) or await self._connect(address, op)
            header: dict[str, JsonIn] = {"op": op, "keys": [keys[i] for i in group], "v": self.table.version}
            if func is not None:
                header["func"] = func
            if push_id is not None:
                header[PUSH_ID_FIELD] = push_id
            fut = conn.submit(header, [values[i] for i in group] if values else [])
            sent.append((conn, group, fut))
        return sent

    async def _run(self, op: str, func: str | None, keys: list[Key], values: list[np.ndarray]) -> _Outcome:
        if values:
            self._check_lengths(keys, values)
        if not keys:
            return _Outcome()
        first = await self._submit(op, func, keys, values, list(range(len(keys))))
        out = _Outcome()
        await self._complete(op, func, keys, values, first, out)
        return out

    async def _complete(self, op: str, func: str | None, keys: list[Key], values: list[np.ndarray],
                        sent: list[tuple[DataPlaneConnection, list[int], asyncio.Future[Frame]]],
                        out: _Outcome, push_id: int | None = None) -> None:
        for rnd in range(MAX_ROUNDS):
            retry: list[int] = []
            for conn, group, fut in sent:
                try:
                    reply = await fut
                except Exception as e:
                    raise StoreClientError(f"{op} of {len(group)} keys at {conn.address} failed: {e}") from e
                retry += self._absorb(reply, keys, group, out)
            if not retry:
                return
            self.redirects_followed += 1
            if rnd >= FAST_ROUNDS:
                # Ownership is converging through a chain of moves: give the broadcast a moment.
                await asyncio.sleep(min(0.001 * 2 ** (rnd - FAST_ROUNDS), 0.05))
            sent = await self._submit(op, func, keys, values, retry, push_id)
        raise StoreClientError(f"{op}: keys still redirected after {MAX_ROUNDS} rounds")

    def _absorb(self, reply: Frame, keys: list[Key], group: list[int], out: _Outcome) -> list[int]:
        """Record a reply; return the indices (from `group`) to re-send after a redirect."""
        h = reply.header
        for k, a in zip(_json_keys(h.get("keys")), reply.arrays):
            out.values[k] = a
        out.missing += _json_keys(h.get("missing"))
        if "redirect" not in h:
            return []
        self._learn_redirects(h)
        redirected = set(_json_keys(h.get("redirect_keys")))
        return [i for i in group if keys[i] in redirected]


def _json_list(value: JsonValue) -> list[JsonValue]:
    """A reply field that is a list (absent: empty); StoreClientError naming it otherwise."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise StoreClientError(f"reply field is {value!r}, expected a list")
    return value


def _json_keys(value: JsonValue) -> list[Key]:
    """A reply's key list (list form: int or str keys)."""
    keys: list[Key] = []
    for k in _json_list(value):
        if isinstance(k, bool) or not isinstance(k, (int, str)):
            raise StoreClientError(f"reply has key {k!r}: keys are ints or strs")
        keys.append(k)
    return keys

"""Data-op requests of the elastic store ("get", "put", "update"), parsed from frames and applied
to a BlockStore one block at a time.

Two wire forms, chosen by the client:

- **array form** (`"key_array": true`), what workers use: buffer 0 is an int64 key array; a put or
  update carries buffer 1, the values as one (n, *row_shape) array; a get names the `dtype` and
  row `shape` it wants. The reply of a get is one (n, *row_shape) array in request order (rows of
  missing or redirected keys are zeros). When some key was not served, the header has
  `"status": true` and a last uint8 buffer says per key: 0 served, 1 missing (get), 2 redirected.
  No JSON key lists, no buffer per key: a request costs a few numpy passes whatever its size.
- **list form** (`"keys": [...]`, one buffer per key): any int or str keys, values of any shape
  each. The reply lists the keys served (with one buffer each), `missing` and `redirect_keys`.

Either way a request is split by block; the StoreService decides per block whether it is served,
queued (the block is arriving) or redirected (the block has moved), and the reply's `redirect`
lists [block, owner, address] for the redirected blocks.
"""
from __future__ import annotations

import asyncio
import math
from abc import ABC, abstractmethod
from collections import defaultdict
from typing import Sequence, Union

import numpy as np

from psruntime.store.block_store import BlockStore, check_func
from psruntime.wire.buffer_pool import BufferPool
from psruntime.wire.dataplane import RequestError
from psruntime.wire.frame_codec import DEFAULT_MAX_BODY_BYTES, check_wire_dtype
from psruntime.store.ownership_table import Key, as_int_keys, block_of, blocks_of_int_keys
from protocol.json_types import JsonObject, JsonValue

SERVED, MISSING, REDIRECTED = 0, 1, 2    # per-key status codes of an array-form reply

# The keys of one request that fall in one block: in the array form, indices into the request's
# key array (None: all of them); in the list form, positions in its key list.
BlockPart = Union[np.ndarray, list[int], None]


def group_by_block(blocks: np.ndarray, num_blocks: int) -> list[tuple[int, np.ndarray | None]]:
    """[(block, indices)] of an int array of block ids, in block order; indices None = all of them."""
    if not len(blocks):
        return []
    # One stable sort, cut where the block changes: a few numpy passes whatever the number of
    # blocks (a mask per block cost two passes each, and a request of a small model spans them all).
    order = np.argsort(blocks, kind="stable")
    ordered = blocks[order]
    cuts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
    if not len(cuts):
        return [(int(ordered[0]), None)]
    starts = [0, *cuts.tolist()]
    ends = [*starts[1:], len(blocks)]
    return [(b, order[s:e]) for b, s, e in zip(ordered[starts].tolist(), starts, ends)]


class Groupings:
    """The block grouping of the last key array grouped, reused for an equal one: a small model's
    worker pulls and pushes the same keys every mini-batch (MLR `small`: all 125), and comparing
    two key arrays is two numpy passes where hashing and grouping them took about ten. With it, each
    block's keys of the request, as read-only arrays that stay the same objects while the grouping
    is reused: a block remembers the one it found covering its dense keys (BlockContents.covers)."""

    def __init__(self) -> None:
        self._keys: np.ndarray | None = None
        self._num_blocks = 0
        self._groups: list[tuple[int, np.ndarray | None]] = []
        self._part_keys: dict[int, np.ndarray] = {}

    def of(self, keys: np.ndarray, num_blocks: int) -> list[tuple[int, np.ndarray | None]]:
        """group_by_block of `keys`' blocks (the index arrays are shared: callers only read them)."""
        last = self._keys
        if (last is not None and num_blocks == self._num_blocks and len(last) == len(keys)
                and bool((last == keys).all())):
            return self._groups
        groups = group_by_block(blocks_of_int_keys(keys, num_blocks), num_blocks)
        # A copy: `keys` may view a receive buffer that a later frame reuses. Read-only, as is each
        # block's part of it, so a block may remember it as covering (BlockContents.covers).
        self._keys, self._num_blocks, self._groups = keys.copy(), num_blocks, groups
        self._keys.flags.writeable = False
        # A new dict (not cleared): a request parsed earlier keeps the one of its own grouping.
        self._part_keys = {}
        for b, idx in groups:
            part = self._keys if idx is None else self._keys[idx]
            part.flags.writeable = False
            self._part_keys[b] = part
        return groups

    @property
    def part_keys(self) -> dict[int, np.ndarray]:
        """Block -> the last grouped keys of that block (read-only; as `of` last returned them)."""
        return self._part_keys


class DataRequest(ABC):
    """One parsed data request; its parts (one per block) are applied, queued or redirected."""

    def __init__(self, op: str, func: str | None) -> None:
        self.op = op
        self.func = func
        self.redirects: dict[int, tuple[str, str]] = {}
        self.pending = 0                              # parts queued on incoming blocks
        self.done: asyncio.Future[None] | None = None

    @abstractmethod
    def parts(self, num_blocks: int) -> list[tuple[int, BlockPart]]:
        """[(block, part)] where a part selects this request's keys of that block."""

    @abstractmethod
    def check(self, store: BlockStore, block: int, part: BlockPart) -> None:
        """Raise StoreError if applying `part` would fail (so a bad request changes nothing)."""

    @abstractmethod
    def apply(self, store: BlockStore, block: int, part: BlockPart) -> None:
        """Serve `part` from / into the store."""

    @abstractmethod
    def redirect(self, block: int, part: BlockPart, target: tuple[str, str]) -> None:
        """Mark `part` as not applied here: the client re-sends it to `target` (owner, address)."""

    @abstractmethod
    def reply(self) -> tuple[JsonObject, list[np.ndarray]]:
        """The reply header (without redirect / table, which the service adds) and buffers."""

    # -- queued parts ------------------------------------------------------------------------
    def part_queued(self) -> None:
        self.pending += 1
        if self.done is None:
            self.done = asyncio.get_running_loop().create_future()

    def part_finished(self, error: BaseException | None = None) -> None:
        self.pending -= 1
        if self.done is None or self.done.done():
            return
        if error is not None:
            self.done.set_exception(error)   # a bad queued part fails its own request only
        elif self.pending == 0:
            self.done.set_result(None)


# ----- array form ----------------------------------------------------------------------------

class ArrayRequest(DataRequest):
    """A request in the array form: one key array, one values array (put/update) or a wanted layout."""

    def __init__(self, op: str, func: str | None, keys: np.ndarray, values: np.ndarray | None,
                 out: np.ndarray | None, groupings: Groupings | None = None) -> None:
        super().__init__(op, func)
        self.groupings = groupings
        self.keys = keys
        self.values = values
        self.out = out
        self.status: np.ndarray | None = None
        # An update's keys and values per block, cut once by `check` and used again by `apply`.
        self._cut: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}
        # Block -> this request's keys of it, from `groupings` (read-only, shared): `parts` sets it.
        self._part_keys: dict[int, np.ndarray] = {}

    def _status(self) -> np.ndarray:
        if self.status is None:
            self.status = np.zeros(len(self.keys), np.uint8)
        return self.status

    def parts(self, num_blocks: int) -> list[tuple[int, BlockPart]]:
        if self.groupings is not None:
            groups: list[tuple[int, BlockPart]] = list(self.groupings.of(self.keys, num_blocks))
            self._part_keys = self.groupings.part_keys
            return groups
        return list(group_by_block(blocks_of_int_keys(self.keys, num_blocks), num_blocks))

    def _select(self, block: int, part: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
        keys = self._part_keys.get(block)
        if part is None:
            return self.keys if keys is None else keys, self.values
        return self.keys[part] if keys is None else keys, (self.values[part] if self.values is not None else None)

    def check(self, store: BlockStore, block: int, part: BlockPart) -> None:
        if self.op == "update":
            keys, values = self._cut[block] = self._select(block, _indices(part))
            store.check_update_many(block, self.func, keys, values)  # type: ignore[arg-type]

    def apply(self, store: BlockStore, block: int, part: BlockPart) -> None:
        part = _indices(part)
        cut = self._cut.pop(block, None)
        keys, values = cut if cut is not None else self._select(block, part)
        if self.op == "get":
            assert self.out is not None
            if part is None:
                missing = store.gather(block, keys, self.out)
                if missing.any():
                    self.out[missing] = 0   # `out` may be a reused buffer: not zeros to begin with
                    self._status()[missing.nonzero()[0]] = MISSING
            else:
                missing = store.gather(block, keys, self.out, at=part)
                if missing.any():
                    lacking = part[missing]
                    self.out[lacking] = 0
                    self._status()[lacking] = MISSING
        elif self.op == "put":
            store.put_many(block, keys, values)  # type: ignore[arg-type]
        else:
            store.update_many(block, self.func, keys, values)  # type: ignore[arg-type]

    def redirect(self, block: int, part: BlockPart, target: tuple[str, str]) -> None:
        part = _indices(part)
        self.redirects[block] = target
        self._status()[slice(None) if part is None else part] = REDIRECTED
        if self.out is not None:
            self.out[slice(None) if part is None else part] = 0

    def reply(self) -> tuple[JsonObject, list[np.ndarray]]:
        header: JsonObject = {"op": "ok", "key_array": True}
        arrays: list[np.ndarray] = [self.out] if self.out is not None else []
        if self.status is not None and self.status.any():
            # Rows of missing or redirected keys are zeros (apply and redirect wrote them).
            header["status"] = True
            header["missing"] = int(np.count_nonzero(self.status == MISSING))
            arrays.append(self.status)
        return header, arrays


def _indices(part: BlockPart) -> np.ndarray | None:
    """An array-form part (a list-form one here would be a bug of the caller's)."""
    if isinstance(part, list):
        raise TypeError("a list-form part given to an array-form request")
    return part


def _parse_array_request(op: str, func: str | None, h: JsonObject, arrays: Sequence[np.ndarray],
                         pool: BufferPool | None, groupings: Groupings | None) -> ArrayRequest:
    want = 1 if op == "get" else 2
    if len(arrays) != want:
        raise RequestError(f"an array-form {op} carries {want} buffer(s) (keys{'' if want == 1 else ', values'}), "
                           f"got {len(arrays)}")
    try:
        keys = as_int_keys(arrays[0])
    except ValueError as e:
        raise RequestError(f"buffer 0 (keys): {e}") from None
    if not len(keys):
        raise RequestError("buffer 0 (keys) must hold at least one key")
    if op != "get":
        values = arrays[1]
        if values.ndim < 1 or len(values) != len(keys):
            raise RequestError(f"buffer 1 (values) must have one row per key: {len(keys)} keys, values of "
                               f"shape {values.shape}")
        return ArrayRequest(op, func, keys, values, None, groupings)
    dtype, shape = h.get("dtype"), h.get("shape")
    if not isinstance(dtype, str):
        raise RequestError("an array-form get needs field 'dtype' (e.g. \"<f4\")")
    try:
        dt = check_wire_dtype(dtype)
    except ValueError as e:
        raise RequestError(f"field 'dtype': {e}") from None
    bad_shape = "field 'shape' must be the row shape, a list of non-negative ints"
    if not isinstance(shape, list):
        raise RequestError(bad_shape)
    dims = [s for s in shape if isinstance(s, int) and not isinstance(s, bool) and s >= 0]
    if len(dims) != len(shape):
        raise RequestError(bad_shape)
    nbytes = len(keys) * math.prod(dims) * dt.itemsize
    if nbytes > DEFAULT_MAX_BODY_BYTES:
        raise RequestError(f"the reply would be {nbytes} bytes, over the frame limit of {DEFAULT_MAX_BODY_BYTES}")
    # Every row of `out` is written by the part that covers it (served, missing or redirected).
    out_shape = (len(keys), *dims)
    out = pool.take_array(out_shape, dt) if pool is not None else np.empty(out_shape, dt)
    return ArrayRequest(op, None, keys, None, out, groupings)


# ----- list form -----------------------------------------------------------------------------

class ListRequest(DataRequest):
    """A request in the list form: JSON keys, one buffer per key."""

    def __init__(self, op: str, func: str | None, keys: list[Key], arrays: Sequence[np.ndarray]) -> None:
        super().__init__(op, func)
        self.keys = keys
        self.arrays = arrays
        self.served_keys: list[Key] = []
        self.served_arrays: list[np.ndarray] = []
        self.missing: list[Key] = []
        self.redirect_keys: list[Key] = []

    def parts(self, num_blocks: int) -> list[tuple[int, BlockPart]]:
        by_block: dict[int, list[int]] = defaultdict(list)
        for i, k in enumerate(self.keys):
            by_block[block_of(k, num_blocks)].append(i)
        return list(by_block.items())

    def check(self, store: BlockStore, block: int, part: BlockPart) -> None:
        if self.op == "update":
            for i in _positions(part):
                store.check_update(self.keys[i], self.func, self.arrays[i], block)  # type: ignore[arg-type]

    def apply(self, store: BlockStore, block: int, part: BlockPart) -> None:
        part = _positions(part)
        if self.op == "get":
            for i in part:
                k = self.keys[i]
                v = store.get(k, block)
                if v is None:
                    self.missing.append(k)
                else:
                    self.served_keys.append(k)
                    self.served_arrays.append(v)
            return
        for i in part:
            if self.op == "put":
                store.put(self.keys[i], self.arrays[i], block)
            else:
                store.update(self.keys[i], self.func, self.arrays[i], block)  # type: ignore[arg-type]
        self.served_keys += [self.keys[i] for i in part]

    def redirect(self, block: int, part: BlockPart, target: tuple[str, str]) -> None:
        self.redirects[block] = target
        self.redirect_keys += [self.keys[i] for i in _positions(part)]

    def reply(self) -> tuple[JsonObject, list[np.ndarray]]:
        header: JsonObject = {"op": "ok", "keys": _json_keys(self.served_keys)}
        if self.missing:
            header["missing"] = _json_keys(self.missing)
        if self.redirect_keys:
            header["redirect_keys"] = _json_keys(self.redirect_keys)
        return header, self.served_arrays


def _positions(part: BlockPart) -> list[int]:
    """A list-form part (an array-form one here would be a bug of the caller's)."""
    if not isinstance(part, list):
        raise TypeError("an array-form part given to a list-form request")
    return part


def _json_keys(keys: list[Key]) -> list[JsonValue]:
    return list(keys)


def _parse_list_request(op: str, func: str | None, h: JsonObject, arrays: Sequence[np.ndarray]) -> ListRequest:
    raw = h.get("keys")
    if not isinstance(raw, list) or not raw:
        raise RequestError("field 'keys' must be a non-empty list of int or str keys")
    keys: list[Key] = []
    for k in raw:
        if isinstance(k, bool) or not isinstance(k, (int, str)):
            raise RequestError(f"field 'keys' has {k!r}: keys must be ints or strs")
        keys.append(k)
    if op != "get" and len(arrays) != len(keys):
        raise RequestError(f"{len(keys)} keys but {len(arrays)} value buffers")
    if op == "get" and arrays:
        raise RequestError("a get carries no value buffers")
    return ListRequest(op, func, keys, arrays)


def parse_request(h: JsonObject, arrays: Sequence[np.ndarray], pool: BufferPool | None = None,
                  groupings: Groupings | None = None) -> DataRequest:
    """The request of a data-op frame; RequestError naming the field that is wrong. An array-form
    get's reply array comes from `pool` when given (a reused buffer, not a fresh mapping), and an
    array-form request's block grouping from `groupings` (the last equal key array's)."""
    op = h["op"]
    if not isinstance(op, str):
        raise RequestError(f"field 'op' must be a string, got {op!r}")
    func: str | None = None
    if op == "update":
        named = h.get("func")
        if not isinstance(named, str):
            raise RequestError("an update needs field 'func' (e.g. \"add\")")
        func = named
        try:
            check_func(func)
        except ValueError as e:
            raise RequestError(str(e)) from None
    if h.get("key_array"):
        return _parse_array_request(op, func, h, arrays, pool, groupings)
    return _parse_list_request(op, func, h, arrays)

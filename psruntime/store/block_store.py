"""The blocks one executor owns, with put / get / update one key at a time or many keys at once.

Model keys are dense int ranges whose values share one layout (MLR/NMF: float32 vectors of the
app's key length), so each block keeps its int keys as **dense rows** (psruntime.store.block_contents):
a sorted int64 key array and one (rows, *row_shape) array, with spare capacity so appending keys
in increasing order (how a model is initialised) is amortised O(1). A multi-key get or update is
then one np.searchsorted plus one fancy-indexed numpy op. Any other key (a str key, an int key whose value
has another shape or dtype) lives in a per-block dict, as before.

`update(key, func, delta)` applies a registered commutative and associative function in place.
Copy-on-write: `get` returns views into the block's storage without copying; an update while such a
view is alive (e.g. the transport still sending it as a pull reply) goes to a fresh copy of the
storage, so what the reader holds never tears. It is detected by reference count, so when nobody
holds a view updates stay in place and allocate nothing.

A block serialises to `BlockArrays` (dense keys + values + the other keys' arrays) for migration
and checkpoints; `export_block` / `import_block` keep the older per-key form.

A store may hold blocks on disk (`spilled`, Harmony's model spill: psruntime.spill.model_spill): they
count as held, and any access brings such a block back into memory first.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import numpy as np

from psruntime.store.block_contents import BlockContents as _Block
from psruntime.store.block_contents import RetiredValues
from psruntime.apps.sorted_unique import strictly_increasing as _strictly_increasing
from psruntime.store.ownership_table import Key, block_of, blocks_of_int_keys
from protocol.errors import AppError

UpdateFunc = Callable[[np.ndarray, np.ndarray], None]
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def _ufunc_in_place(ufunc: np.ufunc) -> UpdateFunc:
    def apply(value: np.ndarray, delta: np.ndarray) -> None:
        ufunc(value, delta, out=value, casting="same_kind")
    return apply


# Only commutative and associative functions: the order in which pushes from many workers arrive
# must not change the result (dissertation §3.3.2, update()).
UPDATE_UFUNCS: dict[str, np.ufunc] = {"add": np.add, "max": np.maximum, "min": np.minimum}
UPDATE_FUNCS: dict[str, UpdateFunc] = {name: _ufunc_in_place(u) for name, u in UPDATE_UFUNCS.items()}


class StoreError(AppError, ValueError):
    """A store operation that cannot be applied (unknown function, missing key, shape mismatch)."""


# References to a stored dict array inside update() when nobody else holds it: the block dict, the
# local variable and getrefcount's own argument.
_UNSHARED_REFS = 3


def _check_key(key: object) -> Key:
    if isinstance(key, bool) or not isinstance(key, (int, str)):
        raise StoreError(f"key {key!r} must be an int or a str")
    return key


def _is_dense_key(key: Key) -> bool:
    return isinstance(key, int) and _INT64_MIN <= key <= _INT64_MAX


_NONE_MISSING: dict[int, np.ndarray] = {}


def _none_missing(n: int) -> np.ndarray:
    """A read-only all-False mask of length `n` (gather's answer for a block that covers every
    key asked), shared rather than allocated per request."""
    mask = _NONE_MISSING.get(n)
    if mask is None:
        if len(_NONE_MISSING) >= 64:     # a model's block sizes are a handful; bound it anyway
            _NONE_MISSING.clear()
        mask = _NONE_MISSING[n] = np.zeros(n, bool)
        mask.flags.writeable = False
    return mask


def _owned_copy(value: np.ndarray) -> np.ndarray:
    # Frame arrays are views into the received buffer: keep a private, writable copy.
    return np.array(value, copy=True, order="C")


def check_func(func: str) -> np.ufunc:
    """The ufunc of update function `func`, or StoreError naming the known ones."""
    try:
        return UPDATE_UFUNCS[func]
    except KeyError:
        raise StoreError(f"unknown update function {func!r}; known: {sorted(UPDATE_UFUNCS)}") from None


@dataclass
class BlockArrays:
    """A block as arrays: sorted int64 `keys` with their `values` rows, plus every other key."""

    keys: np.ndarray
    values: np.ndarray | None
    other_keys: list[Key] = field(default_factory=list)
    other_arrays: list[np.ndarray] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        dense = self.values.nbytes if self.values is not None else 0
        return dense + sum(a.nbytes for a in self.other_arrays)


class SpilledBlocks(Protocol):
    """Blocks a store holds on disk (psruntime.spill.model_spill.ModelSpill)."""

    def blocks(self) -> list[int]: ...

    def holds(self, block: int) -> bool: ...

    def take(self, block: int) -> BlockArrays:
        """The block's arrays, no longer on disk once taken."""
        ...

    def forget(self, block: int) -> None: ...


class BlockStore:
    """The blocks held by one executor. Not thread-safe: one event loop owns it."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise StoreError(f"num_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        self._blocks: dict[int, _Block] = {}
        self._retired = RetiredValues()   # copy-on-write's replaced arrays, reused (block_contents)
        # Blocks spilled to disk under memory pressure (Harmony, psruntime.spill.model_spill): still
        # held, brought back into memory on their next access.
        self.spilled: SpilledBlocks | None = None

    # -- blocks ------------------------------------------------------------------------------
    def block_ids(self) -> list[int]:
        on_disk = self.spilled.blocks() if self.spilled is not None else ()
        return sorted({*self._blocks, *on_disk})

    def has_block(self, block: int) -> bool:
        return block in self._blocks or (self.spilled is not None and self.spilled.holds(block))

    def _present(self, block: int) -> _Block | None:
        """The block in memory, brought back first if it was spilled; None if not held."""
        blk = self._blocks.get(block)
        if blk is None and self.spilled is not None and self.spilled.holds(block):
            self.import_arrays(block, self.spilled.take(block))
            blk = self._blocks.get(block)
        return blk

    def in_memory(self, block: int) -> bool:
        return block in self._blocks

    def create_block(self, block: int) -> None:
        """Make an empty block present (a fresh job's owner starts with empty blocks)."""
        self._check_block(block)
        if self.spilled is not None and self.spilled.holds(block):
            return                      # held, on disk: an empty block would shadow it
        self._blocks.setdefault(block, _Block())

    def drop_block(self, block: int) -> None:
        self._blocks.pop(block, None)
        if self.spilled is not None:
            self.spilled.forget(block)

    def block_nbytes(self, block: int) -> int:
        blk = self._blocks.get(block)
        return blk.nbytes() if blk is not None else 0

    def nbytes(self) -> int:
        return sum(b.nbytes() for b in self._blocks.values())

    def _check_block(self, block: int) -> None:
        if not 0 <= block < self.num_blocks:
            raise StoreError(f"block {block} is out of range 0..{self.num_blocks - 1}")

    def _held(self, block: int, what: object = None) -> _Block:
        blk = self._present(block)
        if blk is None:
            of = f" (of key {what!r})" if what is not None else ""
            raise StoreError(f"block {block}{of} is not held by this store")
        return blk

    def _block_for(self, key: Key, block: int | None) -> _Block:
        return self._held(block_of(key, self.num_blocks) if block is None else block, key)

    # -- one key at a time (Table 3.2) -------------------------------------------------------
    def put(self, key: Key, value: np.ndarray, block: int | None = None) -> None:
        blk = self._block_for(_check_key(key), block)
        value = np.asarray(value)
        if _is_dense_key(key):
            row = blk.row_of(key)  # type: ignore[arg-type]
            if blk.fits(value.dtype, value.shape):
                if row is None:
                    blk.insert(np.array([key], np.int64), value[None])
                else:
                    blk.writable_values(self._retired)[row] = value
                return
            if row is not None:
                blk.remove(key)  # type: ignore[arg-type]  # the new value has another layout
        blk.extra[key] = _owned_copy(value)

    def get(self, key: Key, block: int | None = None) -> np.ndarray | None:
        """The stored array, or None. Not a copy: an update while the caller holds it goes to a copy
        (copy-on-write), so what the caller holds stays as it was when read."""
        blk = self._block_for(_check_key(key), block)
        if _is_dense_key(key):
            row = blk.row_of(key)  # type: ignore[arg-type]
            if row is not None:
                return blk.values[row, ...]  # type: ignore[index]  # a view (0-d for scalar values)
        return blk.extra.get(key)

    def update(self, key: Key, func: str, delta: np.ndarray, block: int | None = None) -> None:
        """value = func(value, delta) in place; a missing key starts as `delta` (func's identity)."""
        check_func(func)
        apply = UPDATE_FUNCS[func]
        blk = self._block_for(_check_key(key), block)
        delta = np.asarray(delta)
        row = blk.row_of(key) if _is_dense_key(key) else None  # type: ignore[arg-type]
        if row is not None:
            self._check_shape(key, blk.values.shape[1:], delta)  # type: ignore[union-attr]
            values = blk.writable_values(self._retired)
            try:
                apply(values[row, ...], delta)
            except TypeError as e:  # numpy's UFuncTypeError on an unsafe cast, e.g. float64 into int32
                raise StoreError(f"cannot apply {func} to key {key!r}: {e}") from None
            return
        value = blk.extra.get(key)
        if value is None:
            self.put(key, delta, block)
            return
        self._check_shape(key, value.shape, delta)
        if sys.getrefcount(value) > _UNSHARED_REFS:
            # Copy-on-write: someone still holds this array (e.g. a pull reply being sent).
            value = blk.extra[key] = value.copy()
        try:
            apply(value, delta)
        except TypeError as e:
            raise StoreError(f"cannot apply {func} to key {key!r}: {e}") from None

    @staticmethod
    def _check_shape(key: Key, shape: tuple[int, ...], delta: np.ndarray) -> None:
        if shape != delta.shape:
            raise StoreError(f"delta for key {key!r} has shape {delta.shape}, value has {shape}")

    def check_update(self, key: Key, func: str, delta: np.ndarray, block: int | None = None) -> None:
        """Raise StoreError if update(key, func, delta) would fail, without changing anything."""
        check_func(func)
        value = self.get(key, block)
        if value is None:
            return
        delta = np.asarray(delta)
        self._check_shape(key, value.shape, delta)
        if not np.can_cast(delta.dtype, value.dtype, "same_kind"):
            raise StoreError(f"delta for key {key!r} is {delta.dtype}, cannot update a {value.dtype} value")

    def keys(self, block: int) -> list[Key]:
        blk = self._present(block)
        if blk is None:
            return []
        return [*blk.keys[:blk.n].tolist(), *blk.extra]

    # -- many int keys at once (the data plane's array ops) ----------------------------------
    def gather(self, block: int, keys: np.ndarray, out: np.ndarray, at: np.ndarray | None = None) -> np.ndarray:
        """Write the values of int64 `keys` of `block` into the rows of `out` (row `at[i]` for
        keys[i]; row i without `at`); return the mask of keys this block does not hold (their rows
        of `out` are left as they were)."""
        blk = self._held(block)
        vals = blk.values
        if vals is not None and blk.covers(keys):
            self._check_readable(block, vals, out)
            if at is None:
                out[:] = vals[:blk.n]
            else:
                out[at] = vals[:blk.n]
            return _none_missing(len(keys))
        rows, found = blk.lookup(keys)
        if vals is not None and blk.n and found.any():
            self._check_readable(block, vals, out)
            if found.all():
                if at is not None:
                    out[at] = vals[rows]
                elif vals.dtype == out.dtype:
                    np.take(vals, rows, axis=0, out=out, mode="clip")  # straight into the reply, no temporary
                else:
                    out[:] = vals[rows]
            else:
                hit = np.flatnonzero(found)
                out[hit if at is None else at[hit]] = vals[rows[hit]]
        missing = ~found
        if blk.extra and missing.any():
            for i in np.flatnonzero(missing):
                v = blk.extra.get(int(keys[i]))
                if v is not None:
                    if v.shape != out.shape[1:]:
                        raise StoreError(f"key {int(keys[i])} has shape {v.shape}, the request asks for "
                                         f"{out.shape[1:]}")
                    out[i if at is None else at[i]] = v
                    missing[i] = False
        return missing

    @staticmethod
    def _check_readable(block: int, vals: np.ndarray, out: np.ndarray) -> None:
        if vals.shape[1:] != out.shape[1:]:
            raise StoreError(f"block {block} holds values of shape {vals.shape[1:]}, "
                             f"the request asks for {out.shape[1:]}")
        if vals.dtype != out.dtype and not np.can_cast(vals.dtype, out.dtype, "same_kind"):
            raise StoreError(f"block {block} holds {vals.dtype}, cannot read it as {out.dtype}")

    def check_update_many(self, block: int, func: str, keys: np.ndarray, deltas: np.ndarray) -> None:
        """Raise StoreError if update_many would fail, without changing anything."""
        check_func(func)
        blk = self._held(block)
        vals = blk.values
        # Only a layout that does not fit fails, and only on keys held: the lookup is needed then alone.
        if vals is not None and blk.n and (vals.shape[1:] != deltas.shape[1:] or (
                vals.dtype != deltas.dtype and not np.can_cast(deltas.dtype, vals.dtype, "same_kind"))):
            _, found = blk.lookup(keys)
            if found.any():
                if vals.shape[1:] != deltas.shape[1:]:
                    raise StoreError(f"deltas for block {block} have shape {deltas.shape[1:]}, its values "
                                     f"have {vals.shape[1:]}")
                raise StoreError(f"deltas are {deltas.dtype}, cannot update {vals.dtype} values")
        for k in blk.extra:
            if isinstance(k, int):
                for i in np.flatnonzero(keys == k):
                    self.check_update(k, func, deltas[i], block)

    def update_many(self, block: int, func: str, keys: np.ndarray, deltas: np.ndarray) -> None:
        """Apply func(value, delta) for every int64 key (check_update_many first: this does not
        roll back). Keys not held start as their delta."""
        ufunc = check_func(func)
        blk = self._held(block)
        keys, deltas = self._take_slow_keys(blk, keys, deltas, lambda k, d: self.update(k, func, d, block),
                                            castable=True)
        if not len(keys):
            return
        if func == "add" and blk.covers(keys):
            # Every held key once, in order (a small model's push): one in-place add, no lookup.
            values = blk.writable_values(self._retired)
            np.add(values[:blk.n], deltas, out=values[:blk.n], casting="same_kind")
            return
        rows, found = blk.lookup(keys)
        if not found.all():
            missing = np.flatnonzero(~found)
            uniq, first = np.unique(keys[missing], return_index=True)
            blk.insert(uniq, deltas[missing[first]])
            rest = np.ones(len(keys), bool)
            rest[missing[first]] = False   # their delta is now their value
            keys, deltas = keys[rest], deltas[rest]
            if not len(keys):
                return
            rows, _ = blk.lookup(keys)
        values = blk.writable_values(self._retired)
        if _strictly_increasing(rows):
            # Unique rows: one gather, one ufunc, one scatter (ufunc.at is ~15x slower).
            if func == "add" and len(rows) == blk.n:
                np.add(values[:blk.n], deltas, out=values[:blk.n], casting="same_kind")
            else:
                values[rows] = ufunc(values[rows], deltas, casting="same_kind")
        else:
            ufunc.at(values, rows, deltas.astype(values.dtype, copy=False))  # repeated keys accumulate

    def put_many(self, block: int, keys: np.ndarray, values: np.ndarray) -> None:
        """Set the value of every int64 key (the last of repeated keys wins)."""
        blk = self._held(block)
        keys, values = self._take_slow_keys(blk, keys, values, lambda k, v: self.put(k, v, block),
                                            castable=False)
        if not len(keys):
            return
        rows, found = blk.lookup(keys)
        if not found.all():
            missing = np.flatnonzero(~found)
            # np.unique keeps first occurrences: reverse so that the last write of a key wins.
            uniq, last = np.unique(keys[missing][::-1], return_index=True)
            blk.insert(uniq, values[missing[::-1][last]])
            if len(missing) == len(keys):
                return
            rows, found = blk.lookup(keys)
            keep = np.ones(len(keys), bool)
            keep[missing] = False
            rows, values = rows[keep], values[keep]
        blk.writable_values(self._retired)[rows] = values

    def _take_slow_keys(self, blk: _Block, keys: np.ndarray, values: np.ndarray,
                        one: Callable[[int, np.ndarray], None], castable: bool) -> tuple[np.ndarray, np.ndarray]:
        """Apply `one` (the per-key op) to the keys that cannot take the dense path; return the rest.

        Values of another row shape or dtype than the block's dense rows (an update may cast
        same_kind) go key by key, as do keys held in the block's dict: rare, and the per-key op has
        the exact semantics for them (a new layout moves a key to the dict, a bad shape is refused).
        """
        vals = blk.values
        if vals is not None and (vals.shape[1:] != values.shape[1:] or (
                vals.dtype != values.dtype and not (castable and np.can_cast(values.dtype, vals.dtype, "same_kind")))):
            for i in range(len(keys)):
                one(int(keys[i]), values[i])
            return keys[:0], values[:0]
        if not blk.extra:
            return keys, values
        slow = np.fromiter((int(k) in blk.extra for k in keys), bool, len(keys))
        for j in np.flatnonzero(slow):
            one(int(keys[j]), values[j])
        return keys[~slow], values[~slow]

    # -- migration and checkpoints -----------------------------------------------------------
    def export_arrays(self, block: int) -> BlockArrays:
        """The block as arrays (views, no copy: the caller sends them before anything mutates them;
        if something does, copy-on-write keeps these views intact)."""
        blk = self._present(block)
        if blk is None:
            raise StoreError(f"block {block} is not held by this store")
        keys, values = blk.dense()
        return BlockArrays(keys, values, list(blk.extra), list(blk.extra.values()))

    def import_arrays(self, block: int, data: BlockArrays) -> None:
        """Install a block received as arrays (copied), replacing any previous contents."""
        self._check_block(block)
        keys = np.asarray(data.keys)
        if keys.ndim != 1 or keys.dtype.kind not in "iu":
            raise StoreError(f"block {block}: dense keys must be a 1-D int array, got {keys.dtype} {keys.shape}")
        keys = keys.astype(np.int64, copy=False)
        if len(keys):
            values = data.values
            if values is None or values.ndim < 1 or len(values) != len(keys):
                raise StoreError(f"block {block}: {len(keys)} dense keys but values of shape "
                                 f"{None if values is None else values.shape}")
            wrong = np.flatnonzero(blocks_of_int_keys(keys, self.num_blocks) != block)
            if len(wrong):
                raise StoreError(f"key {int(keys[wrong[0]])} does not hash to block {block}")
            order = None if _strictly_increasing(keys) else np.argsort(keys, kind="stable")
            if order is not None:
                keys, values = keys[order], values[order]
                if not _strictly_increasing(keys):
                    raise StoreError(f"block {block}: repeated dense keys")
        if len(data.other_keys) != len(data.other_arrays):
            raise StoreError(f"block {block}: {len(data.other_keys)} keys but {len(data.other_arrays)} arrays")
        extra: dict[Key, np.ndarray] = {}
        for k, a in zip(data.other_keys, data.other_arrays):
            k = _check_key(k)
            if block_of(k, self.num_blocks) != block:
                raise StoreError(f"key {k!r} does not hash to block {block}")
            extra[k] = _owned_copy(a)
        blk = _Block()
        if len(keys):
            # Exactly sized and owning their memory (copy-on-write counts references to the base).
            blk.keys, blk.values, blk.n = keys.copy(), np.array(values, copy=True, order="C"), len(keys)
        blk.extra = extra
        self._blocks[block] = blk

    def export_block(self, block: int) -> tuple[list[Key], list[np.ndarray]]:
        """The block's keys and per-key arrays (views, no copy). The older form of export_arrays."""
        data = self.export_arrays(block)
        arrays = list(data.values) if data.values is not None else []
        return [*data.keys.tolist(), *data.other_keys], [*arrays, *data.other_arrays]

    def import_block(self, block: int, keys: Sequence[object], arrays: Sequence[np.ndarray]) -> None:
        """Install a block from per-key arrays (a peer or a checkpoint), replacing its contents."""
        self._check_block(block)
        if len(keys) != len(arrays):
            raise StoreError(f"block {block}: {len(keys)} keys but {len(arrays)} arrays")
        dense_keys: list[int] = []
        dense_rows: list[np.ndarray] = []
        other_keys: list[Key] = []
        other_arrays: list[np.ndarray] = []
        layout: tuple[np.dtype, tuple[int, ...]] | None = None
        for k, a in zip(keys, arrays):
            k = _check_key(k)
            a = np.asarray(a)
            if _is_dense_key(k) and (layout is None or layout == (a.dtype, a.shape)):
                layout = (a.dtype, a.shape)
                dense_keys.append(k)  # type: ignore[arg-type]
                dense_rows.append(a)
            else:
                other_keys.append(k)
                other_arrays.append(a)
        values = np.stack(dense_rows) if dense_rows else None
        self.import_arrays(block, BlockArrays(np.array(dense_keys, np.int64), values, other_keys, other_arrays))

"""The blocks one executor owns: key -> numpy array per block, with put / get / update.

Values are numpy arrays (MLR/NMF models are float32 rows or fixed-size row ranges, so a key is a
row/range index and its value a float32 vector). `update(key, func, delta)` applies a registered
commutative and associative function in place, so a server applies a pushed 8 MiB delta without
allocating. A block serialises to (keys, arrays) for migration over the data plane and checkpoints.
"""
from __future__ import annotations

import sys
from typing import Callable, Sequence

import numpy as np

from psruntime.ownership_table import Key, block_of

UpdateFunc = Callable[[np.ndarray, np.ndarray], None]


def _ufunc_in_place(ufunc: np.ufunc) -> UpdateFunc:
    def apply(value: np.ndarray, delta: np.ndarray) -> None:
        ufunc(value, delta, out=value, casting="same_kind")
    return apply


# Only commutative and associative functions: the order in which pushes from many workers arrive
# must not change the result (dissertation §3.3.2, update()).
UPDATE_FUNCS: dict[str, UpdateFunc] = {
    "add": _ufunc_in_place(np.add),
    "max": _ufunc_in_place(np.maximum),
    "min": _ufunc_in_place(np.minimum),
}


class StoreError(ValueError):
    """A store operation that cannot be applied (unknown function, missing key, shape mismatch)."""


# References to a stored array inside update() when nobody else holds it: the block dict, the local
# variable and getrefcount's own argument.
_UNSHARED_REFS = 3


def _check_key(key: object) -> Key:
    if isinstance(key, bool) or not isinstance(key, (int, str)):
        raise StoreError(f"key {key!r} must be an int or a str")
    return key  # type: ignore[return-value]


def _owned_copy(value: np.ndarray) -> np.ndarray:
    # Frame arrays are read-only views into the received buffer: keep a private, writable copy.
    return np.array(value, copy=True, order="C")


class BlockStore:
    """The blocks held by one executor. Not thread-safe: one event loop owns it."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise StoreError(f"num_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        self._blocks: dict[int, dict[Key, np.ndarray]] = {}

    # -- blocks ------------------------------------------------------------------------------
    def block_ids(self) -> list[int]:
        return sorted(self._blocks)

    def has_block(self, block: int) -> bool:
        return block in self._blocks

    def create_block(self, block: int) -> None:
        """Make an empty block present (a fresh job's owner starts with empty blocks)."""
        self._check_block(block)
        self._blocks.setdefault(block, {})

    def drop_block(self, block: int) -> None:
        self._blocks.pop(block, None)

    def block_nbytes(self, block: int) -> int:
        return sum(v.nbytes for v in self._blocks.get(block, {}).values())

    def nbytes(self) -> int:
        return sum(self.block_nbytes(b) for b in self._blocks)

    def _check_block(self, block: int) -> None:
        if not 0 <= block < self.num_blocks:
            raise StoreError(f"block {block} is out of range 0..{self.num_blocks - 1}")

    def _block_for(self, key: Key, block: int | None) -> dict[Key, np.ndarray]:
        b = block_of(key, self.num_blocks) if block is None else block
        try:
            return self._blocks[b]
        except KeyError:
            raise StoreError(f"block {b} (of key {key!r}) is not held by this store") from None

    # -- data access (Table 3.2) -------------------------------------------------------------
    def put(self, key: Key, value: np.ndarray, block: int | None = None) -> None:
        self._block_for(_check_key(key), block)[key] = _owned_copy(value)

    def get(self, key: Key, block: int | None = None) -> np.ndarray | None:
        """The stored array, or None. Not a copy: an update while the caller holds it goes to a copy
        (copy-on-write), so what the caller holds stays as it was when read."""
        return self._block_for(_check_key(key), block).get(key)

    def update(self, key: Key, func: str, delta: np.ndarray, block: int | None = None) -> None:
        """value = func(value, delta) in place; a missing key starts as `delta` (func's identity)."""
        try:
            apply = UPDATE_FUNCS[func]
        except KeyError:
            raise StoreError(f"unknown update function {func!r}; known: {sorted(UPDATE_FUNCS)}") from None
        data = self._block_for(_check_key(key), block)
        value = data.get(key)
        if value is None:
            data[key] = _owned_copy(delta)
            return
        if value.shape != delta.shape:
            raise StoreError(f"delta for key {key!r} has shape {delta.shape}, value has {value.shape}")
        if sys.getrefcount(value) > _UNSHARED_REFS:
            # Copy-on-write: someone still holds this array, typically the event loop's transport
            # sending it as a pull reply (uvloop sends from our memory, no copy). Updating it in
            # place would tear that reply, so the update goes to a fresh copy.
            value = data[key] = value.copy()
        try:
            apply(value, delta)
        except TypeError as e:  # numpy's UFuncTypeError on an unsafe cast, e.g. float64 into int32
            raise StoreError(f"cannot apply {func} to key {key!r}: {e}") from None

    def check_update(self, key: Key, func: str, delta: np.ndarray, block: int | None = None) -> None:
        """Raise StoreError if update(key, func, delta) would fail, without changing anything."""
        if func not in UPDATE_FUNCS:
            raise StoreError(f"unknown update function {func!r}; known: {sorted(UPDATE_FUNCS)}")
        value = self._block_for(_check_key(key), block).get(key)
        if value is None:
            return
        if value.shape != delta.shape:
            raise StoreError(f"delta for key {key!r} has shape {delta.shape}, value has {value.shape}")
        if not np.can_cast(delta.dtype, value.dtype, "same_kind"):
            raise StoreError(f"delta for key {key!r} is {delta.dtype}, cannot update a {value.dtype} value")

    def keys(self, block: int) -> list[Key]:
        return list(self._blocks.get(block, {}))

    # -- migration and checkpoints -----------------------------------------------------------
    def export_block(self, block: int) -> tuple[list[Key], list[np.ndarray]]:
        """The block's keys and arrays (no copy: the caller sends them before anything mutates them)."""
        data = self._blocks.get(block)
        if data is None:
            raise StoreError(f"block {block} is not held by this store")
        return list(data.keys()), list(data.values())

    def import_block(self, block: int, keys: Sequence[object], arrays: Sequence[np.ndarray]) -> None:
        """Install a block received from a peer or a checkpoint, replacing any previous contents."""
        self._check_block(block)
        if len(keys) != len(arrays):
            raise StoreError(f"block {block}: {len(keys)} keys but {len(arrays)} arrays")
        data: dict[Key, np.ndarray] = {}
        for k, a in zip(keys, arrays):
            k = _check_key(k)
            if block_of(k, self.num_blocks) != block:
                raise StoreError(f"key {k!r} does not hash to block {block}")
            data[k] = _owned_copy(a)
        self._blocks[block] = data

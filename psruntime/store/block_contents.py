"""The contents of one block of the elastic store: int keys as dense rows, other keys in a dict.

Dense rows are a sorted int64 key array and one (rows, *row_shape) values array, so looking up
many keys is one np.searchsorted and reading or updating them one fancy-indexed numpy op.
Appending keys in increasing order (how a model is initialised) fills spare capacity in place.
"""
from __future__ import annotations

import sys

import numpy as np

from psruntime.store.ownership_table import Key

# References to a block's values array when nobody holds a view of it: the slot and
# getrefcount's argument (see BlockContents.writable_values).
_UNSHARED_DENSE_REFS = 2
# References to a retired array when nobody holds a view of it: the list and getrefcount's argument.
_UNSHARED_RETIRED_REFS = 2
_GROWTH = 1.5     # capacity growth of the dense rows: bounds the spare memory to a third
# The first capacity: 16 rows, but no more rows than fit in this many bytes (at least one). A block
# holding one 8 MiB tensor as its only key would otherwise get a 128 MiB array, which no
# RetiredValues keeps, so every copy-on-write of it mapped fresh pages.
_FIRST_CAPACITY_ROWS = 16
_FIRST_CAPACITY_BYTES = 256 << 10


class RetiredValues:
    """Dense values arrays that a copy-on-write replaced, kept to take a later copy once nothing
    references them (a transport done sending a pull's reply from them).

    Why: in an executor every array over 256 KiB is a fresh mapping (psruntime.executor.tune_malloc),
    and faulting a fresh copy's pages in cost as much as the copy (1.2 ms at 8 MiB). A reply still
    being sent while the next push to its block arrives (replies queued together are released
    together) made every tenth pipelined 8 MiB push pay that. Arrays are kept up to
    `max_total_bytes` in all (the oldest go first), so what this pins stays bounded however large
    the blocks: a budget, not a count, because every block with a reply in flight holds one (the
    event loop releases a sent reply only after handling the reads that came with its end). Each
    kept array still owns its memory, so the reference count says whether a view of it is alive
    (see BlockContents).
    """

    def __init__(self, max_total_bytes: int = 64 << 20) -> None:
        self._max_total_bytes = max_total_bytes
        self._arrays: list[np.ndarray] = []
        self._total_bytes = 0

    def take(self, like: np.ndarray) -> np.ndarray | None:
        """A kept array of `like`'s shape and dtype that nothing else references, or None."""
        for i in range(len(self._arrays)):     # indexing, not iterating: no extra reference
            if (sys.getrefcount(self._arrays[i]) == _UNSHARED_RETIRED_REFS
                    and self._arrays[i].shape == like.shape and self._arrays[i].dtype == like.dtype):
                self._total_bytes -= self._arrays[i].nbytes
                return self._arrays.pop(i)
        return None

    def give(self, values: np.ndarray) -> None:
        """Keep `values` (replaced, perhaps still being read) for a later take; the oldest go
        while the kept arrays are over the budget."""
        if values.nbytes > self._max_total_bytes:
            return
        self._arrays.append(values)
        self._total_bytes += values.nbytes
        while self._total_bytes > self._max_total_bytes:
            self._total_bytes -= self._arrays.pop(0).nbytes


class BlockContents:
    """One block's contents: dense rows for the int keys of the block's layout, a dict for the rest.

    `keys[:n]` is sorted and unique; `values[:n]` are their rows. Both are buffers with spare
    capacity, and `values` always owns its memory (copy-on-write counts references to it).
    """

    __slots__ = ("keys", "values", "n", "extra", "version", "_covered", "_covered_at")

    def __init__(self) -> None:
        self.keys = np.zeros(0, np.int64)        # capacity buffer; [:n] sorted, unique
        self.values: np.ndarray | None = None    # (capacity, *row_shape); None until a first int key
        self.n = 0
        self.extra: dict[Key, np.ndarray] = {}
        self.version = 0                         # bumped whenever the dense keys change (insert, remove)
        # The read-only key array `covers` last found equal to keys[:n], at `version` then.
        self._covered: np.ndarray | None = None
        self._covered_at = -1

    # -- layout and lookup -------------------------------------------------------------------
    def fits(self, dtype: np.dtype, row_shape: tuple[int, ...]) -> bool:
        """Whether rows of this dtype and shape can be dense rows of this block."""
        return self.values is None or (self.values.dtype == dtype and self.values.shape[1:] == row_shape)

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row, found) for int64 `keys`; a row is meaningful only where found."""
        n = self.n
        if n == 0:
            return np.zeros(len(keys), np.int64), np.zeros(len(keys), bool)
        held = self.keys[:n]
        rows = np.searchsorted(held, keys)
        np.minimum(rows, n - 1, out=rows)
        return rows, held[rows] == keys

    def covers(self, keys: np.ndarray) -> bool:
        """Whether int64 `keys` are exactly the dense keys held, in order (then their rows are
        values[:n], no lookup needed: a small model's pull or push often names every key of a
        block). A read-only `keys` found covering is remembered until the dense keys change: the
        store's requests name the same keys per block over and over (store_requests.Groupings
        hands out the same read-only array each time), and the comparison is two numpy passes."""
        if keys is self._covered and self._covered_at == self.version:
            return True
        n = self.n
        if n > 0 and len(keys) == n and bool((self.keys[:n] == keys).all()):
            if not keys.flags.writeable:     # nobody can change it in place: safe to remember
                self._covered, self._covered_at = keys, self.version
            return True
        return False

    def row_of(self, key: int) -> int | None:
        if self.n == 0:
            return None
        i = int(np.searchsorted(self.keys[:self.n], key))
        return i if i < self.n and int(self.keys[i]) == key else None

    def writable_values(self, retired: RetiredValues) -> np.ndarray:
        """The dense values, copied first if a reader still holds a view of them (copy-on-write).
        The copy goes into an array of `retired` nothing references any more, else a fresh one,
        and the replaced array is kept in `retired` in turn."""
        assert self.values is not None
        if sys.getrefcount(self.values) > _UNSHARED_DENSE_REFS:
            fresh = retired.take(self.values)
            if fresh is None:
                fresh = np.empty_like(self.values)
            fresh[:self.n] = self.values[:self.n]
            retired.give(self.values)
            self.values = fresh
        return self.values

    # -- changing the dense rows -------------------------------------------------------------
    def _reserve(self, rows: int) -> None:
        assert self.values is not None
        cap = len(self.keys)
        if rows <= cap:
            return
        row_bytes = max(1, int(np.prod(self.values.shape[1:], dtype=np.int64)) * self.values.itemsize)
        first = max(1, min(_FIRST_CAPACITY_ROWS, _FIRST_CAPACITY_BYTES // row_bytes))
        cap = max(rows, int(cap * _GROWTH), first)
        keys = np.empty(cap, np.int64)
        keys[:self.n] = self.keys[:self.n]
        values = np.empty((cap, *self.values.shape[1:]), self.values.dtype)
        values[:self.n] = self.values[:self.n]
        self.keys, self.values = keys, values

    def insert(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """Add new int64 `keys` (sorted, unique, none held yet) with their value `rows` (copied)."""
        if not len(keys):
            return
        if self.values is None:
            self.values = np.empty((0, *rows.shape[1:]), rows.dtype)
        n, k = self.n, len(keys)
        if n == 0 or keys[0] > self.keys[n - 1]:
            # Appending in key order (model initialisation): in place, amortised by the capacity.
            self._reserve(n + k)
            self.keys[n:n + k] = keys
            self.values[n:n + k] = rows
        else:
            all_keys = np.concatenate([self.keys[:n], keys])
            order = np.argsort(all_keys, kind="stable")
            self.keys = all_keys[order]
            self.values = np.concatenate([self.values[:n], rows.astype(self.values.dtype, copy=False)])[order]
        self.n = n + k
        self.version += 1

    def remove(self, key: int) -> None:
        row = self.row_of(key)
        if row is not None and self.values is not None:
            self.keys = np.delete(self.keys[:self.n], row)
            self.values = np.delete(self.values[:self.n], row, axis=0)
            self.n -= 1
            self.version += 1

    def dense(self) -> tuple[np.ndarray, np.ndarray | None]:
        if self.values is None:
            return self.keys[:0], None
        return self.keys[:self.n], self.values[:self.n]

    def nbytes(self) -> int:
        dense = self.n * self.values[:1].nbytes if self.values is not None and len(self.values) else 0
        return dense + sum(v.nbytes for v in self.extra.values())

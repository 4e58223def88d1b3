"""A worker's write-back cache of model rows for one sync window (Bösen's client cache and oplog).

With a job's `sync_batches` k > 1 (docs/internals.md, "PS jobs": sync windows), a worker syncs with
the servers once per window of k mini-batches instead of once per mini-batch
(psruntime.training_pipeline): inside the window it reads model rows from this cache, pulled from
their servers when the window begins, with the worker's own deltas of the window applied
(read-my-writes). At the window's end what the window added goes to the servers as one push per
owner (`take_oplog`) and the cache is dropped, so the next window reads what every worker pushed
meanwhile. One worker alone therefore runs the sequential mini-batch loop; several see each
other's updates at window boundaries rather than after every mini-batch -- within BSP's promise,
which is only that a clock sees the clocks before it.

The oplog is not summed as it goes: a row keeps the value it was pulled with (its base), and what
the window added is the row now minus its base, taken once at the window's end. That spares a
second add per mini-batch (a tenth of a small MLR batch's cost). The server's base + (row - base)
is the worker's row itself where the subtraction is exact (the row stayed within a factor of two
of its base, Sterbenz's lemma) and otherwise differs from it by float32 rounding, so one worker's
model is the sequential loop's up to rounding (in tests/unit/test_training_pipeline.py: 12 % of a tiny
MLR model's values differ in their last bits, none by more than 1e-4 relative).

Sans-I/O: numpy only; the pipeline pulls and pushes. Keys are the app's model keys, the dense range
0 .. num_keys-1 (docs/app_api.md), so a key finds its row through a slot per key (an int32 array of
num_keys, -1 for none): a lookup is one fancy index. The rows themselves are only those the window
used, appended in arrays that grow by doubling. A key written before it was read (an app may push
to rows it did not pull) is kept as a write-only entry with base 0: a later read pulls the row and
adds what was written to it.
"""
from __future__ import annotations

import numpy as np

from psruntime.apps.sorted_unique import keys_outside, sorted_unique, strictly_increasing


class WriteBackCache:
    """The model rows one sync window read, with the window's own deltas applied, and the rows
    as pulled (module doc)."""

    def __init__(self, num_keys: int, key_length: int) -> None:
        self.key_length = key_length
        self._slot = np.full(num_keys, -1, np.int32)        # per key: its row, -1 for none
        self._keys = np.empty(0, np.int64)                   # per row: its key
        self._values = np.empty((0, key_length), np.float32) # per row: the row, the window's deltas in
        self._base = np.empty((0, key_length), np.float32)   # per row: as pulled (0: write-only)
        self._known = np.empty(0, bool)     # the row's server value was pulled in this window
        self._rows = 0
        self._write_only = False            # `apply` may have added rows not pulled

    def __len__(self) -> int:
        return self._rows

    @property
    def dirty(self) -> bool:
        """The window has deltas not yet taken."""
        n = self._rows
        return bool((self._values[:n] != self._base[:n]).any())

    def clear(self) -> None:
        """Drop every row (the window ended, or was abandoned)."""
        n = self._rows
        self._slot[self._keys[:n]] = -1
        self._values[:n] = 0
        self._base[:n] = 0
        self._known[:n] = False
        self._rows = 0
        self._write_only = False

    def _rows_of(self, keys: np.ndarray) -> np.ndarray:
        """Each key's row, adding zero, unknown rows for keys without one (keys may repeat)."""
        rows = self._slot[keys]
        new = rows < 0
        if new.any():
            fresh = sorted_unique(keys[new])     # not np.unique: its hash set fragments the heap
            n, m = self._rows, len(fresh)
            if n + m > len(self._keys):
                self._grow(n + m)
            self._keys[n:n + m] = fresh
            self._slot[fresh] = np.arange(n, n + m, dtype=np.int32)
            self._rows = n + m
            rows = self._slot[keys]
        return rows

    def _grow(self, need: int) -> None:
        size = max(need, 2 * len(self._keys), 64)
        grow = size - len(self._keys)
        self._keys = np.concatenate([self._keys, np.zeros(grow, np.int64)])
        self._values = np.concatenate([self._values, np.zeros((grow, self.key_length), np.float32)])
        self._base = np.concatenate([self._base, np.zeros((grow, self.key_length), np.float32)])
        self._known = np.concatenate([self._known, np.zeros(grow, bool)])

    def missing(self, keys: np.ndarray) -> np.ndarray:
        """The keys of `keys` whose rows must be pulled before `read` (not yet read this window)."""
        rows = self._slot[keys]
        need = rows < 0
        need[~need] = ~self._known[rows[~need]]
        return keys[need]

    def fill(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Rows just pulled for `keys` (unique): a write-only entry's writes are added to its row."""
        if not len(keys):
            return
        rows = self._rows_of(keys)
        fresh = ~self._known[rows]
        rows = rows[fresh]
        pulled = values[fresh]
        self._values[rows] += pulled      # a write-only row holds what was written (its base 0)
        self._base[rows] = pulled
        self._known[rows] = True

    def rows(self, keys: np.ndarray) -> np.ndarray:
        """The rows of `keys`, every one filled this window (KeyError otherwise): for `read_rows`
        and `add_rows`, one lookup for a mini-batch's read and its deltas."""
        rows = self._slot[keys]
        # A row is known once filled and until the cache is cleared, and only `apply` adds unknown
        # (write-only) ones: a cache no `apply` wrote to needs only the slots checked.
        if len(rows) and (rows.min() < 0 or (self._write_only and not self._known[rows].all())):
            raise KeyError(f"{len(self.missing(keys))} keys were not pulled into the cache before reading")
        return rows

    def read_rows(self, rows: np.ndarray) -> np.ndarray:
        """The values of `rows` (from `rows`), as a new (len(rows), key_length) array."""
        return self._values[rows]

    def read(self, keys: np.ndarray) -> np.ndarray:
        """The rows of `keys` (every one filled this window), as a new (len(keys), key_length) array."""
        return self._values[self.rows(keys)]

    def _check_shape(self, n: int, deltas: np.ndarray) -> None:
        # Not numpy's broadcasting: a (n, 1) delta would be added to every column of its row.
        if deltas.shape != (n, self.key_length):
            raise ValueError(f"deltas of shape {deltas.shape} for {n} keys: the cache's rows are "
                             f"({n}, {self.key_length})")

    def add_rows(self, rows: np.ndarray, deltas: np.ndarray) -> None:
        """Add `deltas`, (len(rows), key_length), to `rows` (from `rows`, of unique keys)."""
        self._check_shape(len(rows), deltas)
        self._values[rows] += deltas

    def apply(self, keys: np.ndarray, deltas: np.ndarray) -> None:
        """Add `deltas`, (len(keys), key_length), to the rows of `keys` (keys may repeat; a key not
        read becomes write-only). A key outside 0 .. num_keys-1 is refused (ValueError), not wrapped."""
        self._check_shape(len(keys), deltas)
        if not len(keys):
            return
        if keys.dtype.kind not in "iu" or keys_outside(keys, len(self._slot)):
            raise ValueError(f"keys must be integers in 0 .. {len(self._slot) - 1}, got {keys.dtype} keys "
                             f"(min {keys.min()}, max {keys.max()})")
        self._write_only = True
        rows = self._rows_of(keys)
        if strictly_increasing(keys):       # unique: a plain fancy add
            self._values[rows] += deltas
        else:
            np.add.at(self._values, rows, deltas)

    def take_oplog(self) -> tuple[np.ndarray, np.ndarray]:
        """What the window added, (keys, sums) of every row it changed, sorted by key; the cache is
        cleared."""
        n = self._rows
        diff = self._values[:n] - self._base[:n]
        changed = np.flatnonzero(diff.any(axis=1))
        order = np.argsort(self._keys[changed], kind="stable")
        rows = changed[order]
        keys, sums = self._keys[rows], diff[rows]
        self.clear()
        return keys, sums

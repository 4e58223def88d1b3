"""A worker's write-back cache of model rows for one sync window (Bösen's client cache and oplog).

With a job's `sync_batches` k > 1 (docs/internals.md, "PS jobs": sync windows), a worker syncs with
the servers once per window of k mini-batches instead of once per mini-batch
(psruntime.training_pipeline): inside the window it reads model rows from this cache, each row
pulled from its server the first time the window needs it, with the worker's own deltas of the
window applied (read-my-writes), and it sums those deltas per key (the oplog). At the window's end
the sums go to the servers as one push per owner (`take_oplog`) and the cache is dropped, so the
next window reads what every worker pushed meanwhile. One worker alone therefore runs exactly the
sequential mini-batch loop (up to float32 rounding: the server adds the window's sum once, the cache
added each delta); several see each other's updates at window boundaries rather than after every
mini-batch -- within BSP's promise, which is only that a clock sees the clocks before it.

Sans-I/O: numpy only; the pipeline pulls and pushes. Keys are the app's model keys, the dense range
0 .. num_keys-1 (docs/app_api.md), so a key finds its row through a slot per key (an int32 array of
num_keys, -1 for none): a lookup is one fancy index, where a search over the window's keys cost
several times that per mini-batch. The rows themselves are only those the window used, appended in
arrays that grow by doubling. A key written before it was read (an app may push to rows it did
not pull) is kept as a write-only entry: its sum goes in the oplog, and a later read pulls the row
and adds the sum to it.
"""
from __future__ import annotations

import numpy as np


class WriteBackCache:
    """The model rows one sync window read, with the window's own deltas applied, and the deltas'
    sums per key (module doc)."""

    def __init__(self, num_keys: int, key_length: int) -> None:
        self.key_length = key_length
        self._slot = np.full(num_keys, -1, np.int32)        # per key: its row, -1 for none
        self._keys = np.empty(0, np.int64)                   # per row: its key
        self._values = np.empty((0, key_length), np.float32) # per row: the model row as read
        self._sums = np.empty((0, key_length), np.float32)   # per row: the window's deltas
        self._known = np.empty(0, bool)     # the row's server value was pulled in this window
        self._touched = np.empty(0, bool)   # the window pushed to the row's key
        self._rows = 0

    def __len__(self) -> int:
        return self._rows

    @property
    def dirty(self) -> bool:
        """The window has deltas not yet taken."""
        return bool(self._touched[:self._rows].any())

    def clear(self) -> None:
        """Drop every row and sum (the window ended, or was abandoned)."""
        n = self._rows
        self._slot[self._keys[:n]] = -1
        self._sums[:n] = 0
        self._values[:n] = 0
        self._known[:n] = False
        self._touched[:n] = False
        self._rows = 0

    def _rows_of(self, keys: np.ndarray) -> np.ndarray:
        """Each key's row, adding zero, unknown rows for keys without one (keys may repeat)."""
        rows = self._slot[keys]
        new = rows < 0
        if new.any():
            fresh = np.unique(keys[new])
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
        self._sums = np.concatenate([self._sums, np.zeros((grow, self.key_length), np.float32)])
        self._known = np.concatenate([self._known, np.zeros(grow, bool)])
        self._touched = np.concatenate([self._touched, np.zeros(grow, bool)])

    def missing(self, keys: np.ndarray) -> np.ndarray:
        """The keys of `keys` whose rows must be pulled before `read` (not yet read this window)."""
        rows = self._slot[keys]
        need = rows < 0
        need[~need] = ~self._known[rows[~need]]
        return keys[need]

    def fill(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Rows just pulled for `keys` (unique): a write-only entry's sum is added to its row."""
        if not len(keys):
            return
        rows = self._rows_of(keys)
        fresh = ~self._known[rows]
        rows = rows[fresh]
        self._values[rows] = values[fresh] + self._sums[rows]
        self._known[rows] = True

    def read(self, keys: np.ndarray) -> np.ndarray:
        """The rows of `keys` (every one filled this window), as a new (len(keys), key_length) array."""
        rows = self._slot[keys]
        if (rows < 0).any() or not self._known[rows].all():
            raise KeyError(f"{len(self.missing(keys))} keys were not pulled into the cache before reading")
        return self._values[rows]

    def apply(self, keys: np.ndarray, deltas: np.ndarray) -> None:
        """Add `deltas` to the rows of `keys` and to the window's sums (keys may repeat)."""
        if not len(keys):
            return
        rows = self._rows_of(keys)
        if len(keys) < 2 or (keys[1:] > keys[:-1]).all():     # unique: a plain fancy add
            self._values[rows] += deltas
            self._sums[rows] += deltas
        else:
            np.add.at(self._values, rows, deltas)
            np.add.at(self._sums, rows, deltas)
        self._touched[rows] = True

    def take_oplog(self) -> tuple[np.ndarray, np.ndarray]:
        """The window's (keys, sums) of every key it pushed to, sorted by key; the cache is cleared."""
        n = self._rows
        touched = np.flatnonzero(self._touched[:n])
        order = np.argsort(self._keys[touched], kind="stable")
        rows = touched[order]
        keys, sums = self._keys[rows], self._sums[rows]
        self.clear()
        return keys, sums

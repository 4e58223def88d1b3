"""Large byte buffers reused once nothing references them any more (data-plane bodies and replies).

Why: the executor fixes glibc's mmap threshold (psruntime.executor.tune_malloc), so every array
over 256 KiB is a fresh mapping, and faulting in and zeroing its pages costs about as much as
receiving or gathering the bytes into it (1.2 ms for 8 MiB against 0.17 ms into a reused buffer).

A buffer handed out is free again when its reference count is back to what the pool holds: any
array viewing it (np.frombuffer, slices, reshapes: numpy keeps the owner as their base), any
memoryview or buffer export of it (a transport still sending it) holds a reference. The check
copy-on-write uses in psruntime.store.block_contents.
"""
from __future__ import annotations

import math
import sys

import numpy as np

MIN_BYTES = 64 << 10       # smaller buffers come from malloc's heap, cheap as they are
MAX_BYTES = 64 << 20       # larger ones are not kept: what a pool pins stays bounded
# Per pool (one per connection): a server releases a request body once handled, so it keeps one;
# a client whose caller pipelines holds the last pull's values while the next pull's arrive, on
# two loops at once, so three. A pool grows only while all it keeps are in use: it keeps the peak
# of what was in use at once, up to this many (one buffer made every pipelined 8 MiB pull of
# bench/dataplane.py fault in a fresh mapping).
BUFFERS = 3

# References to a kept buffer when nobody else holds it: the pool's list and getrefcount's argument.
_UNSHARED_REFS = 2


class BufferPool:
    """Hands out uint8 arrays, reusing a kept buffer when nothing else references it.

    Keeps at most `count` buffers, each at most `max_bytes` and no more than twice the size it
    serves, so what a pool pins follows the sizes it currently serves.
    """

    def __init__(self, count: int = BUFFERS, max_bytes: int = MAX_BYTES) -> None:
        self._count = count
        self._max_bytes = max_bytes
        self._bufs: list[np.ndarray] = []

    def take(self, nbytes: int) -> np.ndarray:
        """A uint8 array of `nbytes` that nothing else references (its contents are undefined)."""
        if nbytes < MIN_BYTES or nbytes > self._max_bytes:
            return np.empty(nbytes, np.uint8)   # np.empty: no zero-fill pass the caller overwrites
        free = -1
        for i in range(len(self._bufs)):     # indexing, not iterating: no extra reference
            if sys.getrefcount(self._bufs[i]) == _UNSHARED_REFS:
                if nbytes <= len(self._bufs[i]) <= 2 * nbytes:
                    return self._bufs[i][:nbytes]
                free = i
        fresh = np.empty(nbytes, np.uint8)
        if free >= 0:
            self._bufs[free] = fresh            # a free buffer of the wrong size is replaced
        elif len(self._bufs) < self._count:
            self._bufs.append(fresh)
        return fresh[:nbytes]

    def take_array(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An uninitialised array of `shape` and `dtype` (C order) from take()."""
        n = math.prod(shape) * dtype.itemsize
        return self.take(n).view(dtype).reshape(shape)

    def clear(self) -> None:
        """Forget the kept buffers (a closed connection): they are freed once unreferenced."""
        self._bufs.clear()

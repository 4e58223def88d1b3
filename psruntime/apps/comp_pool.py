"""The threads a COMP may shard its numpy work over (`StepContext.threads`, the job's `comp_threads`).

Under Harmony a COMP holds `threads` cores of its node's arbiter pool (docs/harmony_arbiter.md), so
an app that can split its compute into independent pieces -- column ranges of a product, rows of a
batch -- runs them here, side by side: numpy and scipy.sparse release the GIL in their kernels, so
the pieces really use several cores. `run_shards` returns the pieces' results in order, so an app
that assembles them the same way computes the same numbers whatever the thread count (the same
seed trains the same trajectory).

One pool per thread count, kept for the process (a worker's COMPs run one at a time, so a pool is
never shared by two COMPs of the same executor); with one thread the pieces run in the caller.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np

T = TypeVar("T")
R = TypeVar("R")

_pools: dict[int, ThreadPoolExecutor] = {}
_lock = threading.Lock()


def _pool(threads: int) -> ThreadPoolExecutor:
    with _lock:
        pool = _pools.get(threads)
        if pool is None:
            pool = _pools[threads] = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="comp-shard")
        return pool


def run_shards(fn: Callable[[T], R], pieces: Sequence[T], threads: int) -> list[R]:
    """[fn(p) for p in pieces], over up to `threads` threads; results in the pieces' order."""
    if threads <= 1 or len(pieces) <= 1:
        return [fn(p) for p in pieces]
    return list(_pool(min(threads, len(pieces))).map(fn, pieces))


def split_range(n: int, parts: int) -> list[tuple[int, int]]:
    """[lo, hi) ranges cutting range(n) into at most `parts` nearly equal, non-empty pieces."""
    parts = max(1, min(parts, n))
    bounds = [n * i // parts for i in range(parts + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(parts) if bounds[i + 1] > bounds[i]]


def sum_in_order(parts: Sequence[np.ndarray]) -> np.ndarray:
    """The shards' partial sums added in shard order, into the first (returned): the total does not
    depend on the threads' timing, and with one shard it is that shard's array, unchanged."""
    total = parts[0]
    for p in parts[1:]:
        total += p
    return total

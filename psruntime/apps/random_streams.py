"""Deterministic random streams for data generation and model initialisation.

Every random draw is made from a generator seeded by ``(seed, stream, index)``, where the index
is a block or a chunk of keys. That is what makes generation deterministic by seed *and* by
partition: block b's rows are the same whether one worker generates all blocks or worker i of n
generates only its own, and a server initialises a key to the same value whichever keys it owns.
"""
from __future__ import annotations

import numpy as np

from psruntime.apps.sorted_unique import sorted_unique, unique_of_sorted

# Stream ids: one per independent use of randomness, so adding a use never shifts another.
TRUTH = 1        # ground-truth model of the synthetic data
TRAIN = 2        # training rows, per block
HELDOUT = 3      # held-out rows, per block
MODEL_INIT = 4   # initial server model values, per chunk of keys
STATE_INIT = 5   # initial worker-local state of a block
STEP = 6         # randomness used by compute (LDA sampling), per (epoch, block, batch)

KEY_CHUNK = 1024  # keys drawn together by `keyed_uniform`; fixed so values don't depend on the caller's key set


def rng_for(seed: int, stream: int, *index: int) -> np.random.Generator:
    """A generator that depends only on (seed, stream, index...)."""
    return np.random.default_rng([int(seed), int(stream), *(int(i) for i in index)])


def block_row_range(num_rows: int, rows_per_block: int, block_index: int) -> tuple[int, int]:
    """[start, stop) rows of a block; the last block may be short."""
    start = block_index * rows_per_block
    return start, min(num_rows, start + rows_per_block)


def num_blocks(num_rows: int, rows_per_block: int) -> int:
    return -(-num_rows // rows_per_block)


def partition_block_range(total_blocks: int, partition_index: int, num_partitions: int) -> range:
    """Blocks of partition i of n: contiguous, sizes differing by at most one block."""
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    if not 0 <= partition_index < num_partitions:
        raise ValueError(f"partition_index must be in [0, {num_partitions}), got {partition_index}")
    return range(total_blocks * partition_index // num_partitions,
                 total_blocks * (partition_index + 1) // num_partitions)


def sample_row_indices(rng: np.random.Generator, counts: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row r, about counts[r] distinct column indices in [0, dim), sorted within the row.

    Draws with replacement and drops duplicates, which keeps it O(total) for huge `dim`
    (the count of a row shrinks slightly when dim is small). Returns (indptr int64, indices int32).
    """
    counts = np.asarray(counts, dtype=np.int64)
    # (row, col) pairs as row * dim + col, built and sorted in place: this is most of a worker's
    # transient memory while it generates its data, at 16 bytes per entry instead of ~40.
    cols = rng.integers(0, dim, size=int(counts.sum()), dtype=np.int64)
    keys = np.repeat(np.arange(len(counts), dtype=np.int64) * dim, counts)
    keys += cols
    del cols
    keys.sort()
    keys = unique_of_sorted(keys)            # sorted by (row, col), duplicates removed
    # Row r's entries are the keys in [r * dim, (r + 1) * dim).
    indptr = np.searchsorted(keys, np.arange(len(counts) + 1, dtype=np.int64) * dim).astype(np.int64)
    np.remainder(keys, dim, out=keys)
    return indptr, keys.astype(np.int32)


def keyed_uniform(seed: int, stream: int, keys: np.ndarray, length: int,
                  low: float, high: float) -> np.ndarray:
    """Uniform float32 rows, one per key, that depend only on (seed, stream, key)."""
    keys = np.asarray(keys, dtype=np.int64)
    out = np.empty((len(keys), length), dtype=np.float32)
    chunks = keys // KEY_CHUNK
    for chunk in sorted_unique(chunks):
        sel = chunks == chunk
        table = rng_for(seed, stream, int(chunk)).uniform(low, high, size=(KEY_CHUNK, length))
        out[sel] = table[keys[sel] - chunk * KEY_CHUNK]
    return out

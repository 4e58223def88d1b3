"""Sparse feature rows shared by MLR and Lasso: generation and the key layout of feature weights.

Feature weights are grouped into keys of `features_per_key` consecutive features: key k holds the
weights of features [k*R, (k+1)*R) as a flat (R, width) row-major vector (width = classes for MLR,
1 for Lasso). The last key is padded with weights that no sample touches, so they stay 0.

Products of a design with float32 weights are computed in float64 a few weight columns (and, for
whole blocks, a few rows) at a time: a whole (features x classes) float64 copy of the weights, or
a whole block's design, would be several MB of temporaries on a worker whose data is a few tens
of MB. Chunking changes no value: sparse x dense accumulates every output element alone, over the
row's entries in order, whatever other rows and columns are computed with it.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
import scipy.sparse as sp

from psruntime.apps.blocks import DataBlock
from psruntime.apps.random_streams import sample_row_indices
from psruntime.apps.sorted_unique import sorted_unique

# Budget of one chunk's float64 temporaries (a converted weight column chunk, a chunk's design).
# 4 MB: at 1 MB a 128-class model's products ran in ~40 sparse products of 3 columns each, and the
# objective took ~1.7x as long; 4 MB is as fast as unchunked and still far below the copies it avoids.
PRODUCT_CHUNK_BYTES = 4 << 20


def generate_sparse_rows(rng: np.random.Generator, num_rows: int, num_features: int,
                         nnz_per_row: int, values: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(indptr, features int32, values float32) with about `nnz_per_row` distinct features per row.

    values: "uniform" draws U(0, 1) (non-negative, like tf-idf features), "normal" draws N(0, 1).
    """
    counts = np.full(num_rows, min(nnz_per_row, num_features), dtype=np.int64)
    indptr, feats = sample_row_indices(rng, counts, num_features)
    if values == "uniform":
        vals = rng.random(len(feats), dtype=np.float32)
    else:
        vals = rng.standard_normal(len(feats), dtype=np.float32)
    return indptr, feats, vals


def batch_rows(block: DataBlock, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(indptr rebased to 0, features, values) of rows [start, stop) of a block."""
    ip = block.data["indptr"]
    lo, hi = int(ip[start]), int(ip[stop])
    return ip[start:stop + 1] - lo, block.data["features"][lo:hi], block.data["values"][lo:hi]


def keys_of_features(features: np.ndarray, features_per_key: int) -> np.ndarray:
    return sorted_unique(features.astype(np.int64) // features_per_key)


def local_design(indptr: np.ndarray, features: np.ndarray, values: np.ndarray,
                 keys: np.ndarray | None, features_per_key: int, num_features: int = 0) -> sp.csr_matrix:
    """The rows as a CSR matrix over the local columns of `keys` (key position * R + offset);
    with keys None, over all `num_features` features (column = feature)."""
    f = features.astype(np.int64)
    if keys is None:
        cols, width = f, num_features
    else:
        # In place where possible: this runs per mini-batch on the worker's hot path.
        offset = f % features_per_key
        f //= features_per_key
        cols = np.searchsorted(keys, f)
        del f
        cols *= features_per_key
        cols += offset
        width = len(keys) * features_per_key
    return sp.csr_matrix((values.astype(np.float64), cols, indptr), shape=(len(indptr) - 1, width))


def column_chunks(num_rows: int, num_cols: int) -> Iterator[tuple[int, int]]:
    """[lo, hi) column ranges of a (num_rows, num_cols) float64 array, ~PRODUCT_CHUNK_BYTES each."""
    step = max(1, PRODUCT_CHUNK_BYTES // (8 * max(num_rows, 1)))
    for lo in range(0, num_cols, step):
        yield lo, min(num_cols, lo + step)


def times_columns(x: sp.spmatrix, weights: np.ndarray) -> np.ndarray:
    """x @ float64(weights), (x rows, weights columns) float64, converting a few weight columns at
    a time (bit-identical to the whole product, see the module doc)."""
    rows, cols = weights.shape
    if x.shape[1] != rows:
        raise ValueError(f"design has {x.shape[1]} columns but weights have {rows} rows")
    out = np.empty((x.shape[0], cols))
    for lo, hi in column_chunks(rows, cols):
        out[:, lo:hi] = x @ weights[:, lo:hi].astype(np.float64)
    return out


def design_product(indptr: np.ndarray, features: np.ndarray, values: np.ndarray, keys: np.ndarray | None,
                   features_per_key: int, weights: np.ndarray) -> np.ndarray:
    """local_design(...) @ float64(weights) for many rows (a whole block), built a chunk of rows
    at a time so neither the design nor its index temporaries exist for the whole block. With
    keys None the design's columns are the features: `weights` has a row per feature."""
    n = len(indptr) - 1
    out = np.empty((n, weights.shape[1]))
    entries = int(indptr[-1] - indptr[0])
    # ~24 bytes of design temporaries per entry (int64 columns, float64 values, scipy's copies).
    step = max(1, n * (PRODUCT_CHUNK_BYTES // 24) // max(entries, 1))
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        a, b = int(indptr[lo]), int(indptr[hi])
        x = local_design(indptr[lo:hi + 1] - a, features[a:b], values[a:b], keys, features_per_key,
                         len(weights))
        out[lo:hi] = times_columns(x, weights)
    return out

"""Sparse feature rows shared by MLR and Lasso: generation and the key layout of feature weights.

Feature weights are grouped into keys of `features_per_key` consecutive features: key k holds the
weights of features [k*R, (k+1)*R) as a flat (R, width) row-major vector (width = classes for MLR,
1 for Lasso). The last key is padded with weights that no sample touches, so they stay 0.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from psruntime.apps.blocks import DataBlock
from psruntime.apps.random_streams import sample_row_indices


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
    return np.unique(features.astype(np.int64) // features_per_key)


def local_design(indptr: np.ndarray, features: np.ndarray, values: np.ndarray,
                 keys: np.ndarray, features_per_key: int) -> sp.csr_matrix:
    """The rows as a CSR matrix over the local columns of `keys` (key position * R + offset)."""
    f = features.astype(np.int64)
    key_pos = np.searchsorted(keys, f // features_per_key)
    cols = key_pos * features_per_key + f % features_per_key
    return sp.csr_matrix((values.astype(np.float64), cols, indptr),
                         shape=(len(indptr) - 1, len(keys) * features_per_key))

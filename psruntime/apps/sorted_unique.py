"""Sorted unique integers without numpy's hash-table path, which fragments the malloc heap.

NumPy >= 2.3 computes ``np.unique`` of integers with a C++ hash set: one small heap allocation
per distinct value. Freed, those nodes leave holes in glibc's brk heap that later multi-MB arrays
(a worker's data blocks, per-batch pulls) are carved from instead of getting their own mappings, so
the heap grows and is never returned: a worker's RSS stayed ~1.5x its data after generation. Sort
then mask allocates only whole arrays (mmapped and returned on free) and returns the same values.
`keys_outside` is the range check of such key arrays that the worker loop and its cache share.
"""
from __future__ import annotations

import numpy as np


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values of an integer array (flattened): what ``np.unique(values)``
    returns, in the same dtype."""
    a = np.asarray(values)
    if a.dtype.kind not in "biu":
        raise TypeError(f"sorted_unique needs an integer array, got dtype {a.dtype}")
    return unique_of_sorted(np.sort(a, axis=None))   # a sorted copy; the input is left alone


def unique_of_sorted(s: np.ndarray) -> np.ndarray:
    """The distinct values of an already sorted 1-D array (a new array; `s` is not changed)."""
    if len(s) < 2:
        return s.copy()
    keep = np.empty(len(s), dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def strictly_increasing(a: np.ndarray) -> bool:
    """Whether a 1-D array is sorted without repeats."""
    return len(a) < 2 or bool(np.all(a[1:] > a[:-1]))


_INT64, _UINT64 = np.dtype(np.int64), np.dtype(np.uint64)


def keys_outside(keys: np.ndarray, n: int) -> bool:
    """Any of the integer `keys` (non-empty) outside [0, n). One reduction for int64 keys (every
    app's): viewed as uint64 without a copy, a negative key is >= 2**63, so max() finds a key out
    of range at either end. Other integer dtypes: min and max."""
    dtype = keys.dtype
    if dtype is _INT64:
        return int(keys.view(_UINT64).max()) >= n
    return int(keys.max()) >= n or (dtype.kind == "i" and int(keys.min()) < 0)

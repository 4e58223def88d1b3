"""The collapsed Gibbs sweep of LDA over one mini-batch, as a numpy/loop hybrid.

A plain Gibbs sweep visits tokens one at a time, which costs a Python step per token. Here the
loop runs over *token positions*: step j resamples the j-th token of every document of the batch
at once. Within a document this is exact sequential Gibbs (its counts change between its tokens);
across documents the tokens of one step see each other's word-topic changes only after the step,
the same approximation AD-LDA makes across workers. The loop has max(doc length) steps.
"""
from __future__ import annotations

import numpy as np


def sample_batch(rng: np.random.Generator, indptr: np.ndarray, word_rows: np.ndarray, z: np.ndarray,
                 ndk: np.ndarray, nwk: np.ndarray, nk: np.ndarray, alpha: float, beta: float,
                 vocab_size: int) -> None:
    """One Gibbs sweep over the batch's tokens, updating z, ndk, nwk and nk in place.

    indptr: (docs+1) token offsets of the batch's documents (rebased to 0); word_rows: per token,
    its word's row in `nwk`; z: per token topic (int32); ndk: (docs, K) int32 doc-topic counts;
    nwk: (rows, K) float64 word-topic counts of the pulled words; nk: (K,) float64 topic totals.
    """
    k = ndk.shape[1]
    lengths = np.diff(indptr)
    order = np.argsort(-lengths, kind="stable")        # longest first: step j's docs are a prefix
    sorted_len = lengths[order]
    starts = indptr[:-1][order]
    vbeta = vocab_size * beta
    for j in range(int(sorted_len[0]) if len(sorted_len) else 0):
        m = int(np.searchsorted(-sorted_len, -j, side="left"))   # docs with length > j
        docs = order[:m]
        t = starts[:m] + j
        w = word_rows[t]
        old = z[t].astype(np.int64)
        ndk[docs, old] -= 1
        np.subtract.at(nwk, (w, old), 1.0)
        nk -= np.bincount(old, minlength=k)
        # Counts pulled under SSP may lag others' pushes; never let a stale count go negative.
        p = (ndk[docs] + alpha) * (np.maximum(nwk[w], 0.0) + beta) / (np.maximum(nk, 0.0) + vbeta)
        c = np.cumsum(p, axis=1)
        u = rng.random((m, 1)) * c[:, -1:]
        new = np.minimum((c < u).sum(axis=1), k - 1)
        z[t] = new
        ndk[docs, new] += 1
        np.add.at(nwk, (w, new), 1.0)
        nk += np.bincount(new, minlength=k)

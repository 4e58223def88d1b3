"""The apps' memory-bounded paths give bit-identical results to the plain whole-array math.

A worker's peak RSS was dominated by transients: numpy's hash-based ``np.unique`` fragmenting the
heap, whole-block (entries x rank) gathers, and (features x classes) float64 copies of the
weights and gradients. The apps now compute those in chunks; here each chunked path is compared,
bit for bit, against the whole-array formula it replaced (written out below as the reference),
with the chunk budgets made tiny so that every loop runs many times, and the transient memory of
generation and training is bounded with tracemalloc.
"""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import scipy.sparse as sp

from psruntime.apps import nmf as nmf_module
from psruntime.apps import sparse_features
from psruntime.apps.base import Batch, KeyValues, StepContext
from psruntime.apps.random_streams import rng_for, sample_row_indices
from psruntime.apps.registry import create_app
from psruntime.apps.sorted_unique import sorted_unique, unique_of_sorted

MLR_SPEC = {"num_samples": 900, "rows_per_block": 300, "num_features": 120, "num_classes": 7,
            "nnz_per_sample": 9, "num_heldout": 50}
NMF_SPEC = {"num_users": 600, "num_items": 150, "rank": 6, "observed_fraction": 0.1,
            "rows_per_block": 200, "num_heldout": 40}


@pytest.fixture
def tiny_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunk budgets of a few hundred bytes: every chunked loop runs many iterations."""
    monkeypatch.setattr(sparse_features, "PRODUCT_CHUNK_BYTES", 200)
    monkeypatch.setattr(nmf_module, "GATHER_CHUNK_BYTES", 100)


# ----- sorted_unique ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint16, np.uint64])
def test_sorted_unique_equals_np_unique(dtype: type) -> None:
    rng = np.random.default_rng(1)
    for n, hi in ((0, 5), (1, 5), (2, 2), (1000, 7), (5000, 100)):
        a = rng.integers(0, hi, n).astype(dtype)
        before = a.copy()
        got = sorted_unique(a)
        want = np.unique(a)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(a, before)          # the input is left alone
    np.testing.assert_array_equal(sorted_unique(np.array([[3, 1], [3, 2]])), [1, 2, 3])  # flattened


def test_sorted_unique_rejects_non_integers() -> None:
    with pytest.raises(TypeError, match="integer array.*float64"):
        sorted_unique(np.array([1.0, 2.0]))


def test_unique_of_sorted_returns_a_new_array() -> None:
    s = np.array([1, 1, 2, 5, 5, 5, 9])
    u = unique_of_sorted(s)
    np.testing.assert_array_equal(u, [1, 2, 5, 9])
    single = np.array([4])
    assert unique_of_sorted(single) is not single


# ----- generation ------------------------------------------------------------------------------

def _reference_sample_row_indices(rng: np.random.Generator, counts: np.ndarray, dim: int):
    """The original whole-array implementation."""
    counts = np.asarray(counts, dtype=np.int64)
    rows = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    cols = rng.integers(0, dim, size=len(rows), dtype=np.int64)
    keys = np.unique(rows * dim + cols)
    rows, cols = np.divmod(keys, dim)
    indptr = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=len(counts)), out=indptr[1:])
    return indptr, cols.astype(np.int32)


@pytest.mark.parametrize("counts,dim", [([3, 0, 5, 1], 4), ([50] * 40, 30), ([0, 0], 10), ([7] * 300, 100_000)])
def test_sample_row_indices_matches_the_whole_array_reference(counts: list[int], dim: int) -> None:
    got = sample_row_indices(rng_for(3, 2, 1), np.array(counts), dim)
    want = _reference_sample_row_indices(rng_for(3, 2, 1), np.array(counts), dim)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


def _block_arrays(blocks) -> list[np.ndarray]:
    return [a for b in blocks for a in (*b.data.values(), *b.state.values())]


@pytest.mark.parametrize("app_name,spec", [("mlr", MLR_SPEC), ("nmf", NMF_SPEC)])
def test_generation_does_not_depend_on_chunk_sizes(app_name: str, spec: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    app = create_app(app_name, spec, {})
    default = app.generate_partition(1, 2).blocks
    monkeypatch.setattr(sparse_features, "PRODUCT_CHUNK_BYTES", 200)
    monkeypatch.setattr(nmf_module, "GATHER_CHUNK_BYTES", 100)
    chunked = create_app(app_name, spec, {}).generate_partition(1, 2).blocks
    for a, b in zip(_block_arrays(default), _block_arrays(chunked), strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


def test_mlr_labels_match_the_whole_product_reference(tiny_chunks: None) -> None:
    app = create_app("mlr", MLR_SPEC, {})
    s = app.spec
    block = app.generate_block(2)
    # Reference: all rows at once over the block's features with float64 truth rows.
    start, n, rng = app._block_rows(2, False)
    indptr, feats, vals = sparse_features.generate_sparse_rows(rng, n, s.num_features, s.nnz_per_sample, "uniform")
    used = np.unique(feats).astype(np.int64)
    x = sp.csr_matrix((vals.astype(np.float64), np.searchsorted(used, feats), indptr), shape=(n, len(used)))
    logits = np.asarray(x @ app.true_weights[used].astype(np.float64))
    z = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(z - np.log(np.exp(z).sum(axis=1, keepdims=True)))
    u = rng.random((n, 1))
    labels = np.minimum((probs.cumsum(axis=1) < u).sum(axis=1), s.num_classes - 1).astype(np.int32)
    np.testing.assert_array_equal(block.data["labels"], labels)


# ----- training math ---------------------------------------------------------------------------

def _log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def _mlr_reference(app, block, start: int, stop: int, params: KeyValues):
    """The original whole-array MLR math: (delta values, logits) for rows [start, stop)."""
    r, c = app.hparams.features_per_key, app.spec.num_classes
    indptr, feats, vals = sparse_features.batch_rows(block, start, stop)
    f = feats.astype(np.int64)
    cols = np.searchsorted(params.keys, f // r) * r + f % r
    x = sp.csr_matrix((vals.astype(np.float64), cols, indptr), shape=(len(indptr) - 1, len(params.keys) * r))
    w = params.values.astype(np.float64).reshape(len(params.keys) * r, c)
    logits = np.asarray(x @ w)
    probs = np.exp(_log_softmax(logits))
    probs[np.arange(stop - start), block.data["labels"][start:stop]] -= 1.0
    grad = np.asarray(x.T @ probs) / (stop - start)
    grad += app.hparams.l2 * w
    lr = app.hparams.learning_rate / (1.0 + app.hparams.lr_decay * 3)
    return (-lr * grad).astype(np.float32).reshape(len(params.keys), app.key_length), logits


def test_mlr_chunked_step_and_objective_are_bit_identical(tiny_chunks: None) -> None:
    app = create_app("mlr", MLR_SPEC, {"learning_rate": 0.7, "l2": 0.03, "lr_decay": 0.2,
                                       "batch_size": 64, "features_per_key": 3})
    block = app.generate_block(0)
    rng = np.random.default_rng(5)
    for batch in app.batches(block):
        keys = app.keys_for_batch(batch)
        params = KeyValues(keys, rng.normal(0, 0.3, (len(keys), app.key_length)).astype(np.float32))
        got = app.compute(batch, params, StepContext(epoch=3))
        want, _ = _mlr_reference(app, block, batch.start, batch.stop, params)
        np.testing.assert_array_equal(got.keys, keys)
        assert got.values.dtype == np.float32
        np.testing.assert_array_equal(got.values, want)
    keys = app.objective_keys(block)
    params = KeyValues(keys, rng.normal(0, 0.3, (len(keys), app.key_length)).astype(np.float32))
    _, logits = _mlr_reference(app, block, 0, block.num_rows, params)
    want = -_log_softmax(logits)[np.arange(block.num_rows), block.data["labels"]].sum()
    part = app.objective(block, params)
    assert (part.value, part.count) == (float(want), block.num_rows)


def _nmf_reference(app, block, start: int, stop: int, params: KeyValues, epoch: int):
    """The original whole-array NMF math: (new W rows, delta values, squared error)."""
    hp = app.hparams
    ip = block.data["indptr"]
    lo, hi = int(ip[start]), int(ip[stop])
    counts = np.diff(ip[start:stop + 1])
    rows = np.repeat(np.arange(stop - start), counts)
    items, ratings = block.data["items"][lo:hi], block.data["ratings"][lo:hi]
    cols = params.rows_of(items.astype(np.int64))
    w = block.state["W"][start:stop].astype(np.float64)
    h = np.maximum(params.values.astype(np.float64), 0.0)
    err = (w[rows] * h[cols]).sum(axis=1) - ratings
    e = sp.csr_matrix((err, (rows, cols)), shape=(stop - start, len(params.keys)))
    gw, gh = np.asarray(e @ h), np.asarray(e.T @ w)
    lr = hp.learning_rate / (1.0 + hp.lr_decay * epoch)
    per_item = np.bincount(cols, minlength=len(params.keys))
    w_new = np.maximum(w - lr * (gw / np.maximum(counts, 1)[:, None] + hp.l2 * w), 0.0)
    h_new = np.maximum(h - lr * (gh / np.maximum(per_item, 1)[:, None] + hp.l2 * h), 0.0)
    return w_new, (h_new - h).astype(np.float32), float(np.dot(err, err))


def test_nmf_chunked_step_and_objective_are_bit_identical(tiny_chunks: None) -> None:
    app = create_app("nmf", NMF_SPEC, {"rank": 6, "batch_size": 37, "l2": 0.05, "lr_decay": 0.3})
    block = app.generate_block(1)
    app.init_block(block)
    rng = np.random.default_rng(9)
    for batch in app.batches(block):
        keys = app.keys_for_batch(batch)
        # Some negative values: the projection max(H, 0) must act the same way.
        params = KeyValues(keys, rng.normal(0.2, 0.3, (len(keys), app.key_length)).astype(np.float32))
        w_want, d_want, _ = _nmf_reference(app, block, batch.start, batch.stop, params, epoch=2)
        got = app.compute(batch, params, StepContext(epoch=2))
        np.testing.assert_array_equal(got.values, d_want)
        np.testing.assert_array_equal(block.state["W"][batch.start:batch.stop], w_want.astype(np.float32))
    keys = app.objective_keys(block)
    params = KeyValues(keys, rng.normal(0.2, 0.3, (len(keys), app.key_length)).astype(np.float32))
    _, _, sq = _nmf_reference(app, block, 0, block.num_rows, params, epoch=0)
    part = app.objective(block, params)
    assert (part.value, part.count) == (sq, int(block.data["indptr"][-1]))


def test_design_product_rejects_mismatched_weights() -> None:
    x = sp.csr_matrix(np.eye(3))
    with pytest.raises(ValueError, match="3 columns but weights have 4 rows"):
        sparse_features.times_columns(x, np.ones((4, 2), np.float32))


# ----- memory bounds ---------------------------------------------------------------------------
# Bounds on tracemalloc's peak (numpy reports its buffers to it), with 64 KiB chunk budgets so the
# chunks stay small against these small blocks. The whole-array code measured, on the same sizes:
# generation 4.5 (MLR) / 4.2 (NMF) blocks over the held partition, an MLR step 7.2x and an NMF
# step 9.6x the pulled values, an NMF objective 4.0 blocks; the chunked code 1.1 / 1.3, 1.5x,
# 5.8x and 1.3.

@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sparse_features, "PRODUCT_CHUNK_BYTES", 1 << 16)
    monkeypatch.setattr(nmf_module, "GATHER_CHUNK_BYTES", 1 << 16)


def _traced_peak(fn) -> tuple[int, object]:
    """(peak traced bytes above the start, fn's result) of calling fn."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        out = fn()
        return tracemalloc.get_traced_memory()[1] - base, out
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("app_name,spec,hparams", [
    ("mlr", {"num_samples": 8000, "num_features": 4000, "num_classes": 10, "nnz_per_sample": 40,
             "rows_per_block": 1000}, {}),
    ("nmf", {"num_users": 4000, "num_items": 3000, "rank": 10, "observed_fraction": 0.03,
             "rows_per_block": 500}, {"rank": 10}),
])
def test_generation_transients_stay_within_a_few_blocks(app_name: str, spec: dict, hparams: dict,
                                                        small_chunks: None) -> None:
    app = create_app(app_name, spec, hparams)
    app.generate_block(0)                       # the ground truth is cached: not a transient
    peak, part = _traced_peak(lambda: app.generate_partition(0, 1))
    block_bytes = part.nbytes / len(part.blocks)
    assert (peak - part.nbytes) / block_bytes <= 2.5, (peak, part.nbytes, block_bytes)


def test_mlr_step_transient_is_a_small_multiple_of_the_pulled_values(small_chunks: None) -> None:
    app = create_app("mlr", {"num_samples": 100, "rows_per_block": 100, "num_features": 4000,
                             "num_classes": 25, "nnz_per_sample": 20}, {"batch_size": 100})
    block = app.generate_block(0)
    batch = Batch(block, 0, block.num_rows)
    keys = app.keys_for_batch(batch)
    params = KeyValues(keys, np.full((len(keys), app.key_length), 0.01, np.float32))
    peak, _ = _traced_peak(lambda: app.compute(batch, params, StepContext()))
    assert peak <= 3 * params.values.nbytes, (peak, params.values.nbytes)


def test_nmf_step_and_objective_transients_are_bounded(small_chunks: None) -> None:
    app = create_app("nmf", {"num_users": 200, "rows_per_block": 200, "num_items": 3000, "rank": 20,
                             "observed_fraction": 0.01}, {"batch_size": 200, "rank": 20})
    block = app.generate_block(0)
    app.init_block(block)
    batch = Batch(block, 0, block.num_rows)
    keys = app.keys_for_batch(batch)
    params = KeyValues(keys, np.full((len(keys), app.key_length), 0.01, np.float32))
    peak, _ = _traced_peak(lambda: app.compute(batch, params, StepContext()))
    assert peak <= 7.5 * params.values.nbytes, (peak, params.values.nbytes)

    app = create_app("nmf", {"num_users": 2000, "rows_per_block": 2000, "num_items": 300, "rank": 4,
                             "observed_fraction": 0.2}, {"rank": 4})
    block = app.generate_block(0)
    app.init_block(block)
    keys = app.objective_keys(block)
    params = KeyValues(keys, np.full((len(keys), 4), 0.1, np.float32))
    peak, _ = _traced_peak(lambda: app.objective(block, params))
    assert peak <= 2.5 * block.nbytes, (peak, block.nbytes)

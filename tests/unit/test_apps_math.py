"""Each app's update math on tiny data: gradients against finite differences, LDA count invariants."""
from __future__ import annotations

import numpy as np
import pytest

from psruntime.apps.base import Batch, KeyValues, StepContext
from psruntime.apps.registry import create_app


def _fd(f, x: np.ndarray, coords: list[tuple[int, ...]], eps: float = 1e-5) -> np.ndarray:
    """Central finite differences of scalar f at x (float64) along the given coordinates."""
    out = []
    for c in coords:
        xp, xm = x.copy(), x.copy()
        xp[c] += eps
        xm[c] -= eps
        out.append((f(xp) - f(xm)) / (2 * eps))
    return np.array(out)


def _coords(rng: np.random.Generator, shape: tuple[int, ...], n: int = 12) -> list[tuple[int, ...]]:
    return [tuple(int(rng.integers(0, s)) for s in shape) for _ in range(n)]


def test_mlr_step_is_minus_lr_times_the_cross_entropy_gradient():
    lr, l2 = 0.3, 0.01
    app = create_app("mlr", {"num_samples": 60, "rows_per_block": 60, "num_features": 40,
                             "num_classes": 4, "nnz_per_sample": 6},
                     {"learning_rate": lr, "l2": l2, "batch_size": 60, "features_per_key": 3})
    block = app.generate_block(0)
    batch = Batch(block, 0, block.num_rows)
    keys = app.keys_for_batch(batch)
    np.testing.assert_array_equal(keys, app.objective_keys(block))
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.5, (len(keys), app.key_length))
    delta = app.compute(batch, KeyValues(keys, w), StepContext())
    np.testing.assert_array_equal(delta.keys, keys)
    grad = -delta.values.astype(np.float64) / lr

    def loss(v: np.ndarray) -> float:   # mean CE + the lazy L2 on the pulled rows
        return app.objective(block, KeyValues(keys, v)).value / block.num_rows + 0.5 * l2 * float((v ** 2).sum())

    coords = _coords(rng, w.shape)
    np.testing.assert_allclose(grad[tuple(np.array(coords).T)], _fd(loss, w, coords), rtol=1e-3, atol=1e-6)
    # the server part is the L2 term of the model it holds
    assert app.server_objective(KeyValues(keys, w)) == pytest.approx(0.5 * l2 * float((w ** 2).sum()))


def test_lasso_gradient_and_proximal_step():
    lr, l1 = 0.05, 0.2
    app = create_app("lasso", {"num_samples": 80, "rows_per_block": 80, "num_features": 50, "nnz_per_sample": 8},
                     {"learning_rate": lr, "l1": l1, "batch_size": 80, "features_per_key": 4})
    block = app.generate_block(0)
    batch = Batch(block, 0, block.num_rows)
    keys = app.keys_for_batch(batch)
    rng = np.random.default_rng(1)
    w = rng.normal(0, 0.3, (len(keys), app.key_length))
    w[0] = 0.004    # some weights within the threshold (lr * l1 = 0.01) of zero
    grad = app.loss_gradient(batch, KeyValues(keys, w)).reshape(w.shape)

    def loss(v: np.ndarray) -> float:
        return app.objective(block, KeyValues(keys, v)).value / block.num_rows

    coords = _coords(rng, w.shape)
    np.testing.assert_allclose(grad[tuple(np.array(coords).T)], _fd(loss, w, coords), rtol=1e-4, atol=1e-7)

    one = app.compute(batch, KeyValues(keys, w), StepContext(num_workers=1)).values.astype(np.float64)
    z = w - lr * grad
    expected = np.sign(z) * np.maximum(np.abs(z) - lr * l1, 0) - w
    np.testing.assert_allclose(one, expected, atol=1e-6)
    small = np.abs(z) <= lr * l1
    assert small.any() and np.all(np.abs(w + one)[small] < 1e-6)   # soft-thresholding zeroes them
    # with 3 workers each pushes a third of a step at 3 * lr, so the servers' sum is the average
    # of the workers' proximal steps at the linearly scaled step size
    three = app.compute(batch, KeyValues(keys, w), StepContext(num_workers=3)).values.astype(np.float64)
    z3 = w - 3 * lr * grad
    np.testing.assert_allclose(three, (np.sign(z3) * np.maximum(np.abs(z3) - 3 * lr * l1, 0) - w) / 3, atol=1e-6)
    unscaled = create_app("lasso", app.spec, {"learning_rate": lr, "l1": l1, "batch_size": 80,
                                              "features_per_key": 4, "scale_lr_with_workers": False})
    np.testing.assert_allclose(unscaled.compute(batch, KeyValues(keys, w), StepContext(num_workers=3)).values,
                               one / 3, atol=1e-6)
    assert app.server_objective(KeyValues(keys, w)) == pytest.approx(l1 * np.abs(w).sum())
    # without an explicit l1 the weight scales with the data's sparsity (nnz / features)
    assert create_app("lasso", {"num_features": 1000, "nnz_per_sample": 20}).l1 == pytest.approx(0.02 * 20 / 1000)


def test_nmf_gradients_match_finite_differences_and_steps_stay_non_negative():
    app = create_app("nmf", {"num_users": 30, "num_items": 25, "rows_per_block": 30, "observed_fraction": 0.4},
                     {"rank": 3, "learning_rate": 0.5, "batch_size": 30})
    block = app.generate_block(0)
    assert app.init_block(block) is None
    batch = Batch(block, 0, block.num_rows)
    keys = app.keys_for_batch(batch)
    rng = np.random.default_rng(2)
    h = rng.uniform(0.2, 1.0, (len(keys), 3))   # interior: the projection is inactive for the FD check
    block.state["W"] = rng.uniform(0.2, 1.0, (block.num_rows, 3))
    w0 = block.state["W"].copy()
    _, _, gw, gh = app.gradients(batch, KeyValues(keys, h))

    def loss_h(v: np.ndarray) -> float:
        return 0.5 * app.objective(block, KeyValues(keys, v)).value

    def loss_w(v: np.ndarray) -> float:
        block.state["W"] = v
        try:
            return 0.5 * app.objective(block, KeyValues(keys, h)).value
        finally:
            block.state["W"] = w0

    ch, cw = _coords(rng, h.shape), _coords(rng, w0.shape)
    np.testing.assert_allclose(gh[tuple(np.array(ch).T)], _fd(loss_h, h, ch), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(gw[tuple(np.array(cw).T)], _fd(loss_w, w0, cw), rtol=1e-4, atol=1e-7)

    block.state["W"] = w0.astype(np.float32)
    delta = app.compute(batch, KeyValues(keys, h.astype(np.float32)), StepContext())
    assert np.all(h + delta.values >= -1e-6)          # projected H
    assert np.all(block.state["W"] >= 0)              # projected local W, updated in place
    assert not np.allclose(block.state["W"], w0)
    # a negative stored value reads as 0 and its delta is taken from 0, never pushing it lower
    neg = h.astype(np.float32).copy()
    neg[0] = -5.0
    d = app.compute(batch, KeyValues(keys, neg), StepContext()).values
    assert np.all(d[0] >= 0)


def _recount(app, blocks):
    """Word-topic counts rebuilt from the blocks' assignments, as the full model layout."""
    k = app.key_length
    counts = np.zeros((app.num_keys, k))
    for b in blocks:
        np.add.at(counts, (b.data["words"], b.state["z"]), 1)
        counts[-1] += np.bincount(b.state["z"], minlength=k)
    return counts


def test_lda_counts_stay_consistent_through_init_and_sampling():
    app = create_app("lda", {"num_docs": 60, "rows_per_block": 30, "vocab_size": 50, "doc_length": 15},
                     {"num_topics": 4, "batch_size": 10})
    blocks = app.generate_partition(0, 1).blocks
    model = app.init_value(app.model_keys()).astype(np.float64)
    tokens = 0
    for b in blocks:
        d = app.init_block(b)
        np.add.at(model, d.keys, d.values)
        tokens += len(b.data["words"])
        np.testing.assert_array_equal(b.state["ndk"].sum(axis=1), np.diff(b.data["indptr"]))
    np.testing.assert_array_equal(model, _recount(app, blocks))
    assert model[-1].sum() == tokens and model[:-1].sum() == tokens

    for epoch in range(2):
        for b in blocks:
            for batch in app.batches(b):
                keys = app.keys_for_batch(batch)
                assert keys[-1] == app.totals_key
                params = KeyValues(keys, model[keys].astype(np.float32))
                snapshot = params.values.copy()
                delta = app.compute(batch, params, StepContext(epoch=epoch))
                np.testing.assert_array_equal(params.values, snapshot)   # compute never edits the pull
                assert delta.values.sum() == 0 and delta.values[-1].sum() == 0   # tokens only change topic
                np.testing.assert_array_equal(delta.values[:-1].sum(axis=0), delta.values[-1])
                np.add.at(model, delta.keys, delta.values)
        for b in blocks:
            np.testing.assert_array_equal(b.state["ndk"].sum(axis=1), np.diff(b.data["indptr"]))
            docs = np.repeat(np.arange(b.num_rows), np.diff(b.data["indptr"]))
            ndk = np.zeros_like(b.state["ndk"])
            np.add.at(ndk, (docs, b.state["z"]), 1)
            np.testing.assert_array_equal(ndk, b.state["ndk"])
        np.testing.assert_array_equal(model, _recount(app, blocks))
        assert np.all(model >= 0)


def test_lda_sampling_is_reproducible_by_epoch_and_block():
    app = create_app("lda", {"num_docs": 20, "rows_per_block": 20}, {"batch_size": 20})

    def run(epoch: int) -> np.ndarray:
        b = app.generate_block(0)
        d = app.init_block(b)
        batch = Batch(b, 0, b.num_rows)
        keys = app.keys_for_batch(batch)
        app.compute(batch, KeyValues(keys, d.values.copy()), StepContext(epoch=epoch))
        return b.state["z"].copy()

    np.testing.assert_array_equal(run(0), run(0))
    assert not np.array_equal(run(0), run(1))


def test_lda_objective_splits_into_worker_and_server_parts():
    """The per-token log-likelihood from parts equals log p(w, z) computed in one piece."""
    from scipy.special import gammaln

    app = create_app("lda", {"num_docs": 30, "rows_per_block": 10, "vocab_size": 40}, {"num_topics": 3})
    blocks = app.generate_partition(0, 1).blocks
    for b in blocks:
        app.init_block(b)
    model = _recount(app, blocks)
    a, beta, k, v = app.hparams.alpha, app.hparams.beta, 3, app.vocab
    parts = [app.objective(b, KeyValues(np.zeros(0, np.int64), np.zeros((0, k)))) for b in blocks]
    keys = app.model_keys()
    servers = [app.server_objective(KeyValues(keys[:17], model[:17])),
               app.server_objective(KeyValues(keys[17:], model[17:]))]
    ndk = np.concatenate([b.state["ndk"] for b in blocks]).astype(np.float64)
    nd = ndk.sum(axis=1)
    log_pz = (gammaln(k * a) - gammaln(nd + k * a)).sum() + (gammaln(ndk + a) - gammaln(a)).sum()
    log_pwz = (k * gammaln(v * beta) - gammaln(model[-1] + v * beta).sum()
               + (gammaln(model[:-1] + beta) - gammaln(beta)).sum())
    assert app.combine(parts, servers) == pytest.approx((log_pz + log_pwz) / nd.sum(), rel=1e-9)

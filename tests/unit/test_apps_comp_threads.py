"""A COMP over several threads (`StepContext.threads`): NMF, Lasso and LDA shard their mini-batch
over `comp_pool` into that many pieces; the deterministic apps' update equals one thread's up to
float summation order, LDA's sampler keeps its count invariants and converges like one thread."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from protocol import container_env
from psruntime.app_role import comp_threads
from psruntime.apps import comp_pool
from psruntime.apps.base import Batch, KeyValues, StepContext
from psruntime.apps.blocks import DataBlock
from psruntime.apps.registry import create_app, get_app
from psruntime.apps.single_process import train_single_process
from psruntime.apps.sparse_features import batch_rows, local_design

THREADS = 4


class ShardLog:
    """Wraps a module's `run_shards`: records each call's (pieces, threads) and runs the real pool."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, module: str) -> None:
        self.calls: list[tuple[int, int]] = []
        monkeypatch.setattr(f"psruntime.apps.{module}.run_shards", self)

    def __call__(self, fn: Any, pieces: Any, threads: int) -> list[Any]:
        self.calls.append((len(pieces), threads))
        return comp_pool.run_shards(fn, pieces, threads)


def _fresh_block(app: Any) -> DataBlock:
    """Block 0 with its initial worker-local state (a new copy each call: compute changes it)."""
    block = app.generate_block(0)
    app.init_block(block)
    return block


# ----------------------------------------------------------------- lasso

def _lasso() -> Any:
    # Dense overlap (8 of 30 features per row) so many rows add into every gradient entry.
    return create_app("lasso", {"num_samples": 400, "rows_per_block": 400, "num_features": 30, "nnz_per_sample": 8},
                      {"learning_rate": 0.05, "l1": 0.01, "batch_size": 400, "features_per_key": 4})


def test_lasso_one_thread_gradient_is_the_unsharded_product() -> None:
    app = _lasso()
    block = app.generate_block(0)
    batch = Batch(block, 0, block.num_rows)
    keys = app.keys_for_batch(batch)
    w = np.random.default_rng(0).normal(0, 0.3, (len(keys), app.key_length)).astype(np.float32)
    indptr, feats, vals = batch_rows(block, 0, block.num_rows)
    x = local_design(indptr, feats, vals, keys, 4)
    r = np.asarray(x @ w.astype(np.float64).reshape(-1)) - block.data["targets"]
    np.testing.assert_array_equal(app.loss_gradient(batch, KeyValues(keys, w)), np.asarray(x.T @ r) / block.num_rows)


def test_lasso_step_over_threads_equals_one_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    app = _lasso()
    block = app.generate_block(0)
    batch = Batch(block, 0, block.num_rows)
    keys = app.keys_for_batch(batch)
    params = KeyValues(keys, np.random.default_rng(0).normal(0, 0.3, (len(keys), app.key_length)).astype(np.float32))
    log = ShardLog(monkeypatch, "lasso")
    one = app.compute(batch, params, StepContext(num_workers=2))
    assert log.calls == [(1, 1)]
    many = app.compute(batch, params, StepContext(num_workers=2, threads=THREADS))
    assert log.calls[1:] == [(THREADS, THREADS)]          # the batch's rows in THREADS shards
    np.testing.assert_array_equal(many.keys, one.keys)
    np.testing.assert_allclose(many.values, one.values, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(app.loss_gradient(batch, params, THREADS), app.loss_gradient(batch, params),
                               rtol=1e-12, atol=1e-15)


# ----------------------------------------------------------------- nmf

@pytest.mark.parametrize("hparams", [{"user_steps": 3}, {"user_solve": True}])
def test_nmf_step_over_threads_equals_one_threads(monkeypatch: pytest.MonkeyPatch, hparams: dict[str, Any]) -> None:
    app = create_app("nmf", preset="tiny", hparams={"batch_size": 40, **hparams})
    blocks = [_fresh_block(app), _fresh_block(app)]
    batches = [Batch(b, 0, 40) for b in blocks]
    keys = app.keys_for_batch(batches[0])
    params = KeyValues(keys, app.init_value(keys))
    log = ShardLog(monkeypatch, "nmf")
    one = app.compute(batches[0], params, StepContext())
    assert {c for c in log.calls} == {(1, 1)}
    del log.calls[:]
    many = app.compute(batches[1], params, StepContext(threads=THREADS))
    # every sharded part (user fits or extra user steps, the gradients, W's and H's steps) in THREADS pieces
    assert log.calls and {c for c in log.calls} == {(THREADS, THREADS)}
    np.testing.assert_allclose(many.values, one.values, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(blocks[1].state["W"], blocks[0].state["W"], rtol=1e-6, atol=1e-9)
    assert not np.array_equal(blocks[0].state["W"][:40], _fresh_block(app).state["W"][:40])   # W did move


def test_nmf_gradient_over_threads_equals_one_threads() -> None:
    app: Any = create_app("nmf", preset="tiny", hparams={"batch_size": 60})
    block = _fresh_block(app)
    batch = Batch(block, 0, 60)
    keys = app.keys_for_batch(batch)
    params = KeyValues(keys, app.init_value(keys))
    one, many = app.gradients(batch, params), app.gradients(batch, params, THREADS)
    for a, b in zip(one[:3], many[:3]):       # W, H and dL/dW: per user, bit-identical
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(many[3], one[3], rtol=1e-12, atol=1e-12)   # dL/dH: summed over user shards


# ----------------------------------------------------------------- lda

def test_lda_step_over_threads_keeps_the_count_invariants(monkeypatch: pytest.MonkeyPatch) -> None:
    app = create_app("lda", preset="tiny")
    block = _fresh_block(app)
    k = app.hparams.num_topics
    batch = Batch(block, 0, app.hparams.batch_size)
    ip = block.data["indptr"]
    lo, hi = int(ip[batch.start]), int(ip[batch.stop])
    keys = app.keys_for_batch(batch)
    params = KeyValues(keys, np.abs(np.random.default_rng(0).normal(5, 3, (len(keys), k))).round().astype(np.float32))
    z_before = block.state["z"].copy()
    log = ShardLog(monkeypatch, "lda")
    delta = app.compute(batch, params, StepContext(threads=THREADS)).values.astype(np.float64)
    assert log.calls == [(THREADS, THREADS)]                    # the batch's documents in THREADS shards
    z = block.state["z"]
    assert not np.array_equal(z[lo:hi], z_before[lo:hi])        # it sampled
    np.testing.assert_array_equal(z[:lo], z_before[:lo])        # only the batch's tokens
    np.testing.assert_array_equal(z[hi:], z_before[hi:])
    # The push is exactly the count change of the new assignments: integer, word by word ...
    rows = np.searchsorted(keys, block.data["words"][lo:hi])
    moved = (np.bincount(rows * k + z[lo:hi], minlength=len(keys) * k)
             - np.bincount(rows * k + z_before[lo:hi], minlength=len(keys) * k)).reshape(len(keys), k)
    np.testing.assert_array_equal(delta[:-1], moved[:-1])
    # ... so every word keeps its total count and the topic totals change as the word rows do.
    np.testing.assert_array_equal(delta[:-1].sum(axis=1), 0)
    np.testing.assert_array_equal(delta[-1], delta[:-1].sum(axis=0))
    # The documents' counts match their new assignments and keep their lengths.
    docs = np.repeat(np.arange(block.num_rows), np.diff(ip))
    np.testing.assert_array_equal(block.state["ndk"], np.bincount(docs * k + z, minlength=block.num_rows * k)
                                  .reshape(block.num_rows, k))


def test_lda_one_thread_is_the_unsharded_sweep() -> None:
    from psruntime.apps.lda_sampler import sample_batch
    from psruntime.apps.random_streams import STEP, rng_for
    app: Any = create_app("lda", preset="tiny")
    ours, theirs = _fresh_block(app), _fresh_block(app)
    batch = Batch(ours, 20, 40)
    keys = app.keys_for_batch(batch)
    params = KeyValues(keys, np.abs(np.random.default_rng(0).normal(5, 3, (len(keys), app.key_length)))
                       .round().astype(np.float32))
    delta = app.compute(batch, params, StepContext(epoch=1))
    ip = theirs.data["indptr"]
    lo, hi = int(ip[20]), int(ip[40])
    counts = params.values.astype(np.float64)
    before = counts.copy()
    sample_batch(rng_for(app.seed, STEP, 1, 0, 20), ip[20:41] - lo, params.rows_of(theirs.data["words"][lo:hi]),
                 theirs.state["z"][lo:hi], theirs.state["ndk"][20:40], counts[:-1], counts[-1],
                 app.hparams.alpha, app.hparams.beta, app.vocab)
    np.testing.assert_array_equal(delta.values, (counts - before).astype(np.float32))
    np.testing.assert_array_equal(ours.state["z"], theirs.state["z"])


def test_lda_over_threads_converges_like_one_thread() -> None:
    app = create_app("lda", preset="tiny")
    one, _ = train_single_process(app, max_epochs=8)
    many, _ = train_single_process(app, max_epochs=8, threads=THREADS)
    assert many.initial_objective == one.initial_objective
    # The stated thresholds of test_apps_learning's one-thread run ...
    assert many.epochs[-1].objective >= many.initial_objective + 1.5
    assert many.metrics["heldout_loglik_per_token"] >= many.metrics["true_model_heldout_loglik_per_token"] - 0.5
    # ... and, like the BSP split's AD-LDA across workers there, at least 80% of one thread's gain
    # in as many epochs: the shards sample a different chain (the same seed's 4-thread chain
    # settles in a somewhat worse mode here; other seeds end level with one thread).
    one_gain = one.epochs[-1].objective - one.initial_objective
    assert many.epochs[-1].objective - many.initial_objective >= 0.8 * one_gain


def test_a_comp_uses_the_jobs_threads_else_the_containers_vcores_capped_by_the_app() -> None:
    env = {container_env.CONTAINER_VCORES: "4"}
    assert comp_threads(None, get_app("mlr"), env) == 4          # no cap: the container's vcores
    assert comp_threads(None, get_app("lda"), env) == 1          # LDA's sampler holds the GIL
    assert comp_threads(3, get_app("lda"), env) == 3             # the job's own number wins
    assert comp_threads(None, get_app("mlr"), {}) == 1           # no vcores told: one

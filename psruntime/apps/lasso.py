"""Lasso (L1-regularised least squares) by proximal mini-batch SGD adapted to a PS.

Data: sparse rows with `nnz_per_sample` N(0, 1) features, a ground-truth weight vector with
`support_size` non-zeros of magnitude U(0.5, 1.5) and random sign, y = x.w* + N(0, noise_std^2).
Model on servers: w, keys = groups of `features_per_key` weights.
Objective: 0.5 * mean squared error + l1 * |w|_1 (the L1 term is a server part).

Push rule: a worker computes the proximal step prox(w - lr*g) from the pulled w and pushes
(prox - w) / num_workers, so the servers' additive merge yields the *average* of the workers'
proximal steps. Summing them instead would over-shrink: near zero every worker pushes -w and the
sum oscillates with growing amplitude once there are 3 or more workers. Averaging makes one model
step per round of W mini-batches, so by default the step size follows the linear scaling rule
(lr * num_workers, `scale_lr_with_workers`) to keep per-epoch progress close to one worker's.

Threads (`StepContext.threads`, the job's `comp_threads`): the COMP cuts its mini-batch's rows into
that many shards over `comp_pool`; each shard builds its own design rows, residuals and partial
gradient x_s^T r_s, and the partials are summed in shard order. Rows are independent, so this is
the one-shard gradient up to float summation order (bit-identical with one thread); the proximal
step on the summed gradient is elementwise and cheap, and runs once.
"""
from __future__ import annotations

from functools import cached_property
from typing import Any, ClassVar, Sequence

import numpy as np

from protocol.json_types import JsonObject
from protocol.ps_app_schemas import LASSO_PRESET_HPARAMS, LASSO_PRESETS, LassoHParams, LassoSpec
from psruntime.apps.base import Batch, KeyValues, ObjectivePart, PSApp, StepContext
from psruntime.apps.blocks import DataBlock
from psruntime.apps.comp_pool import run_shards, split_range, sum_in_order
from psruntime.apps.random_streams import TRUTH, rng_for
from psruntime.apps.sparse_features import (batch_rows, generate_sparse_rows, keys_of_features,
                                            local_design)


class LassoApp(PSApp[LassoSpec, LassoHParams]):
    """Lasso regression (proximal SGD with averaged pushes)."""

    name: ClassVar[str] = "lasso"
    Spec = LassoSpec
    HParams = LassoHParams
    ENTRY_FIELDS = ("features", "values")
    ROW_FIELDS = ("targets",)
    PRESETS: ClassVar[dict[str, JsonObject]] = LASSO_PRESETS
    PRESET_HPARAMS: ClassVar[dict[str, JsonObject]] = LASSO_PRESET_HPARAMS
    GENERATION_CACHES = ("true_weights",)

    @property
    def num_rows(self) -> int:
        return self.spec.num_samples

    @property
    def l1(self) -> float:
        """The L1 weight in use (the hyper-parameter, or its sparsity-scaled default)."""
        if self.hparams.l1 is not None:
            return self.hparams.l1
        return 0.02 * self.spec.nnz_per_sample / self.spec.num_features

    @cached_property
    def true_weights(self) -> np.ndarray:
        """Ground truth w* (features,), zero outside a random support."""
        s = self.spec
        rng = rng_for(s.seed, TRUTH)
        w = np.zeros(s.num_features, dtype=np.float32)
        support = rng.choice(s.num_features, size=s.support_size, replace=False)
        w[support] = rng.uniform(0.5, 1.5, s.support_size) * rng.choice([-1.0, 1.0], s.support_size)
        return w

    def generate_block(self, block_index: int, heldout: bool = False) -> DataBlock:
        s = self.spec
        start, n, rng = self._block_rows(block_index, heldout)
        indptr, feats, vals = generate_sparse_rows(rng, n, s.num_features, s.nnz_per_sample, "normal")
        x = local_design(indptr, feats, vals, np.arange(s.num_features, dtype=np.int64), 1)
        y = np.asarray(x @ self.true_weights.astype(np.float64)) + rng.normal(0.0, s.noise_std, n)
        return DataBlock(self.name, block_index, start, n,
                         {"indptr": indptr, "features": feats, "values": vals, "targets": y.astype(np.float32)})

    def data_nbytes(self) -> int:
        s = self.spec
        return s.num_samples * (s.nnz_per_sample * 8 + 8 + 4) + self.num_blocks * 8

    @property
    def num_keys(self) -> int:
        return -(-self.spec.num_features // self.hparams.features_per_key)

    @property
    def key_length(self) -> int:
        return self.hparams.features_per_key

    def init_value(self, keys: np.ndarray) -> np.ndarray:
        return np.zeros((len(keys), self.key_length), dtype=np.float32)

    def weights_from_model(self, model: np.ndarray) -> np.ndarray:
        return model.reshape(-1)[: self.spec.num_features]

    def keys_for_batch(self, batch: Batch) -> np.ndarray:
        _, feats, _ = batch_rows(batch.block, batch.start, batch.stop)
        return keys_of_features(feats, self.hparams.features_per_key)

    def _residuals(self, block: DataBlock, start: int, stop: int, params: KeyValues,
                   w: np.ndarray | None = None) -> tuple[Any, np.ndarray, np.ndarray]:
        """(design, float64 weights, residuals x.w - y) of rows [start, stop); `w`: the pulled
        weights already in float64 (shards of one batch convert them once)."""
        indptr, feats, vals = batch_rows(block, start, stop)
        x = local_design(indptr, feats, vals, params.keys, self.hparams.features_per_key)
        if w is None:
            w = params.values.astype(np.float64).reshape(-1)
        return x, w, np.asarray(x @ w) - block.data["targets"][start:stop]

    def loss_gradient(self, batch: Batch, params: KeyValues, threads: int = 1) -> np.ndarray:
        """Gradient of 0.5 * mean squared error over the batch w.r.t. the pulled weights; with
        `threads` > 1 summed from row shards' partial gradients (see the module docstring)."""
        w = params.values.astype(np.float64).reshape(-1)

        def partial(rows: tuple[int, int]) -> np.ndarray:
            x, _, r = self._residuals(batch.block, batch.start + rows[0], batch.start + rows[1], params, w)
            return np.asarray(x.T @ r)
        return sum_in_order(run_shards(partial, split_range(batch.size, threads), threads)) / batch.size

    def compute(self, batch: Batch, params: KeyValues, ctx: StepContext) -> KeyValues:
        hp = self.hparams
        w = params.values.astype(np.float64).reshape(-1)
        workers = max(ctx.num_workers, 1)
        lr = hp.learning_rate / (1.0 + hp.lr_decay * ctx.epoch)
        if hp.scale_lr_with_workers:
            lr *= workers
        z = w - lr * self.loss_gradient(batch, params, ctx.threads)
        prox = np.sign(z) * np.maximum(np.abs(z) - lr * self.l1, 0.0)   # soft-thresholding
        delta = (prox - w) / workers
        return KeyValues(params.keys, delta.astype(np.float32).reshape(len(params.keys), self.key_length))

    def objective_keys(self, block: DataBlock) -> np.ndarray:
        return keys_of_features(block.data["features"], self.hparams.features_per_key)

    def objective(self, block: DataBlock, params: KeyValues) -> ObjectivePart:
        _, _, r = self._residuals(block, 0, block.num_rows, params)
        return ObjectivePart(0.5 * float(np.dot(r, r)), block.num_rows)

    def server_objective(self, params: KeyValues) -> float:
        return self.l1 * float(np.abs(params.values, dtype=np.float64).sum())

    def predict(self, block: DataBlock, params: KeyValues) -> np.ndarray:
        """The regression value x.w of every row (rows,)."""
        keys = self.objective_keys(block)
        _, _, r = self._residuals(block, 0, block.num_rows, KeyValues(keys, params.values[params.rows_of(keys)]))
        return np.asarray(r + block.data["targets"], np.float64)

    def evaluate(self, model: np.ndarray, heldout: Sequence[DataBlock]) -> dict[str, float]:
        """Held-out mean squared error (and its root) and the support found; with generated data also
        the noise floor (noise_std, the true weights' held-out RMSE) and support recovery vs the
        ground truth (precision, recall, F1, and a random guess's precision)."""
        w = self.weights_from_model(model).astype(np.float64)
        found = np.abs(w) > self.hparams.support_threshold
        everything = np.arange(self.spec.num_features, dtype=np.int64)
        truth = self.true_weights.astype(np.float64) if self.has_ground_truth else None
        sq = true_sq = n = 0.0
        for block in heldout:
            indptr, feats, vals = batch_rows(block, 0, block.num_rows)
            x = local_design(indptr, feats, vals, everything, 1)
            r = np.asarray(x @ w) - block.data["targets"]
            sq += float(np.dot(r, r))
            if truth is not None:
                rt = np.asarray(x @ truth) - block.data["targets"]
                true_sq += float(np.dot(rt, rt))
            n += block.num_rows
        n = max(n, 1)
        metrics: dict[str, float] = {"support_found": int(found.sum()), "heldout_mse": sq / n,
                                     "heldout_rmse": float(np.sqrt(sq / n))}
        if truth is None:
            return metrics
        # The noise floor: the generator's noise level, and what the true weights score on this set.
        metrics.update(noise_std=self.spec.noise_std, true_model_heldout_rmse=float(np.sqrt(true_sq / n)))
        true = self.true_weights != 0
        tp = int((found & true).sum())
        precision = tp / max(int(found.sum()), 1)
        recall = tp / int(true.sum())
        return {"precision": precision, "recall": recall,
                "f1": 2 * precision * recall / max(precision + recall, 1e-12),
                "chance_precision": int(true.sum()) / self.spec.num_features, **metrics}

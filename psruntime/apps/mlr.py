"""Multinomial logistic regression on sparse features, trained by mini-batch SGD.

Data (Petuum-style synthetic sparse data): a ground-truth weight matrix W* (features x classes),
rows with `nnz_per_sample` random features of U(0, 1) value, and each label drawn from
softmax(x W*). Model on servers: W, keys = groups of `features_per_key` feature rows (see
`sparse_features`). Objective: mean cross-entropy + 0.5 * l2 * |W|^2 (the L2 term is a server part).
Pushes are plain SGD steps, summed by the servers as in Bösen.
"""
from __future__ import annotations

from functools import cached_property
from typing import ClassVar, Sequence

import numpy as np

from protocol.json_types import JsonObject
from protocol.ps_app_schemas import MLR_PRESET_HPARAMS, MLR_PRESETS, MLRHParams, MLRSpec
from psruntime.apps.base import Batch, KeyValues, ObjectivePart, PSApp, StepContext
from psruntime.apps.blocks import DataBlock
from psruntime.apps.comp_pool import run_shards, split_range
from psruntime.apps.random_streams import TRUTH, rng_for
from psruntime.apps.sorted_unique import sorted_unique
from psruntime.apps.sparse_features import (batch_rows, column_chunks, design_product, generate_sparse_rows,
                                            keys_of_features, local_design, times_columns)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


class MLRApp(PSApp[MLRSpec, MLRHParams]):
    """Multinomial logistic regression (sparse features, SGD)."""

    name: ClassVar[str] = "mlr"
    Spec = MLRSpec
    HParams = MLRHParams
    ENTRY_FIELDS = ("features", "values")
    ROW_FIELDS = ("labels",)
    PRESETS: ClassVar[dict[str, JsonObject]] = MLR_PRESETS
    PRESET_HPARAMS: ClassVar[dict[str, JsonObject]] = MLR_PRESET_HPARAMS
    GENERATION_CACHES = ("true_weights",)

    # ----------------------------------------------------------------- data
    @property
    def num_rows(self) -> int:
        return self.spec.num_samples

    @cached_property
    def true_weights(self) -> np.ndarray:
        """Ground truth W* (features, classes), scaled so logits have std ~ logit_scale."""
        s = self.spec
        std = s.logit_scale / np.sqrt(s.nnz_per_sample / 3.0)   # E[x^2] = 1/3 for U(0, 1)
        # Drawn as float32 (numpy's float32 ziggurat), not as float64 then cast: the same
        # distribution at a third of the time, which every worker's setup and every replacement
        # worker's regeneration of its splits waits on (210,000 x 128: 0.2 s against 0.75 s).
        w = rng_for(s.seed, TRUTH).standard_normal((s.num_features, s.num_classes), dtype=np.float32)
        w *= np.float32(std)
        return w

    def generate_block(self, block_index: int, heldout: bool = False) -> DataBlock:
        s = self.spec
        start, n, rng = self._block_rows(block_index, heldout)
        indptr, feats, vals = generate_sparse_rows(rng, n, s.num_features, s.nnz_per_sample, "uniform")
        # Only the ground-truth rows of the block's features (the design's columns are those
        # features in order), a chunk of rows and of classes at a time: every logit sums the same
        # products in the same order as over all features, and no (features x classes) float64
        # copy -- nor a float64 conversion of every feature's row per block -- is made.
        used = sorted_unique(feats).astype(np.int64)
        logits = design_product(indptr, feats, vals, used, 1, self.true_weights[used])
        probs = np.exp(_log_softmax(logits))
        u = rng.random((n, 1))
        labels = np.minimum((probs.cumsum(axis=1) < u).sum(axis=1), s.num_classes - 1).astype(np.int32)
        return DataBlock(self.name, block_index, start, n,
                         {"indptr": indptr, "features": feats, "values": vals, "labels": labels})

    def data_nbytes(self) -> int:
        s = self.spec
        return s.num_samples * (s.nnz_per_sample * 8 + 8 + 4) + self.num_blocks * 8

    # ----------------------------------------------------------------- model
    @property
    def num_keys(self) -> int:
        return -(-self.spec.num_features // self.hparams.features_per_key)

    @property
    def key_length(self) -> int:
        return self.hparams.features_per_key * self.spec.num_classes

    def init_value(self, keys: np.ndarray) -> np.ndarray:
        return np.zeros((len(keys), self.key_length), dtype=np.float32)

    def weights_from_model(self, model: np.ndarray) -> np.ndarray:
        """The (features, classes) weight matrix from the full model array."""
        return model.reshape(-1, self.spec.num_classes)[: self.spec.num_features]

    # ----------------------------------------------------------------- worker
    def keys_for_batch(self, batch: Batch) -> np.ndarray:
        _, feats, _ = batch_rows(batch.block, batch.start, batch.stop)
        return keys_of_features(feats, self.hparams.features_per_key)

    def _weights(self, params: KeyValues) -> np.ndarray:
        """The pulled values as float32 (local features, classes) weight rows (a view)."""
        return params.values.reshape(len(params.keys) * self.hparams.features_per_key, self.spec.num_classes)

    def compute(self, batch: Batch, params: KeyValues, ctx: StepContext) -> KeyValues:
        hp = self.hparams
        indptr, feats, vals = batch_rows(batch.block, batch.start, batch.stop)
        x = local_design(indptr, feats, vals, params.keys, hp.features_per_key)
        w = self._weights(params)
        # With ctx.threads > 1 the two products run as column ranges (classes) over the COMP's
        # threads: each output element is computed by the same operations in the same order
        # whatever the split, so the result is bit-identical to one thread's.
        shards = split_range(w.shape[1], ctx.threads)
        logits = np.empty((x.shape[0], w.shape[1]))

        def forward(cols: tuple[int, int]) -> None:
            lo, hi = cols
            logits[:, lo:hi] = times_columns(x, w[:, lo:hi])
        run_shards(forward, shards, ctx.threads)
        probs = np.exp(_log_softmax(logits))
        labels = batch.block.data["labels"][batch.start:batch.stop]
        probs[np.arange(batch.size), labels] -= 1.0                 # d(CE)/d(logits)
        lr = hp.learning_rate / (1.0 + hp.lr_decay * ctx.epoch)
        # The float64 gradient a few classes at a time, each chunk scaled in place and written
        # to the float32 delta: a whole (features x classes) float64 gradient and its scaled
        # copies were most of a worker's per-batch memory. Same operations per element.
        delta = np.empty(w.shape, np.float32)
        xt = x.T

        def backward(cols: tuple[int, int]) -> None:
            for lo, hi in column_chunks(w.shape[0], cols[1] - cols[0]):
                lo, hi = lo + cols[0], hi + cols[0]
                grad = np.asarray(xt @ probs[:, lo:hi])
                grad /= batch.size
                if hp.l2 > 0:
                    grad += hp.l2 * w[:, lo:hi].astype(np.float64)      # lazy L2: on the pulled rows only
                grad *= -lr
                delta[:, lo:hi] = grad
        run_shards(backward, shards, ctx.threads)
        return KeyValues(params.keys, delta.reshape(len(params.keys), self.key_length))

    def objective_keys(self, block: DataBlock) -> np.ndarray:
        return keys_of_features(block.data["features"], self.hparams.features_per_key)

    def objective(self, block: DataBlock, params: KeyValues) -> ObjectivePart:
        indptr, feats, vals = batch_rows(block, 0, block.num_rows)
        logits = design_product(indptr, feats, vals, params.keys, self.hparams.features_per_key,
                                self._weights(params))
        labels = block.data["labels"]
        ce = -_log_softmax(logits)[np.arange(block.num_rows), labels].sum()
        return ObjectivePart(float(ce), block.num_rows)

    def server_objective(self, params: KeyValues) -> float:
        if self.hparams.l2 == 0:
            return 0.0
        return 0.5 * self.hparams.l2 * float(np.square(params.values, dtype=np.float64).sum())

    # ----------------------------------------------------------------- evaluation
    def predict(self, block: DataBlock, params: KeyValues) -> np.ndarray:
        """Class probabilities (rows, classes); the predicted label of a row is its argmax."""
        indptr, feats, vals = batch_rows(block, 0, block.num_rows)
        keys = keys_of_features(feats, self.hparams.features_per_key)
        sub = KeyValues(keys, params.values[params.rows_of(keys)])
        logits = design_product(indptr, feats, vals, keys, self.hparams.features_per_key, self._weights(sub))
        return np.exp(_log_softmax(logits))

    def evaluate(self, model: np.ndarray, heldout: Sequence[DataBlock]) -> dict[str, float]:
        """Held-out accuracy and cross-entropy, beside chance and (generated data only) the true
        model's accuracy and cross-entropy."""
        w = self.weights_from_model(model).astype(np.float64)
        truth = self.true_weights if self.has_ground_truth else None
        everything = np.arange(self.spec.num_features, dtype=np.int64)
        correct = truth_correct = n = 0
        ce = truth_ce = 0.0
        for block in heldout:
            indptr, feats, vals = batch_rows(block, 0, block.num_rows)
            x = local_design(indptr, feats, vals, everything, 1)
            labels = block.data["labels"]
            logp = _log_softmax(np.asarray(x @ w))
            correct += int((logp.argmax(axis=1) == labels).sum())
            if truth is not None:
                truth_logp = _log_softmax(np.asarray(x @ truth, dtype=np.float64))
                truth_correct += int((truth_logp.argmax(axis=1) == labels).sum())
                truth_ce -= float(truth_logp[np.arange(block.num_rows), labels].sum())
            ce -= float(logp[np.arange(block.num_rows), labels].sum())
            n += block.num_rows
        n = max(n, 1)
        metrics = {"accuracy": correct / n, "cross_entropy": ce / n, "chance_accuracy": 1.0 / self.spec.num_classes}
        if truth is not None:
            metrics.update(true_model_accuracy=truth_correct / n, true_model_cross_entropy=truth_ce / n)
        return metrics

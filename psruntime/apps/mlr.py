"""Multinomial logistic regression on sparse features, trained by mini-batch SGD.

Data (Petuum-style synthetic sparse data): a ground-truth weight matrix W* (features x classes),
rows with `nnz_per_sample` random features of U(0, 1) value, and each label drawn from
softmax(x W*). Model on servers: W, keys = groups of `features_per_key` feature rows (see
`sparse_features`). Objective: mean cross-entropy + 0.5 * l2 * |W|^2 (the L2 term is a server part).
Pushes are plain SGD steps, summed by the servers as in Bösen.
"""
from __future__ import annotations

from functools import cached_property
from typing import Any, ClassVar, Sequence

import numpy as np

from protocol.ps_app_schemas import MLR_PRESETS, MLRHParams, MLRSpec
from psruntime.apps.base import Batch, KeyValues, ObjectivePart, PSApp, StepContext
from psruntime.apps.blocks import DataBlock
from psruntime.apps.random_streams import TRUTH, rng_for
from psruntime.apps.sparse_features import (batch_rows, generate_sparse_rows, keys_of_features,
                                            local_design)


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
    PRESETS: ClassVar[dict[str, dict[str, Any]]] = MLR_PRESETS
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
        return rng_for(s.seed, TRUTH).normal(0.0, std, size=(s.num_features, s.num_classes)).astype(np.float32)

    def generate_block(self, block_index: int, heldout: bool = False) -> DataBlock:
        s = self.spec
        start, n, rng = self._block_rows(block_index, heldout)
        indptr, feats, vals = generate_sparse_rows(rng, n, s.num_features, s.nnz_per_sample, "uniform")
        # Only the ground-truth rows of the block's features, in float64: the design's columns
        # are those features in order, so every logit sums the same products in the same order
        # as over all features, without a (features x classes) float64 copy per block.
        used = np.unique(feats).astype(np.int64)
        x = local_design(indptr, feats, vals, used, 1)
        logits = np.asarray(x @ self.true_weights[used].astype(np.float64))
        del x, used
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

    def _logits(self, block: DataBlock, start: int, stop: int, params: KeyValues) -> tuple[Any, np.ndarray, np.ndarray]:
        r, c = self.hparams.features_per_key, self.spec.num_classes
        indptr, feats, vals = batch_rows(block, start, stop)
        x = local_design(indptr, feats, vals, params.keys, r)
        w = params.values.astype(np.float64).reshape(len(params.keys) * r, c)
        return x, w, np.asarray(x @ w)

    def compute(self, batch: Batch, params: KeyValues, ctx: StepContext) -> KeyValues:
        hp = self.hparams
        x, w, logits = self._logits(batch.block, batch.start, batch.stop, params)
        probs = np.exp(_log_softmax(logits))
        labels = batch.block.data["labels"][batch.start:batch.stop]
        probs[np.arange(batch.size), labels] -= 1.0                 # d(CE)/d(logits)
        grad = np.asarray(x.T @ probs) / batch.size
        if hp.l2 > 0:
            grad += hp.l2 * w                                        # lazy L2: on the pulled rows only
        lr = hp.learning_rate / (1.0 + hp.lr_decay * ctx.epoch)
        delta = (-lr * grad).astype(np.float32).reshape(len(params.keys), self.key_length)
        return KeyValues(params.keys, delta)

    def objective_keys(self, block: DataBlock) -> np.ndarray:
        return keys_of_features(block.data["features"], self.hparams.features_per_key)

    def objective(self, block: DataBlock, params: KeyValues) -> ObjectivePart:
        _, _, logits = self._logits(block, 0, block.num_rows, params)
        labels = block.data["labels"]
        ce = -_log_softmax(logits)[np.arange(block.num_rows), labels].sum()
        return ObjectivePart(float(ce), block.num_rows)

    def server_objective(self, params: KeyValues) -> float:
        if self.hparams.l2 == 0:
            return 0.0
        return 0.5 * self.hparams.l2 * float(np.square(params.values, dtype=np.float64).sum())

    # ----------------------------------------------------------------- evaluation
    def evaluate(self, model: np.ndarray, heldout: Sequence[DataBlock]) -> dict[str, float]:
        """Held-out accuracy and cross-entropy, beside chance and the true model's accuracy."""
        w = self.weights_from_model(model).astype(np.float64)
        everything = np.arange(self.spec.num_features, dtype=np.int64)
        correct = truth_correct = n = 0
        ce = 0.0
        for block in heldout:
            indptr, feats, vals = batch_rows(block, 0, block.num_rows)
            x = local_design(indptr, feats, vals, everything, 1)
            labels = block.data["labels"]
            logp = _log_softmax(np.asarray(x @ w))
            correct += int((logp.argmax(axis=1) == labels).sum())
            truth_correct += int((np.asarray(x @ self.true_weights).argmax(axis=1) == labels).sum())
            ce -= float(logp[np.arange(block.num_rows), labels].sum())
            n += block.num_rows
        return {"accuracy": correct / n, "cross_entropy": ce / n,
                "chance_accuracy": 1.0 / self.spec.num_classes, "true_model_accuracy": truth_correct / n}

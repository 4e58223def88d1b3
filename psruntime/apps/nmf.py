"""Non-negative matrix factorisation V ~ W H by projected mini-batch SGD on observed entries.

Data: a non-negative low-rank matrix W* H* (entries U(0, 2/sqrt(rank)) so products average ~1)
plus N(0, noise_std^2) noise, of which each user (row) observes about `observed_fraction` of the
items. Model on servers: H, one key per item (value = that item's `rank` factors). Worker-local
state: W rows of the block's users, kept in the block (`state["W"]`) so they move with it.
Objective: mean squared error on the observed training entries.

Projection: W is projected to >= 0 locally. H is projected where it is read: the effective item
factors are max(H, 0) and deltas are taken relative to them, so the servers' additive merge of
several workers' steps can never make the effective model negative.
"""
from __future__ import annotations

from functools import cached_property
from typing import Any, ClassVar, Sequence

import numpy as np
import scipy.sparse as sp

from protocol.ps_app_schemas import NMF_PRESETS, NMFHParams, NMFSpec
from psruntime.apps.base import Batch, KeyValues, ObjectivePart, PSApp, StepContext
from psruntime.apps.blocks import DataBlock
from psruntime.apps.random_streams import (MODEL_INIT, STATE_INIT, TRUTH,
                                           keyed_uniform, rng_for, sample_row_indices)


GATHER_CHUNK_BYTES = 1 << 20


def _row_dots(a: np.ndarray, rows: np.ndarray, b: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """(a[rows] * b[cols]).sum(axis=1), gathered in chunks of ~GATHER_CHUNK_BYTES per operand:
    the whole (entries x rank) float64 gathers of a batch or block would be several times the
    bytes of the data they are computed from. Each entry's sum is computed alone, as unchunked."""
    out = np.empty(len(rows))
    step = max(1, GATHER_CHUNK_BYTES // (8 * max(a.shape[1], 1)))
    for lo in range(0, len(rows), step):
        hi = lo + step
        out[lo:hi] = (a[rows[lo:hi]] * b[cols[lo:hi]]).sum(axis=1)
    return out


class NMFApp(PSApp[NMFSpec, NMFHParams]):
    """Non-negative matrix factorisation (projected SGD, H on servers, W on workers)."""

    name: ClassVar[str] = "nmf"
    Spec = NMFSpec
    HParams = NMFHParams
    ENTRY_FIELDS = ("items", "ratings")
    ROW_FIELDS = ()
    PRESETS: ClassVar[dict[str, dict[str, Any]]] = NMF_PRESETS
    GENERATION_CACHES = ("true_item_factors",)

    @property
    def num_rows(self) -> int:
        return self.spec.num_users

    @property
    def init_scale(self) -> float:
        return self.hparams.init_scale or 2.0 / np.sqrt(self.hparams.rank)

    @cached_property
    def true_item_factors(self) -> np.ndarray:
        """Ground truth H* as (items, rank)."""
        s = self.spec
        return rng_for(s.seed, TRUTH).uniform(0, 2 / np.sqrt(s.rank), (s.num_items, s.rank))

    def generate_block(self, block_index: int, heldout: bool = False) -> DataBlock:
        s = self.spec
        start, n, rng = self._block_rows(block_index, heldout)
        user_factors = rng.uniform(0, 2 / np.sqrt(s.rank), (n, s.rank))
        counts = np.maximum(rng.binomial(s.num_items, s.observed_fraction, n), 1)
        indptr, items = sample_row_indices(rng, counts, s.num_items)
        users = np.repeat(np.arange(n), np.diff(indptr))
        # Row-wise dot products in chunks of ~GATHER_CHUNK_BYTES per gathered (entries x rank)
        # float64 operand: whole-block operands would dominate a worker's peak while it generates
        # its data. Each entry's product is computed alone, so the chunking does not change values.
        ratings = np.empty(len(items), np.float32)
        step = max(1, GATHER_CHUNK_BYTES // (8 * s.rank))
        truth = self.true_item_factors
        noise = rng.normal(0, s.noise_std, len(items))
        for lo in range(0, len(items), step):
            hi = lo + step
            clean = np.einsum("ij,ij->i", user_factors[users[lo:hi]], truth[items[lo:hi]])
            ratings[lo:hi] = clean + noise[lo:hi]
        del noise, users
        return DataBlock(self.name, block_index, start, n, {"indptr": indptr, "items": items, "ratings": ratings})

    def data_nbytes(self) -> int:
        s = self.spec
        entries = s.num_users * s.num_items * s.observed_fraction
        return int(entries * 8 + s.num_users * (8 + 4 * self.hparams.rank))

    @property
    def num_keys(self) -> int:
        return self.spec.num_items

    @property
    def key_length(self) -> int:
        return self.hparams.rank

    def init_value(self, keys: np.ndarray) -> np.ndarray:
        return keyed_uniform(self.seed, MODEL_INIT, keys, self.key_length, 0.0, self.init_scale)

    def init_block(self, block: DataBlock) -> KeyValues | None:
        rng = rng_for(self.seed, STATE_INIT, block.block_index)
        block.state["W"] = rng.uniform(0, self.init_scale, (block.num_rows, self.hparams.rank)).astype(np.float32)
        return None

    def _entries(self, block: DataBlock, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(per-row entry counts, local row of each entry, items, ratings) of rows [start, stop)."""
        ip = block.data["indptr"]
        lo, hi = int(ip[start]), int(ip[stop])
        counts = np.diff(ip[start:stop + 1])
        rows = np.repeat(np.arange(stop - start), counts)
        return counts, rows, block.data["items"][lo:hi], block.data["ratings"][lo:hi]

    def keys_for_batch(self, batch: Batch) -> np.ndarray:
        _, _, items, _ = self._entries(batch.block, batch.start, batch.stop)
        return np.unique(items).astype(np.int64)

    def gradients(self, batch: Batch, params: KeyValues) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(W, H, dL/dW, dL/dH) of L = 0.5 * sum of squared errors over the batch's entries,
        at the effective (projected) H of the pulled keys."""
        _, rows, items, ratings = self._entries(batch.block, batch.start, batch.stop)
        cols = params.rows_of(items.astype(np.int64))
        w = batch.block.state["W"][batch.start:batch.stop].astype(np.float64)
        h = np.maximum(params.values.astype(np.float64), 0.0)
        err = _row_dots(w, rows, h, cols) - ratings
        e = sp.csr_matrix((err, (rows, cols)), shape=(batch.size, len(params.keys)))
        return w, h, np.asarray(e @ h), np.asarray(e.T @ w)

    def compute(self, batch: Batch, params: KeyValues, ctx: StepContext) -> KeyValues:
        hp = self.hparams
        lr = hp.learning_rate / (1.0 + hp.lr_decay * ctx.epoch)
        counts, _, items, _ = self._entries(batch.block, batch.start, batch.stop)
        w, h, gw, gh = self.gradients(batch, params)
        # Each factor row steps along its gradient averaged over its own entries in the batch,
        # so the step size does not depend on how many ratings a user or item has.
        per_item = np.bincount(params.rows_of(items.astype(np.int64)), minlength=len(params.keys))
        w_new = np.maximum(w - lr * (gw / np.maximum(counts, 1)[:, None] + hp.l2 * w), 0.0)
        h_new = np.maximum(h - lr * (gh / np.maximum(per_item, 1)[:, None] + hp.l2 * h), 0.0)
        batch.block.state["W"][batch.start:batch.stop] = w_new
        return KeyValues(params.keys, (h_new - h).astype(np.float32))

    def objective_keys(self, block: DataBlock) -> np.ndarray:
        return np.unique(block.data["items"]).astype(np.int64)

    def objective(self, block: DataBlock, params: KeyValues) -> ObjectivePart:
        _, rows, items, ratings = self._entries(block, 0, block.num_rows)
        h = np.maximum(params.values.astype(np.float64), 0.0)
        err = _row_dots(block.state["W"].astype(np.float64), rows, h, params.rows_of(items.astype(np.int64))) - ratings
        return ObjectivePart(float(np.dot(err, err)), len(err))

    def evaluate(self, model: np.ndarray, heldout: Sequence[DataBlock]) -> dict[str, float]:
        """Held-out RMSE by fold-in: each held-out user's factors are fitted by non-negative least
        squares on half of its ratings (even positions) and scored on the other half."""
        # Imported here: only the AM evaluates, and scipy.optimize adds ~0.2 s to every executor's start.
        from scipy.optimize import nnls

        h = np.maximum(model.astype(np.float64), 0.0)
        sq = base_sq = 0.0
        n = 0
        for block in heldout:
            ip = block.data["indptr"]
            items, ratings = block.data["items"], block.data["ratings"].astype(np.float64)
            fit_mean = float(ratings.mean()) if len(ratings) else 0.0
            for u in range(block.num_rows):
                it, r = items[ip[u]:ip[u + 1]], ratings[ip[u]:ip[u + 1]]
                fit_it, fit_r, test_it, test_r = it[0::2], r[0::2], it[1::2], r[1::2]
                if len(test_r) == 0:
                    continue
                wu = nnls(h[fit_it], fit_r)[0] if len(fit_r) else np.zeros(h.shape[1])
                err = h[test_it] @ wu - test_r
                sq += float(np.dot(err, err))
                base_sq += float(np.sum((test_r - fit_mean) ** 2))
                n += len(test_r)
        n = max(n, 1)
        return {"heldout_rmse": float(np.sqrt(sq / n)), "mean_predictor_rmse": float(np.sqrt(base_sq / n)),
                "noise_std": self.spec.noise_std}

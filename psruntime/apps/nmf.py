"""Non-negative matrix factorisation V ~ W H by projected mini-batch SGD on observed entries.

Data: a non-negative low-rank matrix W* H* (entries U(0, 2/sqrt(rank)) so products average ~1)
plus N(0, noise_std^2) noise, of which each user (row) observes about `observed_fraction` of the
items. Model on servers: H, one key per item (value = that item's `rank` factors). Worker-local
state: W rows of the block's users, kept in the block (`state["W"]`) so they move with it.
Objective: mean squared error on the observed training entries.

Projection: W is projected to >= 0 locally. H is projected where it is read: the effective item
factors are max(H, 0) and deltas are taken relative to them, so the servers' additive merge of
several workers' steps can never make the effective model negative.

Threads (`StepContext.threads`, the job's `comp_threads`): the COMP cuts its mini-batch's users
(rows) into that many shards over `comp_pool`. Per shard, independently: the entries' errors,
dL/dW of its users (e @ H, rows of the shard only), its users' least-squares fits (`user_solve`)
and projected W steps -- all bit-identical to one thread's, since each user's numbers are computed
alone. dL/dH sums over users: each shard's partial e_s^T W_s is summed in shard order, equal to
the one-shard sum up to float summation order (bit-identical with one thread). H's projected step
is elementwise per item row and is sharded by item rows.
"""
from __future__ import annotations

from functools import cached_property
from typing import Callable, ClassVar, Sequence

import numpy as np
import scipy.sparse as sp

from protocol.json_types import JsonObject
from protocol.ps_app_schemas import NMF_PRESET_HPARAMS, NMF_PRESETS, NMFHParams, NMFSpec
from psruntime.apps.base import Batch, KeyValues, ObjectivePart, PSApp, StepContext
from psruntime.apps.blocks import DataBlock
from psruntime.apps.comp_pool import run_shards, split_range, sum_in_order
from psruntime.apps.random_streams import (MODEL_INIT, STATE_INIT, TRUTH,
                                           keyed_uniform, rng_for, sample_row_indices)
from psruntime.apps.sorted_unique import sorted_unique


GATHER_CHUNK_BYTES = 1 << 20


def _chunk_rows(width: int) -> int:
    """Rows of a (rows, width) float64 operand that make ~GATHER_CHUNK_BYTES."""
    return max(1, GATHER_CHUNK_BYTES // (8 * max(width, 1)))


def _effective(values: np.ndarray) -> np.ndarray:
    """The projected factors max(values, 0) in float64 (one array, projected in place)."""
    h = values.astype(np.float64)
    np.maximum(h, 0.0, out=h)
    return h


IndexAt = Callable[[int, int], np.ndarray]   # (lo, hi) -> an index per entry of [lo, hi)


def _entry_errors(w: np.ndarray, h: np.ndarray, ratings: np.ndarray, rows_at: IndexAt, cols_at: IndexAt) -> np.ndarray:
    """w[row] . h[col] - rating for every entry, float64, a chunk of ~GATHER_CHUNK_BYTES per
    gathered (entries x rank) operand at a time: the whole gathers (and, for a block, its rows and
    columns, which `rows_at` / `cols_at` make per chunk) would be several times the bytes of the
    data. Each entry's sum is computed alone, so the chunking does not change values."""
    err = np.empty(len(ratings))
    step = _chunk_rows(w.shape[1])
    for lo in range(0, len(ratings), step):
        hi = min(len(ratings), lo + step)
        np.subtract((w[rows_at(lo, hi)] * h[cols_at(lo, hi)]).sum(axis=1), ratings[lo:hi], out=err[lo:hi])
    return err


def _entry_rows(indptr: np.ndarray) -> IndexAt:
    """The CSR row of entries [lo, hi), computed per chunk (indptr starts at 0)."""
    return lambda lo, hi: np.searchsorted(indptr, np.arange(lo, hi), side="right") - 1


def _projected_step(x: np.ndarray, grad: np.ndarray, counts: np.ndarray, lr: float, l2: float,
                    delta: np.ndarray | None = None) -> np.ndarray:
    """max(x - lr * (grad / max(counts, 1) + l2 * x), 0) per row, written over `grad` (returned)
    a chunk of rows at a time, so the step's temporaries stay ~GATHER_CHUNK_BYTES; with `delta`,
    also delta = new - x (cast to its dtype). Same operations per element as whole arrays."""
    step = _chunk_rows(x.shape[1])
    for lo in range(0, len(x), step):
        hi = min(len(x), lo + step)
        g, xs = grad[lo:hi], x[lo:hi]
        g /= np.maximum(counts[lo:hi], 1)[:, None]
        g += l2 * xs
        g *= lr
        np.subtract(xs, g, out=g)
        np.maximum(g, 0.0, out=g)
        if delta is not None:
            delta[lo:hi] = g - xs
    return grad


class NMFApp(PSApp[NMFSpec, NMFHParams]):
    """Non-negative matrix factorisation (projected SGD, H on servers, W on workers)."""

    name: ClassVar[str] = "nmf"
    Spec = NMFSpec
    HParams = NMFHParams
    ENTRY_FIELDS = ("items", "ratings")
    ROW_FIELDS = ()
    PRESETS: ClassVar[dict[str, JsonObject]] = NMF_PRESETS
    PRESET_HPARAMS: ClassVar[dict[str, JsonObject]] = NMF_PRESET_HPARAMS
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
        # Row-wise dot products, noise and entry users a chunk of ~GATHER_CHUNK_BYTES per gathered
        # (entries x rank) float64 operand at a time: whole-block operands (and the block's noise
        # and user of every entry, 16 bytes per entry) would dominate a worker's peak while it
        # generates its data. Each entry's product is computed alone and the noise is drawn in
        # the same order from the same stream, so the chunking does not change values.
        ratings = np.empty(len(items), np.float32)
        step = max(1, GATHER_CHUNK_BYTES // (8 * s.rank))
        truth = self.true_item_factors
        for lo in range(0, len(items), step):
            hi = min(len(items), lo + step)
            users = np.searchsorted(indptr, np.arange(lo, hi), side="right") - 1
            clean = np.einsum("ij,ij->i", user_factors[users], truth[items[lo:hi]])
            ratings[lo:hi] = clean + rng.normal(0, s.noise_std, hi - lo)
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
        return sorted_unique(items).astype(np.int64)

    def gradients(self, batch: Batch, params: KeyValues,
                  threads: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(W, H, dL/dW, dL/dH) of L = 0.5 * sum of squared errors over the batch's entries,
        at the effective (projected) H of the pulled keys; with `threads` > 1 over user shards
        (see the module docstring)."""
        h = _effective(params.values)
        users = split_range(batch.size, threads)
        w = np.empty((batch.size, h.shape[1]))
        gw = np.empty_like(w)

        def shard(rows: tuple[int, int]) -> np.ndarray:
            a, b = rows
            _, local, items, ratings = self._entries(batch.block, batch.start + a, batch.start + b)
            cols = params.rows_of(items.astype(np.int64))
            ws = w[a:b]
            ws[:] = batch.block.state["W"][batch.start + a:batch.start + b]
            err = _entry_errors(ws, h, ratings, lambda lo, hi: local[lo:hi], lambda lo, hi: cols[lo:hi])
            e = sp.csr_matrix((err, (local, cols)), shape=(b - a, len(params.keys)))
            gw[a:b] = e @ h
            return np.asarray(e.T @ ws)
        gh = sum_in_order(run_shards(shard, users, threads))
        return w, h, gw, gh

    def compute(self, batch: Batch, params: KeyValues, ctx: StepContext) -> KeyValues:
        hp = self.hparams
        lr = hp.learning_rate / (1.0 + hp.lr_decay * ctx.epoch)
        threads = ctx.threads
        counts, _, items, _ = self._entries(batch.block, batch.start, batch.stop)
        state_w = batch.block.state["W"][batch.start:batch.stop]

        def step_users(w: np.ndarray, gw: np.ndarray) -> None:
            """W <- the projected step, a user shard per thread (rows are independent)."""
            def rows(r: tuple[int, int]) -> None:
                a, b = r
                state_w[a:b] = _projected_step(w[a:b], gw[a:b], counts[a:b], lr, hp.l2)
            run_shards(rows, split_range(len(w), threads), threads)
        # The batch's user rows are worker-local and visited once per epoch, while H takes a step
        # per batch: with one step per visit W lags far behind H. Fitting them to the pulled H
        # first (`user_solve`), or `user_steps` - 1 extra projected steps, costs no communication.
        if hp.user_solve:
            self.fit_users(batch, params, threads)
        for _ in range(hp.user_steps - 1):
            w, _, gw, _ = self.gradients(batch, params, threads)
            step_users(w, gw)
        w, h, gw, gh = self.gradients(batch, params, threads)
        # Each factor row steps along its gradient averaged over its own entries in the batch,
        # so the step size does not depend on how many ratings a user or item has.
        per_item = np.bincount(params.rows_of(items.astype(np.int64)), minlength=len(params.keys))
        step_users(w, gw)
        delta = np.empty(h.shape, np.float32)

        def step_items(r: tuple[int, int]) -> None:
            a, b = r
            _projected_step(h[a:b], gh[a:b], per_item[a:b], lr, hp.l2, delta[a:b])
        run_shards(step_items, split_range(len(h), threads), threads)
        return KeyValues(params.keys, delta)

    def fit_users(self, batch: Batch, params: KeyValues, threads: int = 1) -> None:
        """Set the batch's user rows to their ridge least-squares fit (l2, plus a tiny ridge so
        a user with few ratings stays solvable) against the pulled effective H, clipped at 0;
        with `threads` > 1 a shard of users per thread (each user's fit is its own)."""
        h = _effective(params.values)
        w = batch.block.state["W"]
        eye = np.eye(h.shape[1])

        def shard(rows: tuple[int, int]) -> None:
            counts, _, items, ratings = self._entries(batch.block, batch.start + rows[0], batch.start + rows[1])
            cols = params.rows_of(items.astype(np.int64))
            lo = 0
            for u, n in enumerate(counts.tolist(), start=batch.start + rows[0]):
                hu = h[cols[lo:lo + n]]
                a = hu.T @ hu + (self.hparams.l2 * n + 1e-6) * eye
                w[u] = np.maximum(np.linalg.solve(a, hu.T @ ratings[lo:lo + n].astype(np.float64)), 0.0)
                lo += n
        run_shards(shard, split_range(batch.size, threads), threads)

    def objective_keys(self, block: DataBlock) -> np.ndarray:
        return sorted_unique(block.data["items"]).astype(np.int64)

    def objective(self, block: DataBlock, params: KeyValues) -> ObjectivePart:
        ip, items = block.data["indptr"], block.data["items"]
        err = _entry_errors(block.state["W"].astype(np.float64), _effective(params.values), block.data["ratings"],
                            _entry_rows(ip - ip[0]), lambda lo, hi: params.rows_of(items[lo:hi].astype(np.int64)))
        return ObjectivePart(float(np.dot(err, err)), len(err))

    def evaluate(self, model: np.ndarray, heldout: Sequence[DataBlock]) -> dict[str, float]:
        """Held-out RMSE by fold-in: each held-out user's factors are fitted by non-negative least
        squares on half of its ratings (even positions) and scored on the other half. With generated
        data also the noise level and the same fold-in score of the true item factors: the noise as
        this evaluation sees it (a user's factors fitted from few noisy ratings add to it), the floor
        a trained model is judged against."""
        metrics = self._fold_in_rmse(np.maximum(model.astype(np.float64), 0.0), heldout)
        if self.has_ground_truth:   # the generator's noise level: the best RMSE a model can reach
            metrics["noise_std"] = self.spec.noise_std
            metrics["true_model_heldout_rmse"] = self._fold_in_rmse(self.true_item_factors, heldout)["heldout_rmse"]
        return metrics

    def predict(self, block: DataBlock, params: KeyValues) -> np.ndarray:
        """The reconstructed rating of every (user, item) entry of the block (entries,), in the
        block's entry order: each user's factors are fitted (non-negative least squares, as the
        held-out evaluation's fold-in does) on that user's ratings in the block, since user factors
        are not part of the model."""
        from scipy.optimize import nnls   # see _fold_in_rmse

        h = _effective(params.values[params.rows_of(np.arange(self.num_keys, dtype=np.int64))])
        ip, items = block.data["indptr"], block.data["items"]
        ratings = block.data["ratings"].astype(np.float64)
        out = np.zeros(len(items))
        for u in range(block.num_rows):
            it = items[ip[u]:ip[u + 1]]
            if len(it):
                out[ip[u]:ip[u + 1]] = h[it] @ nnls(h[it], ratings[ip[u]:ip[u + 1]])[0]
        return out

    def _fold_in_rmse(self, h: np.ndarray, heldout: Sequence[DataBlock]) -> dict[str, float]:
        # Imported here: only the AM evaluates, and scipy.optimize adds ~0.2 s to every executor's start.
        from scipy.optimize import nnls

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
        return {"heldout_rmse": float(np.sqrt(sq / n)), "mean_predictor_rmse": float(np.sqrt(base_sq / n))}

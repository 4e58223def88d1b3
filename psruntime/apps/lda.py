"""Latent Dirichlet allocation by collapsed Gibbs sampling, with word-topic counts on servers.

Data: documents drawn from a known topic model: topic-word distributions phi_k ~ Dir(beta_true),
per document theta_d ~ Dir(alpha_true), length ~ Poisson(doc_length), and each token's topic
z ~ theta_d, word ~ phi_z. Model on servers: keys 0..V-1 are the word-topic count rows n_wk and
key V holds the topic totals n_k (all float32 vectors of num_topics; counts are exact below 2^24).
Worker-local state, in the block: token topic assignments `z` and doc-topic counts `ndk`.
Deltas are count changes, so the servers' additive merge keeps the totals exact.
Objective: the joint log-likelihood log p(w, z) per token (higher is better); its document part
is computed by workers, its word part by servers over the keys they own.

Threads (`StepContext.threads`, the job's `comp_threads`): the COMP cuts its mini-batch's documents
into that many shards over `comp_pool`, and each shard runs the Gibbs sweep of `lda_sampler` on its
own copy of the pulled word-topic counts it touches (and of the topic totals), with its own random
stream (keyed by its first document; the first shard's is the one-thread stream, so one thread is
bit-identical to the unsharded sweep). The shards' count changes are added into the push. What is
sharded: documents, whose tokens, `z` and `ndk` rows belong to one shard only. What is not: the
word-topic counts -- a shard's tokens see the other shards' word-topic changes only at the next
pull, the approximation AD-LDA makes across workers (and `lda_sampler` already makes across the
documents of one step), so k threads sample a different but equally valid chain. What holds
whatever the thread count: within a document the sweep is exact sequential Gibbs; the pushed
deltas are exact integer count changes matching the new `z` (each word's and each document's
total count unchanged, the topic totals' change equal to the sum of the word rows' changes); and
the chain converges like the one-thread chain (tests/unit/test_apps_comp_threads.py). The sweep's
steps are small numpy calls that mostly hold the GIL, so threads add little speed here and may cost
some (docs/harmony_arbiter.md "Threads"): a job that does not set `comp_threads` gets one
(`DEFAULT_COMP_THREADS`), not its container's vcores.
"""
from __future__ import annotations

from functools import cached_property
from typing import ClassVar, Sequence

import numpy as np
import scipy.sparse as sp
from scipy.special import gammaln

from protocol.json_types import JsonObject
from protocol.ps_app_schemas import LDA_PRESET_HPARAMS, LDA_PRESETS, LDAHParams, LDASpec
from psruntime.apps.base import Batch, KeyValues, ObjectivePart, PSApp, StepContext
from psruntime.apps.blocks import DataBlock
from psruntime.apps.comp_pool import run_shards, split_range
from psruntime.apps.lda_sampler import sample_batch
from psruntime.apps.random_streams import STATE_INIT, STEP, TRUTH, rng_for
from psruntime.apps.sorted_unique import sorted_unique


class LDAApp(PSApp[LDASpec, LDAHParams]):
    """LDA (collapsed Gibbs sampling; word-topic counts on servers, assignments on workers)."""

    name: ClassVar[str] = "lda"
    Spec = LDASpec
    HParams = LDAHParams
    maximize: ClassVar[bool] = True
    # Measured: 2 threads made a COMP 1.5-2x slower (the sweep's small numpy calls hold the GIL),
    # so a job that does not ask for comp_threads samples on one.
    DEFAULT_COMP_THREADS: ClassVar[int | None] = 1
    ENTRY_FIELDS = ("words",)
    ROW_FIELDS = ()
    PRESETS: ClassVar[dict[str, JsonObject]] = LDA_PRESETS
    PRESET_HPARAMS: ClassVar[dict[str, JsonObject]] = LDA_PRESET_HPARAMS
    GENERATION_CACHES = ("true_topics",)

    @property
    def num_rows(self) -> int:
        return self.spec.num_docs

    @property
    def vocab(self) -> int:
        return self.spec.vocab_size

    @cached_property
    def true_topics(self) -> np.ndarray:
        """Ground truth phi (true topics, vocab): each row a distribution over words."""
        s = self.spec
        return _dirichlet(rng_for(s.seed, TRUTH), s.beta_true, (s.num_topics, s.vocab_size))

    def generate_block(self, block_index: int, heldout: bool = False) -> DataBlock:
        s = self.spec
        start, n, rng = self._block_rows(block_index, heldout)
        theta = _dirichlet(rng, s.alpha_true, (n, s.num_topics))
        lengths = np.maximum(rng.poisson(s.doc_length, n), 1)
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=indptr[1:])
        docs = np.repeat(np.arange(n), lengths)
        topics = _categorical(rng, theta[docs])
        words = np.empty(len(docs), dtype=np.int32)
        cum_phi = np.cumsum(self.true_topics, axis=1)
        u = rng.random(len(docs))
        for k in range(s.num_topics):   # tokens grouped by topic: one searchsorted per topic
            sel = topics == k
            words[sel] = np.minimum(np.searchsorted(cum_phi[k], u[sel] * cum_phi[k, -1], side="right"),
                                    s.vocab_size - 1)
        return DataBlock(self.name, block_index, start, n, {"indptr": indptr, "words": words})

    def data_nbytes(self) -> int:
        s = self.spec
        # words + z (int32 each) per token, indptr and doc-topic counts per doc
        return s.num_docs * (s.doc_length * 8 + 8 + 4 * self.hparams.num_topics)

    @property
    def num_keys(self) -> int:
        return self.vocab + 1

    @property
    def key_length(self) -> int:
        return self.hparams.num_topics

    @property
    def totals_key(self) -> int:
        """The key holding the topic totals n_k."""
        return self.vocab

    def init_value(self, keys: np.ndarray) -> np.ndarray:
        # Counts start at zero; workers push their initial assignments' counts (init_block).
        return np.zeros((len(keys), self.key_length), dtype=np.float32)

    def init_block(self, block: DataBlock) -> KeyValues | None:
        """Random initial topics for every token; returns their counts to push."""
        k = self.hparams.num_topics
        words = block.data["words"]
        z = rng_for(self.seed, STATE_INIT, block.block_index).integers(0, k, len(words)).astype(np.int32)
        docs = np.repeat(np.arange(block.num_rows), np.diff(block.data["indptr"]))
        block.state["z"] = z
        block.state["ndk"] = np.bincount(docs * k + z, minlength=block.num_rows * k).reshape(
            block.num_rows, k).astype(np.int32)
        keys = np.append(sorted_unique(words).astype(np.int64), self.totals_key)
        rows = np.searchsorted(keys, words)
        counts = np.bincount(rows * k + z, minlength=len(keys) * k).reshape(len(keys), k)
        counts[-1] = np.bincount(z, minlength=k)
        return KeyValues(keys, counts.astype(np.float32))

    def keys_for_batch(self, batch: Batch) -> np.ndarray:
        ip = batch.block.data["indptr"]
        words = batch.block.data["words"][ip[batch.start]:ip[batch.stop]]
        return np.append(sorted_unique(words).astype(np.int64), self.totals_key)

    def compute(self, batch: Batch, params: KeyValues, ctx: StepContext) -> KeyValues:
        hp = self.hparams
        block = batch.block
        ip = block.data["indptr"]
        counts = params.values.astype(np.float64)     # read-only here: each shard samples on a copy
        delta = np.zeros_like(counts)

        def sweep(docs: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            """Sample documents [start, stop) of the block; their (word rows, word-row changes,
            topic-total changes)."""
            start, stop = batch.start + docs[0], batch.start + docs[1]
            lo, hi = int(ip[start]), int(ip[stop])
            word_rows = params.rows_of(block.data["words"][lo:hi].astype(np.int64))
            rows = sorted_unique(word_rows)
            nwk, nk = counts[rows], counts[-1].copy()   # copies: sampling updates them as it goes
            rng = rng_for(self.seed, STEP, ctx.epoch, block.block_index, start)
            sample_batch(rng, ip[start:stop + 1] - lo, np.searchsorted(rows, word_rows), block.state["z"][lo:hi],
                         block.state["ndk"][start:stop], nwk, nk, hp.alpha, hp.beta, self.vocab)
            nwk -= counts[rows]
            nk -= counts[-1]
            return rows, nwk, nk
        for rows, d_nwk, d_nk in run_shards(sweep, split_range(batch.size, ctx.threads), ctx.threads):
            delta[rows] += d_nwk     # exact: integer count changes in float64
            delta[-1] += d_nk
        return KeyValues(params.keys, delta.astype(np.float32))

    def objective_keys(self, block: DataBlock) -> np.ndarray:
        return np.zeros(0, dtype=np.int64)   # the document part needs only local counts

    def objective(self, block: DataBlock, params: KeyValues) -> ObjectivePart:
        """log p(z) of the block's documents (the Dirichlet-multinomial over doc-topic counts)."""
        a, k = self.hparams.alpha, self.hparams.num_topics
        lengths = np.diff(block.data["indptr"])
        ndk = block.state["ndk"].astype(np.float64)
        value = (block.num_rows * gammaln(k * a) - gammaln(lengths + k * a).sum()
                 + (gammaln(ndk + a) - gammaln(a)).sum())
        return ObjectivePart(float(value), int(lengths.sum()))

    def server_objective(self, params: KeyValues) -> float:
        """log p(w | z) restricted to these keys: word rows and, if present, the topic totals."""
        b, v = self.hparams.beta, self.vocab
        counts = np.maximum(params.values.astype(np.float64), 0.0)
        is_total = params.keys == self.totals_key
        value = float((gammaln(counts[~is_total] + b) - gammaln(b)).sum())
        if is_total.any():
            value += float((gammaln(v * b) - gammaln(counts[is_total] + v * b)).sum())
        return value

    def combine(self, worker_parts: Sequence[ObjectivePart], server_parts: Sequence[float]) -> float:
        total = sum(worker_parts, ObjectivePart())
        return (total.value + float(sum(server_parts))) / max(total.count, 1)

    def topic_word(self, model: np.ndarray) -> np.ndarray:
        """Estimated p(word | topic) as (vocab, topics) from the count model."""
        counts = np.maximum(model.astype(np.float64), 0.0)
        b = self.hparams.beta
        return (counts[:-1] + b) / (counts[-1] + self.vocab * b)

    def evaluate(self, model: np.ndarray, heldout: Sequence[DataBlock]) -> dict[str, float]:
        """Held-out log-likelihood per token by document completion: each held-out document's
        topic mixture is fitted (EM fold-in) on its even-position tokens and its odd-position
        tokens are scored. With generated data the same score with the true topics is reported
        for reference."""
        metrics = {"heldout_loglik_per_token": self._completion_loglik(self.topic_word(model), heldout)}
        if self.has_ground_truth:
            metrics["true_model_heldout_loglik_per_token"] = self._completion_loglik(self.true_topics.T, heldout)
        return metrics

    def predict(self, block: DataBlock, params: KeyValues) -> np.ndarray:
        """Each document's topic mixture (docs, topics), fitted by EM fold-in on all its tokens
        with the model's topics fixed (the held-out evaluation fits half a document the same way)."""
        phi = self.topic_word(params.values[params.rows_of(np.arange(self.num_keys, dtype=np.int64))])
        ip, words = block.data["indptr"], block.data["words"].astype(np.int64)
        docs = np.repeat(np.arange(block.num_rows), np.diff(ip))
        counts = sp.coo_matrix((np.ones(len(words)), (docs, words)), shape=(block.num_rows, len(phi))).tocsr()
        counts.sum_duplicates()
        fd, fw = counts.nonzero()
        fc = np.asarray(counts[fd, fw]).ravel()
        theta = np.full((block.num_rows, phi.shape[1]), 1.0 / phi.shape[1])
        for _ in range(50):
            s = (theta[fd] * phi[fw]).sum(axis=1)
            ratio = sp.csr_matrix((fc / s, (fd, fw)), shape=counts.shape)
            theta = theta * np.asarray(ratio @ phi) + self.hparams.alpha
            theta /= theta.sum(axis=1, keepdims=True)
        return theta

    def _completion_loglik(self, phi: np.ndarray, heldout: Sequence[DataBlock], iters: int = 50) -> float:
        a = self.hparams.alpha
        total = 0.0
        n = 0
        for block in heldout:
            ip, words = block.data["indptr"], block.data["words"].astype(np.int64)
            docs = np.repeat(np.arange(block.num_rows), np.diff(ip))
            even = (np.arange(len(words)) - ip[docs]) % 2 == 0
            fit = sp.coo_matrix((np.ones(int(even.sum())), (docs[even], words[even])),
                                shape=(block.num_rows, len(phi))).tocsr()
            fit.sum_duplicates()
            fd, fw = fit.nonzero()
            fc = np.asarray(fit[fd, fw]).ravel()
            theta = np.full((block.num_rows, phi.shape[1]), 1.0 / phi.shape[1])
            for _ in range(iters):
                s = (theta[fd] * phi[fw]).sum(axis=1)
                ratio = sp.csr_matrix((fc / s, (fd, fw)), shape=fit.shape)
                theta = theta * np.asarray(ratio @ phi) + a
                theta /= theta.sum(axis=1, keepdims=True)
            td, tw = docs[~even], words[~even]
            total += float(np.log((theta[td] * phi[tw]).sum(axis=1)).sum())
            n += len(tw)
        return total / max(n, 1)


def _dirichlet(rng: np.random.Generator, concentration: float, shape: tuple[int, int]) -> np.ndarray:
    """Rows ~ Dir(concentration); via gammas, guarding the all-zero rows tiny priors can give."""
    g = rng.gamma(concentration, 1.0, size=shape)
    g[g.sum(axis=1) == 0, 0] = 1.0
    return g / g.sum(axis=1, keepdims=True)


def _categorical(rng: np.random.Generator, probs: np.ndarray) -> np.ndarray:
    """One draw per row of `probs` (rows sum to 1)."""
    c = np.cumsum(probs, axis=1)
    u = rng.random((len(probs), 1)) * c[:, -1:]
    return np.minimum((c < u).sum(axis=1), probs.shape[1] - 1)

"""Closed-form solve of eq. 3.5 for identical nodes.

With N identical nodes (per-sample compute c, worker bandwidth b_w, server bandwidth b_s), the
optimal d and m are even splits, so only the number of workers w matters (S = N - w):

    f(w) = (D / w) * T(w),   T(w) = c + (bytes / B) * max(1 / b_w, w / ((N - w) b_s))

which is eq. 3.5 when b_w = b_s = b (bytes = M, the whole model pulled per mini-batch).
Write K_w = bytes / (B b_w), K_s = bytes / (B b_s). Below the crossover w_x = N K_w / (K_w + K_s)
the worker's own bandwidth binds and f = D (c + K_w) / w falls with w; above it
f = D c / w + D K_s / (N - w), convex, with its minimum where (N - w) / w = sqrt(K_s / c), i.e.
w_c = N sqrt(c) / (sqrt(c) + sqrt(K_s)). So f falls then is convex (unimodal) and the continuous
optimum is w* = max(w_x, w_c); the integer optimum is floor(w*) or ceil(w*). That is O(1) instead
of the dissertation's O(N) scan; `baselines.brute_force_homogeneous` is that scan and the tests
check the two agree.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from models.cruise_cost import CostModelError, JobProfile, NodeProfile

from .targets import Slot, Target, build_target, choose_workers


@dataclass(frozen=True)
class HomogeneousOptimum:
    """Best (W, S) for N identical nodes and its continuous-batch epoch time f(W)."""

    workers: int
    servers: int
    epoch_s: float


def homogeneous_epoch_time(job: JobProfile, node: NodeProfile, n: int, w: int) -> float:
    """f(w): eq. 3.5's objective, the epoch time of w workers and n - w servers, even splits."""
    if not 1 <= w <= n - 1:
        raise CostModelError(f"need 1 <= workers <= N - 1, got workers={w}, N={n}")
    k_w = job.bytes_per_batch / (job.batch_size * node.worker_bandwidth)
    k_s = job.bytes_per_batch / (job.batch_size * node.server_bandwidth)
    samples = job.input_blocks * job.samples_per_block
    return samples / w * (node.compute_s_per_sample + max(k_w, k_s * w / (n - w)))


def solve_homogeneous(job: JobProfile, node: NodeProfile, n: int) -> HomogeneousOptimum:
    """The best number of workers for `n` nodes like `node`, in O(1) (see the module doc)."""
    if n < 2:
        raise CostModelError(f"need at least 2 nodes (one worker, one server), got {n}")
    c = node.compute_s_per_sample
    k_w = job.bytes_per_batch / (job.batch_size * node.worker_bandwidth)
    k_s = job.bytes_per_batch / (job.batch_size * node.server_bandwidth)
    w_cross = n * k_w / (k_w + k_s)
    w_convex = n * math.sqrt(c) / (math.sqrt(c) + math.sqrt(k_s))
    w_star = max(w_cross, w_convex)
    candidates = {min(max(v, 1), n - 1) for v in (math.floor(w_star), math.ceil(w_star))}
    # Ties go to fewer workers: the same predicted time with less input to spread.
    best = min(sorted(candidates), key=lambda w: homogeneous_epoch_time(job, node, n, w))
    return HomogeneousOptimum(best, n - best, homogeneous_epoch_time(job, node, n, best))


def mean_profile(profiles: Sequence[NodeProfile], node_id: str = "mean") -> NodeProfile:
    """One profile standing for a set of (nearly) identical nodes."""
    if not profiles:
        raise CostModelError("no node profiles")
    return NodeProfile(node_id, float(np.mean([p.compute_s_per_sample for p in profiles])),
                       float(np.mean([p.worker_bandwidth for p in profiles])),
                       float(np.mean([p.server_bandwidth for p in profiles])))


def solve_homogeneous_target(job: JobProfile, slots: Sequence[Slot],
                             node: Optional[NodeProfile] = None) -> Target:
    """Target for identical `slots`: eq. 3.5's (W, S), current roles kept where possible, blocks
    split evenly (as evenly as whole blocks allow)."""
    t0 = time.perf_counter()
    node = node or mean_profile([s.profile for s in slots])
    best = solve_homogeneous(job, node, len(slots))
    solve_ms = (time.perf_counter() - t0) * 1000.0
    workers = [s.slot_id for s in choose_workers(slots, best.workers)]
    return build_target(job, slots, workers, "closed-form", solve_ms,
                        {"predicted_epoch_s_eq35": best.epoch_s})

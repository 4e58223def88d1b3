"""Closed-form solve of eq. 3.5 for identical nodes.

With N identical nodes (per-sample compute c, worker bandwidth b_w, server bandwidth b_s, latency
L per mini-batch; contention k(w) = max(1, w / P), models.cruise_cost), the optimal d and m are even
splits, so only the number of workers w matters (S = N - w):

    f(w) = (D / w) * T(w),   T(w) = c k(w) + L / B + (bytes / B) * max(1 / b_w, w / ((N - w) b_s))

which is eq. 3.5 when L = 0, P = inf and b_w = b_s = b (bytes = M, the whole model pulled per
mini-batch). Write K_w = bytes / (B b_w), K_s = bytes / (B b_s), a = c + L / B. Below the
crossover w_x = N K_w / (K_w + K_s) the worker's own bandwidth binds and f falls with w; above it,
for w <= P, f = D a / w + D K_s / (N - w), convex, with its minimum where (N - w) / w = sqrt(K_s / a),
i.e. w_c = N sqrt(a) / (sqrt(a) + sqrt(K_s)); for w >= P the compute term is the constant D c / P
and the same holds with a = L / B. So the continuous optimum is one of w_x, the two w_c and P, and
the integer optimum is the floor or ceil of one of them: O(1) instead of the dissertation's O(N)
scan; `baselines.brute_force_homogeneous` is that scan and the tests check the two agree.

Whole blocks: with few input blocks per worker, ceil(D / w) is what the slowest worker trains
(8 blocks on 3 workers: 3, not 2.67), and whole mini-batches round again, so by whole blocks the
cost is a staircase whose best step the continuous candidates can miss (by 2.5x in one case). So
`integral=True` (what the optimizer uses) scores every worker count, by whole blocks and ceil'd
mini-batches as the chosen target is priced: the dissertation's O(N) scan of a closed form, N the
nodes -- a departure from the O(1) search kept for the continuous form.
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
    compute = node.compute_s_per_sample * job.contention(w)
    lat = node.latency_s_per_batch / job.batch_size
    if job.overlap:
        return samples / w * (lat + max(compute + k_w, k_s * w / (n - w)))
    return samples / w * (compute + lat + max(k_w, k_s * w / (n - w)))


def homogeneous_epoch_time_blocks(job: JobProfile, node: NodeProfile, n: int, w: int) -> float:
    """The epoch time of w workers and n - w servers with whole blocks split as evenly as they go
    and ceil'd mini-batches: what the target of that shape is priced at."""
    blocks = -(-job.input_blocks // w)
    model = -(-job.model_blocks // (n - w))
    samples = blocks * job.samples_per_block
    batches = math.ceil(samples / job.batch_size - 1e-9)
    server_batch = model * job.bytes_per_model_block * w / node.server_bandwidth
    worker_batch = job.bytes_per_batch / node.worker_bandwidth
    compute = node.compute_s_per_sample * job.contention(w) * samples
    if job.overlap:
        return max(compute + batches * (node.latency_s_per_batch + worker_batch),
                   batches * (node.latency_s_per_batch + server_batch))
    return compute + batches * (node.latency_s_per_batch + max(worker_batch, server_batch))


def solve_homogeneous(job: JobProfile, node: NodeProfile, n: int, integral: bool = False) -> HomogeneousOptimum:
    """The best number of workers for `n` nodes like `node`, in O(1) (see the module doc); with
    `integral`, by whole blocks, and epoch_s is then `homogeneous_epoch_time_blocks`."""
    if n < 2:
        raise CostModelError(f"need at least 2 nodes (one worker, one server), got {n}")
    lo, hi = job.worker_range(n)
    c, lat = node.compute_s_per_sample, node.latency_s_per_batch / job.batch_size
    k_w = job.bytes_per_batch / (job.batch_size * node.worker_bandwidth)
    k_s = job.bytes_per_batch / (job.batch_size * node.server_bandwidth)
    p = job.compute_parallelism
    if job.overlap:
        # Compute joins the worker's side of the max: the crossover moves to (c + K_w)(N - w) = K_s w
        # (for w > P, c w / P + K_w = K_s w / (N - w), a quadratic), and past it only the latency
        # falls with w, so its convex minimum is the w_c of a = L / B.
        points = [n * (c + k_w) / (c + k_w + k_s), n * math.sqrt(lat) / (math.sqrt(lat) + math.sqrt(k_s))]
        if p < n:
            a, b = c / p, c * n / p - k_w - k_s
            points += [p, (b + math.sqrt(b * b + 4 * a * k_w * n)) / (2 * a) if a > 0 else p]
    else:
        points = [n * k_w / (k_w + k_s), n * math.sqrt(c + lat) / (math.sqrt(c + lat) + math.sqrt(k_s))]
        if p < n:
            points += [p, n * math.sqrt(lat) / (math.sqrt(lat) + math.sqrt(k_s))]
    candidates = {min(max(v, lo), hi) for p in points for v in (math.floor(p), math.ceil(p))}
    cost = homogeneous_epoch_time
    if integral:
        # By whole blocks and whole mini-batches the cost is a staircase whose best step the
        # continuous turning points (and the block-count steps next to them) can miss -- by 2.5x
        # in an audit's case (19 input blocks of one batch each: one worker best, four chosen). So
        # every worker count is scored: O(N) calls of a closed form, N the nodes.
        cost = homogeneous_epoch_time_blocks
        candidates = set(range(lo, hi + 1))
    # Ties go to fewer workers: the same predicted time with less input to spread.
    best = min(sorted(candidates), key=lambda w: cost(job, node, n, w))
    return HomogeneousOptimum(best, n - best, cost(job, node, n, best))


def mean_profile(profiles: Sequence[NodeProfile], node_id: str = "mean") -> NodeProfile:
    """One profile standing for a set of (nearly) identical nodes."""
    if not profiles:
        raise CostModelError("no node profiles")
    return NodeProfile(node_id, float(np.mean([p.compute_s_per_sample for p in profiles])),
                       float(np.mean([p.worker_bandwidth for p in profiles])),
                       float(np.mean([p.server_bandwidth for p in profiles])),
                       float(np.mean([p.latency_s_per_batch for p in profiles])))


def solve_homogeneous_target(job: JobProfile, slots: Sequence[Slot],
                             node: Optional[NodeProfile] = None) -> Target:
    """Target for identical `slots`: eq. 3.5's (W, S), current roles kept where possible, blocks
    split evenly (as evenly as whole blocks allow)."""
    t0 = time.perf_counter()
    node = node or mean_profile([s.profile for s in slots])
    best = solve_homogeneous(job, node, len(slots), integral=True)
    solve_ms = (time.perf_counter() - t0) * 1000.0
    workers = [s.slot_id for s in choose_workers(slots, best.workers)]
    return build_target(job, slots, workers, "closed-form", solve_ms,
                        {"predicted_epoch_s_eq35": best.epoch_s})

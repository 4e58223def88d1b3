"""Optimal integer block split once roles are fixed (the d and m of Fig. 3.2 for a given w, s).

With roles fixed the two sides separate: the model split only sets the slowest server's per-batch
time Z = max_j m_j w / b_j, and every worker's epoch grows with Z, so the best model split is the
one minimising Z; then, for that Z, the best input split minimises max_i d_i r_i with
r_i = C^i_w.proc * k(W) * spb + (L_i + max(Z, bytes/b_i)) * spb / B (the continuous-batch cost of
one block, with the contention k(W) and latency L_i of models.cruise_cost).
Both are "minimise the largest x_i * weight_i with sum x_i = total": proportional water-filling,
rounded down, then the remainder one block at a time to whoever ends up lowest (a greedy that is
optimal for this min-max problem).
"""
from __future__ import annotations

import heapq
from typing import Sequence

import numpy as np

from models.cruise_cost import JobProfile


def min_max_split(total: int, weights: Sequence[float] | np.ndarray) -> np.ndarray:
    """Integers x >= 0 with sum(x) == total minimising max_i x_i * weights_i (weights > 0)."""
    w = np.asarray(weights, dtype=float)
    if total < 0:
        raise ValueError(f"total must be >= 0, got {total}")
    if len(w) == 0:
        raise ValueError("nothing to split over")
    if np.any(~(w > 0)):
        raise ValueError("weights must be positive")
    inv = 1.0 / w
    x = np.floor(total * inv / inv.sum()).astype(np.int64)
    rest = total - int(x.sum())
    if rest:
        # One block at a time to the slot whose cost after taking it is smallest.
        heap = [((int(x[i]) + 1) * w[i], i) for i in range(len(w))]
        heapq.heapify(heap)
        for _ in range(rest):
            _, i = heapq.heappop(heap)
            x[i] += 1
            heapq.heappush(heap, ((int(x[i]) + 1) * w[i], i))
    return x


def split_blocks(job: JobProfile, compute_s_per_sample: np.ndarray, worker_bandwidth: np.ndarray,
                 server_bandwidth: np.ndarray,
                 latency_s_per_batch: np.ndarray | float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(input blocks per worker, model blocks per server) minimising the continuous-batch epoch time
    for the given workers (first two arrays and the latencies) and servers (third array)."""
    w = len(compute_s_per_sample)
    model = min_max_split(job.model_blocks, 1.0 / np.asarray(server_bandwidth, dtype=float))
    z = float(np.max(model * (job.bytes_per_model_block * w) / server_bandwidth))
    worker_batch = job.bytes_per_batch / np.asarray(worker_bandwidth, dtype=float)
    compute = np.asarray(compute_s_per_sample, dtype=float) * job.contention(w)
    if job.overlap:      # the cost model's departure 5: compute hides in the servers' term
        block_cost = job.samples_per_block * np.maximum(compute + (latency_s_per_batch + worker_batch) / job.batch_size,
                                                        (latency_s_per_batch + z) / job.batch_size)
    else:
        block_cost = job.samples_per_block * (compute + (latency_s_per_batch + np.maximum(z, worker_batch))
                                              / job.batch_size)
    return min_max_split(job.input_blocks, block_cost), model

"""Exhaustive searches the solvers are checked and benchmarked against.

`brute_force_homogeneous` scans every (W, S) split with even partitioning and evaluates the cost
model on the full arrays of N nodes (what the dissertation's grid search does, §3.4.2);
`brute_force_heterogeneous` tries every role assignment of a few distinct nodes with the optimal
block split for each (exponential: tests only).
"""
from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np

from models.cruise_cost import CostModelError, JobProfile, NodeProfile, epoch_time_arrays

from .balance import split_blocks
from .solver_homogeneous import HomogeneousOptimum


def brute_force_homogeneous(job: JobProfile, node: NodeProfile, n: int) -> HomogeneousOptimum:
    """The best (W, S) by evaluating eq. 3.1-3.4 for every W in 1..N-1 within the job's role
    bounds (even, continuous splits)."""
    if n < 2:
        raise CostModelError(f"need at least 2 nodes, got {n}")
    lo, hi = job.worker_range(n)
    best: HomogeneousOptimum | None = None
    for w in range(lo, hi + 1):
        s = n - w
        t = epoch_time_arrays(job, np.full(w, node.compute_s_per_sample), np.full(w, node.worker_bandwidth),
                              np.full(w, job.input_blocks / w), np.full(s, node.server_bandwidth),
                              np.full(s, job.model_blocks / s), integral_batches=False,
                              latency_s_per_batch=node.latency_s_per_batch)
        if best is None or t < best.epoch_s:
            best = HomogeneousOptimum(w, s, t)
    assert best is not None
    return best


def brute_force_heterogeneous(job: JobProfile, nodes: Sequence[NodeProfile]) -> tuple[float, tuple[str, ...]]:
    """(best continuous-batch epoch time, worker node ids) over all 2^N - 2 role assignments
    within the job's role bounds."""
    if len(nodes) > 16:
        raise CostModelError(f"brute force over {len(nodes)} nodes would take too long")
    lo, hi = job.worker_range(len(nodes))
    best: tuple[float, tuple[str, ...]] = (float("inf"), ())
    for roles in itertools.product((True, False), repeat=len(nodes)):
        ws = [p for p, r in zip(nodes, roles) if r]
        ss = [p for p, r in zip(nodes, roles) if not r]
        if not lo <= len(ws) <= hi:
            continue
        c = np.array([p.compute_s_per_sample for p in ws])
        bw = np.array([p.worker_bandwidth for p in ws])
        bs = np.array([p.server_bandwidth for p in ss])
        lat = np.array([p.latency_s_per_batch for p in ws])
        d, m = split_blocks(job, c, bw, bs, lat)
        t = epoch_time_arrays(job, c, bw, d, bs, m, integral_batches=False, latency_s_per_batch=lat)
        if t < best[0] - 1e-12:
            best = (t, tuple(p.node_id for p in ws))
    return best

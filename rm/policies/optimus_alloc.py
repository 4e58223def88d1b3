"""Optimus's resource allocation (§4.1): marginal gains (eq. 9), one worker or server at a time.

The paper's loop: start every job at its minimum, then repeatedly give the job with the largest
marginal gain -- the cut in its remaining time t = Q / f(p, w) from one more worker (or server),
divided by the dominant-resource share of that executor, whichever role gains more -- one more
executor of that role, update its gain, until a resource runs out or no gain is positive.

Computed here without a heap of Python objects, for thousands of jobs: a job's sequence of
additions (which role, what gain) depends only on the job itself, so every job's sequence is built
at once, one step per numpy operation over all jobs. The heap would pop a job's next addition
when its gain is the largest of all jobs' next additions, so the global order is that of the
sequences merged by gain: sorting every addition by the running minimum of its job's gains so far
(descending; ties by job order, then step) reproduces the heap's order exactly, non-concave gains
included. Additions are then granted in that order while they fit the budget. Departure: when a
job's next addition does not fit, the paper stops ("until some resource in the cluster is used
up"); here that job stops growing and smaller executors of other jobs may still fit (the same
when every executor is the same size). `greedy_reference` is the paper's loop written plainly,
for the tests.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from models.optimus_fit import features

Array = NDArray[np.float64]
IntArray = NDArray[np.int64]

WORKER, SERVER = 0, 1


@dataclass(frozen=True)
class AllocationProblem:
    """Per job (arrays of length J, jobs in priority order for ties): remaining epochs `remaining`,
    speed coefficients `coefficients` (J x 7, models.optimus_fit.FEATURES: 1/f = c · features),
    starting and largest shape, the executor's resource (J x R), its dominant share `dominant`
    and the priority factor `factor`; `budget` (R) is what the additions may use in all."""

    remaining: Array
    coefficients: Array
    servers: IntArray
    workers: IntArray
    max_servers: IntArray
    max_workers: IntArray
    executor: Array
    dominant: Array
    factor: Array
    budget: Array

    @property
    def jobs(self) -> int:
        return len(self.remaining)


def remaining_time(coefficients: Array, remaining: Array, servers: Array, workers: Array) -> Array:
    """t = Q / f(p, w) per job (vectorised)."""
    return np.asarray(remaining * np.einsum("jf,jf->j", features(servers, workers), coefficients))


def _paths(prob: AllocationProblem) -> tuple[IntArray, IntArray, Array, IntArray]:
    """Every job's own greedy sequence of additions: (job, role, gain, step) per addition, the
    sequence cut at its first non-positive gain or when both roles are at their maximum."""
    p = prob.servers.astype(float).copy()
    w = prob.workers.astype(float).copy()
    q, coef, dom, factor = prob.remaining, prob.coefficients, prob.dominant, prob.factor
    alive = np.ones(prob.jobs, dtype=bool)
    jobs, roles, gains, steps = [], [], [], []
    step = 0
    while True:
        idx = np.nonzero(alive)[0]
        if len(idx) == 0:
            break
        pi, wi, qi, ci = p[idx], w[idx], q[idx], coef[idx]
        now = remaining_time(ci, qi, pi, wi)
        gain_s = np.where(pi < prob.max_servers[idx], (now - remaining_time(ci, qi, pi + 1, wi)) / dom[idx], -np.inf)
        gain_w = np.where(wi < prob.max_workers[idx], (now - remaining_time(ci, qi, pi, wi + 1)) / dom[idx], -np.inf)
        role = np.where(gain_w >= gain_s, WORKER, SERVER)     # a tie goes to a worker
        gain = np.maximum(gain_w, gain_s) * factor[idx]
        go = gain > 0
        alive[idx[~go]] = False
        idx, role, gain = idx[go], role[go], gain[go]
        jobs.append(idx)
        roles.append(role)
        gains.append(gain)
        steps.append(np.full(len(idx), step))
        p[idx] += role == SERVER
        w[idx] += role == WORKER
        step += 1
    if not jobs:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, np.zeros(0), empty
    return (np.concatenate(jobs).astype(np.int64), np.concatenate(roles).astype(np.int64),
            np.concatenate(gains), np.concatenate(steps).astype(np.int64))


def allocate(prob: AllocationProblem) -> tuple[IntArray, IntArray]:
    """The (servers, workers) of every job after the marginal-gain loop (see the module doc)."""
    servers = prob.servers.astype(np.int64).copy()
    workers = prob.workers.astype(np.int64).copy()
    job, role, gain, step = _paths(prob)
    if len(job) == 0:
        return servers, workers
    # The heap's order: by the running minimum of each job's gains along its own sequence.
    key = gain.copy()
    order = np.lexsort((step, job))          # each job's additions in step order
    for_job = job[order]
    starts = np.r_[0, np.nonzero(np.diff(for_job))[0] + 1]
    key[order] = _segment_cummin(gain[order], starts)
    ranked = np.lexsort((step, job, -key))
    budget = prob.budget.astype(float).copy()
    cost = prob.executor[job]
    dead = np.zeros(prob.jobs, dtype=bool)
    dead |= np.any(prob.executor > budget + 1e-9, axis=1)
    taken: list[IntArray] = []
    rest = ranked
    while len(rest):
        rest = rest[~dead[job[rest]]]
        if len(rest) == 0:
            break
        used = np.cumsum(cost[rest], axis=0)
        over = np.nonzero(np.any(used > budget + 1e-9, axis=1))[0]
        cut = over[0] if len(over) else len(rest)
        taken.append(rest[:cut])
        if cut:
            budget = budget - used[cut - 1]
        if cut == len(rest):
            break
        # That job's next addition does not fit: it stops growing, as does any whose executor no
        # longer fits what is left.
        dead[job[rest[cut]]] = True
        dead |= np.any(prob.executor > budget + 1e-9, axis=1)
        rest = rest[cut + 1:]
    if taken:
        got = np.concatenate(taken)
        # Per-job counts of the granted additions (bincount: np.add.at is several times slower).
        servers += np.bincount(job[got][role[got] == SERVER], minlength=prob.jobs)
        workers += np.bincount(job[got][role[got] == WORKER], minlength=prob.jobs)
    return servers, workers


def _segment_cummin(values: Array, starts: IntArray) -> Array:
    """Running minimum of `values` restarting at each index in `starts`."""
    out = values.copy()
    ends = np.r_[starts[1:], len(values)]
    lengths = ends - starts
    # Segments are short (a job's additions); loop over the step position, vectorised over segments.
    for i in range(1, int(lengths.max()) if len(lengths) else 0):
        has = lengths > i
        at = starts[has] + i
        out[at] = np.minimum(out[at], out[at - 1])
    return out


def greedy_reference(prob: AllocationProblem) -> tuple[IntArray, IntArray]:
    """The paper's loop written plainly with a heap (slow; the tests compare `allocate` with it)."""
    servers = prob.servers.astype(np.int64).copy()
    workers = prob.workers.astype(np.int64).copy()
    budget = prob.budget.astype(float).copy()

    def best(j: int) -> tuple[float, int]:
        one = np.array([j])
        now = remaining_time(prob.coefficients[one], prob.remaining[one], servers[one], workers[one])[0]
        gs = gw = -np.inf
        if servers[j] < prob.max_servers[j]:
            gs = (now - remaining_time(prob.coefficients[one], prob.remaining[one], servers[one] + 1,
                                       workers[one])[0]) / prob.dominant[j]
        if workers[j] < prob.max_workers[j]:
            gw = (now - remaining_time(prob.coefficients[one], prob.remaining[one], servers[one],
                                       workers[one] + 1)[0]) / prob.dominant[j]
        return max(gw, gs) * prob.factor[j], WORKER if gw >= gs else SERVER

    heap = []
    for j in range(prob.jobs):
        g, r = best(j)
        heap.append((-g, j, 0, r))
    heapq.heapify(heap)
    while heap:
        neg, j, step, r = heapq.heappop(heap)
        if -neg <= 0:
            break
        if np.any(prob.executor[j] > budget + 1e-9):
            continue
        budget -= prob.executor[j]
        if r == SERVER:
            servers[j] += 1
        else:
            workers[j] += 1
        g, r2 = best(j)
        heapq.heappush(heap, (-g, j, step + 1, r2))
    return servers, workers


__all__ = ["AllocationProblem", "SERVER", "WORKER", "allocate", "greedy_reference", "remaining_time"]

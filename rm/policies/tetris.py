"""The `tetris` policy: packing elastic PS jobs by resource alignment (Tetris, SIGCOMM'14).

The packing baseline of Optimus §6.1 ("packs jobs to servers to minimize resource fragmentation").
Every round, from each started job's minimum (n_min) and room for the jobs that have not started
(rm/policies/packing.py), executors go one at a time to the (job, node) pair with the highest
alignment score: the dot product of the job's demand vector with the node's free vector, both
normalised by the node's capacity (Tetris §3.1), among jobs below their maximum (n_max) and nodes
the executor fits on -- until nothing fits anywhere.

Departure, and why: Tetris also favours jobs with little remaining work (its SRTF term), and
Optimus feeds it its own remaining-time estimates. No such estimate exists outside the `optimus`
policy, so ties of alignment go to the job holding the least (its dominant share: Optimus's "small
resource consumption"), then to the earlier job; ties of node to the job's current nodes (fewer
executors move), then the node id.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from protocol.records import Resource

from .decision import Decision
from .elastic_jobs import ElasticJob, elastic_view
from .packing import Packing
from .snapshot import ClusterSnapshot


def alignment(demand: Resource, free: Resource, capacity: Resource) -> float:
    """Tetris's alignment score of placing `demand` on a node with `free` of `capacity`."""
    score = 0.0
    if capacity.memory > 0:
        score += (demand.memory / capacity.memory) * (free.memory / capacity.memory)
    if capacity.vcores > 0:
        score += (demand.vcores / capacity.vcores) * (free.vcores / capacity.vcores)
    return score


def best_aligned(packing: Packing, job: ElasticJob, r: Resource) -> Optional[int]:
    """The node `r` fits on with the highest alignment score (then the job's current node, then id),
    among those where it displaces no other job's current executor if there are any."""
    cands = packing.fitting(r)
    if not cands:
        return None
    cands = packing.undisplacing(job, r, cands)
    cap = packing.view.capacity
    current = packing.unplaced_current[job.app_id]
    return max(cands, key=lambda k: (alignment(r, packing.free[k], cap[k]), current.get(k, 0) > 0, -k))


def grow(packing: Packing, jobs: list[ElasticJob]) -> None:
    """Tetris's growth: one executor at a time to the best (job, node) pair -- per job its
    `best_aligned` node; across jobs the highest alignment, then the least held (dominant share),
    then the earliest job -- until no job below its n_max fits anywhere. The same choices as
    calling `best_aligned` for every job at every step, with the (job, node) matrices in numpy:
    placing on node k changes only column k."""
    view = packing.view
    a, b = len(jobs), len(view.nodes)
    if not a or not b:
        return
    demand = np.array([[j.demand.memory, j.demand.vcores] for j in jobs], dtype=float)          # (a, 2)
    cap = np.array([[c.memory, c.vcores] for c in view.capacity], dtype=float)                   # (b, 2)
    has_cap = cap > 0
    safe_cap = np.where(has_cap, cap, 1.0)
    free = np.array([[r.memory, r.vcores] for r in packing.free], dtype=float)
    claimed = np.array([[r.memory, r.vcores] for r in packing.claimed], dtype=float)
    own = np.zeros((a, b))
    for i, j in enumerate(jobs):
        for k, n in packing.unplaced_current[j.app_id].items():
            own[i, k] = n
    count = np.array([packing.n(j.app_id) for j in jobs])
    active = count < np.array([j.n_max for j in jobs])
    d_norm = np.where(has_cap[None, :, :], demand[:, None, :] / safe_cap[None, :, :], 0.0)        # (a, b, 2)

    def columns(ks: slice) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """fits, undisplacing and alignment of every job on nodes `ks`."""
        f, c, o = free[ks], claimed[ks], own[:, ks]
        fits = np.all(demand[:, None, :] <= f[None], axis=-1)
        und = np.all(demand[:, None, :] <= f[None] - c[None] + demand[:, None, :] * o[:, :, None], axis=-1)
        align = np.sum(d_norm[:, ks, :] * np.where(has_cap[ks], f / safe_cap[ks], 0.0)[None], axis=-1)
        return fits, und & fits, align

    fits, und, align = columns(slice(None))
    while True:
        cand = np.where(und.any(1, keepdims=True), und, fits) & active[:, None]
        live = cand.any(1)
        if not live.any():
            return
        masked = np.where(cand, align, -np.inf)
        best = masked.max(1)
        tie = cand & (masked >= best[:, None])
        pref = tie & (own > 0)
        node = np.where(pref.any(1), pref.argmax(1), tie.argmax(1))
        # the smallest key wins: highest alignment, then least held, then earliest job
        i = min(np.flatnonzero(live).tolist(), key=lambda i: (
            -float(best[i]), jobs[i].share(int(count[i]), view.total) * jobs[i].weight, jobs[i].order))
        k = int(node[i])
        packing.take(jobs[i], jobs[i].demand, k)
        free[k] -= demand[i]
        if own[i, k] > 0:
            own[i, k] -= 1
            claimed[k] -= demand[i]
        count[i] += 1
        active[i] = count[i] < jobs[i].n_max
        fits[:, k:k + 1], und[:, k:k + 1], align[:, k:k + 1] = columns(slice(k, k + 1))


class TetrisPolicy:
    """Alignment packing of executors (see the module doc). Stateless."""

    name = "tetris"

    def decide(self, snapshot: ClusterSnapshot) -> Decision:
        view = elastic_view(snapshot)
        packing = Packing(view)
        packing.place_minimums(best_aligned)
        packing.place_incoming(best_aligned)
        grow(packing, list(view.started))
        out = {}
        for j in view.started:
            per_node = packing.per_node(j.app_id)
            if per_node and view.changed(j, per_node):
                out[j.app_id] = j.decision(per_node, f"tetris: packed by alignment on {len(per_node)} node(s)")
        return Decision(out)


__all__ = ["TetrisPolicy", "alignment", "best_aligned"]

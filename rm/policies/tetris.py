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


class TetrisPolicy:
    """Alignment packing of executors (see the module doc). Stateless."""

    name = "tetris"

    def decide(self, snapshot: ClusterSnapshot) -> Decision:
        view = elastic_view(snapshot)
        packing = Packing(view)
        packing.place_minimums(best_aligned)
        packing.place_incoming(best_aligned)
        growing = list(view.started)
        while growing:
            best: Optional[tuple[tuple[float, float, tuple[float, str]], ElasticJob, int]] = None
            for j in list(growing):
                k = best_aligned(packing, j, j.demand) if packing.n(j.app_id) < j.n_max else None
                if k is None:
                    growing.remove(j)      # at its maximum or fits nowhere: it gets no more
                    continue
                held = j.demand.scale(packing.n(j.app_id)).dominant_share(view.total)
                # the smallest key wins: highest alignment, then least held, then earliest job
                key = (-alignment(j.demand, packing.free[k], view.capacity[k]), held, j.order)
                if best is None or key < best[0]:
                    best = (key, j, k)
            if best is not None:
                packing.take(best[1], best[1].demand, best[2])
        out = {}
        for j in view.started:
            per_node = packing.per_node(j.app_id)
            if per_node and view.changed(j, per_node):
                out[j.app_id] = j.decision(per_node, f"tetris: packed by alignment on {len(per_node)} node(s)")
        return Decision(out)


__all__ = ["TetrisPolicy", "alignment", "best_aligned"]

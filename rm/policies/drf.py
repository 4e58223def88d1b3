"""The `drf` policy: work-conserving (weighted) dominant resource fairness over elastic PS jobs.

The fairness baseline of Optimus §6.1 ("uses Dominant Resource Fairness to allocate resources to
jobs and dynamically reschedules jobs in each scheduling interval; workers / parameter servers
are placed in a load balancing way"), with DRF's progressive filling (Ghodsi et al., NSDI'11) one
executor at a time: every round, from each started job's minimum (n_min), the job with the lowest
dominant share divided by its weight gets one more executor, on the least loaded node it fits on,
until no job below its maximum (n_max) fits anywhere. Jobs that have not started get room for
their AM and submitted shape first (rm/policies/packing.py).

Roles: a job's executors are split between workers and servers in its current ratio, within its
role bounds (ElasticJob.split); Optimus runs the baselines with as many parameter servers as
workers (§6.1, "1:1"), which is what a job submitted 1:1 keeps.

`drf_counts` is the same filling on the cluster's aggregate room (no nodes): the theoretical DRF
allocation the `dorm` policy measures fairness loss against (Dorm §IV-A, ŝ).
"""
from __future__ import annotations

import heapq
from typing import Sequence

from protocol.records import Resource

from .decision import Decision
from .elastic_jobs import ElasticJob, elastic_view
from .packing import Packing, least_loaded
from .snapshot import ClusterSnapshot


def drf_counts(jobs: Sequence[ElasticJob], room: Resource, total: Resource) -> list[int]:
    """Weighted DRF progressive filling on aggregate `room`: executors per job, from each job's
    n_min (granted even if they overflow `room`), one at a time to the job with the lowest
    dominant share / weight (shares of `total`, the job's AM counted: ElasticJob.share) that is
    below n_max and still fits."""
    counts = [j.n_min for j in jobs]
    left = room
    for j, n in zip(jobs, counts):
        left = left - j.demand.scale(n)
    heap = [(j.share(n, total), j.order, i) for i, (j, n) in enumerate(zip(jobs, counts))]
    heapq.heapify(heap)
    while heap:
        _, order, i = heapq.heappop(heap)
        j = jobs[i]
        if counts[i] >= j.n_max or not j.demand.fits_in(left):
            continue
        counts[i] += 1
        left = left - j.demand
        heapq.heappush(heap, (j.share(counts[i], total), order, i))
    return counts


class DrfPolicy:
    """Work-conserving weighted DRF with load-balanced placement (see the module doc). Stateless."""

    name = "drf"

    def decide(self, snapshot: ClusterSnapshot) -> Decision:
        view = elastic_view(snapshot)
        packing = Packing(view)
        packing.place_minimums(least_loaded)
        packing.place_incoming(least_loaded)
        jobs = view.started
        heap = [(self._share(j, packing.n(j.app_id), view.total), j.order, i) for i, j in enumerate(jobs)]
        heapq.heapify(heap)
        while heap:
            _, order, i = heapq.heappop(heap)
            j = jobs[i]
            if packing.n(j.app_id) >= j.n_max or not packing.place(j, least_loaded):
                continue    # at its maximum, or fits nowhere: it gets no more this round
            heapq.heappush(heap, (self._share(j, packing.n(j.app_id), view.total), order, i))
        out = {}
        for j in jobs:
            per_node = packing.per_node(j.app_id)
            if not per_node or not view.changed(j, per_node):
                continue
            share = self._share(j, sum(per_node.values()), view.total) * j.weight
            out[j.app_id] = j.decision(per_node, f"drf: dominant share {share:.3f} (weight {j.weight:g})")
        return Decision(out)

    @staticmethod
    def _share(job: ElasticJob, n: int, total: Resource) -> float:
        return job.share(n, total)


__all__ = ["DrfPolicy", "drf_counts"]

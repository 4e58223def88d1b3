"""Optimus's task placement (§4.2, Theorem 1): each job on the fewest nodes, the same number of
workers and of servers on each.

The paper's scheme: nodes sorted by free resources, most first (free vcores, then memory: the
paper sorts on CPU); jobs placed smallest demand first; for each job the smallest k such that the
first k nodes can host the job split evenly over them, then those nodes' free resources are
updated and the list re-sorted. Theorem 1's equal split needs k to divide both counts; when it
does not, the split is as even as the counts allow (per node ⌊n/k⌋ or ⌈n/k⌉, the larger shares on
the nodes with more room). A job no k can host is left unplaced (the paper pauses it until the
next interval; the policy keeps such a job at its current shape).

The sorted node list is a Python list kept in order with `bisect` (only the k nodes a job took
move), so placing thousands of jobs on tens of thousands of nodes stays cheap.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from itertools import accumulate
from typing import Optional, Sequence

from protocol.internal_api import NodePlacement


@dataclass(frozen=True)
class PlacementJob:
    """A job to place: `workers` and `servers`, each executor needing `memory` MB and `vcores`."""

    key: str
    workers: int
    servers: int
    memory: int
    vcores: int

    @property
    def demand(self) -> tuple[int, int]:
        n = self.workers + self.servers
        return n * self.vcores, n * self.memory      # CPU first, as the paper sorts


def even_split(count: int, k: int) -> list[int]:
    """`count` split over k nodes as evenly as possible, larger shares first."""
    return [count // k + (i < count % k) for i in range(k)]


class NodeBook:
    """Free resources per node, kept sorted most-free first ((vcores, memory), then node order)."""

    def __init__(self, nodes: Sequence[str], free_memory: Sequence[int], free_vcores: Sequence[int]) -> None:
        self.nodes = list(nodes)
        self.memory = [int(m) for m in free_memory]
        self.vcores = [int(v) for v in free_vcores]
        self.order = sorted((-self.vcores[i], -self.memory[i], i) for i in range(len(self.nodes)))

    def place(self, job: PlacementJob) -> Optional[tuple[NodePlacement, ...]]:
        """Place `job` on the fewest nodes it fits on evenly (updating the book), or None."""
        most = max(job.workers, job.servers)
        if most == 0:
            return ()
        head = self.order[:most]
        # Prefix sums of the first nodes' free resources: a cheap necessary condition per k.
        mem_sum = list(accumulate(-m for _, m, _ in head))
        vc_sum = list(accumulate(-v for v, _, _ in head))
        n = job.workers + job.servers
        for k in range(1, len(head) + 1):
            if mem_sum[k - 1] < n * job.memory or vc_sum[k - 1] < n * job.vcores:
                continue
            ws, ss = even_split(job.workers, k), even_split(job.servers, k)
            if all(-head[i][0] >= (ws[i] + ss[i]) * job.vcores and -head[i][1] >= (ws[i] + ss[i]) * job.memory
                   for i in range(k)):
                return self._take(head[:k], ws, ss, job)
        return None

    def _take(self, chosen: list[tuple[int, int, int]], ws: list[int], ss: list[int],
              job: PlacementJob) -> tuple[NodePlacement, ...]:
        del self.order[:len(chosen)]
        out = []
        for (_, _, i), w, s in zip(chosen, ws, ss):
            self.memory[i] -= (w + s) * job.memory
            self.vcores[i] -= (w + s) * job.vcores
            bisect.insort(self.order, (-self.vcores[i], -self.memory[i], i))
            out.append(NodePlacement(node=self.nodes[i], workers=w, servers=s))
        return tuple(out)


def place_jobs(book: NodeBook, jobs: Sequence[PlacementJob]) -> dict[str, Optional[tuple[NodePlacement, ...]]]:
    """Place `jobs` smallest demand first (ties in the given order); None for a job that fits nowhere."""
    ranked = sorted(range(len(jobs)), key=lambda i: (jobs[i].demand, i))
    return {jobs[i].key: book.place(jobs[i]) for i in ranked}


__all__ = ["NodeBook", "PlacementJob", "even_split", "place_jobs"]

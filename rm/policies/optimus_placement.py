"""Optimus's task placement (§4.2, Theorem 1): each job on the fewest nodes, the same number of
workers and of servers on each.

The paper's scheme: nodes sorted by free resources, most first (free vcores, then memory: the
paper sorts on CPU); jobs placed smallest demand first; for each job the smallest k such that the
first k nodes can host the job split evenly over them, then those nodes' free resources are
updated and the list re-sorted. Theorem 1's equal split needs k to divide both counts; when it
does not, the split is as even as the counts allow (per node ⌊n/k⌋ or ⌈n/k⌉, the larger shares on
the nodes with more room). A job no k can host is left unplaced (the paper pauses it until the
next interval; the policy keeps such a job at its current shape).

The sorted node list is kept in blocks of a few hundred nodes (`SortedKeys`), in order with
`bisect` (only the k nodes a job took move, and each move shifts one block, not the whole list),
so placing thousands of jobs on tens of thousands of nodes stays cheap.
"""
from __future__ import annotations

import bisect
from typing import Iterator, NamedTuple, Optional, Sequence

import numpy as np

from protocol.internal_api import NodePlacement


class PlacementJob(NamedTuple):
    """A job to place: `workers` and `servers`, each executor needing `memory` MB and `vcores` (a
    tuple: thousands are made per round)."""

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
    q, r = divmod(count, k)
    return [q + 1] * r + [q] * (k - r)


Key = tuple[int, int, int]          # (-free vcores, -free memory, node index): most free first


class SortedKeys:
    """A sorted list of unique keys in blocks of at most 2 x `BLOCK`: taking the first keys and
    inserting one cost O(BLOCK) moves, not O(nodes) as in one Python list of 16,000 nodes, where
    each job's `del` at the front and `insort` moved the whole list."""

    BLOCK = 256

    def __init__(self, keys: Sequence[Key]) -> None:
        ordered = sorted(keys)
        self.blocks: list[list[Key]] = [ordered[i:i + self.BLOCK] for i in range(0, len(ordered), self.BLOCK)]
        self.lasts: list[Key] = [b[-1] for b in self.blocks]

    def __len__(self) -> int:
        return sum(map(len, self.blocks))

    def first(self, count: int) -> list[Key]:
        """The `count` smallest keys (fewer if there are not as many), smallest first."""
        out: list[Key] = []
        for b in self.blocks:
            out += b[:count - len(out)]
            if len(out) >= count:
                break
        return out

    def drop_first(self, count: int) -> None:
        """Remove the `count` smallest keys."""
        while count > 0 and self.blocks:
            b = self.blocks[0]
            if len(b) > count:
                del b[:count]
                return
            count -= len(b)
            del self.blocks[0], self.lasts[0]

    def insert(self, key: Key) -> None:
        at = bisect.bisect_left(self.lasts, key)
        if at == len(self.blocks):
            if not self.blocks:
                self.blocks.append([key])
                self.lasts.append(key)
                return
            at -= 1
            self.blocks[at].append(key)
            self.lasts[at] = key
        else:
            bisect.insort(self.blocks[at], key)
        b = self.blocks[at]
        if len(b) > 2 * self.BLOCK:
            self.blocks[at:at + 1] = [b[:self.BLOCK], b[self.BLOCK:]]
            self.lasts[at:at + 1] = [b[self.BLOCK - 1], b[-1]]

    def __iter__(self) -> Iterator[Key]:
        for b in self.blocks:
            yield from b


class NodeBook:
    """Free resources per node, kept sorted most-free first ((vcores, memory), then node order)."""

    def __init__(self, nodes: Sequence[str], free_memory: Sequence[int], free_vcores: Sequence[int]) -> None:
        self.nodes = list(nodes)
        self.memory = [int(m) for m in free_memory]
        self.vcores = [int(v) for v in free_vcores]
        # Sorted by numpy (most free vcores, then memory, then node order), so SortedKeys' own sort
        # meets a sorted list.
        neg_v, neg_m = -np.asarray(self.vcores, dtype=np.int64), -np.asarray(self.memory, dtype=np.int64)
        at = np.lexsort((np.arange(len(self.nodes)), neg_m, neg_v))
        self.order = SortedKeys(list(zip(neg_v[at].tolist(), neg_m[at].tolist(), at.tolist())))

    def place(self, job: PlacementJob) -> Optional[tuple[NodePlacement, ...]]:
        """Place `job` on the fewest nodes it fits on evenly (updating the book), or None."""
        workers, servers, memory, vcores = job.workers, job.servers, job.memory, job.vcores
        most = max(workers, servers)
        if most == 0:
            return ()
        head = self.order.first(most)
        n = workers + servers
        need_memory, need_vcores = n * memory, n * vcores
        # Running sums of the first nodes' free resources: a cheap necessary condition per k.
        mem_sum = vc_sum = 0
        for k in range(1, len(head) + 1):
            v, m, _ = head[k - 1]
            mem_sum -= m
            vc_sum -= v
            if mem_sum < need_memory or vc_sum < need_vcores:
                continue
            ws, ss = even_split(workers, k), even_split(servers, k)
            for i in range(k):
                here = ws[i] + ss[i]
                if -head[i][0] < here * vcores or -head[i][1] < here * memory:
                    break
            else:
                return self._take(head[:k], ws, ss, job)
        return None

    def _take(self, chosen: list[Key], ws: list[int], ss: list[int],
              job: PlacementJob) -> tuple[NodePlacement, ...]:
        self.order.drop_first(len(chosen))
        out = []
        for (_, _, i), w, s in zip(chosen, ws, ss):
            self.memory[i] -= (w + s) * job.memory
            self.vcores[i] -= (w + s) * job.vcores
            self.order.insert((-self.vcores[i], -self.memory[i], i))
            out.append(NodePlacement(node=self.nodes[i], workers=w, servers=s))
        return tuple(out)


def place_jobs(book: NodeBook, jobs: Sequence[PlacementJob]) -> dict[str, Optional[tuple[NodePlacement, ...]]]:
    """Place `jobs` smallest demand first (ties in the given order); None for a job that fits nowhere."""
    ranked = sorted(range(len(jobs)), key=lambda i: (jobs[i].demand, i))
    return {jobs[i].key: book.place(jobs[i]) for i in ranked}


__all__ = ["NodeBook", "PlacementJob", "SortedKeys", "even_split", "place_jobs"]

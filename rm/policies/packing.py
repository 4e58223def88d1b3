"""Executor-by-executor packing of elastic jobs onto nodes, shared by the `drf` and `tetris` policies.

A `Packing` starts from the room each node has for the jobs' executors (rm/policies/elastic_jobs.py)
and places one executor (or AM) at a time on the node a *node chooser* picks. Both policies
rebuild their whole allocation each round, as the Optimus paper runs them ("dynamically
reschedules jobs in each scheduling interval", §6.1): first every started job's minimum, then the
jobs that have not started (their AM and submitted shape, first come first served: one that does
not fit waits, and so do the ones behind it), then growth by the policy's own rule. The result is
a pure function of the snapshot, so an unchanged cluster gets unchanged directives.
"""
from __future__ import annotations

from typing import Callable, Optional

from protocol.records import ZERO, Resource

from .elastic_jobs import ElasticJob, ElasticView

# (packing, job, resource to place) -> index of the node to place it on, or None if none fits
NodeChooser = Callable[["Packing", ElasticJob, Resource], Optional[int]]


class Packing:
    """Room left per node and executors placed per job and node (indices into `view.nodes`)."""

    def __init__(self, view: ElasticView):
        self.view = view
        self.free: list[Resource] = list(view.room)
        self.counts: dict[str, dict[int, int]] = {}
        index = {node: k for k, node in enumerate(view.nodes)}
        # Executors each job has on each node now and not yet re-placed: choosers keep them where
        # they are when they can (fewer executors move).
        self.unplaced_current: dict[str, dict[int, int]] = {
            j.app_id: {index[node]: n for node, n in j.current_on().items() if node in index} for j in view.jobs}
        # Per node, what those not yet re-placed executors hold: room another job takes from it
        # displaces them (see `undisplacing`).
        self.claimed: list[Resource] = [ZERO] * len(view.nodes)
        for j in view.jobs:
            for k, n in self.unplaced_current[j.app_id].items():
                self.claimed[k] = self.claimed[k] + j.demand.scale(n)

    def fits(self, r: Resource, k: int) -> bool:
        return r.fits_in(self.free[k])

    def fitting(self, r: Resource) -> list[int]:
        return [k for k in range(len(self.free)) if r.fits_in(self.free[k])]

    def n(self, app_id: str) -> int:
        return sum(self.counts.get(app_id, {}).values())

    def per_node(self, app_id: str) -> dict[str, int]:
        return {self.view.nodes[k]: v for k, v in sorted(self.counts.get(app_id, {}).items()) if v}

    def sticky(self, job: ElasticJob, r: Resource) -> Optional[int]:
        """A node where the job has an executor not yet re-placed and `r` fits (lowest index)."""
        for k, left in sorted(self.unplaced_current[job.app_id].items()):
            if left > 0 and self.fits(r, k):
                return k
        return None

    def undisplacing(self, job: ElasticJob, r: Resource, cands: list[int]) -> list[int]:
        """Of `cands`, the nodes where `r` fits without the room other jobs' executors now use
        there (all of `cands` if none): placing there moves no one else's executor."""
        own = self.unplaced_current[job.app_id]
        out = [k for k in cands
               if r.fits_in(self.free[k] - self.claimed[k] + job.demand.scale(own.get(k, 0)))]
        return out or cands

    def take(self, job: ElasticJob, r: Resource, k: int, executor: bool = True) -> None:
        self.free[k] = self.free[k] - r
        if executor:
            c = self.counts.setdefault(job.app_id, {})
            c[k] = c.get(k, 0) + 1
            cur = self.unplaced_current[job.app_id]
            if cur.get(k, 0) > 0:
                cur[k] -= 1
                self.claimed[k] = self.claimed[k] - job.demand

    def place(self, job: ElasticJob, choose: NodeChooser) -> bool:
        """One more executor of `job` on the node `choose` picks; False if none fits."""
        k = choose(self, job, job.demand)
        if k is None:
            return False
        self.take(job, job.demand, k)
        return True

    def place_minimums(self, choose: NodeChooser) -> None:
        """Every started job's n_min executors (what a running job never goes below)."""
        for job in self.view.started:
            while self.n(job.app_id) < job.n_min and self.place(job, choose):
                pass

    def place_incoming(self, choose: NodeChooser) -> None:
        """Jobs not started yet, first come first served: AM and submitted shape, all or nothing."""
        for job in self.view.jobs:
            if job.started:
                continue
            saved = (list(self.free), {a: dict(c) for a, c in self.counts.items()},
                     {a: dict(c) for a, c in self.unplaced_current.items()}, list(self.claimed))
            ok = True
            if job.am.memory or job.am.vcores:
                k = choose(self, job, job.am)
                ok = k is not None
                if k is not None:
                    self.take(job, job.am, k, executor=False)
            while ok and self.n(job.app_id) < job.n_min:
                ok = self.place(job, choose)
            if not ok:
                self.free, self.counts, self.unplaced_current, self.claimed = saved
                return


def least_loaded(packing: Packing, job: ElasticJob, r: Resource) -> Optional[int]:
    """Load balancing (the default placement of Kubernetes the Optimus paper runs DRF with): the
    node whose room is least used (dominant share). A job's executors stay on the nodes they are
    on first, and others go where they displace no one's current executor if they can."""
    k = packing.sticky(job, r)
    if k is not None:
        return k
    cands = packing.fitting(r)
    if not cands:
        return None
    cands = packing.undisplacing(job, r, cands)
    view = packing.view

    def used_share(i: int) -> float:
        return (view.room[i] - packing.free[i]).dominant_share(view.room[i])
    return min(cands, key=lambda i: (used_share(i), i))


__all__ = ["NodeChooser", "Packing", "least_loaded"]

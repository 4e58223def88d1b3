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

from typing import Callable, Optional, Sequence

import numpy as np

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
        # The same as arrays (node x (memory, vcores)), so a chooser looks at every node at once.
        self.free_array = _array(self.free)
        self.claimed_array = _array(self.claimed)
        self.room_array = _array(view.room)

    def fits(self, r: Resource, k: int) -> bool:
        return r.fits_in(self.free[k])

    def fitting(self, r: Resource) -> list[int]:
        return np.flatnonzero(self.fit_mask(r)).tolist()

    def fit_mask(self, r: Resource) -> np.ndarray:
        mask: np.ndarray = np.all(np.array([r.memory, r.vcores], dtype=float) <= self.free_array, axis=1)
        return mask

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
        out = np.flatnonzero(self.undisplacing_mask(job, r))
        keep = set(cands)
        return [k for k in out.tolist() if k in keep] or cands

    def undisplacing_mask(self, job: ElasticJob, r: Resource) -> np.ndarray:
        """Per node: `r` fits in the room other jobs' current executors leave there."""
        avail = self.free_array - self.claimed_array
        for k, n in self.unplaced_current[job.app_id].items():
            if n:
                avail[k] += np.array([job.demand.memory, job.demand.vcores], dtype=float) * n
        mask: np.ndarray = np.all(np.array([r.memory, r.vcores], dtype=float) <= avail, axis=1)
        return mask

    def take(self, job: ElasticJob, r: Resource, k: int, executor: bool = True) -> None:
        self.free[k] = self.free[k] - r
        self.free_array[k] -= (r.memory, r.vcores)
        if executor:
            c = self.counts.setdefault(job.app_id, {})
            c[k] = c.get(k, 0) + 1
            cur = self.unplaced_current[job.app_id]
            if cur.get(k, 0) > 0:
                cur[k] -= 1
                self.claimed[k] = self.claimed[k] - job.demand
                self.claimed_array[k] -= (job.demand.memory, job.demand.vcores)

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
                     {a: dict(c) for a, c in self.unplaced_current.items()}, list(self.claimed),
                     self.free_array.copy(), self.claimed_array.copy())
            ok = True
            if job.am.memory or job.am.vcores:
                k = choose(self, job, job.am)
                ok = k is not None
                if k is not None:
                    self.take(job, job.am, k, executor=False)
            while ok and self.n(job.app_id) < job.n_min:
                ok = self.place(job, choose)
            if not ok:
                (self.free, self.counts, self.unplaced_current, self.claimed, self.free_array,
                 self.claimed_array) = saved
                return


def _array(resources: Sequence[Resource]) -> np.ndarray:
    return np.array([[r.memory, r.vcores] for r in resources], dtype=float).reshape(len(resources), 2)


def least_loaded(packing: Packing, job: ElasticJob, r: Resource) -> Optional[int]:
    """Load balancing (the default placement of Kubernetes the Optimus paper runs DRF with): the
    node whose room is least used (dominant share). A job's executors stay on the nodes they are
    on first, and others go where they displace no one's current executor if they can."""
    k = packing.sticky(job, r)
    if k is not None:
        return k
    fits = packing.fit_mask(r)
    if not fits.any():
        return None
    und = fits & packing.undisplacing_mask(job, r)
    cands = und if und.any() else fits
    room = packing.room_array
    # Resource.dominant_share of what is used of the room: the largest share over the resources
    # the node has (0 for a node with none); the lowest, first node wins.
    share = np.where(room > 0, (room - packing.free_array) / np.where(room > 0, room, 1.0), -np.inf).max(axis=1)
    share = np.where(np.isfinite(share), share, 0.0)
    return int(np.argmin(np.where(cands, share, np.inf)))


__all__ = ["NodeChooser", "Packing", "least_loaded"]

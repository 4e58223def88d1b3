"""What a simulation run is judged by: JCT, makespan, utilization and Dorm's DRF fairness loss.

- JCT: a job's end (its AM unregistered) minus its arrival; makespan: the last end minus the first
  arrival (Optimus §6.1).
- Utilization at time t: for each resource (memory, vCores) what the scheduler has allocated over
  the cluster's capacity, averaged over the two (Dorm eq. 1 sums them; the mean keeps it in [0, 1]
  and the ratios between policies are the same). The run's figure is its time average over the
  makespan (samples are taken on a fixed period, so a plain mean of the samples). That is
  allocation: AMs and jobs still gathering, launching or reshaping count as used.
- Useful utilization (issue 25): the same measure over the executors of jobs that are training now
  (the executors their active shape runs on): AMs, executors granted but not yet training, jobs
  starting, reshaping, pausing or finishing are left out. It is at most the allocation; a policy
  that hands out executors jobs cannot use yet raises the one and not the other.
- Fairness loss at time t (Dorm eq. 2): over the jobs in the system (arrived, not finished),
  sum |s_i - ŝ_i| of the actual dominant share s_i (everything the app holds, AM included, over the
  cluster) and the DRF share ŝ_i: progressive filling of the jobs' containers (executor-sized,
  up to each job's maximum shape plus its AM) by smallest dominant share until nothing more fits.
  A job waiting in a queue holds nothing, so it counts its whole fair share as loss.

Comparing runs (issue 33's rules of evidence): `ratio` is a time's speed-up (baseline over new),
`Spread` a ratio's median and range over seeds and how many seeds gave one (a gain is reported
with its min-max and `_n`, never one seed's figure alone), and `completed_in_both` the jobs two runs
both finished: a job that failed or stalled in either run has no JCT, so it is counted apart and
left out of a JCT ratio rather than given a timeout as its JCT (`jct_gain_in_both`).
"""
from __future__ import annotations

import heapq
import statistics
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from protocol.records import Resource


@dataclass(frozen=True)
class Demand:
    """A job's DRF demand: its AM and up to `max_executors` executors of `executor` each."""

    app_id: str
    am: Resource
    executor: Resource
    max_executors: int
    held: Resource


def drf_shares(demands: Sequence[Demand], total: Resource) -> dict[str, float]:
    """ŝ_i: progressive filling, one container at a time to the job with the smallest dominant
    share (ties by app id) whose next container still fits the cluster; jobs are capped at their
    AM plus max_executors."""
    free = total
    alloc = {d.app_id: Resource(0, 0) for d in demands}
    count = {d.app_id: -1 for d in demands}      # -1: AM not placed yet
    by_id = {d.app_id: d for d in demands}
    heap = [(0.0, d.app_id) for d in demands]
    heapq.heapify(heap)
    while heap:
        _, app_id = heapq.heappop(heap)
        d = by_id[app_id]
        nxt = d.am if count[app_id] < 0 else d.executor
        if count[app_id] >= d.max_executors or not nxt.fits_in(free):
            continue       # capped, or its next container no longer fits: it is done
        free = free - nxt
        alloc[app_id] = alloc[app_id] + nxt
        count[app_id] += 1
        heapq.heappush(heap, (alloc[app_id].dominant_share(total), app_id))
    return {a: r.dominant_share(total) for a, r in alloc.items()}


def fairness_loss(demands: Sequence[Demand], total: Resource) -> float:
    fair = drf_shares(demands, total)
    return sum(abs(d.held.dominant_share(total) - fair[d.app_id]) for d in demands)


def utilization(used: Resource, total: Resource) -> float:
    parts = []
    if total.memory > 0:
        parts.append(used.memory / total.memory)
    if total.vcores > 0:
        parts.append(used.vcores / total.vcores)
    return sum(parts) / len(parts) if parts else 0.0


@dataclass(frozen=True)
class Sample:
    """The cluster at one sampling time (seconds from the start of the run)."""

    t: float
    utilization: float
    memory_used: int
    vcores_used: int
    running: int           # jobs training (or reshaping / paused: holding an AM)
    waiting: int           # jobs arrived but not yet started
    fairness_loss: float
    useful_utilization: float = 0.0
    useful_vcores: int = 0


@dataclass(frozen=True)
class Summary:
    jobs: int
    finished: int
    mean_jct_s: Optional[float]
    median_jct_s: Optional[float]
    makespan_s: Optional[float]
    mean_utilization: float
    mean_fairness_loss: float
    reshapes: int
    virtual_s: float
    wall_s: float
    events: int
    mean_useful_utilization: float = 0.0
    failed: int = 0        # jobs that ended without succeeding: not in `finished` nor in any JCT

    def to_json(self) -> dict[str, object]:
        def r(x: Optional[float]) -> Optional[float]:
            return None if x is None else round(x, 4)
        return {"jobs": self.jobs, "finished": self.finished, "failed": self.failed, "mean_jct_s": r(self.mean_jct_s),
                "median_jct_s": r(self.median_jct_s), "makespan_s": r(self.makespan_s),
                "mean_utilization": r(self.mean_utilization),
                "mean_useful_utilization": r(self.mean_useful_utilization), "mean_fairness_loss": r(self.mean_fairness_loss),
                "reshapes": self.reshapes, "virtual_s": r(self.virtual_s), "wall_s": r(self.wall_s),
                "events": self.events}


def summarize(jcts: Iterable[Optional[float]], arrivals: Sequence[float], ends: Sequence[Optional[float]],
              samples: Sequence[Sample], reshapes: int, virtual_s: float, wall_s: float, events: int) -> Summary:
    done = [j for j in jcts if j is not None]
    finished_ends = [e for e in ends if e is not None]
    makespan = (max(finished_ends) - min(arrivals)) if finished_ends and len(finished_ends) == len(ends) else None
    first = min(arrivals) if arrivals else 0.0
    last = max(finished_ends) if finished_ends else float("inf")
    window = [s for s in samples if first <= s.t <= last] or list(samples)
    return Summary(jobs=len(ends), finished=len(done), mean_jct_s=statistics.fmean(done) if done else None,
                   median_jct_s=statistics.median(done) if done else None, makespan_s=makespan,
                   mean_utilization=statistics.fmean(s.utilization for s in window) if window else 0.0,
                   mean_fairness_loss=statistics.fmean(s.fairness_loss for s in window) if window else 0.0,
                   reshapes=reshapes, virtual_s=virtual_s, wall_s=wall_s, events=events,
                   mean_useful_utilization=statistics.fmean(s.useful_utilization for s in window) if window else 0.0)


# ----- comparing runs ----------------------------------------------------------------------------

def ratio(num: Optional[float], den: Optional[float], digits: int = 3) -> Optional[float]:
    """num / den rounded (a gain: the baseline's time over the new one's), None when either is
    missing or den is not positive."""
    if num is None or den is None or den <= 0:
        return None
    return round(num / den, digits)


@dataclass(frozen=True)
class Spread:
    """A figure over seeds: its median and range, and how many seeds gave one."""

    median: float
    min: float
    max: float
    n: int

    @staticmethod
    def of(values: Iterable[Optional[float]]) -> Optional["Spread"]:
        """The spread of the values present (None when there are none)."""
        vs = [v for v in values if v is not None]
        if not vs:
            return None
        return Spread(round(statistics.median(vs), 3), round(min(vs), 3), round(max(vs), 3), len(vs))

    def keys(self, name: str) -> dict[str, float]:
        """`name` (the median), `name_min`, `name_max` and `name_n`: a bench's last-line keys."""
        # `_n` so a median over 1 of 5 seeds reads as such, not as a five-seed figure.
        return {name: self.median, f"{name}_min": self.min, f"{name}_max": self.max, f"{name}_n": self.n}


def spread_keys(name: str, values: Iterable[Optional[float]]) -> dict[str, Optional[float]]:
    """`Spread.keys` of the values, or the figures as None (and `name_n` 0) when no seed gave a value."""
    sp = Spread.of(values)
    if sp is None:
        return {name: None, f"{name}_min": None, f"{name}_max": None, f"{name}_n": 0}
    return {k: v for k, v in sp.keys(name).items()}


def completed_in_both(a: Iterable[tuple[str, Optional[float]]], b: Iterable[tuple[str, Optional[float]]]
                      ) -> tuple[list[float], list[float]]:
    """The JCTs, in the same job order, of the jobs that finished in both runs (each run given as
    (job name, JCT or None) pairs): the only jobs a JCT ratio between the runs may cover."""
    jb = {name: jct for name, jct in b if jct is not None}
    pa, pb = [], []
    for name, jct in a:
        if jct is not None and name in jb:
            pa.append(jct)
            pb.append(jb[name])
    return pa, pb


def jct_gain_in_both(base: Iterable[tuple[str, Optional[float]]], new: Iterable[tuple[str, Optional[float]]],
                     digits: int = 3) -> Optional[float]:
    """`base`'s mean JCT over `new`'s, both over the jobs that finished in both runs
    (`completed_in_both`); None when no job did."""
    jb, jn = completed_in_both(base, new)
    return ratio(statistics.fmean(jb), statistics.fmean(jn), digits) if jb else None


__all__ = ["Demand", "Sample", "Spread", "Summary", "completed_in_both", "drf_shares", "fairness_loss",
           "jct_gain_in_both", "ratio", "spread_keys", "summarize", "utilization"]

"""A clairvoyant lower bound on a trace's mean JCT and makespan: what no scheduler can beat.

Issue 33 part 3: Optimus is compared with a true bound, not with another heuristic fed the truth
(sim/optimus_truth.py is such a heuristic). The bound knows every job's true epochs and speed
function (the calibration the simulator runs on), charges no resize and no queueing delay, and
relaxes the cluster in two ways; each gives a valid bound, and the figure is the larger:

- **Each job alone.** A job's JCT is at least its AM start, its executors' start-up, its epochs at
  its fastest shape within its [min, max] bounds, and its finish (`JobNeed.solo_s`): a run can
  only add queueing, resize stalls and contention to that (the simulator's iteration-time models
  only ever slow a job, sim/iteration_time.py).
- **The cluster as one fluid resource.** Per resource (memory, vCores), a job needs at least its
  least resource-seconds over its shapes: (workers + servers) x executor size x epoch time x
  epochs (`JobNeed.area`) -- any shape, any reshape stall or contention only uses more -- and
  cannot start training before its arrival plus AM start and start-up. On one machine of the
  cluster's capacity that may split itself among jobs at will, preemptive shortest remaining
  processing time (SRPT) minimises the sum of completion times (1|r_j, pmtn|ΣC_j), so its mean
  JCT, plus each job's finish, is a lower bound; the makespan is bounded by the same machine
  working without a pause from the first release.

Scope: schedulers that keep each job's executor size (static, drf, tetris, optimus, dorm, the
simulator's optimus-truth); a policy that shrinks executors (harmony, eps's size changes) may use
less area than the trace asks, so the fluid term does not bind it (the per-job term still does).
AMs' own resources are left out (a weaker, still valid bound). Pure: no simulator run.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Optional, Sequence

from protocol.records import Resource

from .calibration import AppCalibration, Calibration
from .trace import TraceJob
from .workload import job_epochs


@dataclass(frozen=True)
class JobNeed:
    """What a job needs at the least: its fixed costs, its fastest training time, its least area."""

    name: str
    arrival_s: float
    before_s: float             # AM start + executors' start-up: no training before
    after_s: float              # finish (AM unregisters) after the last epoch
    train_s: float              # its epochs at its fastest shape
    area: tuple[float, float]   # least (MB-seconds, vCore-seconds) of executors over its shapes

    @property
    def solo_s(self) -> float:
        return self.before_s + self.train_s + self.after_s


def job_need(job: TraceJob, app: AppCalibration) -> JobNeed:
    """`JobNeed` of a job by its calibration (every shape within its bounds tried)."""
    epochs = job_epochs(job, app)
    model = app.epoch_model()
    fastest = float("inf")
    mem = cpu = float("inf")
    (lo_w, lo_s), (hi_w, hi_s) = job.shape_min, job.shape_max
    for w in range(max(1, lo_w), max(1, hi_w) + 1):
        for s in range(max(1, lo_s), max(1, hi_s) + 1):
            t = epochs * model.epoch_time(w, s, job.data_scale)
            fastest = min(fastest, t)
            mem = min(mem, (w + s) * job.executor_memory_mb * t)
            cpu = min(cpu, (w + s) * job.executor_vcores * t)
    return JobNeed(job.name, job.arrival_s, app.am_start_s + app.startup_s, app.finish_s, fastest, (mem, cpu))


def srpt_completions(releases: Sequence[float], work: Sequence[float]) -> list[float]:
    """Completion times of jobs (release, processing time) on one preemptive machine under
    shortest remaining processing time first: the schedule with the least sum of completions."""
    order = sorted(range(len(releases)), key=lambda j: releases[j])
    done = [0.0] * len(releases)
    heap: list[tuple[float, int]] = []          # (remaining, job)
    t, i = 0.0, 0
    while i < len(order) or heap:
        if not heap:
            t = max(t, releases[order[i]])
        while i < len(order) and releases[order[i]] <= t:
            heapq.heappush(heap, (work[order[i]], order[i]))
            i += 1
        rem, j = heapq.heappop(heap)
        nxt = releases[order[i]] if i < len(order) else float("inf")
        if t + rem <= nxt:
            t += rem
            done[j] = t
        else:
            heapq.heappush(heap, (rem - (nxt - t), j))
            t = nxt
    return done


@dataclass(frozen=True)
class Bound:
    """Lower bounds on a trace's mean JCT and makespan (seconds), and which relaxation gave each."""

    mean_jct_s: float
    makespan_s: float
    mean_jct_by: str            # "solo" or "fluid-memory" / "fluid-vcores"
    makespan_by: str

    def to_json(self) -> dict[str, object]:
        return {"mean_jct_s": round(self.mean_jct_s, 1), "makespan_s": round(self.makespan_s, 1),
                "mean_jct_by": self.mean_jct_by, "makespan_by": self.makespan_by}


def clairvoyant_bound(trace: Sequence[TraceJob], cal: Calibration, cluster: Resource) -> Bound:
    """The larger of the per-job and the fluid-cluster bounds (module doc) for `trace` on a
    cluster of total capacity `cluster` (executors' nodes only)."""
    if not trace:
        raise ValueError("a bound needs at least one job")
    if cluster.memory <= 0 or cluster.vcores <= 0:
        raise ValueError(f"cluster capacity must be positive, got {cluster}")
    needs = [job_need(j, cal.app(j.app)) for j in trace]
    n = len(needs)
    first = min(x.arrival_s for x in needs)
    jct: list[tuple[float, str]] = [(sum(x.solo_s for x in needs) / n, "solo")]
    mk: list[tuple[float, str]] = [(max(x.arrival_s + x.solo_s for x in needs) - first, "solo")]
    releases = [x.arrival_s + x.before_s for x in needs]
    for k, (label, cap) in enumerate((("fluid-memory", cluster.memory), ("fluid-vcores", cluster.vcores))):
        work = [x.area[k] / cap for x in needs]
        ends = srpt_completions(releases, work)
        jct.append((sum(e + x.after_s - x.arrival_s for e, x in zip(ends, needs)) / n, label))
        busy_until = 0.0
        for r, w in sorted(zip(releases, work)):
            busy_until = max(busy_until, r) + w
        mk.append((busy_until + min(x.after_s for x in needs) - first, label))
    best_jct, best_mk = max(jct), max(mk)
    return Bound(best_jct[0], best_mk[0], best_jct[1], best_mk[1])


def over_bound(bound_s: Optional[float], measured_s: Optional[float]) -> Optional[float]:
    """bound / measured: 1.0 = the run met the bound; always <= 1 for a run the bound covers."""
    if bound_s is None or measured_s is None or measured_s <= 0:
        return None
    return round(bound_s / measured_s, 3)


__all__ = ["Bound", "JobNeed", "clairvoyant_bound", "job_need", "over_bound", "srpt_completions"]

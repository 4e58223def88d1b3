"""Harmony against isolated and naive co-location on one simulated cluster and one trace.

Three runs of the same trace on the same cluster (sim/simulator.py), each with the co-location
model (sim/colocation.py) in one mode:

- `isolated`: the `static` policy (each job runs the shape it asks for, on hosts it does not share
  when executors fill a host, as the paper's workload asks them to) and the model's ISOLATED mode:
  a job's iteration is its COMP then its COMM;
- `harmony`: the real `harmony` policy (rm/policies/harmony.py: profiling, Algorithm 1 grouping,
  regrouping, pause / resume / migrate) and the model's HARMONY mode (eq. 4.1 + measured handoffs).
  Its jobs are submitted with one worker and one server (`as_harmony_job`): a PS AM takes its
  submitted shape before it acts on any directive (appmaster/ps/controller/rules.py), and under Harmony
  that first shape is the profiling one ("the smallest number of machines for each job", §4.3.2);
  the policy gives every shape after it;
- `naive`: the same `harmony` policy's groups, the model's NAIVE mode (no arbiter: jobs contend
  freely). The paper's naive baseline searched every grouping for its best case; here it is
  Harmony's grouping without the arbiter, i.e. Fig. 4.12's "naive + grouping" step.

The isolated baseline (issue 33 part 3) is the stronger of two ways to run the queue alone, each
job on hosts of its own, in the same queue order (`static`, ISOLATED mode):

- every job at its own best DoP alone (`best_dop`: the candidate DoP at which its calibrated solo
  JCT -- AM start, start-up, its epochs at that shape, finish -- is least; the dissertation's
  baseline);
- the whole queue at one fixed DoP, the best of `DOP_CANDIDATES` for this trace (DoP 16 was the
  earlier baseline: under eq. 4.2 a job alone is fastest at the highest DoP, but the queue's
  throughput is not, since COMM does not shrink with the DoP).

`isolated_baselines` runs each candidate; `IsolatedBaselines.best` is the one with the least mean
JCT among the runs that finished every job (`harmony_baseline_dop` names it: an int, or "per-job").
Beside it: fixed DoP 16, and `isolated_at_dops(harmony's DoPs)` -- each job alone at the DoP Harmony
ran it at most (`harmony_dops`; a job Harmony never trained has none and is left out,
`missing_dops`) -- so the gain from DoP choice (isolated at Harmony's DoP over DoP
16) and the gain from grouping (Harmony, and naive co-location, over isolated at Harmony's DoP)
are shown apart.

Per run: mean JCT, makespan, finished jobs, eq. 4.4's CPU and network utilization averaged over the
makespan (useful subtask work per host, `ColocationTimes.mean_utilization`); and the gains of
harmony and naive over isolated (`gains`: the mean-JCT gain over the jobs both runs finished, each
run's finished count beside it). `best_case` gives the model's own ceiling for the trace: every job
paired with its most complementary partner (eq. 4.1, no profiling, regrouping or handoff costs).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Optional, Sequence, Union

import msgspec

from .calibration import AppCalibration, Calibration
from .colocation import ColocationTimes, Interference, MEASURED, Mode, SubtaskTimes, iteration_times
from .metrics import completed_in_both, jct_gain_in_both
from .simulator import SimConfig, SimResult, Simulator, T0
from .trace import TraceJob
from .workload import job_epochs

RUNS: tuple[tuple[str, str, Mode], ...] = (
    ("isolated", "static", Mode.ISOLATED),
    ("harmony", "harmony", Mode.HARMONY),
    ("naive", "harmony", Mode.NAIVE),
)


@dataclass(frozen=True)
class RunOutcome:
    """One mode's run: the simulator's result and eq. 4.4's utilization over its makespan."""

    name: str
    policy: str
    mode: Mode
    result: SimResult
    cpu_utilization: float
    net_utilization: float
    max_jobs_sharing: int

    @property
    def mean_jct_s(self) -> Optional[float]:
        return self.result.summary.mean_jct_s

    @property
    def makespan_s(self) -> Optional[float]:
        return self.result.summary.makespan_s

    def to_json(self) -> dict[str, object]:
        s = self.result.summary
        return {"policy": self.policy, "mode": self.mode.value, "mean_jct_s": _round(s.mean_jct_s),
                "makespan_s": _round(s.makespan_s), "finished": s.finished, "jobs": s.jobs,
                "cpu_utilization": round(self.cpu_utilization, 4), "net_utilization": round(self.net_utilization, 4),
                "max_jobs_sharing": self.max_jobs_sharing, "pauses": sum(r.pauses for r in self.result.records),
                "wall_s": round(s.wall_s, 2)}


def _round(x: Optional[float]) -> Optional[float]:
    return None if x is None else round(x, 1)


def as_harmony_job(job: TraceJob) -> TraceJob:
    """The job as submitted under Harmony: one worker and one server (module doc)."""
    return msgspec.structs.replace(job, workers=1, servers=1, min_workers=1, min_servers=1)


def run_mode(trace: Sequence[TraceJob], calibration: Calibration, cfg: SimConfig, name: str, policy: str,
             mode: Mode, interference: Interference = MEASURED) -> RunOutcome:
    """One run of `trace` under `policy` with the co-location model in `mode`."""
    if policy == "harmony":
        trace = [as_harmony_job(j) for j in trace]
    model = ColocationTimes(calibration, mode, interference)
    sim = Simulator(trace, policy, calibration, replace(cfg, iteration_time=model))
    model.clock = sim.loop.clock
    result = sim.run()
    ends = [r.end for r in result.records if r.end is not None]
    start = T0 + min((j.arrival_s for j in trace), default=0.0)
    cpu, net = model.mean_utilization(cfg.nodes, start, max(ends) if ends else start)
    return RunOutcome(name, policy, mode, result, cpu, net, model.max_set)


def compare(trace: Sequence[TraceJob], calibration: Calibration, cfg: SimConfig,
            interference: Interference = MEASURED, runs: Sequence[tuple[str, str, Mode]] = RUNS
            ) -> dict[str, RunOutcome]:
    """The runs of `runs` (default: isolated, harmony, naive) on the same trace and cluster."""
    return {name: run_mode(trace, calibration, cfg, name, policy, mode, interference) for name, policy, mode in runs}


def gain(base: Optional[float], new: Optional[float]) -> Optional[float]:
    """base / new (a time's speed-up), rounded; None when either is missing or zero."""
    if base is None or new is None or new <= 0 or base <= 0:
        return None
    return round(base / new, 3)


def gains(out: dict[str, RunOutcome], name: str, base: str = "isolated") -> dict[str, Optional[float]]:
    """`name`'s mean-JCT and makespan speed-ups and CPU-utilization gain over `base`. The JCT gain
    covers only the jobs both runs finished (`jct_gain_jobs` of them); each run's finished and
    submitted jobs are given beside it (`<run>_finished`, `<run>_jobs`)."""
    b, n = out[base], out[name]
    util = round(n.cpu_utilization / b.cpu_utilization, 3) if b.cpu_utilization > 0 else None
    # Each run's own finished-jobs mean would compare different job sets: a run that lost its
    # long jobs would look faster.
    pairs_b = [(r.name, r.jct) for r in b.result.records]
    pairs_n = [(r.name, r.jct) for r in n.result.records]
    both, _ = completed_in_both(pairs_b, pairs_n)
    return {"jct_gain": jct_gain_in_both(pairs_b, pairs_n), "makespan_gain": gain(b.makespan_s, n.makespan_s),
            "util_gain": util, "jct_gain_jobs": len(both),
            f"{base}_finished": b.result.summary.finished, f"{base}_jobs": b.result.summary.jobs,
            f"{name}_finished": n.result.summary.finished, f"{name}_jobs": n.result.summary.jobs}


def pairs(loads: Sequence[SubtaskTimes]) -> list[tuple[int, ...]]:
    """Complementary pairing: jobs sorted by COMP share, the i-th most computation-bound with the
    i-th most communication-bound (an odd one out alone)."""
    order = sorted(range(len(loads)), key=lambda j: loads[j].t_cpu / max(loads[j].alone, 1e-12))
    out: list[tuple[int, ...]] = []
    lo, hi = 0, len(order) - 1
    while lo < hi:
        out.append((order[lo], order[hi]))
        lo, hi = lo + 1, hi - 1
    if lo == hi:
        out.append((order[lo],))
    return out


def _unit_finish(loads: Sequence[SubtaskTimes], work: Sequence[float], unit: tuple[int, ...],
                 interference: Interference) -> dict[int, float]:
    """When each job of a unit (one job, or a pair sharing the hosts under eq. 4.1) ends, from the
    unit's start: both at the pair's pace until the first ends, the other then alone."""
    if len(unit) == 1:
        return {unit[0]: work[unit[0]]}
    a, b = unit
    ta, tb = iteration_times([loads[a], loads[b]], Mode.HARMONY, interference)
    ra, rb = loads[a].alone / ta, loads[b].alone / tb       # isolated-seconds of work per second
    first = min(work[a] / ra, work[b] / rb)
    if work[a] / ra <= work[b] / rb:
        return {a: first, b: first + (work[b] - first * rb)}
    return {b: first, a: first + (work[a] - first * ra)}


def ideal_schedule(loads: Sequence[SubtaskTimes], work: Sequence[float], slots: int, paired: bool,
                   interference: Interference = MEASURED) -> tuple[float, float]:
    """(mean JCT, makespan) of the jobs, all there at 0, run in order on `slots` equal host sets
    (each job's `work[j]`: its time alone on one), one job per set -- or, `paired`, complementary
    pairs (`pairs`) sharing a set under eq. 4.1. No profiling, regrouping or start-up costs: the
    model's own best case for pairing at a fixed DoP."""
    units = pairs(loads) if paired else [(j,) for j in range(len(loads))]
    units.sort(key=min)                     # in arrival order of their first job
    free = [0.0] * max(1, slots)
    end: dict[int, float] = {}
    for unit in units:
        k = min(range(len(free)), key=lambda i: free[i])
        fin = _unit_finish(loads, work, unit, interference)
        for j, t in fin.items():
            end[j] = free[k] + t
        free[k] += max(fin.values())
    return (sum(end.values()) / max(1, len(end)), max(end.values(), default=0.0))


def best_case(loads: Sequence[SubtaskTimes], work: Sequence[float],
              interference: Interference = MEASURED) -> float:
    """The model's ceiling on throughput for these jobs by complementary pairing (`pairs`), each
    pair at its eq. 4.1 rate, no costs: total isolated work over the pairs' total time."""
    total = sum(work)
    t = sum(max(_unit_finish(loads, work, u, interference).values()) for u in pairs(loads))
    return round(total / t, 3) if t > 0 else 1.0


# ----- the isolated baselines (module doc) -----------------------------------------------------

DOP_CANDIDATES: tuple[int, ...] = (2, 4, 8, 16)
PER_JOB = "per-job"
BaselineName = Union[int, str]          # a fixed DoP, or PER_JOB


def at_dop(job: TraceJob, dop: int) -> TraceJob:
    """The job asking for `dop` workers and `dop` servers (one of each per host, as DoP 16 asked)."""
    if dop < 1:
        raise ValueError(f"a DoP must be >= 1, got {dop}")
    (lo_w, lo_s), (hi_w, hi_s) = job.shape_min, job.shape_max
    return msgspec.structs.replace(job, workers=dop, servers=dop, min_workers=min(lo_w, dop), min_servers=min(lo_s, dop),
                                   max_workers=max(hi_w, dop), max_servers=max(hi_s, dop))


def solo_jct_s(job: TraceJob, app: AppCalibration, dop: int) -> float:
    """The job's JCT alone at DoP `dop` by its calibration: AM start, executors' start-up, its
    epochs at that shape, finish (no queueing, no contention)."""
    train = job_epochs(job, app) * app.epoch_model().epoch_time(dop, dop, job.data_scale)
    return app.am_start_s + app.startup_s + train + app.finish_s


def best_dop(job: TraceJob, app: AppCalibration, candidates: Sequence[int] = DOP_CANDIDATES) -> int:
    """The candidate DoP with the least solo JCT (a tie goes to the fewer hosts)."""
    if not candidates:
        raise ValueError("best_dop needs at least one candidate DoP")
    return min(candidates, key=lambda d: (solo_jct_s(job, app, d), d))


def isolated_at_dops(trace: Sequence[TraceJob], dops: Mapping[str, int]) -> list[TraceJob]:
    """The trace, same order, each job asking for its DoP in `dops` (by job name). A job with no
    DoP there (one Harmony never trained: `harmony_dops` has none for it) is left out, not given
    one; `missing_dops` names them."""
    return [at_dop(j, dops[j.name]) for j in trace if j.name in dops]


def missing_dops(trace: Sequence[TraceJob], dops: Mapping[str, int]) -> list[str]:
    """The jobs of `trace` without a DoP in `dops`: those `isolated_at_dops` leaves out."""
    return [j.name for j in trace if j.name not in dops]


def harmony_dops(result: SimResult) -> dict[str, int]:
    """Each job's DoP under a run: the worker count it trained at for the longest time (shape
    changes are recorded with their times; a job's last shape lasts until its end)."""
    out: dict[str, int] = {}
    for r in result.records:
        held: dict[int, float] = {}
        marks = list(r.shapes)
        for i, (t, w, _s) in enumerate(marks):
            end = marks[i + 1][0] if i + 1 < len(marks) else (r.end if r.end is not None else t)
            if w >= 1:
                held[w] = held.get(w, 0.0) + max(0.0, end - t)
        if held:
            out[r.name] = max(sorted(held), key=lambda w: held[w])     # a tie: the fewer hosts
        elif marks and marks[-1][1] >= 1:
            out[r.name] = marks[-1][1]
    return out


@dataclass(frozen=True)
class IsolatedBaselines:
    """The isolated runs of one trace: each fixed candidate DoP, and every job at its own best."""

    fixed: dict[int, RunOutcome]
    per_job: RunOutcome
    per_job_dops: dict[str, int]

    def candidates(self) -> dict[BaselineName, RunOutcome]:
        out: dict[BaselineName, RunOutcome] = {d: o for d, o in self.fixed.items()}
        out[PER_JOB] = self.per_job
        return out

    def best(self) -> tuple[BaselineName, RunOutcome]:
        """The candidate with the least mean JCT among those that finished every job (module doc)."""
        return strongest(self.candidates())


def strongest(runs: Mapping[BaselineName, RunOutcome]) -> tuple[BaselineName, RunOutcome]:
    """The run with the least mean JCT of those that finished every job (a tie: the first given).
    ValueError when none did: a baseline that left jobs unfinished has no mean JCT to compare."""
    complete = [(k, o) for k, o in runs.items()
                if o.mean_jct_s is not None and o.result.summary.finished == o.result.summary.jobs]
    if not complete:
        raise ValueError(f"no isolated baseline finished every job (ran {sorted(map(str, runs))})")
    return min(complete, key=lambda ko: float(ko[1].mean_jct_s or 0.0))


def isolated_baselines(trace: Sequence[TraceJob], calibration: Calibration, cfg: SimConfig,
                       candidates: Sequence[int] = DOP_CANDIDATES, interference: Interference = MEASURED
                       ) -> IsolatedBaselines:
    """Run the trace alone at each fixed candidate DoP the cluster holds, and with every job at its
    own best DoP (the fixed run's outcome when every job's best is that DoP)."""
    fits = [d for d in candidates if d <= cfg.nodes]
    if not fits:
        raise ValueError(f"no candidate DoP in {list(candidates)} fits {cfg.nodes} nodes")
    fixed = {d: run_mode(isolated_at_dops(trace, {j.name: d for j in trace}), calibration, cfg, f"isolated-dop{d}",
                         "static", Mode.ISOLATED, interference) for d in fits}
    dops = {j.name: best_dop(j, calibration.app(j.app), fits) for j in trace}
    same = set(dops.values())
    if len(same) == 1:
        per_job = replace(fixed[same.pop()], name="isolated-per-job")
    else:
        per_job = run_mode(isolated_at_dops(trace, dops), calibration, cfg, "isolated-per-job", "static",
                           Mode.ISOLATED, interference)
    return IsolatedBaselines(fixed, per_job, dops)


__all__ = ["BaselineName", "DOP_CANDIDATES", "IsolatedBaselines", "PER_JOB", "RUNS", "RunOutcome", "as_harmony_job",
           "at_dop", "best_case", "best_dop", "compare", "gain", "gains", "harmony_dops", "ideal_schedule",
           "isolated_at_dops", "isolated_baselines", "missing_dops", "pairs", "run_mode", "solo_jct_s", "strongest"]

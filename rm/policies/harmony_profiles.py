"""Harmony's job profiles: the 3-tuple (T_cpu, T_net, c_g) per job from its AM's job reports.

A PS AM reports, on every allocate, its workers' per-iteration COMP and COMM times (moving averages
over its own workers; protocol/job_report.py `worker_times`). Each report that shows new iterations
taken in a steady shape (the AM has acted on its latest directive and is not reconfiguring, so the
times belong to the machines it is told to have) is one sample (T_cpu, T_net, c_g) with c_g = the
workers measured: under Harmony a job runs one worker on each node of its group, so that is its
machines. The profile keeps COMP normalised to one machine (eq. 4.2, models/harmony.py) and both
times as exponential moving averages over the samples (dissertation §4.3.2: "updated using moving
averages for up-to-date information").

The times are those the subtasks *held* their arbiter grants (`compute_held_s`, `comm_held_s`),
not the time they took including the wait for a grant: co-located, a job's COMP waits while its
partners' COMPs hold the CPU, and a profile that counted the wait would absorb them (§4.3.2:
"individual subtasks are executed in isolation from other subtasks", so what a subtask holds is
its own cost). A report without held times (an AM older than them, or a job that does not run
through the arbiter) says only the whole time, which is the job's own only when it runs alone:
`update(..., alone=False)` then leaves the profile as it is.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from models.harmony import normalise_cpu
from protocol.job_report import JobReport

EMA_WEIGHT = 0.3        # the weight of a new sample in the moving averages


@dataclass(frozen=True)
class Profile:
    """A job's profile: COMP time on one machine and COMM time per iteration (seconds)."""

    t_cpu1: float
    t_net: float
    machines: int           # c_g of the latest sample
    samples: int
    iterations: int         # the report's `iterations` at the latest sample

    def at(self, machines: float) -> tuple[float, float]:
        """(T_cpu, T_net) on `machines` machines (eq. 4.2)."""
        return self.t_cpu1 / machines, self.t_net


@dataclass(frozen=True)
class Sample:
    """One report's (T_cpu, T_net, c_g); `held`: the times are held grant times (not waited)."""

    t_cpu: float
    t_net: float
    machines: int
    held: bool


def sample(report: JobReport) -> Optional[Sample]:
    """The report's sample -- held times where the report has them, else the whole times -- or None
    while it has no timings."""
    wt = report.worker_times
    if wt.workers < 1 or (wt.compute_s <= 0.0 and wt.comm_s <= 0.0):
        return None
    if wt.compute_held_s > 0.0 or wt.comm_held_s > 0.0:
        return Sample(wt.compute_held_s, wt.comm_held_s, wt.workers, True)
    return Sample(wt.compute_s, wt.comm_s, wt.workers, False)


def update(profile: Optional[Profile], report: JobReport, ema_weight: float = EMA_WEIGHT,
           alone: bool = True) -> Optional[Profile]:
    """`profile` with the report's sample folded in (unchanged when the report has no timings, no
    iterations since the last sample, or only whole times of a job that is not `alone`)."""
    s = sample(report)
    # The AM's moving averages move only with iterations; fewer iterations than the last sample
    # mean a new AM attempt counting afresh, whose report is a sample too.
    if s is None or (profile is not None and report.iterations == profile.iterations):
        return profile
    if not s.held and not alone:
        return profile          # its waits for partners' grants are in these times
    t_cpu, t_net, machines = s.t_cpu, s.t_net, s.machines
    t1 = normalise_cpu(t_cpu, machines)
    if profile is None:
        return Profile(t1, t_net, machines, 1, report.iterations)
    a = ema_weight
    return Profile((1.0 - a) * profile.t_cpu1 + a * t1, (1.0 - a) * profile.t_net + a * t_net, machines,
                   profile.samples + 1, report.iterations)


class ProfileBook:
    """The profiles of the jobs the policy tracks (app id -> Profile)."""

    def __init__(self, ema_weight: float = EMA_WEIGHT):
        self.ema_weight = ema_weight
        self.profiles: dict[str, Profile] = {}

    def observe(self, app_id: str, report: Optional[JobReport], alone: bool = True) -> Optional[Profile]:
        """Fold a steady report of `app_id` in (`alone`: no other job's executors share its nodes);
        returns its profile (None: not profiled yet)."""
        old = self.profiles.get(app_id)
        if report is None:
            return old
        new = update(old, report, self.ema_weight, alone)
        if new is not None:
            self.profiles[app_id] = new
        return new

    def get(self, app_id: str) -> Optional[Profile]:
        return self.profiles.get(app_id)

    def forget(self, app_id: str) -> None:
        self.profiles.pop(app_id, None)


__all__ = ["EMA_WEIGHT", "Profile", "ProfileBook", "Sample", "sample", "update"]
